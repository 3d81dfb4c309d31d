"""Tool-layer throughput: sandboxed Python executions per second (20 concurrent, trivial code)
with and without the run's cgroup, against the same runs as a plain `subprocess` (the ratio is
the sandbox's overhead), and
local-search queries per second with the real MiniLM embedder against BM25, plus recall@5 of
both on 50 title-paraphrase queries.

  python bench/tools.py                       # full corpus if its dense index is cached
  python bench/tools.py --passages 2000       # embed a subset when the full index is not built
  python bench/tools.py --sandbox-only        # the sandbox part alone
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import peak_rss_mib, record  # noqa: E402
from orchestrax.tools import sandbox_limits  # noqa: E402
from orchestrax.tools.sandbox import SandboxConfig, run_python  # noqa: E402
from orchestrax.tools.search_eval import derive_queries, recall_at_k  # noqa: E402
from orchestrax.tools.search_index import (SearchIndexConfig, build_index_async,  # noqa: E402
                                           load_corpus)

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "wiki_summaries_en.json"
CODE = "print(sum(range(100)))"


async def plain_python(code: str, python: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        python, "-I", "-", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(code.encode())
    return out.decode()


async def rate(make_call, total: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one():
        async with gate:
            out = await make_call()
            assert out == "4950\n", out

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - t0)


async def bench_sandbox(total: int, concurrency: int) -> str:
    """bwrap with the run's cgroup (where the host allows one) and without (uid pool and memory
    watchdog), against a plain subprocess, interleaved in one run so the shared cores' load hits
    all three alike."""
    boxed = {"cgroup": SandboxConfig(limits="auto"), "uid": SandboxConfig(limits="uid")}
    calls = {name: (lambda c=c: _stdout(run_python(CODE, c))) for name, c in boxed.items()}
    calls["plain"] = lambda: plain_python(CODE, boxed["uid"].python)
    for call in calls.values():  # warm the page cache
        await rate(call, concurrency, concurrency)
    rates = {name: [] for name in calls}
    for _ in range(3):
        for name, call in calls.items():
            rates[name].append(await rate(call, total // 3, concurrency))
    best = {name: max(r) for name, r in rates.items()}
    cgroup = "cgroup" if sandbox_limits.cgroup_host() is not None else "no cgroup on this host"
    return (f"sandbox {total // 3 * 3} runs x {concurrency} concurrent of `{CODE}` (best of 3): "
            f"bwrap+seccomp+uid pool+{cgroup} {best['cgroup']:.1f} exec/s, "
            f"bwrap+seccomp+uid pool+memory watchdog {best['uid']:.1f} exec/s, "
            f"plain subprocess {best['plain']:.1f} exec/s, "
            f"overhead ratio {best['plain'] / best['cgroup']:.2f}x / {best['plain'] / best['uid']:.2f}x")


async def _stdout(coro) -> str:
    return (await coro).stdout


async def bench_search(passages_n: int | None, n_queries: int) -> str:
    passages = load_corpus(CORPUS)
    queries = derive_queries(passages, 50, seed=0)
    titles = None
    if passages_n is not None:
        targets = {t for _, t in queries}
        rest = sorted({p.title for p in passages} - targets)
        titles = tuple(sorted(targets | set(random.Random(1).sample(rest, passages_n - len(targets)))))
    dense_cfg = SearchIndexConfig(corpus_path=str(CORPUS), titles=titles)
    t0 = time.perf_counter()
    dense = await build_index_async(dense_cfg)
    build_s = time.perf_counter() - t0
    bm25 = await build_index_async(SearchIndexConfig(corpus_path=str(CORPUS), backend="bm25",
                                                     titles=titles))
    stream = [q for q, _ in derive_queries(passages, n_queries, seed=1)]
    out = {}
    for name, index in (("dense", dense), ("bm25", bm25)):
        await index.search(stream[0], 5)
        t0 = time.perf_counter()
        for q in stream:
            await index.search(q, 5)
        out[name] = (len(stream) / (time.perf_counter() - t0), await recall_at_k(index, queries, 5))
    (dq, dr), (bq, br) = out["dense"], out["bm25"]
    return (f"local search over {len(dense.passages)} passages ({n_queries} sequential queries, "
            f"k=5): MiniLM+FAISS {dq:.1f} q/s recall@5 {dr:.2f}, BM25 {bq:.1f} q/s recall@5 {br:.2f}, "
            f"q/s ratio BM25/dense {bq / dq:.2f}x (index ready in {build_s:.1f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--passages", type=int, default=None, help="index a subset (incl. the 50 targets)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--sandbox-only", action="store_true", help="skip the search benchmark")
    args = ap.parse_args()
    sandbox = asyncio.run(bench_sandbox(args.runs, args.concurrency))
    search = "" if args.sandbox_only else "; " + asyncio.run(bench_search(args.passages, args.queries))
    flags = (f"{' --passages ' + str(args.passages) if args.passages else ''}"
             f"{' --sandbox-only' if args.sandbox_only else ''}")
    record(f"tools (CPU, 2 shared cores): {sandbox}{search}; peak RSS {peak_rss_mib():,.0f} MiB "
           f"(python bench/tools.py{flags})")


if __name__ == "__main__":
    main()
