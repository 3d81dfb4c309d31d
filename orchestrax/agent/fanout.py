"""The one bounded fan-out: a coroutine function over many items, a fixed number in flight.

Train rollouts, Flow-GRPO rollouts, warm-start demonstrations, `run_episodes` and `orchestrax eval`
all fan out through `fan_out`; the process pool (`agent.pool`) spreads the same jobs over
processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Sized
from typing import Awaitable, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")

YOUNG_GC_THRESHOLD = 50_000  # allocations between young-generation collections (default 700)


@contextlib.contextmanager
def young_gc_threshold(threshold: int = YOUNG_GC_THRESHOLD) -> Iterator[None]:
    """Collect the young generation less often while episodes run. Thousands of episodes in
    flight allocate coroutine frames, handles and futures that die young, and each collection
    that reaches the old generation walks every live trajectory's token lists: with the default
    threshold (700) the collector took ~40% of the CPU of `bench/rollout_concurrency.py`."""
    old = gc.get_threshold()
    gc.set_threshold(max(threshold, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


async def fan_out(fn: Callable[[T], Awaitable[R]], items: Iterable[T], *,
                  max_in_flight: int) -> list[R]:
    """`fn(item)` for every item, at most `max_in_flight` awaiting at once; results in item
    order. A fixed pool of workers pulls the items lazily from one iterator, so memory stays
    bounded by the calls in flight plus the finished results, however many items there are.
    The first exception cancels the calls still running and propagates as itself."""
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) \
            or max_in_flight < 1:
        raise ValueError(f"fan_out max_in_flight={max_in_flight!r}; must be an int >= 1")
    source = enumerate(items)
    results: dict[int, R] = {}

    async def worker() -> None:
        for index, item in source:  # the shared iterator hands each item out once
            results[index] = await fn(item)

    n = min(max_in_flight, len(items)) if isinstance(items, Sized) else max_in_flight
    with young_gc_threshold():
        workers = [asyncio.ensure_future(worker()) for _ in range(n)]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
    return [results[i] for i in range(len(results))]
