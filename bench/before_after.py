"""The same benchmarks at an earlier commit and at HEAD, on the same box, in one run: each round
runs `bench/forward.py` and `bench/train_step.py` once per tree, in alternating order (ABBA), in
fresh processes from throw-away worktrees, and reads their "orchestrax N tok/s" figure. Prints
per-round numbers, the medians and HEAD/base; appends one dated line to bench/RESULTS.md.

    python bench/before_after.py [--base 0d33131 --rounds 5 --benches forward,train_step]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURE = re.compile(r"orchestrax ([\d,]+) tok/s")
ARGS = {"forward": ["--repeats", "5"], "train_step": ["--rounds", "3", "--no-record"]}


def worktree(rev: str, where: str) -> str:
    path = os.path.join(where, rev)
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", path, rev],
                   check=True, capture_output=True)
    return path


def tok_per_s(tree: str, bench: str) -> float:
    env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, f"bench/{bench}.py", *ARGS[bench]], cwd=tree, env=env,
                         capture_output=True, text=True, check=True).stdout
    found = FIGURE.findall(out)
    if not found:
        raise RuntimeError(f"{bench} at {tree} printed no 'orchestrax N tok/s':\n{out}")
    return float(found[-1].replace(",", ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="0d33131")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--benches", default="forward,train_step")
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    benches = args.benches.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": worktree(args.base, tmp), "head": worktree(head, tmp)}
        try:
            got = {(b, t): [] for b in benches for t in trees}
            for r in range(args.rounds):
                order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
                for b in benches:
                    for t in order:
                        got[b, t].append(tok_per_s(trees[t], b))
                    print(f"round {r + 1} {b}: base {got[b, 'base'][-1]:,.0f}, "
                          f"head {got[b, 'head'][-1]:,.0f} tok/s", flush=True)
        finally:
            for path in trees.values():
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path],
                               capture_output=True)
    parts = []
    for b in benches:
        base, new = statistics.median(got[b, "base"]), statistics.median(got[b, "head"])
        spread = max(got[b, "base"]) / min(got[b, "base"]) - 1
        parts.append(f"{b} base {base:,.0f} / HEAD {new:,.0f} tok/s = {new / base:.3f}x "
                     f"(base's own round-to-round spread {spread:.1%})")
    record(f"before/after ({args.base} vs {head}, CPU fp32, {args.rounds} alternating rounds, "
           f"medians, fresh process per run): " + "; ".join(parts)
           + f" (python bench/before_after.py --base {args.base} --rounds {args.rounds})")


if __name__ == "__main__":
    main()
