"""The demo: its command and its table, and (slow) GRPO moving its one policy towards the tool
each P kind favours."""

import dataclasses
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrax.train import demo
from orchestrax.train.loop import train

ROOT = Path(__file__).resolve().parents[1]

def test_table_prints_a_dash_for_a_share_of_no_calls():
    """A policy that called no tool on a kind's tasks has no share there: '-' and a footnote,
    not 'nan'; the other cells keep their numbers."""
    cfg = runpy.run_path(str(ROOT / "configs" / "demo.py"))["config"]()
    row = {"env/preferred_share_cost": 0.5, "env/preferred_share_latency": 0.25,
           "rollout/accuracy": 0.75}
    ev = {"adherence": None, "accuracy": 0.0, "share": {"cost": float("nan"), "latency": 1.0}}
    out = demo.table([("before RL (warm start)", row, ev)], cfg)
    assert "nan" not in out and "no tool call" in out
    line = out.splitlines()[-2]
    assert line.split()[-7:] == ["0.50", "0.25", "0.75", "-", "1.00", "0.00", "-"]


def _demo_command(*argv):
    from orchestrax.cli import build_parser, command_config
    return command_config(build_parser().parse_args(["demo", *argv]))


def test_the_demo_command_runs_the_config_files_two_runs(monkeypatch):
    """Without flags `orchestrax demo` runs configs/demo.py's warm start and GRPO as written."""
    monkeypatch.chdir(ROOT)  # the config file is read from the working directory
    cmd = _demo_command()
    configs = runpy.run_path(str(ROOT / "configs" / "demo.py"))
    assert (cmd.out, cmd.fresh) == ("runs/demo", False)
    assert demo.runs(cmd) == (configs["config_warmstart"](), configs["config"]())


def test_demo_flags_and_set_change_the_command_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "d"
    cmd = _demo_command("--out", str(out), "--fresh", "--set", "warmstart.sft_steps=2",
                        "--set", "grpo.steps=1", "--config", "configs/demo.py")
    warm, grpo = demo.runs(cmd)
    assert cmd.fresh and cmd.out == str(out)
    assert (warm.sft_steps, warm.steps, grpo.sft_steps, grpo.steps) == (2, 0, 0, 1)
    assert (warm.out_dir, warm.init_from) == (str(out / "warmstart"), None)
    assert (grpo.out_dir, grpo.init_from) == (str(out / "grpo"), str(out / "warmstart"))


def test_demo_bad_input_is_one_line_naming_the_field(tmp_path, monkeypatch, capsys):
    from orchestrax.cli import main
    monkeypatch.chdir(tmp_path)  # no configs/demo.py here
    for argv, named in ((["demo"], "--config 'configs/demo.py' not found"),
                        (["demo", "--config", str(ROOT / "configs" / "demo.py"),
                          "--set", "grpo.bogus=1"], "grpo.bogus"),
                        (["demo", "--config", str(ROOT / "configs" / "demo.py"),
                          "--set", "fresh=maybe"], "fresh='maybe'")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert named in err and err.count("\n") == 1, err
    (tmp_path / "two.py").write_text("def config(): return None\n")
    assert main(["demo", "--config", "two.py"]) == 2
    assert "no function 'config_warmstart'" in capsys.readouterr().err


def test_orchestrax_demo_reaches_the_trainer(tmp_path, monkeypatch, capsys):
    """The sub-command's wiring up to the first run: --fresh empties --out, then the warm
    start's Trainer is built and refuses an sft_batch the 8 devices do not divide."""
    from orchestrax.cli import main
    monkeypatch.chdir(ROOT)
    out = tmp_path / "d"
    out.mkdir()
    (out / "stale").write_text("")
    assert main(["demo", "--out", str(out), "--fresh", "--set", "warmstart.sft_batch=9"]) == 2
    assert "sft_batch=9 does not split over the 8 devices" in capsys.readouterr().err
    assert not (out / "stale").exists()


def test_demo_terminal_shows_its_own_lines_and_warnings_the_log_file_everything(tmp_path,
                                                                              capsys):
    """Under the trainer's logging_redirect_tqdm too: the runs' INFO lines (per-step rows,
    checkpoints) go to the log file only; warnings and the demo's own lines to both."""
    import logging

    from tqdm.contrib.logging import logging_redirect_tqdm
    root, ours = logging.getLogger(), logging.getLogger("orchestrax")
    handlers, levels = root.handlers, (root.level, ours.level)
    try:
        demo.configure_logging(tmp_path / "out" / "demo.log")
        with logging_redirect_tqdm():
            logging.getLogger("orchestrax.train.loop").info("rl step 1/16")
            logging.getLogger("orchestrax.train.checkpoint").warning("checkpoint 4 is corrupt")
            demo.log.info("GRPO: 16 steps")
        logging.getLogger("orchestrax.train.loop").info("done: demo-grpo")
        for h in root.handlers:
            h.flush()
    finally:
        root.handlers = handlers
        root.setLevel(levels[0])
        ours.setLevel(levels[1])
    err = capsys.readouterr().err
    assert err == ("WARNING orchestrax.train.checkpoint: checkpoint 4 is corrupt\n"
                   "GRPO: 16 steps\n"), err
    text = (tmp_path / "out" / "demo.log").read_text()
    for line in ("rl step 1/16", "checkpoint 4 is corrupt", "GRPO: 16 steps", "done: demo-grpo"):
        assert line in text


# What `orchestrax eval` writes while the demo waits on it: lines, and its episode bar (tqdm
# to a pipe, erased when done) between them.
_EVAL_CHILD = """
from tqdm import tqdm
print("eval settings: samples=4", flush=True)
bar = tqdm(total=64, desc="routing [grpo]", leave=False)
for _ in range(64):
    bar.update(1)
    bar.set_postfix(acc="0.950", usd="0.0123")
bar.close()
print("task set  acc\\n\\nrouting   0.95")
print("wrote eval.json", end="")
"""


def test_orchestrax_eval_s_episode_bar_drives_the_demo_s_and_stays_out_of_the_log(tmp_path):
    """`orchestrax eval` of each policy took a minute with nothing moving on the screen: its
    bar's frames now count the demo's episodes (done, of the right total), and only its lines
    reach demo.log."""
    seen = []
    log = tmp_path / "demo.log"
    code, lines = demo.run_logged([sys.executable, "-c", _EVAL_CHILD], log,
                                  lambda done, total: seen.append((done, total)))
    assert code == 0
    assert seen[-1] == (64, 64) and {t for _, t in seen} == {64}
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) > 2
    assert lines == ["eval settings: samples=4", "task set  acc", "", "routing   0.95",
                     "wrote eval.json"]   # its blank lines too: the log reads as its output
    text = log.read_text()
    assert text.endswith("\n".join(lines) + "\n") and "\r" not in text and "64/64" not in text


def test_eval_episodes_short_of_an_answer_are_one_line():
    """What an eval accuracy below 1 is made of, said on the terminal: episodes cut at the
    context limit or out of turns, and answers with no valid tool call; nothing when none."""
    def rec(end, calls):
        return {"end_reason": end, "calls": calls}

    fine = [rec("answer", {"cheap": 1}), rec("answer", {"fast": 1})]
    assert demo.short_episodes(fine) == ""
    out = demo.short_episodes(fine + [rec("context", {}), rec("answer", {}),
                                      rec("context", {"cheap": 1}), rec("max_turns", {})])
    assert out == ("of 6 episodes, 2 cut at the context limit, 1 answered with no valid tool "
                   "call, 1 out of turns")


@pytest.mark.slow
def test_grpo_moves_the_one_policy_towards_each_kind_s_tool(tmp_path):
    """The demo's recipe shortened to 8 GRPO steps from its own warm start: the policy's
    teacher-forced probability of the preferred tool rises for BOTH P kinds. A drift that
    ignores P (every run before cost/latency blocks with shared seeds) raises one kind's and
    lowers the other's; the warm start is near 0.6 / 0.4 for cheap whatever P says. Runs in a
    subprocess on one CPU device, as `make demo` does (the suite's 8 host devices would
    shard the tiny model and its sampler eight ways on two cores)."""
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True,
                          text=True, timeout=3000, env={**os.environ, "XLA_FLAGS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = json.loads(proc.stdout.strip().splitlines()[-1])
    print("P(preferred tool) before", before, "after", after)
    assert after["cost"] > before["cost"] + 0.05, (before, after)
    assert after["latency"] > before["latency"] + 0.05, (before, after)


def _shortened_demo(out: str) -> tuple[dict[str, float], dict[str, float]]:
    cmd = demo.config(str(ROOT / "configs" / "demo.py"))
    warm, grpo = demo.runs(dataclasses.replace(cmd, out=out))
    warm = dataclasses.replace(warm, eval_every=0)
    grpo = dataclasses.replace(grpo, steps=8, eval_every=0)
    train(warm)
    before = demo.preferred_probabilities(warm)
    train(grpo)
    return before, demo.preferred_probabilities(grpo)


if __name__ == "__main__":
    print(json.dumps(_shortened_demo(sys.argv[1])))
