"""`orchestrax serve`: the SGLang native API subset an RL trainer uses, plus an OpenAI-compatible
`/v1/chat/completions` (chat_route.py, wire format in openai_chat.py), backed by the embedded
sampler (`ContinuousSampler`: continuous batching, which `/server_info` reports as `engine`).

Routes and response shapes follow SGLang's entrypoints/http_server.py: `/generate`,
`/update_weights_from_disk` -> `{success, message, num_paused_requests}`, `/model_info`
(alias `/get_model_info`) -> `{model_path, tokenizer_path, is_generation,
preferred_sampling_params, weight_version}`, `/server_info` (alias `/get_server_info`),
`/flush_cache`, `/health`, `/abort_request` (`{rid, abort_all}`), OpenAI's `/v1/completions`
(openai_completions.py) and the RL routes of rl_routes.py (pause, memory release, tokenize). Errors are
`{"error": {"message": ...}}` with status 400, as SGLang's `_create_error_response`.

Clients are isolated from each other: a request is checked in full (`ServeLimits`, field types
and ranges, the sampler's `admit_error`) before it can join a batch; text is tokenised in a
worker thread after its length was checked; a client that disconnects is cancelled, and its
rows leave the running batch at the next engine step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import time
import uuid
from typing import Any

import jax
from aiohttp import web

from orchestrax import models
from orchestrax.rollout.sampler import GenerateRequest, GenerateResult
from orchestrax.rollout import rl_routes
from orchestrax.rollout.chat_route import chat_completions, list_models
from orchestrax.rollout.openai_completions import completions
from orchestrax.rollout.embedded import EngineFault
from orchestrax.rollout.http_io import (STATE, STREAM_STARTED, client_of, error, json_response,
                                        merge, read_json, sse)
from orchestrax.rollout.protocol import parse_generate, result_to_json
from orchestrax.rollout.serving import ServerState, Update, run_request, stream_request
from orchestrax.rollout.validate import ProtocolError

log = logging.getLogger(__name__)
OPEN_PATHS = ("/health",)   # answered without the bearer token (load balancers probe it)


def _with_rid(req: GenerateRequest) -> GenerateRequest:
    # Every request gets an id so /abort_request can reach it.
    return req if req.rid else dataclasses.replace(req, rid=uuid.uuid4().hex)



# --- /generate ------------------------------------------------------------------------------------
async def generate(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    t0 = time.perf_counter()
    try:
        # Checking a million input ids takes a while: off the event loop, like the parse.
        call = await asyncio.to_thread(
            parse_generate, await read_json(request), vocab_size=st.sampler.cfg.vocab_size,
            has_tokenizer=st.tokenizer is not None, limits=st.limits)
        texts = [p for p in call.prompts if isinstance(p, str)]
        ids = iter(await st.tokenize(texts) if texts else [])
        items = call.items([next(ids) if isinstance(p, str) else p for p in call.prompts])
        if any(it.stop for it in items) and st.tokenizer is None:
            raise ProtocolError("sampling_params.stop (strings) needs a tokenizer; start the "
                                "server with one or use stop_token_ids")
        items = [dataclasses.replace(it, request=_with_rid(it.request)) for it in items]
        st.admit([it.request for it in items])
        scoring = [it for it in items if it.logprob_start_len >= 0 or it.score_only]
        for it in scoring:
            if it.logprob_start_len >= len(it.request.input_ids):
                raise ProtocolError(f"logprob_start_len={it.logprob_start_len}; must be -1 or "
                                    f"in [0, {len(it.request.input_ids)}) (the prompt's tokens)")
        if scoring and call.stream:
            raise ProtocolError("logprob_start_len and max_new_tokens=0 need stream=false")
        if st.released:
            raise ProtocolError(f"memory released ({', '.join(sorted(st.released))}); POST "
                                "/resume_memory_occupation first")
    except ProtocolError as e:
        return error(str(e))
    await st.sampler.unpaused.wait()   # /pause_generation holds prompt scoring too
    decode = st.decode if st.tokenizer is not None else None
    client = client_of(request)
    want_prompt = [it for it in items if it.logprob_start_len >= 0]
    scored = dict(zip(map(id, want_prompt), await st.scorer.ascore(
        [it.request.input_ids for it in want_prompt],
        [it.logprob_start_len for it in want_prompt],
        [it.request.top_logprobs for it in want_prompt]))) if want_prompt else {}

    def item_json(it, u: Update) -> dict[str, Any]:
        return result_to_json(u.result, return_logprob=it.return_logprob, rid=it.request.rid,
                              text=u.final_text, matched=u.matched, decode=decode,
                              text_in_logprobs=call.return_text_in_logprobs,
                              e2e_latency=time.perf_counter() - t0,
                              prompt_ids=it.request.input_ids,
                              prompt_logprobs=scored.get(id(it)))

    async def run(it) -> Update:
        if not it.score_only:
            return await run_request(st, it.request, it.stop, it.no_stop_trim, client)
        res = GenerateResult(output_ids=(), logprobs=(), finish_reason="length",
                             prompt_tokens=len(it.request.input_ids),
                             weight_version=st.sampler.weight_version, rid=it.request.rid)
        return Update("", (), (), (), done=True, result=res,
                      final_text="" if decode is not None else None)

    if not call.stream:
        done = await asyncio.gather(*(run(it) for it in items))
        out = [item_json(it, u) for it, u in zip(items, done)]
        return await json_response(out if call.batched else out[0])

    async def events():
        # SGLang's cumulative stream format: every event carries the text and ids so far.
        texts = [""] * len(items)
        streams = [stream_request(st, it.request, it.stop, it.no_stop_trim, client)
                   for it in items]
        async for i, u in merge(streams):
            it = items[i]
            texts[i] += u.text
            if u.done:
                event = item_json(it, u)
            else:
                event = {"output_ids": list(u.output_ids),
                         "meta_info": {"id": it.request.rid, "finish_reason": None,
                                       "prompt_tokens": len(it.request.input_ids),
                                       "completion_tokens": len(u.output_ids)}}
                if decode is not None:
                    event["text"] = texts[i]
            if call.batched:
                event["index"] = i
            yield event
    return await sse(request, events())




# --- weights and admin ----------------------------------------------------------------------------
def _same_shapes(a: Any, b: Any) -> bool:
    if isinstance(b["layers"], tuple) and not isinstance(a["layers"], tuple):
        a = jax.eval_shape(models.unstack_layers, a)   # a trainer's push left them unstacked
    sa = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), a)
    sb = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), b)
    return jax.tree.structure(a) == jax.tree.structure(b) and sa == sb


def _under_roots(path: str, roots: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep)
               for r in (os.path.realpath(x) for x in roots))


async def update_weights_from_disk(request: web.Request) -> web.Response:
    st = request.app[STATE]
    try:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            raise ProtocolError("update_weights_from_disk needs a string model_path")
    except ProtocolError as e:
        return error(str(e))
    path, version = body["model_path"], body.get("weight_version")
    if "\0" in path or not path:
        return error(f"model_path={path[:60]!r}; must be a non-empty path without NUL bytes")

    def failed(message: str, status: int) -> web.Response:
        return web.json_response({"success": False, "message": message,
                                  "num_paused_requests": 0}, status=status)

    if not _under_roots(path, st.weight_roots):
        roots = ", ".join(st.weight_roots) or "none: start serve with --weight-root DIR"
        return failed(f"model_path {path!r} is outside the weight roots this server was started "
                      f"with ({roots})", 403)
    async with st.weight_lock:
        try:
            # Reading safetensors is blocking file I/O; keep the event loop serving meanwhile.
            cfg, params = await asyncio.to_thread(st.load_weights or models.load_hf, path)
            if not _same_shapes(params, st.sampler.params):
                raise ValueError(f"{path} holds a different architecture than the served model")
        except Exception as e:  # any load failure is reported, the old weights keep serving
            return failed(f"Failed to update weights: {e}", 400)
        n_aborted = st.sampler.abort() if body.get("abort_all_requests") else 0
        new_version = str(version) if version is not None else st.sampler.weight_version
        st.sampler.set_params(params, weight_version=new_version)
        st.model_path = path
        st.weight_updates += 1
    message = "Succeeded to update model weights."
    if version is not None:
        message += f" Weight version updated to {version}."
    return web.json_response({"success": True, "message": message,
                              "num_paused_requests": n_aborted})


async def model_info(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return web.json_response({"model_path": st.model_path, "tokenizer_path": st.tokenizer_path,
                              "is_generation": True, "preferred_sampling_params": None,
                              "weight_version": st.sampler.weight_version})


async def server_info(request: web.Request) -> web.Response:
    st = request.app[STATE]
    s = st.sampler
    return web.json_response({
        "model_path": st.model_path, "tokenizer_path": st.tokenizer_path,
        "served_model_name": st.served_model_name, "weight_version": s.weight_version,
        "context_length": s.max_len, "max_running_requests": s.max_batch,
        "engine": "continuous",
        "internal_states": [{"outstanding_requests": s.outstanding, **s.stats,
                             "weight_updates": st.weight_updates}],
        "limits": dataclasses.asdict(st.limits), "version": "orchestrax",
    })


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    # The continuous engine's kept prefixes (freed only while idle).
    request.app[STATE].sampler.release_cache()
    return web.Response(text="Cache flushed.\n")


async def abort_request(request: web.Request) -> web.Response:
    st = request.app[STATE]
    try:
        body = await read_json(request)
    except ProtocolError as e:
        return error(str(e))
    if not isinstance(body, dict):
        return error("abort_request needs a JSON object with rid or abort_all")
    if body.get("abort_all") is True:
        st.sampler.abort()
    elif isinstance(body.get("rid"), str):
        st.sampler.abort(body["rid"])
    else:
        return error("abort_request needs rid (string) or abort_all: true")
    return web.Response(status=200)


@web.middleware
async def bearer_auth(request: web.Request, handler):
    key = request.app[STATE].api_key
    if key is not None and request.path not in OPEN_PATHS:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            return error("missing or wrong bearer token (Authorization: Bearer <key>)", 401)
    return await handler(request)


@web.middleware
async def named_500(request: web.Request, handler):
    """An unexpected failure answers 500 with its type and message (an engine fault, or one
    request's row failing alone), unless a stream already started (it ends the stream)."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:
        if request.get(STREAM_STARTED):
            raise
        if not isinstance(e, EngineFault):   # the sampler logged an engine fault once
            log.exception("%s %s failed", request.method, request.path)
        return error(f"{type(e).__name__}: {e}", 500)


def make_app(state: ServerState) -> web.Application:
    # Bodies over the limit get 413 from aiohttp before they are read.
    app = web.Application(client_max_size=state.limits.max_body_bytes,
                          middlewares=[bearer_auth, named_500])
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
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    rl_routes.add_routes(app)

    async def close_sampler(app: web.Application) -> None:
        await state.sampler.aclose()
    app.on_cleanup.append(close_sampler)
    return app


async def start(state: ServerState, *, host: str = "127.0.0.1", port: int = 0) -> web.AppRunner:
    """Start serving on (host, port) inside the running loop; port 0 picks a free one (read it
    back with `bound_port(runner)`). A client that disconnects cancels its handler
    (handler_cancellation), which drops its requests; idle connections close after
    `limits.idle_timeout_s`."""
    runner = web.AppRunner(make_app(state), handle_signals=False, handler_cancellation=True,
                           keepalive_timeout=state.limits.idle_timeout_s)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    return runner.addresses[0][1]
