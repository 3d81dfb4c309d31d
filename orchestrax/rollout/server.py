"""`orchestrax serve`: the SGLang native API subset an RL trainer uses, backed by the embedded
sampler, plus an OpenAI-compatible `/v1/chat/completions` (see openai_chat.py).

Routes and response shapes follow SGLang's entrypoints/http_server.py: `/generate`,
`/update_weights_from_disk` -> `{success, message, num_paused_requests}`, `/model_info`
(alias `/get_model_info`) -> `{model_path, tokenizer_path, is_generation,
preferred_sampling_params, weight_version}`, `/server_info` (alias `/get_server_info`),
`/flush_cache`, `/health`, `/abort_request` (`{rid, abort_all}`). Errors are
`{"error": {"message": ...}}` with status 400, as SGLang's `_create_error_response`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from typing import Any, Callable

import jax
from aiohttp import web

from orchestrax import models
from orchestrax.rollout.embedded import EmbeddedSampler
from orchestrax.rollout.protocol import ProtocolError, parse_generate, result_to_json

log = logging.getLogger(__name__)
STATE = web.AppKey("state", object)


@dataclasses.dataclass(kw_only=True)
class ServerState:
    sampler: EmbeddedSampler
    model_path: str
    tokenizer: Any = None                  # a transformers tokenizer; needed for text and chat
    tokenizer_path: str | None = None
    chat_template: str | None = None       # overrides the tokenizer's own template when given
    served_model_name: str = "orchestrax"
    # (path) -> (cfg, params); default reads an HF safetensors directory with models.load_hf.
    load_weights: Callable[[str], tuple[models.ModelConfig, Any]] | None = None
    weight_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProtocolError(f"request body is not valid JSON: {e}") from None


async def generate(request: web.Request) -> web.StreamResponse:
    st: ServerState = request.app[STATE]
    t0 = time.perf_counter()
    try:
        call = parse_generate(await read_json(request),
                              encode=st.encode if st.tokenizer is not None else None)
        # Every request gets an id so /abort_request can reach it.
        reqs = [r if r.rid else dataclasses.replace(r, rid=uuid.uuid4().hex)
                for r in call.requests]
        results = await st.sampler.generate(reqs)
    except (ProtocolError, ValueError) as e:
        return error(str(e))
    decode = st.decode if st.tokenizer is not None else None
    items = [result_to_json(res, return_logprob=lp, rid=r.rid, decode=decode,
                            text_in_logprobs=call.return_text_in_logprobs,
                            e2e_latency=time.perf_counter() - t0)
             for r, res, lp in zip(reqs, results, call.return_logprob)]
    if not call.stream:
        return web.json_response(items if call.batched else items[0])
    # Generation runs as one jitted call per batch, so the stream carries each finished item
    # as one event (SGLang's cumulative format), then the [DONE] sentinel.
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i, item in enumerate(items):
        if call.batched:
            item = {**item, "index": i}
        await resp.write(b"data: " + json.dumps(item).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _same_shapes(a: Any, b: Any) -> bool:
    sa = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), a)
    sb = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), b)
    return jax.tree.structure(a) == jax.tree.structure(b) and sa == sb


async def update_weights_from_disk(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    try:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            raise ProtocolError("update_weights_from_disk needs a string model_path")
    except ProtocolError as e:
        return error(str(e))
    path, version = body["model_path"], body.get("weight_version")
    async with st.weight_lock:
        try:
            # Reading safetensors is blocking file I/O; keep the event loop serving meanwhile.
            cfg, params = await asyncio.to_thread(st.load_weights or models.load_hf, path)
            if not _same_shapes(params, st.sampler.params):
                raise ValueError(f"{path} holds a different architecture than the served model")
        except Exception as e:  # any load failure is reported, the old weights keep serving
            return web.json_response({"success": False, "message": f"Failed to update weights: {e}",
                                      "num_paused_requests": 0}, status=400)
        n_aborted = st.sampler.abort() if body.get("abort_all_requests") else 0
        new_version = str(version) if version is not None else st.sampler.weight_version
        st.sampler.set_params(params, weight_version=new_version)
        st.model_path = path
    message = "Succeeded to update model weights."
    if version is not None:
        message += f" Weight version updated to {version}."
    return web.json_response({"success": True, "message": message,
                              "num_paused_requests": n_aborted})


async def model_info(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    return web.json_response({"model_path": st.model_path, "tokenizer_path": st.tokenizer_path,
                              "is_generation": True, "preferred_sampling_params": None,
                              "weight_version": st.sampler.weight_version})


async def server_info(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    s = st.sampler
    return web.json_response({
        "model_path": st.model_path, "tokenizer_path": st.tokenizer_path,
        "served_model_name": st.served_model_name, "weight_version": s.weight_version,
        "context_length": s.max_len, "max_running_requests": s.max_batch,
        "internal_states": [{"outstanding_requests": s.outstanding, **s.stats}],
        "version": "orchestrax",
    })


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    # No prefix cache is kept between batches, so there is nothing to flush.
    return web.Response(text="Cache flushed.\n")


async def abort_request(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    try:
        body = await read_json(request)
    except ProtocolError as e:
        return error(str(e))
    if not isinstance(body, dict):
        return error("abort_request needs a JSON object with rid or abort_all")
    if body.get("abort_all"):
        st.sampler.abort()
    elif isinstance(body.get("rid"), str):
        st.sampler.abort(body["rid"])
    else:
        return error("abort_request needs rid (string) or abort_all: true")
    return web.Response(status=200)


def make_app(state: ServerState) -> web.Application:
    from orchestrax.rollout.openai_chat import chat_completions, list_models
    app = web.Application(client_max_size=1 << 28)
    app[STATE] = state
    app.router.add_route("POST", "/generate", generate)
    app.router.add_route("PUT", "/generate", generate)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    app.router.add_get("/health", health)
    app.router.add_route("GET", "/flush_cache", flush_cache)
    app.router.add_route("POST", "/flush_cache", flush_cache)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)

    async def close_sampler(app: web.Application) -> None:
        await state.sampler.aclose()
    app.on_cleanup.append(close_sampler)
    return app


async def start(state: ServerState, *, host: str = "127.0.0.1", port: int = 0) -> web.AppRunner:
    """Start serving on (host, port) inside the running loop; port 0 picks a free one (read it
    back with `bound_port(runner)`)."""
    runner = web.AppRunner(make_app(state), handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    return runner.addresses[0][1]
