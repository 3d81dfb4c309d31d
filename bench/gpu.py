"""One-GPU benchmark: Qwen3-8B GRPO step MFU, continuous-batching sampler tok/s, EpisodePool
start time, compiled vs measured peak memory. Random weights, no hub.

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python bench/gpu.py            # one GPU, <= 8 min
    python bench/gpu.py --smoke                                          # CPU, tiny presets

The compilation cache (--cache-dir) is on: compile time is reported apart from step time, and a
rerun finds its compiles there.

Each section runs in its own child process under its own timeout (a hung compile or an
out-of-memory cannot take the rest down, and each section's peak memory is its own); a section
that fails or times out is reported as such in the table. Prints a table and appends one dated
line to bench/RESULTS.md (or --results).

- train: `rl.make_train_step`, bf16 compute, fp32 params, remat full (gradients accumulated
  in place), B x T = 16k tokens at T = 4k in 4 micro-batches: Qwen3-8B with bf16 Adam moments
  (as configs' config_one_h200), Qwen3-4B with fp32 Adam; MFU = rl.mfu (matmul + causal
  attention FLOPs) over the datasheet bf16 peak of the detected chip.
- sampler: `rollout.engine.ContinuousEngine`, qwen3-8b bf16, 64 and 256 concurrent requests of
  256 prompt + 256 new tokens at T = 1; output tok/s and the fraction of the bandwidth floor
  (every decode step reads the weights and each row's filled KV once, at datasheet HBM speed).
- pool: `agent.pool.EpisodePool` of 16 workers (bench/rollout_concurrency.py's player), time to
  ready, then 16 one-turn episodes played to check it works.
- memory: for train and sampler, XLA's compiled footprint (`memory_analysis`: arguments +
  outputs + temporaries - aliased) next to `device.memory_stats()["peak_bytes_in_use"]`.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
GIB = 2**30
HBM_BYTES_PER_S = {"h200": 4.8e12, "h100": 3.35e12, "a100": 2.0e12}   # datasheet (SXM)


# --- sections (each runs in a child process) ---------------------------------------------------
def _chip() -> str | None:
    import jax
    kind = jax.devices()[0].device_kind.lower()
    return next((c for c in ("h200", "h100", "a100") if c in kind), None)


def _compiled_bytes(compiled) -> float | None:
    m = compiled.memory_analysis()
    if m is None:
        return None
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


def _peak_bytes() -> float | None:
    import jax
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def train_setup(smoke: bool, seq: int, model: str = "qwen3-8b"):
    """(model config, GRPOConfig, OptimizerConfig, rows) of a train section; also what
    bench/gpu_compile.py compiles for the H200 to size it."""
    from orchestrax import models, rl

    if smoke:
        cfg = models.tiny_config(dtype="bfloat16", remat="full")
        tokens = 4 * seq
    else:
        cfg = models.preset(model, dtype="bfloat16", remat="full")
        tokens = 16384
    b = tokens // seq
    micro = max(1, b // max(1, 4096 // seq))                 # <= 4k tokens per micro-step
    gcfg = rl.GRPOConfig(compute_entropy=False, logprob_chunk=min(seq, 1024),
                         num_microbatches=micro)
    # Qwen3-8B as config_one_h200 trains it (bf16 moments; fp32 Adam with its 30.5 GiB moments
    # compiles past the card's 133 GiB, bench/gpu_compile.py); Qwen3-4B with fp32 Adam.
    lean = "bfloat16" if model == "qwen3-8b" else None     # the smoke runs the same path
    return cfg, gcfg, rl.OptimizerConfig(lr=1e-6, mu_dtype=lean, nu_dtype=lean), b


def train_batch(cfg, b: int, seq: int) -> dict:
    """A random GRPO batch of b full rows of seq tokens (numpy, right-padded as the trainer's
    rows: no padding), old logprobs given."""
    import numpy as np
    rng = np.random.default_rng(0)
    return {"tokens": rng.integers(0, cfg.vocab_size, (b, seq)).astype(np.int32),
            "attention_mask": np.ones((b, seq), np.int32),
            "loss_mask": np.ones((b, seq), np.float32),
            "advantages": rng.normal(size=b).astype(np.float32),
            "old_logprobs": np.full((b, seq), -np.log(cfg.vocab_size), np.float32)}


def sampler_setup(smoke: bool, concurrency: int):
    """(model config, prompt tokens, new tokens, prefill chunk) of a sampler section; the
    engine has `concurrency` slots of prompt + new positions and decodes 8 steps a dispatch."""
    from orchestrax import models
    if smoke:
        cfg, prompt, new = models.tiny_config(), 8, 8
    else:
        cfg, prompt, new = models.preset("qwen3-8b", dtype="bfloat16",
                                         param_dtype="bfloat16"), 256, 256
    return cfg, prompt, new, max(prompt, 16)     # the whole prompt in one prefill chunk


SAMPLER_DECODE_STEPS = 8


def section_train(smoke: bool, seq: int, model: str = "qwen3-8b") -> dict:
    import jax
    import jax.numpy as jnp
    from orchestrax import models, rl

    cfg, gcfg, ocfg, b = train_setup(smoke, seq, model)
    tokens, micro = b * seq, gcfg.num_microbatches
    train = rl.make_train_step(cfg, gcfg, ocfg, right_padded=True)   # as the trainer's step
    state = train.init(jax.jit(models.init_params, static_argnums=0)(cfg))
    host = train_batch(cfg, b, seq)
    # Checked here: the step runs under an outer jit, whose traced batch has no values.
    rl.check_right_padded(host["attention_mask"], "bench/gpu.py's train batch")
    batch = {k: jnp.asarray(v) for k, v in host.items()}
    # One outer jit around the step so its compiled memory can be read and then run as is.
    t0 = time.perf_counter()
    step = jax.jit(lambda s, x: train.step(s, x), donate_argnums=0).lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    state, _ = step(state, batch)
    jax.block_until_ready(state)
    times = []
    for _ in range(2 if smoke else 3):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    t = sorted(times)[len(times) // 2]
    chip = _chip()
    return {"what": f"train_step T={seq}", "model": f"tiny (as {model})" if smoke else model,
            "B": b, "T": seq, "micro": micro, "s_per_step": t, "tok_s": tokens / t,
            "mfu": rl.mfu(cfg, tokens, seq, t, rl.peak_flops(chip)) if chip else None,
            "compile_s": compile_s, "loss": float(metrics["loss_first"]),
            "compiled_bytes": _compiled_bytes(step), "peak_bytes": _peak_bytes()}


def section_sampler(smoke: bool, concurrency: int) -> dict:
    import jax
    import numpy as np
    from orchestrax import models
    from orchestrax.rollout import engine as eng_mod
    from orchestrax.rollout.sampler import GenerateRequest, SamplingParams

    cfg, prompt, new, chunk = sampler_setup(smoke, concurrency)
    # Laid out as the embedded sampler keeps its copy (embedded.sampler_copy): layers unstacked,
    # on the host as its multi-process path does it, so the device never holds both layouts.
    # Unstacked in the init's own jit, XLA:GPU fuses the random init into the slices: one
    # kernel of ~50k PTX lines a weight, which ptxas had not compiled after 12 min here.
    params = jax.device_put(models.unstack_layers(jax.device_get(
        jax.jit(models.init_params, static_argnums=0)(cfg))))
    engine = eng_mod.ContinuousEngine(cfg, params, max_batch=concurrency, max_len=chunk + new,
                                      prefill_chunk=chunk, decode_steps=SAMPLER_DECODE_STEPS)
    rng = np.random.default_rng(0)

    def requests(n, n_new):
        return [GenerateRequest(input_ids=tuple(rng.integers(0, cfg.vocab_size, prompt).tolist()),
                                sampling=SamplingParams(temperature=1.0, max_new_tokens=n_new,
                                                        sampling_seed=i))
                for i in range(n)]

    t0 = time.perf_counter()
    # Compiles: two requests dispatch the programs of all (the engine's slot count, the
    # prompt's chunk and span, the decode's steps and span; the prefill of several rows where
    # the chunk is short enough to batch), without all their prefills.
    engine.generate(requests(min(2, concurrency), 2))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = engine.generate(requests(concurrency, new))
    wall = time.perf_counter() - t0
    out_tokens = sum(len(r.output_ids) for r in results)
    # Bandwidth floor: each decode step reads the weights once and every row's filled KV once.
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2     # k+v, bf16
    steps_bytes = sum(weight_bytes + concurrency * (prompt + j) * kv_per_token
                      for j in range(new))
    chip = _chip()
    floor_s = steps_bytes / HBM_BYTES_PER_S[chip] if chip else None
    compiled = eng_mod._decode.lower(cfg, params, engine._state,
                                     np.ones((concurrency,), bool),
                                     np.ones((concurrency,), bool),
                                     n_steps=SAMPLER_DECODE_STEPS, n_top=0,
                                     span=engine.max_len, filtering=False).compile()
    return {"what": f"sampler@{concurrency}", "model": "tiny" if smoke else "qwen3-8b",
            "requests": concurrency, "prompt": prompt, "new": new, "wall_s": wall,
            "tok_s": out_tokens / wall, "floor_s": floor_s,
            "floor_frac": floor_s / wall if floor_s else None, "compile_s": compile_s,
            "compiled_bytes": _compiled_bytes(compiled), "peak_bytes": _peak_bytes()}


def section_pool(smoke: bool, workers: int) -> dict:
    import asyncio
    sys.path.insert(0, str(HERE))
    from rollout_concurrency import PlanPlayer, check, make_plan, tasks_for
    from orchestrax.agent.pool import EpisodePool

    plan = make_plan(workers, 1, seed=0)
    t0 = time.perf_counter()
    with EpisodePool(functools.partial(PlanPlayer, plan), workers=workers) as pool:
        start_s = time.perf_counter() - t0
        trajs = asyncio.run(pool.play(tasks_for(plan)))
    check(trajs, plan)
    return {"what": f"pool start ({workers} workers)", "start_s": start_s,
            "episodes": len(trajs)}


TRAIN_MODELS = {"train": "qwen3-8b", "train4b": "qwen3-4b"}
SECTIONS = {**{name: functools.partial(section_train, model=m) for name, m in TRAIN_MODELS.items()},
            "sampler": section_sampler, "pool": section_pool}


def plan(smoke: bool) -> list[tuple[str, int, int]]:
    """(section, argument, timeout s); the timeouts add up to 447 s (<= 8 minutes with the
    driver's own start). Each is 1.3x or more a section's cold compiles for the H200, ~15 s of
    process start, CUDA and weight init (the sampler's 16.4 GB host round trip included), and
    its run at a low 15% of MFU or of the bandwidth floor. Compiles as measured on a loaded
    2-core box (2026-12-05, load 8-12; a GPU host compiles faster but autotunes): each
    section's programs compiled cold for the H200 target as bench/gpu_compile.py compiles, one
    process a section, after the engine's layers were unrolled. 8B train 55 s (init 6, step
    48) + 4 steps of 16k tokens at 5.4 s; 4B 28 s (step 21) + 4 x 3.1 s; the engine at 64
    slots 61 s (init 8, prefill chunk 27, 8-step decode 25) + 64 one-row prefills and 256
    decode steps, ~9 s; at 256 slots its init comes from the cache and its prefill and decode
    compiled in 21 and 17 s, counted as 27 and 25 (54 s) + ~18 s. Sums 92, 55, 85 and 87 s.
    Compiled memory (bench/gpu_compile.py's bench rows, 133.4 GiB usable): the 8B step at
    4 x 4k tokens with bf16 moments 97.4 GiB, the 4B one with fp32 Adam 64.9, the engine's
    decode 20.2 at 64 slots of 512 and 34.2 at 256. A rerun finds its compiles in the
    compilation cache."""
    if smoke:
        # Every section the GPU run has (tiny presets), so a typo cannot first show on a GPU.
        return [("train", 32, 240), ("train4b", 32, 240), ("sampler", 4, 240),
                ("sampler", 8, 240), ("pool", 2, 120)]
    return [("train", 4096, 120), ("train4b", 4096, 72), ("sampler", 64, 111),
            ("sampler", 256, 114), ("pool", 16, 30)]


# --- driver ------------------------------------------------------------------------------------
def run_child(name: str, arg: int, timeout: int, smoke: bool, cache_dir: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent) + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    cmd = [sys.executable, __file__, "--section", name, "--arg", str(arg),
           "--cache-dir", cache_dir] + (["--smoke"] if smoke else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"what": f"{name}({arg})", "status": f"TIMEOUT after {timeout} s"}
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    if proc.returncode != 0 or not last or not last[0].startswith("{"):
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {"what": f"{name}({arg})", "status": f"FAILED rc={proc.returncode}: {why}"}
    return {**json.loads(last[0]), "status": "ok"}


def _fmt(x, unit="", scale=1.0, digits=1):
    return "n/a" if x is None else f"{x / scale:,.{digits}f}{unit}"


def _mem(x) -> str:
    if x is None:
        return "n/a"
    return f"{x / GIB:,.2f} GiB" if x >= GIB else f"{x / 2**20:,.1f} MiB"


def describe(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['what']}: {r['status']}"
    mem = (f"memory compiled {_mem(r.get('compiled_bytes'))} / measured peak "
           f"{_mem(r.get('peak_bytes'))}")
    if r["what"].startswith("train_step"):
        return (f"{r['what']} {r['model']} B={r['B']} (micro-batches {r['micro']}): "
                f"{r['s_per_step']:.2f} s/step, {r['tok_s']:,.0f} tok/s, MFU "
                f"{_fmt(r['mfu'] and 100 * r['mfu'], '%')}, compile {r['compile_s']:.0f} s, "
                f"{mem}")
    if r["what"].startswith("sampler"):
        return (f"{r['what']} {r['model']} {r['requests']}x({r['prompt']}+{r['new']}): "
                f"{r['tok_s']:,.0f} out tok/s, {r['wall_s']:.2f} s vs floor "
                f"{_fmt(r['floor_s'], ' s', digits=2)} "
                f"({_fmt(r['floor_frac'] and 100 * r['floor_frac'], '%')} of the floor), "
                f"compile {r['compile_s']:.0f} s, {mem}")
    return f"{r['what']}: ready in {r['start_s']:.2f} s, {r['episodes']} episodes played"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny presets, CPU, seconds")
    ap.add_argument("--results", default=str(HERE / "RESULTS.md"))
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/orchestrax-xla"),
                    help="JAX persistent compilation cache")
    ap.add_argument("--only", default="", help="comma-separated sections to run (train, "
                    "train4b, sampler, pool; default all): a card too small for one (the 8B "
                    "train row needs the H200's memory) skips it")
    ap.add_argument("--timeout-scale", type=float, default=1.0,
                    help="multiply every section's timeout (a lease with time to spare)")
    ap.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)
    ap.add_argument("--arg", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.section:                      # child: one section, its result as the last line
        import jax
        # Compiles persist across sections and runs: a rerun spends its budget on steps.
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        print(json.dumps(SECTIONS[args.section](args.smoke, args.arg)))
        return
    import jax
    device = jax.devices()[0]
    kind = f"{device.platform} {device.device_kind}"
    t0 = time.perf_counter()
    only = {w for w in args.only.split(",") if w}
    if only - set(SECTIONS):
        raise SystemExit(f"--only {args.only!r}: sections are {', '.join(sorted(SECTIONS))}")
    rows = [run_child(name, arg, round(timeout * args.timeout_scale), args.smoke,
                      args.cache_dir)
            for name, arg, timeout in plan(args.smoke) if not only or name in only]
    total = time.perf_counter() - t0
    print(f"bench/gpu.py on {kind}{' (smoke)' if args.smoke else ''}, {total:.0f} s")
    for r in rows:
        print("  " + describe(r))
    what = f"{kind}, smoke: tiny presets" if args.smoke else kind
    line = (f"- {datetime.date.today().isoformat()} gpu ({what}; "
            f"{total:.0f} s): " + "; ".join(describe(r) for r in rows)
            + f" (python bench/gpu.py{' --smoke' if args.smoke else ''})")
    with open(args.results, "a") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    main()
