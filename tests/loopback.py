"""Real aiohttp servers on 127.0.0.1 with an OS-picked port, for tests of HTTP clients: any app
(`serve_app`), a scripted OpenAI-compatible chat server (`ScriptedChatServer`) for the judge
and user-simulator clients, and `orchestrax serve` itself, in process (`run_serve`) or as a
subprocess (`start_tiny_server`) with the trainer's multi-turn episodes against it
(`token_episode`)."""

import asyncio
import contextlib
import json
import socket
import sys
import urllib.error
import urllib.request
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from orchestrax.rollout.sampler import GenerateRequest, SamplingParams
from orchestrax.rollout.server import ServerState, bound_port, start
from orchestrax.rollout.sglang_client import post_json

def post_sync(url: str, body: Any, timeout: float = 120) -> tuple[int, Any]:
    """(status, JSON) of a blocking POST of `body` as JSON, for tests that drive a server from
    threads or next to sync clients; a plain-text refusal (the router's) is {"text": ...}."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read().decode()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"text": raw}


Responder = Callable[[dict[str, Any]], "str | tuple[int, str]"]


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` for the block; yields its base URL (`http://127.0.0.1:PORT`)."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


class ScriptedChatServer:
    """`async with ScriptedChatServer(fn) as srv:` serves POST /v1/chat/completions at
    `srv.base_url` (ending in /v1). `fn(request_body)` returns the reply text, or
    `(status, body)` to answer with an HTTP error. Every request body is kept in `srv.requests`.
    `usage`: the (prompt, completion) token counts every answer reports, for tests that bill
    them; by default a rough count from the characters."""

    def __init__(self, respond: Responder, usage: tuple[int, int] | None = None):
        self.respond = respond
        self.usage = usage
        self.requests: list[dict[str, Any]] = []
        self._served: contextlib.AsyncExitStack | None = None
        self.base_url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        out = self.respond(body)
        if isinstance(out, tuple):
            return web.Response(status=out[0], text=out[1])
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        # a rough token count by default: the server is a fixture, not a tokenizer
        prompt, completion = self.usage or (prompt_chars // 4, len(out) // 4)
        return web.json_response({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
            "model": body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": out}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}})

    async def __aenter__(self) -> "ScriptedChatServer":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._served = contextlib.AsyncExitStack()
        self.base_url = await self._served.enter_async_context(serve_app(app)) + "/v1"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._served is not None
        await self._served.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_tiny_server(port: int, *, timeout_s: float = 180) -> asyncio.subprocess.Process:
    """`orchestrax serve --tiny` in a subprocess, returned once it prints that it listens."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrax.cli", "serve", "--tiny", "--port", str(port),
        "--max-len", "256", "--max-batch", "16", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=timeout_s)
    assert b"listening" in line, line
    return proc


def run_serve(make_state: Callable[[], ServerState],
              fn: Callable[[aiohttp.ClientSession, str, ServerState], Awaitable[Any]]) -> Any:
    """`fn(http, url, state)` in a fresh event loop, against `orchestrax serve`'s app over
    `state = make_state()` (built inside the loop, where its sampler's queue lives) at `url`;
    the server is closed after, whatever `fn` raises. Returns what `fn` returns."""
    async def main() -> Any:
        state = make_state()
        runner = await start(state, port=0)
        try:
            async with aiohttp.ClientSession() as http:
                return await fn(http, f"http://127.0.0.1:{bound_port(runner)}", state)
        finally:
            await runner.cleanup()
    return asyncio.run(main())


async def post(http: aiohttp.ClientSession, url: str, body: Any, path: str = "/generate",
               **kw: Any) -> tuple[int, Any]:
    """(status, JSON or text) of POSTing `body` (a str or bytes as it is) to `url + path`."""
    return await post_json(http, url + path, body, **kw)


TOOL_RESPONSE_IDS = (10, 11, 12, 13)  # stands in for a tool response appended with loss mask 0


async def token_episode(client: Any, i: int, turns: int, *,
                        max_new_tokens: int) -> tuple[list[int], list[int], list]:
    """A multi-turn token-in/token-out episode through `client.generate`, as the trainer runs
    one: each turn's output and a stand-in tool response are appended to the prompt. Returns
    (ids, loss mask: 1 on sampled tokens, results); turn t's request has rid `ep{i}-turn{t}`."""
    ids, mask, results = [1 + i % 50, 7, 8, 9], [0, 0, 0, 0], []
    for t in range(turns):
        res = (await client.generate([GenerateRequest(
            input_ids=tuple(ids), rid=f"ep{i}-turn{t}",
            sampling=SamplingParams(temperature=0.8, max_new_tokens=max_new_tokens,
                                    sampling_seed=i))]))[0]
        results.append(res)
        ids += list(res.output_ids) + list(TOOL_RESPONSE_IDS)
        mask += [1] * len(res.output_ids) + [0] * len(TOOL_RESPONSE_IDS)
    return ids, mask, results


def check_token_episode(ids: list[int], mask: list[int], results: list, turns: int) -> None:
    """Every turn ended normally, and ids/mask hold exactly the prompt, each output (the
    sampled tokens, one logprob each) and each tool response."""
    assert len(results) == turns
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert len(ids) == len(mask) == 4 + sum(len(r.output_ids) for r in results) + turns * 4
    assert sum(mask) == sum(len(r.logprobs) for r in results)
