"""Continuous batching under a stream of requests: `--max-batch` slots vs one slot (each
request served alone, in arrival order), same run, same model.

Requests of mixed prompt lengths and token budgets arrive over time (Poisson arrivals, fixed
seed); each one is a separate `generate` call, as an episode's turn is. In the engine
(`ContinuousSampler`) requests join and leave the running batch between engine steps. Both
samplers see the same arrival schedule after a warm-up pass that compiles every bucket.
Reports output tokens per second over the whole stream and p50/p95 request latency (arrival
to result), and checks that both gave the same greedy tokens (a request's tokens do not depend
on what it shares its steps with).

CPU numbers (tiny model, fp32, 2 shared cores) say what batching is worth on this box, not
what a GPU does: there decode is memory-bound and a row more costs almost nothing, while here
every row costs compute.
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
from orchestrax.rollout.embedded import ContinuousSampler  # noqa: E402


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
    ap.add_argument("--decode-steps", type=int, default=8, help="decode steps per engine step")
    ap.add_argument("--prefill-chunk", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="measured rounds, alternating")
    args = ap.parse_args()
    cfg = models.tiny_config(vocab_size=1024, hidden_size=256, intermediate_size=768,
                             num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32)
    params = models.init_params(cfg, seed=0)
    max_len = 512
    schedule = stream(args.requests, args.rate, cfg.vocab_size, seed=0)

    def engine(slots: int) -> ContinuousSampler:
        return ContinuousSampler(cfg, params, max_batch=slots, max_len=max_len,
                                 prefill_chunk=args.prefill_chunk,
                                 decode_steps=args.decode_steps, top_logprobs=0)
    make = {"slots": lambda: engine(args.max_batch), "one": lambda: engine(1)}
    for kind in make:   # warm-up: compile the buckets this stream needs (arrivals at once)
        asyncio.run(play(make[kind](), [(0.0, r) for _, r in schedule]))
    runs = {k: [] for k in make}
    for _ in range(args.rounds):
        for kind in make:
            runs[kind].append(asyncio.run(play(make[kind](), schedule)))
    tokens = sum(len(r.output_ids) for r in runs["one"][0][2])
    same = all(a.output_ids == b.output_ids
               for a, b in zip(runs["one"][0][2], runs["slots"][0][2]))
    summary = {}
    for kind, rs in runs.items():
        span = float(np.median([r[0] for r in rs]))
        lat = np.concatenate([r[1] for r in rs])
        summary[kind] = (tokens / span, np.percentile(lat, 50), np.percentile(lat, 95))
        print(f"{kind:>10}: {tokens / span:8,.0f} tok/s  p50 {summary[kind][1]:.3f} s  "
              f"p95 {summary[kind][2]:.3f} s  (makespans {[round(r[0], 2) for r in rs]})")
    (ot, o50, o95), (nt, n50, n95) = summary["one"], summary["slots"]
    record(f"engine slots (CPU fp32, tiny L={cfg.num_layers} D={cfg.hidden_size}, greedy, "
           f"decode_steps {args.decode_steps}, chunk {args.prefill_chunk}): {args.requests} "
           f"requests at {args.rate}/s Poisson, prompts 8-256, budgets 8-128, {args.rounds} "
           f"alternating rounds: 1 slot {ot:,.0f} tok/s p50 {o50:.2f} s p95 {o95:.2f} s; "
           f"{args.max_batch} slots {nt:,.0f} tok/s p50 {n50:.2f} s p95 {n95:.2f} s; "
           f"{args.max_batch} slots / 1 throughput {nt / ot:.2f}x, p50 latency "
           f"{n50 / o50:.2f}x, p95 {n95 / o95:.2f}x; same greedy tokens: {same}. CPU numbers, "
           f"not GPU ones (python bench/engine.py)")
    if not same:
        raise SystemExit("1 slot and many gave different greedy tokens")


if __name__ == "__main__":
    main()
