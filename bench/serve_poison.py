"""Soak of `orchestrax serve` with poisoned requests mixed into normal traffic.

    python bench/serve_poison.py [--minutes 10] [--clients 8]
    python bench/serve_poison.py --fair-share   # only the giant-call latency A/B
    python bench/serve_poison.py --fair-share --giant-tokens 1000 --no-reserve-0   # minutes

`--clients` loops each send good seeded requests (on /generate and on chat, in turn) while one
loop sends poison: top_k of 2**31, deep JSON, lone surrogates, reserved chat_template_kwargs,
NaN temperatures, a NUL model_path, and now and then a giant call (256 requests x 64 tokens).
Every good answer must equal the one the same request got alone before the soak (seeds make
outputs batch-independent), every poison must get a 4xx. Reported: good requests sent, lost
(non-200) and changed, poison answered 4xx / otherwise, and the small-request latency while a
giant call runs over the same without one (the fair queue's bound, measured in this run). A
line goes to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from orchestrax import models  # noqa: E402
from orchestrax.agent.scripted import tiny_qwen3_tokenizer  # noqa: E402
from orchestrax.rollout.embedded import ContinuousSampler  # noqa: E402
from orchestrax.rollout.server import ServerState, bound_port, start  # noqa: E402
from orchestrax.rollout.sglang_client import post_json  # noqa: E402

DEEP = '{"input_ids": ' + "[" * 50_000 + "]" * 50_000 + "}"


def good(i: int) -> tuple[str, dict]:
    if i % 2:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": f"q {i % 40}"}],
                                        "max_tokens": 6, "temperature": 0.9, "seed": i % 40}
    return "/generate", {"input_ids": [5, 17, 40 + i % 40, 3], "sampling_params": {
        "temperature": 0.9, "max_new_tokens": 6, "sampling_seed": i % 40}}


def poison(i: int) -> tuple[str, str | dict]:
    kinds = [
        ("/generate", {"input_ids": [5, 6], "sampling_params": {"top_k": 2**31}}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "top_k": 2**31}),
        ("/generate", DEEP),
        ("/generate", '{"text": "a \\ud800 b"}'),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "chat_template_kwargs": {"return_tensors": "np"}}),
        ("/generate", '{"input_ids": [5], "sampling_params": {"temperature": NaN}}'),
        ("/update_weights_from_disk", {"model_path": "/tmp/\u0000x"}),
    ]
    return kinds[i % len(kinds)]


def key(path: str, body: dict) -> str:
    return json.dumps([path, body], sort_keys=True)


def answer(path: str, out: dict):
    return out["output_ids"] if path == "/generate" else out["choices"][0]["message"]


async def small_latency(http, url, n: int = 5) -> float:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        await post_json(http, url + good(2 * i)[0], good(2 * i)[1])
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def main(args) -> dict:
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    sampler = ContinuousSampler(cfg, models.init_params(cfg, seed=0), max_batch=16, max_len=128)
    runner = await start(ServerState(sampler=sampler, model_path="tiny", tokenizer=tok,
                                     weight_roots=("/tmp",)), port=0)
    url = f"http://127.0.0.1:{bound_port(runner)}"
    stats = {"good": 0, "lost": 0, "changed": 0, "poison": 0, "poison_4xx": 0, "giants": 0}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            reference = {}
            for i in range(80):
                path, body = good(i)
                status, out = await post_json(http, url + path, body)
                assert status == 200, out
                reference[key(path, body)] = answer(path, out)
            idle = await small_latency(http, url)
            giant = {"input_ids": [[5, 6, 7, i % 50] for i in range(256)],
                     "sampling_params": {"max_new_tokens": 64, "temperature": 0.0}}
            big = asyncio.create_task(post_json(http, url + "/generate", giant))
            while sampler.outstanding < 200:
                await asyncio.sleep(0.01)
            loaded = await small_latency(http, url)
            await big
            stats["small_latency_ratio"] = loaded / idle

            deadline = time.monotonic() + 60 * args.minutes

            async def client(c: int):
                i = c
                while time.monotonic() < deadline:
                    path, body = good(i)
                    status, out = await post_json(http, url + path, body)
                    stats["good"] += 1
                    if status != 200:
                        stats["lost"] += 1
                    elif answer(path, out) != reference[key(path, body)]:
                        stats["changed"] += 1
                    i += args.clients

            async def poisoner():
                i = 0
                while time.monotonic() < deadline:
                    path, body = poison(i)
                    status, _ = await post_json(http, url + path, body)
                    stats["poison"] += 1
                    stats["poison_4xx"] += 400 <= status < 500
                    if i % 50 == 49:
                        stats["giants"] += 1
                        await post_json(http, url + "/generate", giant)
                    i += 1

            t0 = time.monotonic()
            await asyncio.gather(*(client(c) for c in range(args.clients)), poisoner())
            stats["minutes"] = (time.monotonic() - t0) / 60
    finally:
        await runner.cleanup()
    return stats


async def fair_share(reserve_slots: int, giant_requests: int = 1024,
                     giant_tokens: int = 4000, n_small: int = 5,
                     timeout_s: float | None = None, dispatch_reads: int | None = 2048) -> dict:
    """A small request's median latency while one client's call of `giant_requests` x
    `giant_tokens` runs (its rows half way through), over the same idle, on a server whose
    continuous sampler keeps `reserve_slots` slots from any one client (0: a giant call may
    take every slot) and bounds a decode dispatch by `dispatch_reads` (None: 8 steps a
    dispatch at every span). Past `timeout_s` the loaded latency is reported as that (a lower
    bound, `timed_out`). Also the giant's own tokens/s while it runs alone (3/8 to 1/2 of its
    way)."""
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    sampler = ContinuousSampler(cfg, models.init_params(cfg, seed=0), max_batch=16,
                                max_len=giant_tokens + 96, reserve_slots=reserve_slots,
                                dispatch_reads=dispatch_reads)
    runner = await start(ServerState(sampler=sampler, model_path="tiny", tokenizer=tok), port=0)
    url = f"http://127.0.0.1:{bound_port(runner)}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:
            await small_latency(http, url, 2)   # compiles
            idle = await small_latency(http, url)
            giant = {"input_ids": [[5, 6, 7, i % 50] for i in range(giant_requests)],
                     "sampling_params": {"max_new_tokens": giant_tokens, "temperature": 0.0,
                                         "stop_token_ids": []}}
            big = asyncio.create_task(post_json(http, url + "/generate", giant))
            while len(sampler._live) < 16 - reserve_slots:   # the giant holds its slots
                if big.done():
                    raise RuntimeError(f"the giant call ended early: {big.result()}")
                await asyncio.sleep(0.01)
            held = len(sampler._live)

            async def giant_at(tokens: int) -> tuple[int, float]:
                """Wait until every giant row has `tokens` tokens; (engine tokens, time)."""
                while min((len(j.ids) for j in sampler.engine._slots if j is not None),
                          default=0) < tokens:
                    if big.done():
                        raise RuntimeError(f"the giant call ended early: {big.result()}")
                    await asyncio.sleep(0.01)
                return sampler.engine.stats["tokens"], time.perf_counter()
            # The giant's own rate from 3/8 to 1/2 of the way: one cache span bucket, compiled
            # before the window (a power of two below 3/8 of the way).
            tokens0, t0 = await giant_at(giant_tokens * 3 // 8)
            # Measured once the giant's rows are half way: every step that runs them reads
            # their long cache span.
            tokens1, t1 = await giant_at(giant_tokens // 2)
            giant_tps = (tokens1 - tokens0) / (t1 - t0)
            try:
                loaded = await asyncio.wait_for(small_latency(http, url, n_small), timeout_s)
                timed_out = False
            except asyncio.TimeoutError:
                loaded, timed_out = timeout_s, True
            big.cancel()   # closes its connection: its rows leave the engine
            try:
                await big
            except asyncio.CancelledError:
                pass
    finally:
        await runner.cleanup()
    return {"idle_s": idle, "loaded_s": loaded, "ratio": loaded / idle, "giant_slots": held,
            "timed_out": timed_out, "held_steps": sampler.stats.get("held_steps", 0),
            "giant_tokens_per_s": giant_tps,
            "steps": sampler.stats["steps"], "reruns": sampler.stats["reruns"]}


def run_fair_share(record: bool, giant_requests: int, giant_tokens: int,
                   reserve_0: bool) -> None:
    import os
    load = os.getloadavg()[0]
    # The peer in the same run: the same server with 8 decode steps a dispatch at every span.
    eight = asyncio.run(fair_share(1, giant_requests, giant_tokens, dispatch_reads=None))
    after = asyncio.run(fair_share(1, giant_requests, giant_tokens))
    line = (f"- {datetime.date.today()} serve fair share (continuous engine, tiny model, 16 "
            f"slots, max_len {giant_tokens + 96}; one call of {giant_requests} requests x "
            f"{giant_tokens} tokens in flight): a small request's latency (6 tokens) loaded / "
            f"idle = {after['ratio']:.1f}x with one slot kept for clients that hold none "
            f"(reserve_slots=1), steps shared by span and a decode dispatch bounded to 2048 "
            f"cache positions a row (serve's dispatch_reads; medians of 5, the same server: "
            f"{after['loaded_s']:.3f} s / {after['idle_s']:.3f} s; the giant held "
            f"{after['giant_slots']} slots; {after['held_steps']} of {after['steps']} steps "
            f"held the giant's rows, {after['reruns']} reruns) vs {eight['ratio']:.1f}x with 8 "
            f"decode steps a dispatch at every span ({eight['loaded_s']:.3f} s / "
            f"{eight['idle_s']:.3f} s); the giant alone {after['giant_tokens_per_s']:.0f} vs "
            f"{eight['giant_tokens_per_s']:.0f} tokens/s "
            f"({after['giant_tokens_per_s'] / eight['giant_tokens_per_s']:.2f}x)")
    if reserve_0:
        # With every slot free to the giant, a small request waits for a giant row to finish:
        # one such request is measured there, for at most 5 minutes.
        before = asyncio.run(fair_share(0, giant_requests, giant_tokens, n_small=1,
                                        timeout_s=300.0))
        over = ">" if before["timed_out"] else ""
        line += (f", {over}{before['ratio']:.1f}x with a giant call free to take every slot "
                 f"(1 request: {over}{before['loaded_s']:.2f} s / {before['idle_s']:.3f} s)")
    line += (f"; load average {load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
             f"cores (python bench/serve_poison.py --fair-share --giant-requests "
             f"{giant_requests} --giant-tokens {giant_tokens}"
             f"{'' if reserve_0 else ' --no-reserve-0'})")
    print(line)
    if record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(line + "\n")


def run() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--fair-share", action="store_true",
                   help="only the giant-call latency A/B (reserve_slots 0 vs 1)")
    p.add_argument("--giant-requests", type=int, default=1024)
    p.add_argument("--giant-tokens", type=int, default=4000)
    p.add_argument("--no-reserve-0", action="store_true",
                   help="skip the reserve_slots=0 run (up to 5 minutes)")
    args = p.parse_args()
    if args.fair_share:
        return run_fair_share(not args.no_record, args.giant_requests, args.giant_tokens,
                              not args.no_reserve_0)
    s = asyncio.run(main(args))
    ok = s["lost"] == 0 and s["changed"] == 0 and s["poison_4xx"] == s["poison"]
    import os
    line = (f"- {datetime.date.today()} serve poison soak ({s['minutes']:.1f} min, continuous "
            f"engine, tiny model, {args.clients} good clients + 1 poisoner): {s['good']} good "
            f"requests, lost {s['lost']}, changed {s['changed']}; {s['poison']} poisoned, "
            f"{s['poison_4xx']} answered 4xx; {s['giants']} giant calls (256 x 64 tokens) "
            f"mixed in; a small request's median latency during a giant call / idle = "
            f"{s['small_latency_ratio']:.2f}x; load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores; {'OK' if ok else 'FAILED'} (python bench/serve_poison.py "
            f"--minutes {args.minutes:g})")
    print(line)
    if not args.no_record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    run()
