"""The trainer's per-row retry counters equal the retries the servers saw, whether episodes run on
the trainer's event loop (one SGLang client) or in two episode workers (a client each, whose
counters come back with their episodes).

Two real `orchestrax serve` processes stand behind counting proxies on loopback: proxy A answers
every second /generate it receives with a 500 (the client retries the request on B); proxy B
never fails, so it is always up for the trainer's weight syncs, and it notes A's 500 count when
each weight version first reaches it. A version is published after each step's update (and
once before the first eval), so the 500s between two versions are exactly one step's retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading

import aiohttp
import pytest
from aiohttp import web
from loopback import serve_app
from test_train_loop import tiny_run
from test_train_sglang import servers  # noqa: F401  # the fixture: two `orchestrax serve`

from orchestrax.train.loop import train

pytestmark = pytest.mark.slow


class CountingProxy:
    """Forwards every route to `upstream`. With `fail_every=k`, every k-th /generate gets a 500
    instead (counted in `injected`). Records `injected_at[version]`: the `injected` count of
    `counts_of` (a proxy, or itself) when /update_weights_from_disk for that version first came."""

    def __init__(self, upstream: str, fail_every: int = 0,
                 counts_of: CountingProxy | None = None):
        self.upstream, self.fail_every = upstream, fail_every
        self.counts_of = counts_of or self
        self.generate_calls = self.injected = 0
        self.injected_at: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == "/generate":
            self.generate_calls += 1
            if self.fail_every and self.generate_calls % self.fail_every == 0:
                self.injected += 1
                return web.json_response({"error": {"message": "injected"}}, status=500)
        if request.path == "/update_weights_from_disk":
            version = (await request.json())["weight_version"]
            self.injected_at.setdefault(version, self.counts_of.injected)
        async with aiohttp.ClientSession() as s, s.request(
                request.method, self.upstream + request.path_qs, data=body,
                headers={"Content-Type": request.content_type}) as r:
            return web.Response(body=await r.read(), status=r.status,
                                content_type=r.content_type)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 28)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


class ProxiesThread:
    """`with ProxiesThread(apps) as urls:` serves the apps on an event loop of their own, in a
    thread: `train` blocks the test's thread with the trainer's loop."""

    def __init__(self, apps: list[web.Application]):
        self.apps, self.urls = apps, []
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            self.urls = [await stack.enter_async_context(serve_app(a)) for a in self.apps]
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> list[str]:
        self._thread.start()
        assert self._ready.wait(timeout=30), "the proxies did not start"
        return self.urls

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


@pytest.mark.parametrize("workers", [0, 2])
def test_each_rows_retries_are_the_500s_the_servers_sent(tmp_path, servers, workers):  # noqa: F811
    flaky = CountingProxy(servers[0], fail_every=2)
    steady = CountingProxy(servers[1], counts_of=flaky)
    base = tiny_run(tmp_path / "run", steps=2, sft_steps=0)
    with ProxiesThread([flaky.app(), steady.app()]) as urls:
        cfg = dataclasses.replace(base, rollout=dataclasses.replace(
            base.rollout, backend="sglang", server_urls=tuple(urls), workers=workers,
            weight_sync_dir=str(tmp_path / "weights")), eval_every=2)
        history = train(cfg)
    evals = [h for h in history if h["phase"] == "eval"]
    rl = [h for h in history if h["phase"] == "rl"]
    assert [h["step"] for h in evals] == [0, 2] and [h["step"] for h in rl] == [1, 2]
    # Versions "0" (before the first eval), "1" and "2" (after each step) reached B in order.
    at = steady.injected_at
    assert list(at) == ["0", "1", "2"] and at["0"] == 0
    assert flaky.injected >= 4  # A got its share of requests: every row below saw faults
    # The initial eval and step 1 both sample between versions 0 and 1; step 2 alone after 1.
    assert evals[0]["sampler/retries"] + rl[0]["sampler/retries"] == at["1"] - at["0"]
    assert rl[1]["sampler/retries"] == at["2"] - at["1"] > 0
    # The final eval samples after the last publish: A's 500s since then are its retries.
    assert evals[1]["sampler/retries"] == flaky.injected - at["2"]
    for row in evals + rl:
        assert row["sampler/failures"] == 0  # every retried request succeeded on B
    # Every attempt reached a proxy: requests + retries == /generate calls seen.
    attempts = sum(h["sampler/requests"] + h["sampler/retries"] for h in evals + rl)
    assert attempts == flaky.generate_calls + steady.generate_calls
