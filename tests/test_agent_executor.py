"""Tool executor with real asyncio tools: retries, timeouts, crashes, limits, bookkeeping."""

import asyncio

import pytest
from agent_fixtures import SleepTool

from orchestrax.agent.executor import ExecutorConfig, TokenBucket, ToolExecutor, ToolLimits

FAST = ToolLimits(timeout_s=5.0, max_attempts=3, backoff_s=0.01, backoff_max_s=0.02)
EPS = 1e-3  # asyncio may wake a timer up to one clock tick early


def run(coro):
    return asyncio.run(coro)


def test_success_records_cost_and_measured_latency():
    async def main():
        ex = ToolExecutor(ExecutorConfig(default=FAST))
        slow = SleepTool("slow", latency_s=0.05, cost=0.002)
        nominal = SleepTool("sim", cost=0.5, report_latency=12.0)
        return await ex.call_many([(slow, {"q": "a"}), (nominal, {"q": "b"})])
    a, b = run(main())
    assert a.ok and a.observation == "slow result for a" and a.cost == 0.002
    assert a.latency >= 0.05 - EPS
    assert b.ok and b.latency == 12.0 and b.cost == 0.5   # simulated tools report, not sleep


def test_transient_errors_retry_with_backoff_then_succeed():
    tool = SleepTool("flaky", fail_first=2, cost=1.0)
    rec = run(ToolExecutor(ExecutorConfig(default=FAST)).call(tool, {"q": "x"}))
    assert rec.ok and tool.calls == 3 and rec.cost == 1.0
    assert rec.latency >= 0.01 + 0.02 - EPS   # two backoff waits: 0.01, then 0.02


def test_transient_errors_exhaust_attempts():
    tool = SleepTool("down", fail_first=99)
    rec = run(ToolExecutor(ExecutorConfig(default=FAST)).call(tool, {}))
    assert not rec.ok and tool.calls == 3 and rec.cost == 0.0
    assert rec.observation == "Error: tool 'down' failed: down is unavailable (3 attempts)."


def test_permanent_error_is_not_retried():
    tool = SleepTool("bad", fail_first=99, transient=False)
    rec = run(ToolExecutor(ExecutorConfig(default=FAST)).call(tool, {}))
    assert not rec.ok and tool.calls == 1
    assert rec.observation == "Error: tool 'bad' failed: bad is unavailable"


def test_timeouts_retry_and_become_observations():
    tool = SleepTool("hang", latency_s=30.0)
    limits = ToolLimits(timeout_s=0.05, max_attempts=2, backoff_s=0.01, backoff_max_s=0.01)
    rec = run(ToolExecutor(ExecutorConfig(default=limits)).call(tool, {}))
    assert not rec.ok and tool.calls == 2 and tool.active == 0
    assert rec.observation == "Error: tool 'hang' timed out after 0.05 s (2 attempts)."
    assert rec.latency >= 2 * 0.05 + 0.01 - EPS


def test_crash_and_wrong_return_type_do_not_escape():
    class Wrong:
        spec = SleepTool("wrong").spec

        async def __call__(self, arguments):
            return "not a ToolResult"

    async def main():
        ex = ToolExecutor(ExecutorConfig(default=FAST))
        return await ex.call_many([(SleepTool("boom", fail_first=1, crash=True), {}),
                                   (Wrong(), {}), (SleepTool("fine"), {"q": "z"})])
    boom, wrong, fine = run(main())
    assert not boom.ok and boom.observation == "Error: tool 'boom' failed: ValueError: boom crashed"
    assert not wrong.ok and "returned str, not ToolResult" in wrong.observation
    assert fine.ok and fine.observation == "fine result for z"


def test_per_tool_and_global_concurrency_limits():
    a, b = SleepTool("a", latency_s=0.02), SleepTool("b", latency_s=0.02)
    peak = {"now": 0, "max": 0}

    class Counted:
        def __init__(self, tool):
            self.tool, self.spec = tool, tool.spec

        async def __call__(self, args):
            peak["now"] += 1
            peak["max"] = max(peak["max"], peak["now"])
            try:
                return await self.tool(args)
            finally:
                peak["now"] -= 1

    async def main():
        cfg = ExecutorConfig(default=FAST, max_concurrency=3,
                             per_tool={"a": ToolLimits(max_concurrency=2)})
        ex = ToolExecutor(cfg)
        calls = [(Counted(a), {})] * 8 + [(Counted(b), {})] * 8
        return await asyncio.gather(*(ex.call(t, x) for t, x in calls))
    records = run(main())
    assert all(r.ok for r in records) and a.calls == b.calls == 8
    assert a.max_active == 2 and peak["max"] == 3


def test_rate_limit_spaces_calls():
    tool = SleepTool("rl")

    async def main():
        ex = ToolExecutor(ExecutorConfig(per_tool={"rl": ToolLimits(rate_per_s=50.0, burst=2)}))
        await asyncio.gather(*(ex.call(tool, {}) for _ in range(6)))
    run(main())
    # Token bucket, burst 2 at 50/s: by call i (from 0) at least (i - 1) refills of 20 ms have
    # passed. Single gaps may be shorter than 20 ms after a late call (tokens accrue meanwhile),
    # so only the cumulative bound is an invariant; load can only make it easier to meet.
    since_first = [t - tool.starts[0] for t in tool.starts]
    for i, elapsed in enumerate(since_first[2:], start=2):
        assert elapsed >= (i - 1) * 0.02 - EPS, since_first


def test_token_bucket_never_exceeds_rate():
    async def main():
        bucket, stamps = TokenBucket(rate=100.0, capacity=1), []
        loop = asyncio.get_running_loop()

        async def one():
            await bucket.acquire()
            stamps.append(loop.time())
        await asyncio.gather(*(one() for _ in range(10)))
        return stamps
    stamps = run(main())
    assert stamps[-1] - stamps[0] >= 9 * 0.01 - EPS


def test_cancellation_propagates():
    async def main():
        ex = ToolExecutor(ExecutorConfig(default=FAST))
        task = asyncio.create_task(ex.call(SleepTool("slow", latency_s=10.0), {}))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    run(main())


def test_cancelling_a_turn_cancels_all_of_its_calls():
    async def main():
        ex = ToolExecutor(ExecutorConfig(default=FAST))
        started = []

        class Slow(SleepTool):
            async def __call__(self, arguments):
                started.append(asyncio.current_task())
                return await super().__call__(arguments)

        tools = [Slow("a", latency_s=0.0), Slow("b", latency_s=10.0), Slow("c", latency_s=10.0)]
        turn = asyncio.create_task(ex.call_many([(t, {}) for t in tools]))
        await asyncio.sleep(0.05)  # "a" (run in the turn's own task) is done; "b", "c" sleep
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        await asyncio.sleep(0)
        assert len(started) == 3 and all(t.done() for t in started)
        assert started[1].cancelled() and started[2].cancelled()
    run(main())


def test_long_observations_are_clipped():
    tool = SleepTool("big", observation="x" * 100)
    rec = run(ToolExecutor(ExecutorConfig(max_observation_chars=10)).call(tool, {}))
    assert rec.observation == "x" * 10 + "\n[... truncated 90 characters]"


@pytest.mark.parametrize("kwargs, field", [
    ({"timeout_s": 0}, "timeout_s"), ({"max_attempts": 0}, "max_attempts"),
    ({"backoff_s": 2.0, "backoff_max_s": 1.0}, "backoff_s"), ({"max_concurrency": 0}, "max_concurrency"),
    ({"rate_per_s": -1.0}, "rate_per_s"), ({"burst": 0}, "burst")])
def test_limits_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=f"ToolLimits.{field}"):
        ToolLimits(**kwargs)


def test_executor_config_validation():
    with pytest.raises(ValueError, match="ExecutorConfig.max_concurrency"):
        ExecutorConfig(max_concurrency=0)
    with pytest.raises(ValueError, match=r"per_tool\['x'\]"):
        ExecutorConfig(per_tool={"x": {"timeout_s": 1}})
