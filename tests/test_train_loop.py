"""The outer loop end to end on the routing env: SFT warm start, GRPO steps, checkpoints, resume."""

import asyncio
import dataclasses
import json
import runpy
import threading
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from orchestrax import models
from orchestrax.envs.routing import RoutingConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.train.checkpoint import Checkpointer
from orchestrax.train.train_config import RolloutConfig, TrainConfig
from orchestrax.train.loop import Trainer, train
from orchestrax.train.overrides import apply_overrides, load_config

ROOT = Path(__file__).resolve().parents[1]


def tiny_run(out_dir, steps, sft_steps=4) -> TrainConfig:
    return TrainConfig(
        name="test", out_dir=str(out_dir),
        model=models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64,
                                 num_heads=2, num_kv_heads=1, head_dim=16),
        grpo=GRPOConfig(num_minibatches=2),
        optim=OptimizerConfig(lr=1e-3, total_steps=100),
        rollout=RolloutConfig(group_size=4, tasks_per_step=2, max_new_tokens=24, max_turns=2,
                              context_tokens=768, enable_thinking=False),
        env=RoutingConfig(num_train=16, num_eval=4),
        sft_steps=sft_steps, sft_batch=8, steps=steps, checkpoint_every=1, eval_every=0)


@pytest.mark.slow
def test_sft_then_grpo_then_resume(tmp_path):
    history = train(tiny_run(tmp_path, steps=2))
    phases = [h["phase"] for h in history]
    assert phases.count("sft") >= 1 and phases.count("rl") == 2 and phases[-1] == "rl"
    rl_rows = [h for h in history if h["phase"] == "rl"]
    for row in rl_rows:
        for key in ("rollout/reward_mean", "rollout/accuracy", "rollout/cost_mean",
                    "rollout/latency_mean", "train/loss", "train/grad_norm",
                    "env/preferred_tool_rate", "filter/kept"):
            assert key in row, key
        assert row["rollout/tokens_mean"] > 500  # the whole system prompt with three tools is there
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(history)
    ckpts = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert ckpts[-1] == 4 + 2  # global step = SFT steps + RL steps

    # A rerun with more steps resumes from the last checkpoint and only runs the remainder.
    more = train(tiny_run(tmp_path, steps=3))
    assert [h["step"] for h in more if h["phase"] == "rl"] == [3]
    assert not any(h["phase"] == "sft" for h in more)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len({(r["phase"], r["step"]) for r in rows}) == len(rows)  # no row twice
    assert [r["step"] for r in rows if r["phase"] == "rl"] == [1, 2, 3]
    assert (tmp_path / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))

    # The run exports to a directory transformers loads, with the checkpoint's exact logits.
    export = runpy.run_path(str(ROOT / "tools" / "export_hf.py"))["export"]
    out = export(str(tmp_path), str(tmp_path / "hf"))
    cfg, params = models.load_hf(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.arange(1, 25, dtype=np.int32).reshape(2, 12)
    ours = np.asarray(models.forward(cfg, params, jnp.asarray(ids)))
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    assert transformers.AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<|im_end|>") > 0


@pytest.mark.slow
def test_init_from_starts_rl_from_another_runs_params(tmp_path):
    warm = dataclasses.replace(tiny_run(tmp_path / "warm", steps=0), eval_every=1)
    train(warm)  # SFT, then the step-0 eval of its result (eval_every=0 would skip it)
    _, meta = Checkpointer(tmp_path / "warm" / "checkpoints", every=0).restore(
        _abstract_state(warm))
    assert (meta["phase"], meta["step"]) == ("sft", 4)
    rows = len((tmp_path / "warm" / "metrics.jsonl").read_text().splitlines())
    assert 0 < meta["metrics_rows"] <= rows
    before = (tmp_path / "warm" / "metrics.jsonl").read_text()
    assert train(warm) == []  # complete: a rerun runs nothing and keeps the final eval row
    assert (tmp_path / "warm" / "metrics.jsonl").read_text() == before
    rl_cfg = dataclasses.replace(tiny_run(tmp_path / "rl", steps=1, sft_steps=0),
                                 init_from=str(tmp_path / "warm"), eval_every=1)
    history = train(rl_cfg)
    assert [h["phase"] for h in history] == ["eval", "rl", "eval"]
    first_eval = history[0]
    warm_eval = [json.loads(x) for x in (tmp_path / "warm" / "metrics.jsonl").read_text()
                 .splitlines() if json.loads(x)["phase"] == "eval"][-1]
    # Same params and greedy decoding: the RL run starts exactly where the warm start ended.
    assert first_eval == warm_eval


def _abstract_state(cfg):
    from orchestrax import parallel, rl
    from orchestrax.train import setup
    mesh = parallel.make_mesh(cfg.mesh)
    mcfg, params = setup.load_params(cfg, mesh)
    return rl.make_train_step(mcfg, cfg.grpo, cfg.optim, mesh).init(params)


def test_configs_build_and_overrides_name_the_field():
    demo = load_config(str(ROOT / "configs" / "demo.py"))
    assert isinstance(demo.env, RoutingConfig) and demo.model is not None
    demo_ns = runpy.run_path(str(ROOT / "configs" / "demo.py"))
    warm = demo_ns["config_warmstart"]()
    assert demo.init_from == warm.out_dir and warm.steps == 0 and demo.sft_steps == 0
    # the warm start saw the same phrasings; GRPO draws its tasks in cost/latency blocks of one
    # job, a block a group
    assert dataclasses.replace(demo.env, kind_blocks=False) == warm.env
    assert demo.env.kind_blocks and demo.grpo.group_tasks == len(demo.env.preferences) == 2
    # one policy on both preference kinds, drawn from the training pairs
    assert demo.env.preferences == ("pool:cost", "pool:latency") and demo.env.num_eval == 16
    cfg = apply_overrides(demo, ["rollout.group_size=4", "optim.lr=1e-5", "steps=3",
                                 "rollout.server_urls=['http://h:1']"])
    assert (cfg.rollout.group_size, cfg.optim.lr, cfg.steps) == (4, 1e-5, 3)
    assert cfg.rollout.server_urls == ("http://h:1",)
    with pytest.raises(ValueError, match="RolloutConfig has no field 'groupsize'"):
        apply_overrides(demo, ["rollout.groupsize=4"])
    with pytest.raises(ValueError, match="backend='vllm'.*allowed"):
        apply_overrides(demo, ["rollout.backend=vllm"])
    gpu = load_config(str(ROOT / "configs" / "qwen3_8b_gpu.py"))
    assert gpu.rollout.backend == "sglang" and len(gpu.rollout.server_urls) == 4
    assert gpu.remat == "full"  # what bench/memory.py's figures for these configs assume
    emb = load_config(str(ROOT / "configs" / "qwen3_8b_gpu.py") + ":config_embedded")
    assert emb.rollout.backend == "embedded"
    tpu = runpy.run_path(str(ROOT / "configs" / "qwen3_tpu.py"))["config"]()
    assert tpu.mesh is not None and tpu.remat == "full"


def test_bad_train_config_is_named():
    with pytest.raises(ValueError, match="exactly one of model"):
        TrainConfig(name="x")
    with pytest.raises(ValueError, match="env='web'; allowed: a config of \\['MixConfig', "
                                         "'QAConfig', 'RoutingConfig', 'Tau2Config', "
                                         "'ToolScaleConfig'\\]"):
        TrainConfig(name="x", model=models.tiny_config(), env="web")
    with pytest.raises(ValueError, match="server_urls is empty"):
        RolloutConfig(backend="sglang")


@pytest.mark.slow
def test_rollouts_in_worker_processes(tmp_path, caplog):
    """rollout.workers=2: episodes run in an EpisodePool whose workers call the trainer's
    embedded sampler over loopback HTTP; the step sees whole, verified trajectories."""
    base = tiny_run(tmp_path, steps=1, sft_steps=0)
    cfg = dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, workers=2),
                              eval_every=0)
    with caplog.at_level("INFO", logger="orchestrax"):
        history = train(cfg)
    assert any("2 episode workers started (sampler at http://127.0.0.1:" in r.getMessage()
               for r in caplog.records)
    (row,) = [h for h in history if h["phase"] == "rl"]
    assert row["rollout/tokens_mean"] > 500 and row["rollout/turns_mean"] >= 1
    assert 0.0 <= row["rollout/accuracy"] <= 1.0 and np.isfinite(row["train/loss"])


@pytest.mark.slow
def test_the_update_leaves_the_event_loop_free(tmp_path):
    """The GRPO update blocks for its whole length (~30 s on two cores in the rehearsal); the
    event loop's other tasks (the SGLang client's health checks) must run meanwhile. Here the
    update cannot finish until a task on the loop has run while it waits: run on the loop, it
    would wait for itself."""
    trainer = Trainer(tiny_run(tmp_path, steps=1, sft_steps=0))
    started, released = threading.Event(), threading.Event()
    step, start = trainer.update.step, trainer.rollouts.start

    def gated_step(state, batch):
        started.set()
        assert released.wait(timeout=60), "no task on the event loop ran during the update"
        return step(state, batch)

    async def release():
        while not started.is_set():
            await asyncio.sleep(0.01)
        released.set()

    tasks = []

    async def start_then_release():  # the rollout driver starts on the trainer's event loop
        await start()
        tasks.append(asyncio.create_task(release()))

    trainer.update = trainer.update._replace(step=gated_step)
    trainer.rollouts.start = start_then_release
    history = trainer.run()
    assert [h["phase"] for h in history] == ["rl"] and released.is_set()


def test_warm_start_from_jsonl_packs_with_a_token_mean_loss(tmp_path):
    """`sft_data` runs the grain pipeline's packed rows (segment ids and positions) through the
    trainer's SFT step, which aggregates by token whatever the RL phase uses: a per-row mean
    over a packed row would be refused."""
    rng = np.random.default_rng(0)
    path = tmp_path / "demos.jsonl"
    with path.open("w") as f:
        for _ in range(24):
            n = int(rng.integers(20, 120))
            f.write(json.dumps({"token_ids": rng.integers(5, 500, n).tolist(),
                                "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)}) + "\n")
    cfg = tiny_run(tmp_path / "run", steps=0, sft_steps=2).replace(
        sft_data=(str(path),), sft_workers=0,
        grpo=GRPOConfig(num_minibatches=2, agg="seq-mean-token-mean"))
    history = train(cfg)
    sft = [h for h in history if h["phase"] == "sft"]
    assert sft and sft[-1]["step"] == 2
    assert all(np.isfinite(h["train/loss"]) and h["train/loss"] > 0 for h in sft)
