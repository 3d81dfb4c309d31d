"""Asyncio tool execution: per-tool timeout, retries with exponential backoff, global and per-tool
concurrency limits, per-tool rate limits (token bucket), and cost/latency bookkeeping.

One `ToolExecutor` is shared by every episode in flight so its limits are global. A call never
raises (except cancellation): failures, timeouts and crashes come back as a `ToolCallRecord` with
`ok=False` and an observation the model can read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Mapping, Sequence

from orchestrax.data.records import ToolCallRecord
from orchestrax.tools.tool import Tool, ToolError, ToolResult


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolLimits:
    """Limits for one tool. Times in seconds; rate in calls per second (None: unlimited)."""

    timeout_s: float = 60.0
    max_attempts: int = 3            # 1 + retries; only transient errors and timeouts retry
    backoff_s: float = 0.5           # first retry waits this; doubles each retry
    backoff_max_s: float = 8.0
    max_concurrency: int | None = None
    rate_per_s: float | None = None
    burst: int = 1                   # token-bucket capacity

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"ToolLimits.timeout_s={self.timeout_s}; must be > 0")
        if self.max_attempts < 1:
            raise ValueError(f"ToolLimits.max_attempts={self.max_attempts}; must be >= 1")
        if self.backoff_s < 0 or self.backoff_max_s < self.backoff_s:
            raise ValueError(f"ToolLimits.backoff_s={self.backoff_s}, backoff_max_s="
                             f"{self.backoff_max_s}; need 0 <= backoff_s <= backoff_max_s")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"ToolLimits.max_concurrency={self.max_concurrency}; must be None or >= 1")
        if self.rate_per_s is not None and not self.rate_per_s > 0:
            raise ValueError(f"ToolLimits.rate_per_s={self.rate_per_s}; must be None or > 0")
        if self.burst < 1:
            raise ValueError(f"ToolLimits.burst={self.burst}; must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecutorConfig:
    default: ToolLimits = ToolLimits()
    per_tool: Mapping[str, ToolLimits] = dataclasses.field(default_factory=dict)
    max_concurrency: int | None = 256  # all tools together
    max_observation_chars: int | None = 16_384  # longer observations are cut, with a marker

    def __post_init__(self):
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"ExecutorConfig.max_concurrency={self.max_concurrency}; must be None or >= 1")
        if self.max_observation_chars is not None and self.max_observation_chars < 1:
            raise ValueError(f"ExecutorConfig.max_observation_chars={self.max_observation_chars}; "
                             "must be None or >= 1")
        for name, limits in self.per_tool.items():
            if not isinstance(limits, ToolLimits):
                raise ValueError(f"ExecutorConfig.per_tool[{name!r}] must be ToolLimits, got "
                                 f"{type(limits).__name__}")

    def limits(self, name: str) -> ToolLimits:
        return self.per_tool.get(name, self.default)


class TokenBucket:
    """`rate` tokens per second up to `capacity`; `acquire` waits for one. Waiters are served in
    arrival order (the lock), so a burst of callers is spread out instead of stampeding."""

    def __init__(self, rate: float, capacity: int):
        self._rate, self._capacity = rate, float(capacity)
        self._tokens, self._stamp = float(capacity), time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self._capacity, self._tokens + (now - self._stamp) * self._rate)
                self._stamp = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self._rate)


class _Slot:
    """Semaphores and bucket of one tool name (created lazily, shared across episodes)."""

    def __init__(self, limits: ToolLimits):
        self.limits = limits
        self.sem = asyncio.Semaphore(limits.max_concurrency) if limits.max_concurrency else None
        self.bucket = (TokenBucket(limits.rate_per_s, limits.burst)
                       if limits.rate_per_s is not None else None)


class ToolExecutor:
    """Runs tool calls under the configured limits. Create it inside the running event loop."""

    def __init__(self, config: ExecutorConfig = ExecutorConfig()):
        self.config = config
        self._global = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
        self._slots: dict[str, _Slot] = {}

    def _slot(self, name: str) -> _Slot:
        if name not in self._slots:
            self._slots[name] = _Slot(self.config.limits(name))
        return self._slots[name]

    async def call_many(self, calls: Sequence[tuple[Tool, dict[str, Any]]]) -> list[ToolCallRecord]:
        """The calls of one turn, concurrently; records come back in call order. The first call
        runs in the caller's task and the others in tasks of their own (a task per call is most
        of the scheduling cost of a turn)."""
        if not calls:
            return []
        others = [asyncio.ensure_future(self.call(tool, args)) for tool, args in calls[1:]]
        try:
            first = await self.call(*calls[0])
            return [first] + [await task for task in others]
        except BaseException:  # cancelled: take the other calls down with us
            for task in others:
                task.cancel()
            raise

    async def call(self, tool: Tool, arguments: dict[str, Any]) -> ToolCallRecord:
        """One call with retries. latency = time spent in attempts (the tool's reported latency
        when it gives one, else measured wall time) plus backoff waits; queueing for limits is
        not charged to the tool. cost = the successful attempt's cost (failed attempts: 0)."""
        name = tool.spec.name
        slot = self._slot(name)
        limits = slot.limits
        latency, last_error = 0.0, ""
        for attempt in range(limits.max_attempts):
            if attempt:
                wait = min(limits.backoff_max_s, limits.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(wait)
                latency += wait
            outcome, seconds = await self._attempt(tool, arguments, slot)
            if isinstance(outcome, str) or outcome is None:  # transient failure or timeout
                latency += seconds
                last_error = outcome or f"timed out after {limits.timeout_s:g} s"
                continue
            if isinstance(outcome, Exception):
                return ToolCallRecord(name=name, arguments=arguments, ok=False,
                                      latency=latency + seconds,
                                      observation=f"Error: tool {name!r} failed: {_describe(outcome)}")
            latency += outcome.latency if outcome.latency is not None else seconds
            return ToolCallRecord(name=name, arguments=arguments,
                                  observation=self._clip(outcome.observation), cost=outcome.cost,
                                  latency=latency, input_tokens=outcome.input_tokens,
                                  output_tokens=outcome.output_tokens)
        tries = f"{limits.max_attempts} attempt{'s' if limits.max_attempts > 1 else ''}"
        return ToolCallRecord(name=name, arguments=arguments, ok=False, latency=latency,
                              observation=f"Error: tool {name!r} {last_error} ({tries}).")

    async def _attempt(self, tool: Tool, arguments: dict[str, Any], slot: _Slot):
        """(ToolResult | permanent Exception | transient message str | None for timeout, seconds)."""
        if slot.bucket is not None:
            await slot.bucket.acquire()
        if self._global is None and slot.sem is None:
            return await self._timed(tool, arguments, slot.limits.timeout_s)
        async with _maybe(self._global), _maybe(slot.sem):
            return await self._timed(tool, arguments, slot.limits.timeout_s)

    @staticmethod
    async def _timed(tool: Tool, arguments: dict[str, Any], timeout_s: float):
        """One attempt under its timeout; see `_attempt` for what comes back."""
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                result = await tool(arguments)
        except TimeoutError:
            return None, time.monotonic() - start
        except ToolError as e:
            seconds = time.monotonic() - start
            return (f"failed: {e}" if e.transient else e), seconds
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a buggy tool costs its own call, never the batch
            return e, time.monotonic() - start
        seconds = time.monotonic() - start
        if not isinstance(result, ToolResult):
            return TypeError(f"returned {type(result).__name__}, not ToolResult"), seconds
        return result, seconds

    def _clip(self, text: str) -> str:
        limit = self.config.max_observation_chars
        if limit is None or len(text) <= limit:
            return text
        return text[:limit] + f"\n[... truncated {len(text) - limit} characters]"


def _describe(e: Exception) -> str:
    return str(e) if isinstance(e, ToolError) else f"{type(e).__name__}: {e}"


class _maybe:
    """`async with _maybe(sem)`: the semaphore, or nothing when it is None."""

    __slots__ = ("sem",)

    def __init__(self, sem: asyncio.Semaphore | None):
        self.sem = sem

    async def __aenter__(self):
        if self.sem is not None:
            await self.sem.acquire()

    async def __aexit__(self, *exc):
        if self.sem is not None:
            self.sem.release()
