"""One process of a multi-process run, started by tests/test_train_multiprocess.py:
`python tests/multiprocess_worker.py MODE OUT PROCESS_ID NUM_PROCESSES PORT`.

MODE "train": a tiny routing run (warm start, then GRPO with a KL reference, embedded sampler,
checkpoints) through the real Trainer. MODE "step": one GRPO step with a KL term on a fixed
batch, each process contributing its own rows (rows of different lengths per process). Each
writes its results to OUT/result-<process id>.json. MODE "fault": the "train" run without its
warm start and evals, in which process 1 raises in its first GRPO rollout, under
`parallel.exit_on_error` as `orchestrax train` runs it; no results.
"""

import dataclasses
import json
import pathlib
import sys

import jax
import numpy as np

from orchestrax import models, parallel, rl
from orchestrax.envs.routing import RoutingConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.train import batching
from orchestrax.train.train_config import RolloutConfig, TrainConfig

MODEL = models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64, num_heads=2,
                           num_kv_heads=1, head_dim=16)
ROWS, LENGTHS = 8, (48, 80)  # rows per process; process p's rows are LENGTHS[p] long


def train_config(out: pathlib.Path) -> TrainConfig:
    return TrainConfig(
        name="multiprocess", out_dir=str(out), model=MODEL,
        grpo=GRPOConfig(num_minibatches=2, kl_coef=0.05, kl="k3"),
        optim=OptimizerConfig(lr=1e-3, total_steps=100),
        rollout=RolloutConfig(group_size=4, tasks_per_step=2, max_new_tokens=16, max_turns=2,
                              context_tokens=768, enable_thinking=False),
        env=RoutingConfig(num_train=16, num_eval=2),
        sft_steps=4, sft_batch=8, steps=1, checkpoint_every=2, eval_every=1)


def local_rows(process: int) -> dict[str, np.ndarray]:
    """Process `process`'s rollout rows: a pure function of its index (its parity sets T)."""
    rng = np.random.default_rng([7, process])
    t = LENGTHS[process % 2]
    n = rng.integers(t // 2, t + 1, ROWS)
    attn = (np.arange(t)[None] < n[:, None]).astype(np.int32)
    return {"tokens": rng.integers(1, MODEL.vocab_size, (ROWS, t)).astype(np.int32) * attn,
            "attention_mask": attn,
            "loss_mask": (attn * (np.arange(t)[None] >= 8)).astype(np.float32),
            "advantages": rng.normal(size=ROWS).astype(np.float32),
            "sample_mask": (rng.random(ROWS) > 0.2).astype(np.float32)}


def padded(rows: dict[str, np.ndarray], t: int) -> dict[str, np.ndarray]:
    return {k: np.pad(v, [(0, 0), (0, t - v.shape[1])]) if v.ndim == 2 else v
            for k, v in rows.items()}


def sft_steps(mesh) -> list[float]:
    """Three warm-start steps on batches every process holds whole (as the loop's are)."""
    gcfg = GRPOConfig(objective="sft", num_minibatches=1, agg="token-mean")
    update = rl.make_train_step(MODEL, gcfg, OptimizerConfig(lr=1e-2, total_steps=10), mesh)
    shardings = models.param_shardings(MODEL, mesh)
    state = update.init(jax.jit(models.init_params, static_argnums=(0, 1),
                                out_shardings=shardings)(MODEL, 1))
    losses = []
    for step in range(3):
        rows = [padded(local_rows(p + 2 * step), max(LENGTHS)) for p in range(2)]
        batch = {k: np.concatenate([r[k] for r in rows])
                 for k in ("tokens", "attention_mask", "loss_mask")}
        state, metrics = update.step(state, batching.from_global_rows(
            batch, rl.batch_shardings(batch, mesh)))
        losses.append(float(np.asarray(metrics["loss"])))
    return losses


def one_step(out: pathlib.Path) -> dict:
    """SFT losses, then one GRPO step's metrics and param sum, its batch from each process's
    rows."""
    mesh = parallel.make_mesh(parallel.MeshConfig())
    sft = sft_steps(mesh)
    gcfg = GRPOConfig(num_minibatches=2, kl_coef=0.1, kl="k3")
    update = rl.make_train_step(MODEL, gcfg, OptimizerConfig(lr=1e-3, total_steps=10), mesh)
    shardings = models.param_shardings(MODEL, mesh)
    params = jax.jit(models.init_params, static_argnums=(0, 1), out_shardings=shardings)(MODEL, 0)
    ref = jax.tree.map(lambda x: x * 0.99, params)  # a reference that differs from the policy
    state = update.init(params)
    if jax.process_count() == 1:  # the same rows, all in this process, in process order
        t = max(LENGTHS)
        parts = [padded(local_rows(p), t) for p in range(len(LENGTHS))]
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    else:
        batch = local_rows(jax.process_index())
    batch = batching.from_process_rows(batch, rl.batch_shardings(batch, mesh))
    rows = rl.batch_shardings({"tokens": np.zeros((1, 1))}, mesh)["tokens"]
    ref_fn = jax.jit(lambda p, t, m: models.token_logprobs(MODEL, p, t, m), out_shardings=rows)
    batch["ref_logprobs"] = ref_fn(ref, batch["tokens"], batch["attention_mask"])
    state, metrics = update.step(state, batch)
    total = jax.jit(lambda p: sum(jax.numpy.sum(x.astype(np.float32))
                                  for x in jax.tree.leaves(p)),
                    out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return {"sft_losses": sft, "metrics": {k: float(np.asarray(v)) for k, v in metrics.items()},
            "param_sum": float(np.asarray(total(state.params)))}


def fault(out: pathlib.Path) -> None:
    from orchestrax.train import loop
    rollout = loop.Trainer._rollout

    async def failing(self, tasks, group, temperature=None):
        if jax.process_index() == 1:
            raise RuntimeError("injected fault in process 1's rollout")
        return await rollout(self, tasks, group, temperature)

    loop.Trainer._rollout = failing
    with parallel.exit_on_error():
        loop.train(dataclasses.replace(train_config(out), sft_steps=0, eval_every=0))
    raise AssertionError("the run did not fail")


def main() -> None:
    mode, out, pid, n, port = sys.argv[1], pathlib.Path(sys.argv[2]), *map(int, sys.argv[3:6])
    if n > 1:
        parallel.initialize(f"127.0.0.1:{port}", n, pid)
    if mode == "fault":
        fault(out)
    if mode == "step":
        result = one_step(out)
    else:
        from orchestrax.train.loop import train
        history = train(train_config(out))
        result = {"history": history}
    result |= {"processes": jax.process_count(), "devices": jax.device_count()}
    (out / f"result-{jax.process_index()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    out_dir = pathlib.Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    main()
