"""Metrics people look at: metrics.jsonl cut back to the checkpoint on resume, TensorBoard
events next to it, PNG plots."""

import json
import struct

import pytest
from tensorboardX.proto import event_pb2

from orchestrax.train import plots
from orchestrax.train.metrics_log import MetricsLog


def _events(logdir):
    """(tag, step, value) of every scalar in the event files, read as TFRecords."""
    out = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return out


def test_rows_and_events_and_resume_cut(tmp_path):
    log = MetricsLog(tmp_path, keep_rows=0, resume_step=None)
    for step in (1, 2, 3):
        log.write({"phase": "rl", "step": step, "rollout/reward_mean": step / 10,
                   "train/ok": True}, 10 + step)
    log.close()
    assert [r["step"] for r in log.read()] == [1, 2, 3]
    tag = "rl/rollout/reward_mean"
    assert sorted(e for e in _events(tmp_path / "tensorboard") if e[0] == tag) == [
        (tag, 11, pytest.approx(0.1)), (tag, 12, pytest.approx(0.2)),
        (tag, 13, pytest.approx(0.3))]
    tags = {tag for tag, _, _ in _events(tmp_path / "tensorboard")}
    assert "rl/train/ok" not in tags and "rl/step" not in tags  # booleans and the step are not scalars

    # Resumed from a checkpoint taken after 2 rows (global step 12): row 3 is re-run, once.
    log = MetricsLog(tmp_path, keep_rows=2, resume_step=12)
    assert log.rows == 2
    log.write({"phase": "rl", "step": 3, "rollout/reward_mean": 0.5}, 13)
    log.close()
    assert [(r["step"], r["rollout/reward_mean"]) for r in log.read()] == [
        (1, 0.1), (2, 0.2), (3, 0.5)]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3


def test_plots_are_written(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"phase": "eval", "step": 0, "rollout/accuracy": 0.5, "env/tool_share_a": 0.5,
             "env/tool_share_b": 0.5}]
    rows += [{"phase": "rl", "step": s, "rollout/reward_mean": 0.1 * s, "rollout/accuracy": 1.0,
              "rollout/cost_mean": 0.01, "env/tool_share_a": 0.2 * s,
              "env/tool_share_b": 1 - 0.2 * s} for s in range(1, 5)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    png = plots.plot_run(metrics, tmp_path / "metrics.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plots.tool_names(rows) == ["a", "b"]
    kinds = [{"env/preferred_share_cost": 0.2 * s, "env/preferred_share_latency": 1 - 0.2 * s}
             for s in range(5)]
    metrics.write_text("".join(json.dumps(r | k) + "\n" for r, k in zip(rows, kinds)))
    shares = plots.plot_preference_shares(
        metrics, ("cost", "latency"),
        {"warm": {"share": {"cost": 0.3, "latency": 0.4}, "adherence": None},
         "grpo": {"share": {"cost": 0.9, "latency": 0.8}, "adherence": 0.7}}, tmp_path / "s.png")
    assert shares.stat().st_size > 10_000
    (tmp_path / "sft.jsonl").write_text(json.dumps({"phase": "sft", "step": 10}) + "\n")
    assert plots.plot_run(tmp_path / "sft.jsonl", tmp_path / "none.png") is None


def test_plot_panels_are_the_ones_with_data():
    """An SFT-only run plots its loss and nothing else; an RL run adds loss, KL and the kept
    fraction; no panel is empty."""
    sft = [{"phase": "sft", "step": s, "train/loss": 2.0 / s} for s in (10, 20)]
    assert [(t, [(lab, xs, ys) for lab, xs, ys, _ in ser]) for t, ser in plots.panels(sft)] == [
        ("SFT loss", [("warm start", [10, 20], [0.2, 0.1])])]
    rl = [{"phase": "rl", "step": 1, "rollout/reward_mean": 0.5, "rollout/accuracy": 0.5,
           "rollout/cost_mean": 0.1, "train/loss": 0.3, "train/kl": 0.01,
           "filter/kept_fraction": 0.75, "env/tool_share_a": 1.0},
          {"phase": "eval", "step": 1, "rollout/accuracy": 1.0, "rollout/cost_mean": 0.2}]
    drawn = dict(plots.panels(sft + rl))
    assert list(drawn) == ["SFT loss", "reward", "accuracy", "cost ($)", "policy loss",
                           "KL to reference", "kept fraction", "share of tool calls"]
    assert [lab for lab, *_ in drawn["accuracy"]] == ["train", "eval"]
    assert drawn["kept fraction"][0][2] == [0.75]
    assert all(xs for series in drawn.values() for _, xs, _, _ in series)


def test_tensorboard_itself_reads_the_run_events(tmp_path):
    """BUILD.md's `tensorboard --logdir runs/` after `pip install -e '.[tensorboard]'`: the
    installed TensorBoard's own reader finds the scalars."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    (tmp_path / "run").mkdir()
    log = MetricsLog(tmp_path / "run", keep_rows=0, resume_step=None)
    for step in (1, 2):
        log.write({"phase": "rl", "step": step, "train/loss": 0.5 / step}, step)
    log.close()
    mux = EventMultiplexer().AddRunsFromDirectory(str(tmp_path)).Reload()
    (run,) = mux.Runs()
    assert [(e.step, e.value) for e in mux.Scalars(run, "rl/train/loss")] == [(1, 0.5), (2, 0.25)]


def test_process_rows_sum_counters_and_average_the_rest():
    """Two processes' rows of one RL step, each of its own 16 episodes; the step's metrics come
    from the global batch, so both hold the same loss and policy_tokens."""
    from orchestrax.train.metrics_log import combine_process_rows
    a = {"phase": "rl", "step": 3, "rollout/episodes": 16.0, "rollout/episodes_failed": 1.0,
         "filter/kept": 12.0, "filter/kept_fraction": 0.75, "flow/turn_samples": 40.0,
         "sampler/requests": 30.0,
         "rollout/stale_trajectories": 0.0, "rollout/accuracy": 0.5, "env/tool_calls_mean": 2.0,
         "train/loss": 0.25, "train/policy_tokens": 900.0, "env/mix/tau2": 1.0}
    b = a | {"rollout/episodes_failed": 3.0, "filter/kept": 8.0, "filter/kept_fraction": 0.5,
             "flow/turn_samples": 20.0, "sampler/requests": 34.0,
             "rollout/stale_trajectories": 2.0, "rollout/accuracy": 0.25,
             "env/tool_calls_mean": 3.0}
    del b["env/mix/tau2"]  # a source this process drew no task from reports nothing
    row = combine_process_rows([a, b])
    assert row == {"phase": "rl", "step": 3, "rollout/episodes": 32.0,
                   "rollout/episodes_failed": 4.0,
                   "filter/kept": 20.0, "filter/kept_fraction": 0.625,
                   "flow/turn_samples": 60.0, "sampler/requests": 64.0,
                   "rollout/stale_trajectories": 2.0, "rollout/accuracy": 0.375,
                   "env/tool_calls_mean": 2.5, "train/loss": 0.25, "train/policy_tokens": 900.0,
                   "env/mix/tau2": 1.0}
    assert combine_process_rows([a]) is a
    with pytest.raises(ValueError, match="step"):
        combine_process_rows([a, b | {"step": 4}])


def test_metrics_are_copied_whole_to_a_mirror_and_resumed_from_it(tmp_path):
    """An object store cannot append: the mirror (gs:// in a TPU run, a local epath here) gets
    the whole file after every row, and a machine without the local file resumes from it."""
    from etils import epath
    mirror = epath.Path(tmp_path / "bucket")
    mirror.mkdir()
    (tmp_path / "vm1").mkdir()
    log = MetricsLog(tmp_path / "vm1", keep_rows=0, resume_step=None, mirror=mirror)
    for step in (1, 2, 3):
        log.write({"phase": "rl", "step": step, "train/loss": float(step)}, step)
        assert (mirror / "metrics.jsonl").read_text() == (tmp_path / "vm1/metrics.jsonl").read_text()
    log.close()
    (tmp_path / "vm2").mkdir()
    log = MetricsLog(tmp_path / "vm2", keep_rows=2, resume_step=2, mirror=mirror)
    assert [r["step"] for r in log.read()] == [1, 2]
    assert len((mirror / "metrics.jsonl").read_text().splitlines()) == 2
    log.close()


def test_tool_totals_put_nameless_calls_under_one_key():
    from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord
    from orchestrax.rl.batch import tool_totals

    def call(name, cost):
        return ToolCallRecord(name=name, arguments={}, observation="", cost=cost, ok=bool(name))

    traj = Trajectory(task_id="t", turns=[
        TurnRecord(text="", tool_calls=[call("python", 0.5), call("", 0.25)]),
        TurnRecord(text="", tool_calls=[call("a/b", 0.0), call("python", 0.25), call(" ", 0.0)])])
    assert tool_totals([traj]) == {
        "tools/python/calls": 2.0, "tools/python/cost_usd": 0.75,
        "tools/_malformed/calls": 3.0, "tools/_malformed/cost_usd": 0.25}


def test_tool_totals_never_make_a_key_the_metrics_log_refuses():
    """A model-emitted name becomes a key segment only when it is one of the task's tools;
    others go under `_unknown` or `_malformed`, and every key passes `check_key` (a name
    like ',fast' once crashed a demo run at its first metrics row)."""
    from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord
    from orchestrax.rl.batch import tool_totals
    from orchestrax.train.metrics_log import check_key

    names = [",fast", "fast", "cheap ", "fast\n", "über", "x" * 65, "fst", "a.b-c_d", "cheap"]
    traj = Trajectory(task_id="t", turns=[TurnRecord(text="", tool_calls=[
        ToolCallRecord(name=n, arguments={}, observation="", cost=0.5, ok=True)
        for n in names])])
    out = tool_totals([traj], known={"fast", "cheap", "a.b-c_d"})
    for key in out:
        check_key(key)
    assert out == {"tools/fast/calls": 1.0, "tools/fast/cost_usd": 0.5,
                   "tools/cheap/calls": 1.0, "tools/cheap/cost_usd": 0.5,
                   "tools/a.b-c_d/calls": 1.0, "tools/a.b-c_d/cost_usd": 0.5,
                   "tools/_unknown/calls": 1.0, "tools/_unknown/cost_usd": 0.5,
                   "tools/_malformed/calls": 5.0, "tools/_malformed/cost_usd": 2.5}
    # without the task's names every usable name is its own column, still a valid key
    for key in tool_totals([traj]):
        check_key(key)


def test_every_key_is_in_the_one_slash_style(tmp_path):
    """`group/name` with a known group, or phase/step; a row with any other key is refused
    before anything is written (the trainer's own rows go through the same check)."""
    from orchestrax.train.metrics_log import check_key
    for key in ("phase", "step", "rollout/reward_mean", "train/loss", "time/step_s",
                "sampler/retries", "tools/web_search/cost_usd", "env/routing/preferred_share_cost",
                "filter/kept", "flow/turn_samples", "dispatches/coder", "tokens/prompt_mean"):
        check_key(key)
    for key in ("reward_mean", "rollout_retries", "time_step_s", "loss", "Rollout/x",
                "rollout/", "misc/x", "rollout//x"):
        with pytest.raises(ValueError, match="not group/name"):
            check_key(key)
    log = MetricsLog(tmp_path, keep_rows=0, resume_step=None)
    with pytest.raises(ValueError, match="'rollout_retries'"):
        log.write({"phase": "rl", "step": 1, "rollout_retries": 2.0}, 1)
    log.close()
    assert log.read() == []
