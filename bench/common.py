"""Shared helpers for benchmarks: timing, peak RSS, appending a dated line to RESULTS.md."""

from __future__ import annotations

import datetime
import pathlib
import resource
import statistics
import time
from typing import Callable

RESULTS = pathlib.Path(__file__).with_name("RESULTS.md")


def median_seconds(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def record(line: str) -> None:
    """Print and append `- YYYY-MM-DD <line>` to bench/RESULTS.md."""
    entry = f"- {datetime.date.today().isoformat()} {line}"
    print(entry)
    with RESULTS.open("a") as f:
        f.write(entry + "\n")
