"""Multi-turn rollouts with and without the engine's prefix cache, and with the cache but a
row a prefill dispatch (`prefill_rows=1`, no batched prefill), same run, same model.

One group of G samples of a shared prompt, each played for a number of turns as an episode
is: the next turn's prompt is the previous one + the reply + a tool output of fixed length.
The G episodes run concurrently against one `ContinuousSampler` (each turn one `generate`
call); the prefix cache lets the G samples share the prompt's prefill and each turn prefill
only its new tokens, and batched prefill lets the G episodes' turns share prefill dispatches.
Reports output tokens per second over the whole group, prompt tokens prefilled (the engine's
counter) and reused, and prefill dispatches, for each sampler, alternating rounds after a
warm-up that compiles every bucket; checks that all gave the same tokens (greedy).

CPU numbers (tiny model, fp32, shared cores): the prefill counter is exact on any machine;
tokens/s says what the saved prefill is worth here, where prefill is compute a GPU would do
much faster; so is the dispatch count (on a GPU each short-chunk dispatch costs a read of
the weights; bench/gpu_compile.py estimates those bytes).
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


async def group(sampler, *, g: int, turns: int, prompt: int, reply: int, tool: int,
                vocab: int) -> tuple[float, list[list[tuple[int, ...]]]]:
    """(seconds, replies [sample][turn]) of G concurrent episodes."""
    rng = np.random.default_rng(0)
    opening = tuple(rng.integers(0, vocab, prompt).tolist())
    tools = [[tuple(rng.integers(0, vocab, tool).tolist()) for _ in range(turns)]
             for _ in range(g)]

    async def episode(i: int) -> list[tuple[int, ...]]:
        ids, replies = opening, []
        for turn in range(turns):
            r = (await sampler.generate([GenerateRequest(
                input_ids=ids, sampling=SamplingParams(temperature=0.0,
                                                       max_new_tokens=reply))]))[0]
            replies.append(r.output_ids)
            ids = ids + r.output_ids + tools[i][turn]
        return replies

    t0 = time.perf_counter()
    out = await asyncio.gather(*(episode(i) for i in range(g)))
    seconds = time.perf_counter() - t0
    await sampler.aclose()
    return seconds, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--reply", type=int, default=32)
    ap.add_argument("--tool", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    cfg = models.tiny_config(vocab_size=1024, hidden_size=256, intermediate_size=768,
                             num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32)
    params = models.init_params(cfg, seed=0)
    max_len = 1 << (args.prompt + args.turns * (args.reply + args.tool) + 64).bit_length()
    kw = dict(max_batch=args.samples, max_len=max_len)
    make = {
        "cache": lambda: ContinuousSampler(cfg, params, prefill_chunk=128, top_logprobs=0,
                                           prefix_cache=True, **kw),
        "no-cache": lambda: ContinuousSampler(cfg, params, prefill_chunk=128, top_logprobs=0,
                                              prefix_cache=False, **kw),
        "row-a-dispatch": lambda: ContinuousSampler(cfg, params, prefill_chunk=128,
                                                    top_logprobs=0, prefix_cache=True,
                                                    prefill_rows=1, **kw),
    }
    shape = dict(g=args.samples, turns=args.turns, prompt=args.prompt, reply=args.reply,
                 tool=args.tool, vocab=cfg.vocab_size)
    for kind in make:   # warm-up: every bucket compiled
        asyncio.run(group(make[kind](), **shape))
    runs = {k: [] for k in make}
    counters = {}
    for _ in range(args.rounds):
        for kind in make:
            sampler = make[kind]()
            runs[kind].append(asyncio.run(group(sampler, **shape)))
            counters[kind] = sampler.take_counters() | {
                "prefill_dispatches": sampler.engine.stats["prefill_dispatches"]}
    tokens = sum(len(t) for sample in runs["cache"][0][1] for t in sample)
    same = all(r[0][1] == runs["cache"][0][1] for r in runs.values())
    rate = {k: tokens / float(np.median([s for s, _ in rs])) for k, rs in runs.items()}
    for kind in make:
        print(f"{kind:>9}: {rate[kind]:8,.0f} tok/s  {counters[kind]}")
    on, off, rows1 = counters["cache"], counters["no-cache"], counters["row-a-dispatch"]
    record(f"engine multi-turn (CPU fp32, tiny L={cfg.num_layers} D={cfg.hidden_size}, greedy): "
           f"{args.samples} samples x {args.turns} turns of one {args.prompt}-token prompt, "
           f"{args.reply}-token replies, {args.tool}-token tool outputs, continuous engine, "
           f"{args.rounds} alternating rounds: prefix cache {rate['cache']:,.0f} tok/s, "
           f"{on['prefill_tokens']:,} prompt tokens prefilled ({on['cached_tokens']:,} reused); "
           f"without {rate['no-cache']:,.0f} tok/s, {off['prefill_tokens']:,} prefilled; "
           f"prefill tokens {off['prefill_tokens'] / on['prefill_tokens']:.1f}x fewer, "
           f"tok/s {rate['cache'] / rate['no-cache']:.2f}x; prefill dispatches "
           f"{on['prefill_dispatches']:,} (batched prefill) against "
           f"{rows1['prefill_dispatches']:,} a row a dispatch, tok/s "
           f"{rate['cache'] / rate['row-a-dispatch']:.2f}x; same greedy tokens: "
           f"{same} (python bench/engine_multiturn.py)")
    if not same:
        raise SystemExit("the samplers gave different greedy tokens")


if __name__ == "__main__":
    main()
