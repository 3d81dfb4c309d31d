"""OpenAI `/v1/chat/completions` wire format for `orchestrax serve`: request checks and response
and stream-chunk bodies. The server renders the prompt with the tokenizer's chat template and
runs the sampler; nothing here does I/O.

Supported: messages (with tools, `chat_template_kwargs`), max_tokens / max_completion_tokens,
temperature, top_p, n, seed, stop (strings), logprobs / top_logprobs (<= 20, real values),
presence_penalty / frequency_penalty (applied in the sampler), stream with stream_options
(include_usage), tools with tool_choice "auto" / "none" and parallel_tool_calls (Qwen3
`<tool_call>` blocks in the output become `tool_calls`), response_format {"type": "text"}, and
SGLang's extras top_k and stop_token_ids. Refused with a 400 naming the feature: constrained
decoding (response_format json_object / json_schema, tool_choice "required" or a named
function) and logit_bias. Other top-level keys are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from typing import Any, Callable, Sequence

from orchestrax.rollout.sampler import MAX_TOP_LOGPROBS, GenerateResult, SamplingParams, TopLogprobs
from orchestrax.rollout.protocol import sampling_params, stop_strings
from orchestrax.rollout.validate import (ProtocolError, ServeLimits, boolean, integer,
                                         optional, unicode_text)

DEFAULT_MAX_TOKENS = 512
# apply_chat_template's own arguments: the server sets these, a client's kwargs may not (with
# return_tensors or tokenize=False the render is no longer a list of ids).
RESERVED_TEMPLATE_KWARGS = ("conversation", "tools", "documents", "chat_template",
                            "add_generation_prompt", "continue_final_message", "tokenize",
                            "padding", "truncation", "max_length", "return_tensors",
                            "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatCall:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None      # None: render no tools, parse no tool calls
    template_kwargs: dict[str, Any]
    sampling: SamplingParams                # without the tokenizer's end-of-turn ids yet
    n: int
    stop: tuple[str, ...]
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    parallel_tool_calls: bool


def _messages(value: Any, limits: ServeLimits) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ProtocolError("messages must be a non-empty list of {role, content} objects")
    chars = 0
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ProtocolError(f"messages[{i}] must be an object with a string role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text can be rendered
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise ProtocolError(f"messages[{i}].content[{j}]: only text parts are "
                                        "supported")
                chars += len(unicode_text(part["text"], f"messages[{i}].content[{j}].text"))
        elif isinstance(content, str):
            chars += len(unicode_text(content, f"messages[{i}].content"))
        elif content is not None:
            raise ProtocolError(f"messages[{i}].content must be a string, a list of text parts "
                                "or null")
        chars += len(json.dumps(m.get("tool_calls"))) if m.get("tool_calls") else 0
    if chars > limits.max_text_chars:
        raise ProtocolError(f"messages hold {chars} characters; at most {limits.max_text_chars} "
                            "per request")
    return value


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) for t in tools)):
        raise ProtocolError("tools must be a list of tool objects")
    if choice not in (None, "auto", "none"):
        raise ProtocolError(f"tool_choice={choice!r} would need constrained decoding, which "
                            "this server does not support; use 'auto' or 'none'")
    return None if not tools or choice == "none" else tools


def parse_chat(body: Any, *, vocab_size: int, limits: ServeLimits = ServeLimits()) -> ChatCall:
    """Check a chat-completion body (nothing is tokenised). Raises ProtocolError naming the
    field."""
    if not isinstance(body, dict):
        raise ProtocolError("the chat completion body must be a JSON object")
    messages = _messages(body.get("messages"), limits)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise ProtocolError(f"response_format={fmt!r}: constrained decoding (json_object, "
                            "json_schema) is not supported; use {'type': 'text'} or leave it out")
    if body.get("logit_bias"):
        raise ProtocolError("logit_bias is not supported")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ProtocolError("chat_template_kwargs must be an object")
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise ProtocolError(f"chat_template_kwargs.{key} is set by the server; template "
                                "variables may not use the names "
                                f"{', '.join(RESERVED_TEMPLATE_KWARGS)}")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    sp = sampling_params(
        temperature=body.get("temperature"), top_p=body.get("top_p"), top_k=body.get("top_k"),
        max_new_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        stop_token_ids=body.get("stop_token_ids"), seed=body.get("seed"),
        presence_penalty=body.get("presence_penalty"),
        frequency_penalty=body.get("frequency_penalty"), vocab_size=vocab_size, limits=limits,
        names={"max_new_tokens": ("max_completion_tokens" if "max_completion_tokens" in body
                                  and body["max_completion_tokens"] is not None
                                  else "max_tokens"), "sampling_seed": "seed"})
    logprobs = optional(body, "logprobs", boolean, False)
    top = optional(body, "top_logprobs", integer, 0, lo=0, hi=MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise ProtocolError("top_logprobs needs logprobs=true")
    stream = optional(body, "stream", boolean, False)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ProtocolError("stream_options must be an object")
    return ChatCall(
        messages=messages, tools=_tools(body), template_kwargs=kwargs, sampling=sp,
        n=optional(body, "n", integer, 1, lo=1, hi=limits.max_n),
        stop=stop_strings(body.get("stop"), "stop", limits), logprobs=logprobs,
        top_logprobs=top, stream=stream,
        include_usage=stream and optional(opts or {}, "include_usage", boolean, False,
                                          name="stream_options.include_usage"),
        parallel_tool_calls=optional(body, "parallel_tool_calls", boolean, True))


def split_tool_calls(text: str, parallel: bool) -> tuple[str | None, list[dict[str, Any]]]:
    """Qwen3 `<tool_call>{"name", "arguments"}</tool_call>` blocks -> OpenAI `tool_calls`; the
    rest is the content (None when empty). A block that is not a valid call stays content.
    Without `parallel`, only the first call is kept."""
    calls, spans = [], []
    for m in _TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
                and isinstance(obj.get("arguments", {}), dict)):
            continue
        spans.append(m.span())
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": json.dumps(obj.get("arguments", {}))}})
    if not parallel:
        calls = calls[:1]
    rest, last = [], 0
    for a, b in spans:
        rest.append(text[last:a])
        last = b
    content = ("".join(rest) + text[last:]).strip()
    return content or None, calls


def logprobs_json(output_ids: Sequence[int], logprobs: Sequence[float],
                  top_logprobs: Sequence[TopLogprobs], start: int, top: int,
                  token_text: Callable[[int], str]) -> dict[str, Any]:
    """OpenAI `choices[i].logprobs` for the output tokens from `start` on."""
    def entry(tok: int, lp: float) -> dict[str, Any]:
        text = token_text(tok)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for i in range(start, len(output_ids)):
        item = entry(output_ids[i], logprobs[i])
        item["top_logprobs"] = [entry(tok, lp) for tok, lp in top_logprobs[i][:top]] if top else []
        content.append(item)
    return {"content": content}


def finish_reason(result: GenerateResult, matched_stop: bool, has_tool_calls: bool) -> str:
    if has_tool_calls:
        return "tool_calls"
    return "stop" if result.finish_reason == "stop" or matched_stop else (
        "length" if result.finish_reason == "length" else "abort")


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion_json(cid: str, model: str, choices: list[dict[str, Any]], prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def chunk_json(cid: str, model: str, choices: list[dict[str, Any]],
               usage: dict[str, int] | None = None) -> dict[str, Any]:
    out = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
           "model": model, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out
