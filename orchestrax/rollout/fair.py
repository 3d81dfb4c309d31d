"""A fair queue for the embedded samplers: requests wait per client and leave by the tokens
each client already got, so one client's giant call cannot hold another's small request back.

Start-time fair queueing by tokens: every client has a virtual time, the tokens (prompt plus
budget) of its requests already taken; `get` takes the head of the client with the smallest
one. A client that was idle resumes at the virtual time of the last request taken, so idling
banks no credit. Hence a small request that arrives while a giant call has 1,000 requests
queued is taken after at most one more of them, however many are queued.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Hashable


class FairQueue:
    """`put_nowait(item, client, cost)`; `get`/`get_nowait`/`empty` as `asyncio.Queue`'s."""

    def __init__(self):
        self._queues: dict[Hashable, collections.deque] = {}   # insertion order breaks ties
        self._vtime: dict[Hashable, float] = {}
        self._clock = 0.0
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: Any, client: Hashable, cost: float) -> None:
        if client not in self._queues:
            self._queues[client] = collections.deque()
            self._vtime[client] = max(self._vtime.get(client, 0.0), self._clock)
        self._queues[client].append((item, cost))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def empty(self) -> bool:
        return not self._queues

    def qsize(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def get_nowait(self) -> Any:
        if not self._queues:
            raise asyncio.QueueEmpty
        client = min(self._queues, key=self._vtime.__getitem__)
        queue = self._queues[client]
        item, cost = queue.popleft()
        self._clock = self._vtime[client]
        self._vtime[client] += cost
        if not queue:
            del self._queues[client]
            # Clients behind the clock would resume at the clock anyway: forget them, so
            # per-call keys do not pile up.
            for c in [c for c, v in self._vtime.items() if v <= self._clock
                      and c not in self._queues]:
                del self._vtime[c]
        return item

    async def get(self) -> Any:
        while not self._queues:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.get_nowait()
