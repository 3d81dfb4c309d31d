"""Compiled per-device memory of the GRPO train step, the reference pass and the sampler's
prefill / decode, for Qwen3 presets x sequence lengths x device counts, without allocating:
each function is lowered on abstract arguments and XLA's `memory_analysis()` is read.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/memory.py [--quick]

What is compiled (bf16 compute, fp32 master weights, remat "full", FSDP over all devices):
- train: `rl.make_train_step` with AdamW; a batch of 8 rows per device in 8 micro-batches (one
  row of T tokens per device at a time), logprob_chunk 1024; the state donated.
- ref: `models.token_logprobs` (chunk 1024) on one row of T per device.
- prefill: `models.forward_with_cache(last_only=True)` of 4 rows x T per device into a bf16
  cache of T slots; decode: one token for the same rows and cache (cache donated).
Footprint = arguments + outputs - donated (aliased) + temporaries, per device. On CPU, XLA's
fusion and buffer assignment are not the GPU's or TPU's: read these as estimates (the GPU adds
its own workspace, and XLA reserves 75% of the card unless told otherwise).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from common import record
from orchestrax import models, parallel, rl

GIB = 1 << 30
MODELS = ("qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-14b")
SEQS = (2048, 8192, 24_576)
DEVICES = (1, 4, 8)
ROWS_TRAIN, ROWS_SAMPLER, CHUNK = 8, 4, 1024
QUICK = (("qwen3-0.6b", 2048, 1), ("qwen3-0.6b", 8192, 8), ("qwen3-8b", 8192, 8))


def footprint(jitted, *args) -> float:
    m = jitted.lower(*args).compile().memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes) / GIB


def abstract(shape, dtype, sharding):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def with_shardings(shapes, shardings):
    return jax.tree.map(lambda x, s: abstract(x.shape, x.dtype, s), shapes, shardings)


def measure(name: str, t: int, n_dev: int) -> dict[str, float]:
    cfg = models.preset(name, dtype="bfloat16", remat="full")
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("data", 1), ("fsdp", -1),
                                                        ("tensor", 1))),
                              devices=jax.devices()[:n_dev])
    rows = lambda n: parallel.logical_to_spec(("batch",) + (None,) * (n - 1), mesh=mesh)  # noqa
    p_sh = models.param_shardings(cfg, mesh)
    params = with_shardings(jax.eval_shape(lambda: models.init_params(cfg)), p_sh)
    out = {}

    with parallel.activation_sharding(mesh):
        gcfg = rl.GRPOConfig(num_minibatches=1, num_microbatches=ROWS_TRAIN,
                             logprob_chunk=CHUNK, compute_entropy=False)
        ocfg = rl.OptimizerConfig()
        train = rl.make_train_step(cfg, gcfg, ocfg, mesh=mesh)
        state_shapes = jax.eval_shape(lambda p: rl.init_state(p, ocfg), params)
        state = with_shardings(state_shapes, train.shardings)
        b = ROWS_TRAIN * n_dev
        row_sh, vec_sh = NamedSharding(mesh, rows(2)), NamedSharding(mesh, rows(1))
        batch = {"tokens": abstract((b, t), jnp.int32, row_sh),
                 "attention_mask": abstract((b, t), jnp.int32, row_sh),
                 "loss_mask": abstract((b, t), jnp.float32, row_sh),
                 "old_logprobs": abstract((b, t), jnp.float32, row_sh),
                 "advantages": abstract((b,), jnp.float32, vec_sh)}
        out["train"] = footprint(jax.jit(train.step, donate_argnums=0), state, batch)

        ids = abstract((n_dev, t), jnp.int32, row_sh)
        ref = jax.jit(lambda p, i, m: models.token_logprobs(cfg, p, i, m, chunk_size=CHUNK))
        out["ref"] = footprint(ref, params, ids, ids)

        b = ROWS_SAMPLER * n_dev
        cache_shapes = jax.eval_shape(lambda: models.init_cache(cfg, b, t))
        cache_sh = parallel.tree_shardings(cache_shapes, models.cache_logical_axes(), mesh)
        cache = with_shardings(cache_shapes, cache_sh)
        prompt = abstract((b, t), jnp.int32, row_sh)
        step = jax.jit(lambda p, i, m, c, last: models.forward_with_cache(cfg, p, i, m, c,
                                                                          last_only=last),
                       static_argnums=4, donate_argnums=3)
        out["prefill"] = footprint(step, params, prompt, prompt, cache, True)
        one = abstract((b, 1), jnp.int32, row_sh)
        out["decode"] = footprint(step, params, one, one, cache, False)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help=f"only {QUICK}")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seqs", default=",".join(map(str, SEQS)))
    ap.add_argument("--devices", default=",".join(map(str, DEVICES)))
    args = ap.parse_args()
    grid = QUICK if args.quick else [(m, int(t), int(d)) for m in args.models.split(",")
                                     for t in args.seqs.split(",")
                                     for d in args.devices.split(",")]
    grid = [g for g in grid if g[2] <= jax.device_count()]
    header = f"{'model':<11} {'T':>6} {'dev':>3} | {'train':>7} {'ref':>7} {'prefill':>7} " \
             f"{'decode':>7}  GiB per device"
    print(header)
    lines = []
    for name, t, n_dev in grid:
        t0 = time.perf_counter()
        r = measure(name, t, n_dev)
        line = (f"{name:<11} {t:>6} {n_dev:>3} | {r['train']:>7.1f} {r['ref']:>7.1f} "
                f"{r['prefill']:>7.1f} {r['decode']:>7.1f}")
        print(f"{line}   ({time.perf_counter() - t0:.0f} s to compile)", flush=True)
        lines.append(line)
    record("memory (compiled per-device GiB; train: 1 row x T per device per micro-step, "
           f"ref: 1 row, prefill/decode: {ROWS_SAMPLER} rows + bf16 cache of T; bf16 compute, "
           "fp32 params + AdamW, remat full, FSDP; python bench/memory.py "
           f"{' '.join(sys.argv[1:])}):\n  " + header + "\n  "
           + "\n  ".join(lines))


if __name__ == "__main__":
    main()
