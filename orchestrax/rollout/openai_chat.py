"""OpenAI-compatible `/v1/chat/completions` over the embedded sampler, so a served model can be
an LLM-as-tool. The prompt is the tokenizer's own chat template; generation stops on the
tokenizer's end-of-turn/eos ids; `usage` counts tokens exactly as sampled.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from orchestrax.rollout.base import GenerateRequest, SamplingParams
from orchestrax.rollout.protocol import ProtocolError, check_body
from orchestrax.rollout.server import STATE, ServerState, error, read_json

ALLOWED_KEYS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature",
                "top_p", "top_k", "n", "seed", "stop_token_ids", "tools", "tool_choice",
                "chat_template_kwargs", "stream", "user")
DEFAULT_MAX_TOKENS = 512


def _stop_ids(tokenizer: Any) -> tuple[int, ...]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return tuple(sorted(ids))


def parse_chat(body: Any, tokenizer: Any, chat_template: str | None = None
               ) -> tuple[list[int], SamplingParams, int]:
    """-> (prompt ids, sampling params, n). Raises ProtocolError naming the bad field."""
    check_body(body, "chat completion", ALLOWED_KEYS)
    if body.get("stream"):
        raise ProtocolError("stream=true is not supported on /v1/chat/completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and "role" in m for m in messages):
        raise ProtocolError("messages must be a non-empty list of {role, content} objects")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ProtocolError("chat_template_kwargs must be an object")
    tools = body.get("tools") if body.get("tool_choice", "auto") != "none" else None
    try:
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                            tokenize=True, chat_template=chat_template, **kwargs)
    except Exception as e:  # template errors (bad roles, bad content) are the caller's input
        raise ProtocolError(f"messages could not be rendered by the chat template: {e}") from None
    if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    n = body.get("n") or 1
    if not isinstance(n, int) or n < 1:
        raise ProtocolError(f"n={n!r}; must be an integer >= 1")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    temperature = body.get("temperature")
    try:
        sp = SamplingParams(
            temperature=1.0 if temperature is None else float(temperature),
            top_p=float(body.get("top_p") if body.get("top_p") is not None else 1.0),
            top_k=int(body.get("top_k") if body.get("top_k") is not None else -1),
            max_new_tokens=int(max_tokens),
            stop_token_ids=tuple(sorted(set(_stop_ids(tokenizer))
                                        | set(body.get("stop_token_ids") or ()))),
            sampling_seed=body.get("seed"))
    except (TypeError, ValueError) as e:
        raise ProtocolError(str(e)) from None
    return list(ids), sp, n


async def chat_completions(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    if st.tokenizer is None:
        return error("/v1/chat/completions needs a tokenizer; start the server with one")
    try:
        ids, sp, n = parse_chat(await read_json(request), st.tokenizer, st.chat_template)
        reqs = [GenerateRequest(input_ids=tuple(ids), rid=uuid.uuid4().hex,
                                sampling=sp if sp.sampling_seed is None or j == 0 else
                                SamplingParams(**{**sp.__dict__,
                                                  "sampling_seed": sp.sampling_seed + j}))
                for j in range(n)]
        results = await st.sampler.generate(reqs)
    except (ProtocolError, ValueError) as e:
        return error(str(e))
    stops = set(sp.stop_token_ids)
    choices, completion = [], 0
    for j, res in enumerate(results):
        completion += len(res.output_ids)
        body_ids = [t for t in res.output_ids if t not in stops]
        choices.append({"index": j, "logprobs": None, "finish_reason": res.finish_reason,
                        "message": {"role": "assistant", "content": st.decode(body_ids),
                                    "tool_calls": None}})
    return web.json_response({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": st.served_model_name, "choices": choices,
        "usage": {"prompt_tokens": len(ids), "completion_tokens": completion,
                  "total_tokens": len(ids) + completion},
    })


async def list_models(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    return web.json_response({"object": "list", "data": [
        {"id": st.served_model_name, "object": "model", "owned_by": "orchestrax",
         "root": st.served_model_name, "max_model_len": st.sampler.max_len}]})
