"""HTTP plumbing shared by the routes of `orchestrax serve`: the app's state key, error bodies,
bounded body reads, server-sent events and interleaving of per-request streams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from orchestrax.rollout.serving import ServerState
from orchestrax.rollout.validate import ProtocolError, json_depth_error

STATE = web.AppKey("state", ServerState)
STREAM_STARTED = web.RequestKey("stream_started", bool)   # its response's headers are sent
CLIENT_HEADER = "X-Client-Id"
MAX_CLIENT_NAME = 128   # characters of the header kept: a long name buys nothing


def client_of(request: web.Request) -> tuple[str, str, object]:
    """The sampler's fair-queue path of one HTTP call: (peer address, the name the
    `X-Client-Id` header gives, this call). SGLang and OpenAI clients send no id of their own,
    and a client's pool opens many connections, so the peer's address (not its port) is the
    client; behind a router or proxy every call has that one address, so the header names
    the clients there. A name only divides its peer's share (`rollout.fair`): a peer cannot
    buy more turns by sending many names, nor by sending many rids."""
    return (request.remote or "", request.headers.get(CLIENT_HEADER, "")[:MAX_CLIENT_NAME],
            object())


def error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def read_json(request: web.Request) -> Any:
    """The body as JSON, read within the read timeout (a half-sent body cannot hold a
    handler)."""
    limits = request.app[STATE].limits
    try:
        raw = await asyncio.wait_for(request.read(), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(
            text=json.dumps({"error": {"message": "request body not received within "
                                                  f"{limits.read_timeout_s} s"}}),
            content_type="application/json") from None
    # A body of many megabytes takes seconds to parse: a worker thread keeps /health and the
    # other clients answered meanwhile.
    return await asyncio.to_thread(parse_json, raw, limits.max_json_depth)


def parse_json(raw: bytes, max_depth: int) -> Any:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:  # ValueError covers JSONDecodeError
        raise ProtocolError(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ProtocolError(f"request body nests arrays/objects deeper than {max_depth} "
                            "levels") from None
    why = json_depth_error(body, max_depth)
    if why is not None:
        raise ProtocolError(why)
    return body


async def json_response(value: Any, status: int = 200) -> web.Response:
    """`web.json_response`, serialised in a worker thread (a 1,024-item answer takes a while)."""
    text = await asyncio.to_thread(json.dumps, value)
    return web.Response(text=text, status=status, content_type="application/json")



async def sse(request: web.Request, events) -> web.StreamResponse:
    """Server-sent events: one `data:` line per JSON event, then `data: [DONE]`."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    request[STREAM_STARTED] = True
    async for event in events:
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def merge(streams):
    """Interleave several async iterators of (index, item) as items arrive."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, it):
        try:
            async for x in it:
                await queue.put((i, x, None))
        except Exception as e:  # a failed stream ends the whole response
            await queue.put((i, None, e))
        await queue.put((i, None, None))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            i, x, e = await queue.get()
            if e is not None:
                raise e
            if x is None:
                live -= 1
            else:
                yield i, x
    finally:
        for t in tasks:
            t.cancel()

