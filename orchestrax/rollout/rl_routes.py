"""The SGLang routes RL frameworks (verl, slime) call besides /generate and the weight update
from disk: `/health_generate`, `/tokenize`, `/detokenize`, `/weight_version` (alias
`/get_weight_version`), `/pause_generation` and `/continue_generation`,
`/release_memory_occupation` and `/resume_memory_occupation` (tags `kv_cache`, `weights`,
`cuda_graph`; none means all), and a 501 for the tensor / NCCL weight-update routes, whose
weights cannot come from JAX: the answer names the disk route that does the same."""

from __future__ import annotations

import logging

import jax
from aiohttp import web

from orchestrax.rollout.sampler import GenerateRequest, SamplingParams
from orchestrax.rollout.http_io import STATE, error, read_json
from orchestrax.rollout.serving import run_request
from orchestrax.rollout.validate import ProtocolError

log = logging.getLogger(__name__)
PAUSE_MODES = ("abort", "retract", "in_place")
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")   # SGLang's GPU_MEMORY_ALL_TYPES
NOT_FROM_JAX = ("/update_weights_from_tensor", "/init_weights_update_group",
                "/update_weights_from_distributed", "/destroy_weights_update_group")


async def health_generate(request: web.Request) -> web.Response:
    """200 once one token has been generated end to end (the sampler answers), else 503."""
    st = request.app[STATE]
    req = GenerateRequest(input_ids=(0,), sampling=SamplingParams(temperature=0.0,
                                                                   max_new_tokens=1),
                          rid="health_generate")
    try:
        await run_request(st, req)
    except Exception as e:  # any failure of the generate path is the answer: not healthy
        log.warning("health_generate failed: %s: %s", type(e).__name__, e)
        return web.Response(status=503, text=f"{type(e).__name__}: {e}")
    return web.Response(status=200)


async def _body(request: web.Request) -> dict:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ProtocolError("the body must be a JSON object")
    return body


async def tokenize(request: web.Request) -> web.Response:
    """{"prompt": str | [str], "add_special_tokens": bool} -> {"tokens", "count",
    "max_model_len"}; a list of prompts gives lists."""
    st = request.app[STATE]
    try:
        body = await _body(request)
        prompt, special = body.get("prompt"), body.get("add_special_tokens", True)
        many = isinstance(prompt, list)
        texts = prompt if many else [prompt]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ProtocolError("tokenize needs prompt: a string or a list of strings")
        if not isinstance(special, bool):
            raise ProtocolError("tokenize add_special_tokens must be true or false")
        if sum(map(len, texts)) > st.limits.max_text_chars:
            raise ProtocolError(f"prompt text over {st.limits.max_text_chars} characters")
    except ProtocolError as e:
        return error(str(e))
    ids = [st.tokenizer.encode(t, add_special_tokens=special) for t in texts]
    return web.json_response({"tokens": ids if many else ids[0],
                              "count": [len(i) for i in ids] if many else len(ids[0]),
                              "max_model_len": st.sampler.max_len})


async def detokenize(request: web.Request) -> web.Response:
    """{"tokens": [int]} -> {"text"} (special tokens kept, as SGLang's default)."""
    st = request.app[STATE]
    try:
        body = await _body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < len(st.tokenizer)
                for t in tokens):
            raise ProtocolError(f"detokenize needs tokens: a list of ids in "
                                f"[0, {len(st.tokenizer)})")
    except ProtocolError as e:
        return error(str(e))
    return web.json_response({"text": st.tokenizer.decode(tokens, skip_special_tokens=False)})


async def weight_version(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[STATE].sampler.weight_version})


async def not_from_jax(request: web.Request) -> web.Response:
    return web.json_response({
        "success": False,
        "message": f"{request.path} is not supported by orchestrax serve: its weights live in "
                   "JAX, not in torch tensors or an NCCL group. Write an HF safetensors directory "
                   "and POST /update_weights_from_disk {\"model_path\": DIR} instead."},
        status=501)


async def pause_generation(request: web.Request) -> web.Response:
    """{"mode": "abort" | "retract" | "in_place"}: abort ends every request now (with what it
    generated so far); retract and in_place hold them where they are (the KV cache is kept, so
    both resume without recomputing). New requests wait until /continue_generation."""
    st = request.app[STATE]
    try:
        body = await _body(request) if request.can_read_body else {}
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise ProtocolError(f"pause_generation mode={mode!r}; allowed: {', '.join(PAUSE_MODES)}")
    except ProtocolError as e:
        return error(str(e))
    st.sampler.pause()
    if mode == "abort":
        st.sampler.abort()
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    request.app[STATE].sampler.resume()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def _tags(request: web.Request) -> tuple[str, ...]:
    body = await _body(request) if request.can_read_body else {}
    tags = body.get("tags")
    if tags is None:
        return MEMORY_TAGS
    if not isinstance(tags, list) or not all(t in MEMORY_TAGS for t in tags):
        raise ProtocolError(f"tags={tags!r}; a list of {', '.join(MEMORY_TAGS)} (none: all)")
    return tuple(tags)


async def release_memory_occupation(request: web.Request) -> web.Response:
    """Free the slot cache (`kv_cache`) and/or move the weights to host memory (`weights`);
    only while no request is in flight. /generate is refused until the matching resume."""
    st = request.app[STATE]
    try:
        tags = await _tags(request)
        if st.sampler.outstanding:
            raise ProtocolError(f"{st.sampler.outstanding} requests in flight; POST "
                                "/pause_generation {\"mode\": \"abort\"} (or wait) first")
    except ProtocolError as e:
        return error(str(e))
    async with st.weight_lock:
        if "weights" in tags and "weights" not in st.released:
            params = st.sampler.params
            st.host_params = (jax.device_get(params), jax.tree.map(lambda x: x.sharding, params))
            st.sampler.drop_params()   # frees the continuous engine's slot cache with them
        if "kv_cache" in tags:
            st.sampler.release_cache()
        st.released = st.released | set(tags)
    return web.json_response(None)


async def resume_memory_occupation(request: web.Request) -> web.Response:
    """Bring back what release gave up: the same weights (and version) onto the same devices;
    the slot cache is allocated again by the next engine step."""
    st = request.app[STATE]
    try:
        tags = await _tags(request)
    except ProtocolError as e:
        return error(str(e))
    async with st.weight_lock:
        if "weights" in tags and st.host_params is not None:
            host, shardings = st.host_params
            st.sampler.set_params(jax.device_put(host, shardings),
                                  weight_version=st.sampler.weight_version)
            st.host_params = None
        st.released = st.released - set(tags)
    return web.json_response(None)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health_generate", health_generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    for path in ("/weight_version", "/get_weight_version"):
        app.router.add_get(path, weight_version)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/release_memory_occupation", release_memory_occupation)
        app.router.add_route(method, "/resume_memory_occupation", resume_memory_occupation)
    for path in NOT_FROM_JAX:
        app.router.add_post(path, not_from_jax)
