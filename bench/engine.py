"""Static batches vs continuous batching under a stream of requests, same run, same model.

Requests of mixed prompt lengths and token budgets arrive over time (Poisson arrivals, fixed
seed); each one is a separate `generate` call, as an episode's turn is. The static batcher
(`EmbeddedSampler`) starts a batch with whatever is queued and runs it to its longest row;
the continuous one (`ContinuousSampler`) lets requests join and leave between engine steps.
Both samplers see the same arrival schedule after a warm-up pass that compiles every bucket.
Reports output tokens per second over the whole stream and p50/p95 request latency (arrival
to result), and checks that both gave the same greedy tokens.

CPU numbers (tiny model, fp32, 2 shared cores) say how the batchers compare on this box, not
what a GPU does: there decode is memory-bound and a padded row costs almost nothing, while
here every padded row costs compute.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import asyncio
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.common import record  # noqa: E402
from orchestrax import models  # noqa: E402
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams  # noqa: E402
from orchestrax.rollout.embedded import ContinuousSampler, EmbeddedSampler  # noqa: E402


def stream(n: int, rate: float, vocab: int, seed: int
           ) -> list[tuple[float, GenerateRequest]]:
    """(arrival time s, greedy request) pairs: prompts 8..256 tokens, budgets 8..128."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    out = []
    for i in range(n):
        prompt = rng.integers(0, vocab, int(rng.choice([8, 24, 60, 130, 256]))).tolist()
        new = int(rng.choice([8, 16, 40, 128]))
        out.append((float(t[i]), GenerateRequest(
            input_ids=tuple(prompt), rid=f"r{i}",
            sampling=SamplingParams(temperature=0.0, max_new_tokens=new))))
    return out


async def play(sampler, schedule) -> tuple[float, list[float], list]:
    """Send each request at its arrival time; (makespan s, latencies s, results)."""
    t0 = time.perf_counter()

    async def one(at: float, r: GenerateRequest):
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        start = time.perf_counter()
        res = (await sampler.generate([r]))[0]
        return time.perf_counter() - start, res

    done = await asyncio.gather(*(one(at, r) for at, r in schedule))
    await sampler.aclose()
    return time.perf_counter() - t0, [d[0] for d in done], [d[1] for d in done]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=6.0, help="arrivals per second")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--decode-steps", type=int, default=8,
                    help="continuous: decode steps per engine step")
    ap.add_argument("--prefill-chunk", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="measured A/B rounds, alternating")
    args = ap.parse_args()
    cfg = models.tiny_config(vocab_size=1024, hidden_size=256, intermediate_size=768,
                             num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32)
    params = models.init_params(cfg, seed=0)
    max_len = 512
    schedule = stream(args.requests, args.rate, cfg.vocab_size, seed=0)
    make = {
        "static": lambda: EmbeddedSampler(cfg, params, max_batch=args.max_batch,
                                          max_len=max_len),
        "continuous": lambda: ContinuousSampler(
            cfg, params, max_batch=args.max_batch, max_len=max_len,
            prefill_chunk=args.prefill_chunk, decode_steps=args.decode_steps, top_logprobs=0),
    }
    for kind in make:   # warm-up: compile the buckets this stream needs (arrivals at once)
        asyncio.run(play(make[kind](), [(0.0, r) for _, r in schedule]))
    runs = {k: [] for k in make}
    for _ in range(args.rounds):
        for kind in make:
            runs[kind].append(asyncio.run(play(make[kind](), schedule)))
    tokens = sum(len(r.output_ids) for r in runs["static"][0][2])
    same = all(a.output_ids == b.output_ids
               for a, b in zip(runs["static"][0][2], runs["continuous"][0][2]))
    summary = {}
    for kind, rs in runs.items():
        span = float(np.median([r[0] for r in rs]))
        lat = np.concatenate([r[1] for r in rs])
        summary[kind] = (tokens / span, np.percentile(lat, 50), np.percentile(lat, 95))
        print(f"{kind:>10}: {tokens / span:8,.0f} tok/s  p50 {summary[kind][1]:.3f} s  "
              f"p95 {summary[kind][2]:.3f} s  (makespans {[round(r[0], 2) for r in rs]})")
    (st, s50, s95), (ct, c50, c95) = summary["static"], summary["continuous"]
    record(f"engine A/B (CPU fp32, tiny L={cfg.num_layers} D={cfg.hidden_size}, greedy): "
           f"{args.requests} requests at {args.rate}/s Poisson, prompts 8-256, budgets 8-128, "
           f"max_batch {args.max_batch}, {args.rounds} alternating rounds: static "
           f"{st:,.0f} tok/s p50 {s50:.2f} s p95 {s95:.2f} s; continuous (decode_steps "
           f"{args.decode_steps}, chunk {args.prefill_chunk}) {ct:,.0f} tok/s p50 {c50:.2f} s "
           f"p95 {c95:.2f} s; continuous/static throughput {ct / st:.2f}x, p50 latency "
           f"{c50 / s50:.2f}x, p95 {c95 / s95:.2f}x; same greedy tokens: {same}. CPU numbers, "
           f"not GPU ones (python bench/engine.py)")
    if not same:
        raise SystemExit("static and continuous gave different greedy tokens")


if __name__ == "__main__":
    main()
