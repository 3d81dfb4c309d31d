"""What a run tells its user: the short per-row line (step N/total, rate, ETA), warnings for
steps that trained on nothing, the out_dir lock and the resolved config next to the metrics."""

import json

import pytest

from orchestrax import models
from orchestrax.envs.routing import RoutingConfig
from orchestrax.eval.eval_command import routing_from_json
from orchestrax.train import console, run_info
from orchestrax.train.train_config import RolloutConfig, TrainConfig


class FakeTime:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_line_shows_step_of_total_rate_and_eta():
    now = FakeTime()
    clock = console.Clock(now)
    row = {"phase": "rl", "step": 2, "rollout/reward_mean": 0.5, "rollout/accuracy": 0.25,
           "rollout/cost_mean": 0.001, "filter/kept_fraction": 0.75, "train/loss": 0.0123,
           "train/grad_norm": 1.5, "rollout/tokens_mean": 600.0, "time/step_s": 3.0}
    assert console.line(row, 10, clock) == ("rl step 2/10  reward 0.5  acc 0.25  cost 0.001  "
                                            "kept 0.75  loss 0.0123  grad 1.5")
    now.t += 30.0  # two more steps in 30 s: 15 s/step, 6 steps left -> 90 s
    line = console.line(row | {"step": 4}, 10, clock)
    assert line.endswith("| 15 s/step, ETA 0:01:30") and "tokens" not in line
    assert console.line({"phase": "eval", "step": 4, "rollout/accuracy": 1.0}, None, clock) == \
        "eval at step 4  acc 1"


def test_bar_postfix_shows_the_preferred_tool_share_per_kind_when_the_env_reports_it():
    rl = {"phase": "rl", "step": 3, "rollout/reward_mean": 0.5, "rollout/accuracy": 0.875,
          "rollout/cost_mean": 0.01}
    assert console.bar_postfix(rl) == "reward 0.5; acc 0.88"
    routed = rl | {"env/preferred_share_latency": 0.25, "env/preferred_share_cost": 0.71875,
                   "env/preferred_tool_rate_cost": 0.5}
    assert console.bar_postfix(routed) == "preferred tool cost 0.72, latency 0.25; acc 0.88"
    assert console.bar_postfix({"phase": "sft", "step": 1, "train/loss": 3.14159}) == \
        "loss 3.142"
    assert console.bar_postfix({"phase": "rl", "step": 1, "rollout/accuracy": float("nan")}) == ""


def test_degenerate_steps_are_named():
    base = {"phase": "rl", "step": 3, "train/grad_norm": 0.7, "filter/kept": 5,
            "rollout/format_error_rate": 0.1}
    assert console.degenerate(base) == []
    assert "trained on nothing" in console.degenerate(base | {"filter/kept": 0})[0]
    assert "gradient norm is 0" in console.degenerate(base | {"train/grad_norm": 0.0})[0]
    both = console.degenerate(base | {"rollout/format_error_rate": 1.0, "filter/kept": 0})
    assert len(both) == 2 and "format error" in both[0]
    assert console.degenerate({"phase": "eval", "step": 3, "filter/kept": 0}) == []


def test_a_second_trainer_on_the_same_out_dir_is_refused_with_the_first_ones_pid(tmp_path):
    import os
    first = run_info.lock_out_dir(tmp_path)
    with pytest.raises(run_info.OutDirLocked, match=f"pid {os.getpid()}.*another out_dir"):
        run_info.lock_out_dir(tmp_path)
    first.close()
    run_info.lock_out_dir(tmp_path).close()  # released with its holder


def test_resolved_config_is_written_and_read_back_as_eval_settings(tmp_path):
    cfg = TrainConfig(name="t", out_dir=str(tmp_path), model=models.tiny_config(),
                      env=RoutingConfig(num_eval=4, preferences=("latency",)),
                      rollout=RolloutConfig(max_new_tokens=24, max_turns=2, context_tokens=768,
                                            enable_thinking=False))
    path = run_info.write(tmp_path, cfg)
    assert json.loads(path.read_text())["rollout"]["group_size"] == 8
    settings, found = run_info.policy_settings(tmp_path)
    assert found == path
    env = settings.pop("env")
    assert settings == {"enable_thinking": False, "max_new_tokens": 24, "max_turns": 2,
                        "context_tokens": 768, "temperature": 0.0, "eval_samples": 1,
                        "top_p": 1.0, "top_k": -1, "seconds_per_token": 0.03,
                        "sampler_max_batch": 64, "seed": 0,
                        "eval_tasks": None, "eval_sheet": None, "preferences": True,
                        "env_kind": "RoutingConfig", "name": "t"}
    assert routing_from_json(env) == cfg.env  # what eval measures the `routing` task set on
    (tmp_path / "model").mkdir()
    assert run_info.policy_settings(tmp_path / "model")[1] == path
    assert run_info.policy_settings(tmp_path / "model" / "x") is None
    # A run config from before the one embedded engine names its batcher: read as before,
    # the name ignored (every embedded sampler is the continuous engine).
    saved = json.loads(path.read_text())
    saved["rollout"]["engine"] = "static"
    path.write_text(json.dumps(saved))
    assert run_info.policy_settings(tmp_path)[0] == settings | {"env": env}
    (tmp_path / run_info.RUN_CONFIG).write_text("{}")
    with pytest.raises(ValueError, match="train_config.json: not a run config"):
        run_info.policy_settings(tmp_path)


def test_eval_settings_that_differ_from_training_are_named():
    base = TrainConfig(name="t", model=models.tiny_config(), eval_every=5,
                       rollout=RolloutConfig(temperature=1.0, group_size=8))
    assert console.eval_differences(base) == [
        "eval rows decode greedy (eval_temperature), training rollouts sample at T=1 "
        "(rollout.temperature)"]
    sampled = base.replace(eval_temperature=0.7, eval_samples=4)
    assert console.eval_differences(sampled) == [
        "eval rows decode at T=0.7 (eval_temperature), training rollouts sample at T=1 "
        "(rollout.temperature)",
        "eval rows average 4 sample(s) a task (eval_samples), training rollouts 8 "
        "(rollout.group_size)"]
    same = base.replace(eval_temperature=1.0, eval_samples=8)
    assert console.eval_differences(same) == []
    assert console.eval_differences(base.replace(eval_every=0)) == []   # no eval rows


class _Bar:
    """A progress bar that records what it is told."""

    made: list["_Bar"] = []

    def __init__(self, total, initial, desc, unit="step", leave=True):
        self.total, self.desc, self.unit, self.leave = total, desc, unit, leave
        self.updates, self.closed = [], False
        _Bar.made.append(self)

    def update(self, n=1):
        self.updates.append(n)

    def close(self):
        self.closed = True


def test_an_eval_counts_its_episodes_on_a_bar_of_its_own(monkeypatch):
    """The trainer's eval (the demo's longest quiet stretch before: a minute of rollouts with
    no step bar moving) drives its own bar: tasks x eval_samples episodes, one tick as each
    finishes, erased when done (the row's line says how it went)."""
    import asyncio
    import types

    from orchestrax.agent.codec import Codec
    from orchestrax.agent.episode import EpisodeConfig
    from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
    from orchestrax.data.instances import prepare_instance
    from orchestrax.rollout.sampler import SamplingParams
    from orchestrax.train import loop, rollouts, setup

    cfg = TrainConfig(name="t", model=models.tiny_config(), env=RoutingConfig(num_eval=3),
                      eval_every=1, eval_samples=2, eval_temperature=0.7,
                      rollout=RolloutConfig(max_new_tokens=24, max_turns=2, context_tokens=768,
                                            enable_thinking=False))
    env = setup.make_env(cfg)
    codec = Codec(tiny_qwen3_tokenizer())
    trainer = object.__new__(loop.Trainer)   # the eval's own parts, no model or engine
    trainer.cfg, trainer.env, trainer.step, trainer.phase = cfg, env, 5, "rl"
    trainer.eval_tasks = [prepare_instance(t, env, split="eval", seed=i, config=cfg.instances)
                          for i, t in enumerate(env.tasks("eval"))]
    trainer.ckpt = types.SimpleNamespace(commit=lambda: None)
    trainer.episode_cfg = EpisodeConfig(max_turns=2, context_tokens=768, max_new_tokens=24,
                                        enable_thinking=False, sampling=SamplingParams())
    trainer.rollouts = rollouts.DirectRollouts(
        cfg, env, ScriptedSampler(codec, ["<answer>done</answer>"]), codec)
    _Bar.made = []
    monkeypatch.setattr(loop, "progress", _Bar)
    row = asyncio.run(trainer._evaluate())
    (bar,) = _Bar.made
    assert (bar.desc, bar.total, bar.unit, bar.leave) == ("eval at step 5", 6, "episode", False)
    assert bar.updates == [1] * 6 and bar.closed
    assert row["phase"] == "eval" and row["step"] == 5
