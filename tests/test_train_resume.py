"""SIGKILL in the middle of an RL phase that really updates params: the resumed run ends with
exactly the params, task order and metrics of a run that was never killed.

Runs in subprocesses on one CPU device; python tests/test_train_resume.py OUT INIT_FROM STEPS
is the run itself."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RL_STEPS = 3


def config(out_dir, *, sft_steps=0, steps=RL_STEPS, init_from=None):
    from orchestrax import models
    from orchestrax.envs.routing import RoutingConfig
    from orchestrax.rl import GRPOConfig, OptimizerConfig
    from orchestrax.train.train_config import RolloutConfig, TrainConfig
    return TrainConfig(
        name="resume", out_dir=str(out_dir), init_from=init_from,
        model=models.tiny_config(vocab_size=512, hidden_size=64, intermediate_size=128,
                                 num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32),
        # k1's gradient is the policy's own score, non-zero on every kept token, so each RL step
        # moves the params even while the tiny policy earns no reward yet.
        grpo=GRPOConfig(num_minibatches=1, temperature=1.0, min_group_std=0.0, kl="k1",
                        kl_coef=0.05),
        optim=OptimizerConfig(lr=1e-3, total_steps=100, weight_decay=0.0),
        sft_optim=OptimizerConfig(lr=1e-2, warmup_steps=3, schedule="cosine",
                                  total_steps=max(sft_steps, 4), weight_decay=0.0),
        rollout=RolloutConfig(group_size=4, tasks_per_step=4, max_new_tokens=64, max_turns=2,
                              context_tokens=768, enable_thinking=False),
        # 6 tasks, 4 a step: epochs turn over. P weighs latency: its feature is the episode's
        # deterministic clock (tokens x seconds per token + tools' latency), so the resumed run
        # must reproduce every reward.
        env=RoutingConfig(num_train=6, num_eval=2, preferences=("latency",)),
        sft_steps=sft_steps, sft_batch=16, steps=steps, checkpoint_every=1, eval_every=0)


def _run(args, *, kill_at_rl_step=None, out=None):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, __file__, *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if kill_at_rl_step is None:
        _, err = proc.communicate(timeout=1500)
        assert proc.returncode == 0, err[-3000:]
        return
    metrics = pathlib.Path(out) / "metrics.jsonl"
    deadline = time.time() + 1500
    while time.time() < deadline and proc.poll() is None:
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() \
            else []
        if any(r["phase"] == "rl" and r["step"] == kill_at_rl_step for r in rows):
            proc.send_signal(signal.SIGKILL)  # mid-run: its checkpoint may be half written
            break
        time.sleep(0.05)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]


def _final(out):
    """(step, state, meta) of a run's newest checkpoint, restored as saved (no target)."""
    import orbax.checkpoint as ocp
    ckpt_dir = pathlib.Path(out) / "checkpoints"
    step = max(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
    with ocp.CheckpointManager(ckpt_dir) as mngr:
        out_ = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                          meta=ocp.args.JsonRestore()))
    return step, out_["state"], out_["meta"]


def _rows(out):
    """Metrics rows without the wall-clock ones (step times, measured sampler time); the
    latency feature and the rewards stay in."""
    rows = [json.loads(x) for x in (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items()
             if not k.startswith("time/") and k != "rollout/generation_wall_s_mean"} for r in rows]


@pytest.mark.slow
def test_sigkill_mid_rl_resumes_bit_exactly(tmp_path):
    warm, straight, killed = tmp_path / "warm", tmp_path / "straight", tmp_path / "killed"
    _run([warm, "-", 0, 30])  # warm start only: the tool-call format, so samples are kept
    _run([straight, warm, RL_STEPS, 0])
    _run([killed, warm, RL_STEPS, 0], kill_at_rl_step=2, out=killed)
    _run([killed, warm, RL_STEPS, 0])

    step_a, state_a, meta_a = _final(straight)
    step_b, state_b, meta_b = _final(killed)
    assert step_a == step_b == RL_STEPS and meta_a == meta_b
    leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
    assert len(leaves_a) == len(leaves_b)
    for a, b in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit for bit

    rows_a, rows_b = _rows(straight), _rows(killed)
    assert rows_b == rows_a  # same tasks, samples and losses; no row twice
    rl = [r for r in rows_a if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == list(range(1, RL_STEPS + 1))
    assert all(r["filter/kept"] > 0 and r["train/grad_norm"] > 0 and r["train/skipped"] == 0
               for r in rl)
    assert all(r["rollout/latency_mean"] > 0 for r in rl)   # what the latency-weighted P reads
    # The RL phase moved the params away from the warm start.
    _, warm_state, _ = _final(warm)
    embed = lambda s: np.asarray(s["params"]["embed"] if isinstance(s, dict) else s[0]["embed"])
    assert not np.array_equal(embed(warm_state), embed(state_a))


if __name__ == "__main__":
    from orchestrax.train import setup
    from orchestrax.train.loop import train
    out, init_from, steps, sft_steps = sys.argv[1:5]
    setup.configure_logging()
    train(config(out, sft_steps=int(sft_steps), steps=int(steps),
                 init_from=None if init_from == "-" else init_from))
