"""Rollout faults: two real `orchestrax serve` processes behind fault-injecting
proxies on loopback — one answers 500s, truncated JSON and a dropped connection, then is
SIGKILLed mid-step; the other is slow. Every episode completes, every request has exactly one
result, and the retries are counted. Tool timeouts, huge outputs and never-returning tools
bound a batch of calls."""

import asyncio
import itertools

import aiohttp
import pytest
from aiohttp import web
from loopback import check_token_episode, free_port, serve_app, start_tiny_server, token_episode

from orchestrax.agent.executor import ExecutorConfig, ToolExecutor, ToolLimits
from orchestrax.rollout.sglang_client import SGLangClient, SGLangClientConfig
from orchestrax.tools.tool import Pricing, ToolError, ToolResult, ToolSpec


def fault_proxy(upstream: str, faults, delay_s: float = 0.0):
    """Forwards /generate and /health to `upstream`. `faults` yields, per /generate request,
    None (pass through), 500, "truncate" (a 200 with half its body) or "drop" (the connection
    closes mid-body). Records the rid of every request it saw."""
    seen = []

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body.get("rid"))
        fault = next(faults, None)
        if fault == 500:
            return web.json_response({"error": {"message": "injected"}}, status=500)
        await asyncio.sleep(delay_s)
        async with aiohttp.ClientSession() as s, s.post(f"{upstream}/generate", json=body) as r:
            raw = await r.read()
            status = r.status
        if fault == "truncate":
            return web.Response(body=raw[:len(raw) // 2], content_type="application/json")
        if fault == "drop":
            resp = web.StreamResponse(headers={"Content-Length": str(len(raw)),
                                               "Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(raw[:len(raw) // 2])
            request.transport.close()
            return resp
        return web.Response(body=raw, status=status, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{upstream}/health") as r:
                return web.Response(status=r.status)
        except aiohttp.ClientError:
            return web.Response(status=503)

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    return app, seen


@pytest.mark.slow
def test_a_step_survives_500s_truncated_json_a_kill_and_a_slow_server():
    episodes, turns = 16, 3

    async def main():
        ports = [free_port(), free_port()]
        procs = await asyncio.gather(*(start_tiny_server(p) for p in ports))
        faults_a = iter([500, "truncate", "drop"])
        app_a, seen_a = fault_proxy(f"http://127.0.0.1:{ports[0]}", faults_a)
        app_b, seen_b = fault_proxy(f"http://127.0.0.1:{ports[1]}", iter(()), delay_s=0.2)
        try:
            async with serve_app(app_a) as url_a, serve_app(app_b) as url_b:
                cfg = SGLangClientConfig(urls=(url_a, url_b), health_interval_s=0.2,
                                         retry_backoff_s=0.01, max_attempts=6)
                async with SGLangClient(cfg) as client:
                    tasks = [asyncio.create_task(token_episode(client, i, turns, max_new_tokens=10))
                             for i in range(episodes)]
                    while len(seen_a) < 8:  # kill A mid-step, once the faults were served
                        await asyncio.sleep(0.005)
                    procs[0].kill()
                    out = await asyncio.gather(*tasks)
                    return out, dict(client.stats), client.take_counters(), seen_a, seen_b
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                await p.wait()

    out, stats, counters, seen_a, seen_b = asyncio.run(main())
    assert len(out) == episodes
    rids = []
    for ids, mask, results in out:
        check_token_episode(ids, mask, results, turns)
        rids += [r.rid for r in results]
    # Exactly one result per request, none lost and none twice, although some rids were sent
    # to both servers (the retried ones).
    assert sorted(rids) == sorted(f"ep{i}-turn{t}" for i in range(episodes) for t in range(turns))
    retried = set(seen_a) & set(seen_b)
    assert retried and retried <= set(rids)
    assert stats["failures"] == 0 and stats["requests"] == episodes * turns
    assert stats["retries"] >= 3 and counters == stats  # three injected faults, then the kill
    assert len(seen_a) + len(seen_b) == stats["requests"] + stats["retries"]


class _Tool:
    def __init__(self, name, behaviour):
        self.spec = ToolSpec(name=name, description=name, parameters={"type": "object"},
                             pricing=Pricing())
        self.behaviour = behaviour
        self.calls = 0
        self.attempts: dict[int, int] = {}   # per call (arguments["i"])

    async def __call__(self, arguments):
        self.calls += 1
        self.attempts[arguments["i"]] = self.attempts.get(arguments["i"], 0) + 1
        return await self.behaviour(self.attempts[arguments["i"]])


async def _never(n):
    await asyncio.Event().wait()


async def _slow(n):
    await asyncio.sleep(30)
    return ToolResult(observation="late")


async def _huge(n):
    return ToolResult(observation="x" * 10_000_000)


async def _flaky(attempt):
    if attempt == 1:
        raise ToolError("unavailable", transient=True)
    return ToolResult(observation="ok")


async def _broken(n):
    raise RuntimeError("bug in the tool")


def test_tool_faults_bound_the_batch():
    tools = [_Tool("never", _never), _Tool("slow", _slow), _Tool("huge", _huge),
             _Tool("flaky", _flaky), _Tool("broken", _broken)]
    limits = ToolLimits(timeout_s=0.3, max_attempts=2, backoff_s=0.01, backoff_max_s=0.01)
    executor = ToolExecutor(ExecutorConfig(default=limits, max_observation_chars=1000))
    calls = [(tool, {"i": i}) for i, tool in enumerate(itertools.islice(itertools.cycle(tools),
                                                                         50))]

    async def main():
        # Whatever the tools do, the batch ends: at most 2 attempts x 0.3 s per call.
        return await asyncio.wait_for(executor.call_many(calls), timeout=20)

    records = asyncio.run(main())
    assert len(records) == 50 and [r.name for r in records] == [t.spec.name for t, _ in calls]
    by_name = {}
    for r in records:
        by_name.setdefault(r.name, []).append(r)
    assert all(not r.ok and "timed out" in r.observation for r in by_name["never"] + by_name["slow"])
    assert all(len(r.observation) < 1100 and "truncated" in r.observation for r in by_name["huge"])
    assert all(r.ok and r.observation == "ok" for r in by_name["flaky"])  # retried once
    assert all(not r.ok and "bug in the tool" in r.observation for r in by_name["broken"])
    assert tools[0].calls == tools[1].calls == 20  # 10 calls each, both attempts timed out
