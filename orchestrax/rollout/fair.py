"""A fair queue for the embedded samplers: requests wait per client and leave by the tokens
each client already got, so one client's giant call cannot hold another's small request back.

Start-time fair queueing by tokens: every client has a virtual time, the tokens (prompt plus
budget) of its requests already taken; `get` takes the head of the client with the smallest
one. A client that was idle resumes at the virtual time of the last request taken, so idling
banks no credit. Hence a small request that arrives while a giant call has 1,000 requests
queued is taken after at most one more of them, however many are queued.

A client is a path, e.g. (peer address, the name it gives, its HTTP call): the same rule
applies at every level, first across peers, then across the names within one peer, then across
the calls of one name. A peer that names every request differently splits only its own share.

`take(allowed)` skips every client whose (whole) path `allowed` refuses, e.g. one that may not
take another slot of a running batch now: the next client in turn goes first.

`StepShare` shares the engine's steps among the clients whose requests already hold slots,
by the device work each got, so one client's long rows cannot make every step of another's
short rows as slow as theirs.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Callable, Hashable


class FairQueue:
    """`put_nowait(item, client, cost)`; `get`/`get_nowait`/`empty` as `asyncio.Queue`'s.
    `client` is a key or a tuple of keys (a path, outermost first); every path under one key
    has the same length."""

    def __init__(self):
        # key -> a deque of (item, cost) (the path ends there) or the FairQueue below it;
        # insertion order breaks ties
        self._children: dict[Hashable, collections.deque | FairQueue] = {}
        self._vtime: dict[Hashable, float] = {}
        self._clock = 0.0
        self._size = 0
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: Any, client: Hashable | tuple, cost: float) -> None:
        self._put(item, client if isinstance(client, tuple) else (client,), cost)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def empty(self) -> bool:
        return self._size == 0

    def qsize(self) -> int:
        return self._size

    def get_nowait(self) -> Any:
        if not self._size:
            raise asyncio.QueueEmpty
        return self._take()[0]

    def take(self, allowed: Callable[[tuple], bool]) -> Any | None:
        """The next item of a client whose path `allowed` accepts, in fair order; None when no
        queued client qualifies."""
        got = self._take(allowed) if self._size else None
        return None if got is None else got[0]

    async def get(self) -> Any:
        while not self._size:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.get_nowait()

    def _put(self, item: Any, path: tuple, cost: float) -> None:
        key, rest = path[0], path[1:]
        if key not in self._children:
            self._children[key] = FairQueue() if rest else collections.deque()
            self._vtime[key] = max(self._vtime.get(key, 0.0), self._clock)
        child = self._children[key]
        if rest:
            child._put(item, rest, cost)
        else:
            child.append((item, cost))
        self._size += 1

    def _take(self, allowed: Callable[[tuple], bool] | None = None,
              prefix: tuple = ()) -> tuple[Any, float] | None:
        for key in sorted(self._children, key=self._vtime.__getitem__):   # stable: FIFO ties
            child = self._children[key]
            if isinstance(child, collections.deque):
                if allowed is not None and not allowed((*prefix, key)):
                    continue
                got = child.popleft()
            else:
                got = child._take(allowed, (*prefix, key))
            if got is not None:
                break
        else:
            return None
        item, cost = got
        self._clock = self._vtime[key]
        self._vtime[key] += cost
        self._size -= 1
        if not len(child):
            del self._children[key]
            # Keys behind the clock would resume at the clock anyway: forget them, so
            # per-call keys do not pile up.
            for c in [c for c, v in self._vtime.items() if v <= self._clock
                      and c not in self._children]:
                del self._vtime[c]
        return item, cost

    def __len__(self) -> int:
        return self._size


class StepShare:
    """Which clients' rows run in the next engine step, fair by the work each got.

    A step's decode reads the first `span` cache positions of every slot, so its cost grows
    with the longest row that runs. Every client holding rows has a virtual time: the span x
    steps of every step its rows ran, at its own span. A step runs the client with the
    smallest virtual time (ties: the smaller span) and every client whose rows fit in that
    span (they cost the step nothing more); the others' rows wait. A client that starts holding
    rows starts at the smallest virtual time of those already holding some (idling banks no
    credit). So a client whose rows need span s beside one whose rows need S > s gets steps
    of cost s, about S/s of them per step of the other's, instead of sharing every step at S.
    """

    def __init__(self):
        self._vtime: dict[Hashable, float] = {}

    def choose(self, spans: dict[Hashable, int], steps_at: Callable[[int], int]) -> set:
        """`spans`: client -> the span its rows need (a client per key, every client holding
        rows); the clients to run, each charged its span x the decode steps the step runs at
        its span (`steps_at(span)`, the largest that runs)."""
        for c in [c for c in self._vtime if c not in spans]:
            del self._vtime[c]
        floor = min(self._vtime.values(), default=0.0)
        for c in spans:
            self._vtime.setdefault(c, floor)
        first = min(spans, key=lambda c: (self._vtime[c], spans[c]))
        run = {c for c in spans if spans[c] <= spans[first]}
        steps = steps_at(spans[first])
        for c in run:
            self._vtime[c] += spans[c] * steps
        return run
