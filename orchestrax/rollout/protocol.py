"""SGLang native `/generate` wire format, shared by the HTTP client and `orchestrax serve`.

Field names follow SGLang's `GenerateReqInput` (managers/io_struct.py), `SamplingParams`
(sampling/sampling_params.py) and the finish-reason `to_json` of managers/schedule_batch.py:
`{"type": "stop", "matched": id}`, `{"type": "length", "length": n}`, `{"type": "abort", ...}`.
`meta_info.output_token_logprobs` is a list of `[logprob, token_id, text_or_null]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from orchestrax.rollout.base import GenerateRequest, GenerateResult, SamplingParams

# Sampling keys the embedded sampler implements.
SUPPORTED_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids",
                           "sampling_seed", "n")
# Further SGLang sampling keys, accepted only at their SGLang default (where they change nothing),
# so clients that send a full parameter dict still work.
NEUTRAL_SAMPLING_DEFAULTS: dict[str, Any] = {
    "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "min_new_tokens": 0, "ignore_eos": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "no_stop_trim": False, "stop": None, "stop_regex": None,
    "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None, "logit_bias": None,
    "custom_params": None, "stream_interval": None,
}
ALLOWED_SAMPLING_KEYS = SUPPORTED_SAMPLING_KEYS + tuple(NEUTRAL_SAMPLING_DEFAULTS)
# Top-level `/generate` keys this server understands (a subset of GenerateReqInput).
ALLOWED_GENERATE_KEYS = ("text", "input_ids", "sampling_params", "return_logprob",
                         "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
                         "stream", "rid")
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when the key is absent
_GREEDY_EPS = 1e-6                   # SGLang treats temperature below this as greedy


class ProtocolError(ValueError):
    """A request that does not fit the supported API; the server answers 400 with the message."""


def sampling_to_json(sp: SamplingParams) -> dict[str, Any]:
    """SamplingParams -> SGLang `sampling_params` dict (no `n`)."""
    d: dict[str, Any] = {"max_new_tokens": sp.max_new_tokens, "temperature": sp.temperature,
                         "top_p": sp.top_p, "top_k": sp.top_k}
    if sp.stop_token_ids:
        d["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.sampling_seed is not None:
        d["sampling_seed"] = sp.sampling_seed
    return d


def _is_neutral(key: str, value: Any) -> bool:
    default = NEUTRAL_SAMPLING_DEFAULTS[key]
    return value == default or (default is None and value in ([], "", {}))


def parse_sampling_params(d: dict[str, Any] | None) -> tuple[SamplingParams, int]:
    """SGLang `sampling_params` dict -> (SamplingParams, n). Raises ProtocolError naming the key."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ProtocolError(f"sampling_params must be an object, got {type(d).__name__}")
    for key, value in d.items():
        if key not in ALLOWED_SAMPLING_KEYS:
            raise ProtocolError(f"unknown sampling_params key {key!r}; allowed: "
                                f"{', '.join(ALLOWED_SAMPLING_KEYS)}")
        if key in NEUTRAL_SAMPLING_DEFAULTS and not _is_neutral(key, value):
            raise ProtocolError(f"sampling_params.{key}={value!r} is not supported (only its default "
                                f"{NEUTRAL_SAMPLING_DEFAULTS[key]!r}); supported keys: "
                                f"{', '.join(SUPPORTED_SAMPLING_KEYS)}")
    n = d.get("n") if d.get("n") is not None else 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ProtocolError(f"sampling_params.n={n!r}; must be an integer >= 1")
    temperature = float(d["temperature"]) if d.get("temperature") is not None else 1.0
    if 0 <= temperature < _GREEDY_EPS:
        temperature = 0.0
    top_k = d.get("top_k") if d.get("top_k") is not None else -1
    stop = d.get("stop_token_ids") or ()
    seed = d.get("sampling_seed")
    try:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop):
            raise ValueError(f"SamplingParams.stop_token_ids={stop!r}; must be a list of ints")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"SamplingParams.sampling_seed={seed!r}; must be an int or null")
        max_new = d.get("max_new_tokens")
        sp = SamplingParams(
            temperature=temperature,
            top_p=float(d["top_p"]) if d.get("top_p") is not None else 1.0,
            top_k=int(top_k),
            max_new_tokens=int(max_new) if max_new is not None else SGLANG_DEFAULT_MAX_NEW_TOKENS,
            stop_token_ids=tuple(sorted(set(stop))),
            sampling_seed=seed)
    except (TypeError, ValueError) as e:
        raise ProtocolError(str(e)) from None
    return sp, n


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateCall:
    """One parsed `/generate` body: requests expanded `n` times (prompt-major), plus options."""

    requests: tuple[GenerateRequest, ...]
    batched: bool                 # the body held a list of prompts: answer with a list
    return_logprob: tuple[bool, ...]
    return_text_in_logprobs: bool
    stream: bool


def _per_item(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise ProtocolError(f"{name} has {len(value)} entries for {count} prompts")
        return value
    return [value] * count


def _ids(x: Any, name: str) -> tuple[int, ...]:
    if not isinstance(x, list) or not x or not all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in x):
        raise ProtocolError(f"{name} must be a non-empty list of token ids")
    return tuple(x)


def check_body(body: Any, what: str, allowed: Sequence[str]) -> None:
    """A JSON object whose keys are all in `allowed`; else ProtocolError naming the bad key."""
    if not isinstance(body, dict):
        raise ProtocolError(f"the {what} body must be a JSON object")
    for key in body:
        if key not in allowed:
            raise ProtocolError(f"unknown {what} key {key!r}; allowed: {', '.join(allowed)}")


def parse_generate(body: Any, *, encode=None) -> GenerateCall:
    """Parse a `/generate` JSON body. `encode(text) -> ids` is needed only for `text` prompts."""
    check_body(body, "/generate", ALLOWED_GENERATE_KEYS)
    if (body.get("logprob_start_len") not in (None, -1)
            or body.get("top_logprobs_num") not in (None, 0)):
        raise ProtocolError("only output-token logprobs are supported: logprob_start_len must be "
                            "-1 and top_logprobs_num 0")
    if (body.get("input_ids") is None) == (body.get("text") is None):
        raise ProtocolError("give exactly one of input_ids, text")
    if body.get("input_ids") is not None:
        raw = body["input_ids"]
        batched = isinstance(raw, list) and bool(raw) and isinstance(raw[0], list)
        prompts = [_ids(p, f"input_ids[{i}]") for i, p in enumerate(raw)] if batched \
            else [_ids(raw, "input_ids")]
    else:
        if encode is None:
            raise ProtocolError("text prompts need a tokenizer; start the server with one or send "
                                "input_ids")
        raw = body["text"]
        batched = isinstance(raw, list)
        texts = raw if batched else [raw]
        if not all(isinstance(t, str) for t in texts):
            raise ProtocolError("text must be a string or a list of strings")
        prompts = [tuple(encode(t)) for t in texts]
    count = len(prompts)
    sampling = _per_item(body.get("sampling_params"), count, "sampling_params")
    want_lp = _per_item(body.get("return_logprob") or False, count, "return_logprob")
    rids = body.get("rid")
    if isinstance(rids, list):
        rids = _per_item(rids, count, "rid")
    else:  # SGLang expands one string into per-item ids with it as a prefix
        rids = [rids if count == 1 or rids is None else f"{rids}-{i}" for i in range(count)]
    requests, lps = [], []
    for i, (ids, sp_json) in enumerate(zip(prompts, sampling)):
        sp, n = parse_sampling_params(sp_json)
        batched = batched or n > 1
        for j in range(n):
            # Copies of one prompt must differ, so a given seed is offset per copy.
            sp_j = sp if j == 0 or sp.sampling_seed is None \
                else dataclasses.replace(sp, sampling_seed=sp.sampling_seed + j)
            base = rids[i] if isinstance(rids[i], str) else None
            rid = None if base is None else (base if n == 1 else f"{base}-{j}")
            requests.append(GenerateRequest(input_ids=ids, sampling=sp_j, rid=rid))
            lps.append(bool(want_lp[i]))
    return GenerateCall(requests=tuple(requests), batched=batched, return_logprob=tuple(lps),
                        return_text_in_logprobs=bool(body.get("return_text_in_logprobs")),
                        stream=bool(body.get("stream")))


def finish_reason_json(result: GenerateResult, message: str = "") -> dict[str, Any]:
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": result.output_ids[-1]}
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.output_ids)}
    return {"type": "abort", "message": message or "aborted"}


def result_to_json(result: GenerateResult, *, return_logprob: bool, rid: str,
                   decode=None, text_in_logprobs: bool = False,
                   e2e_latency: float | None = None) -> dict[str, Any]:
    """GenerateResult -> SGLang response item `{text?, output_ids, meta_info}`."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason_json(result),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.output_ids),
        "cached_tokens": 0,
        "weight_version": result.weight_version,
    }
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, tok, decode([tok]) if (decode and text_in_logprobs) else None]
            for lp, tok in zip(result.logprobs, result.output_ids)]
    out: dict[str, Any] = {"output_ids": list(result.output_ids), "meta_info": meta}
    if decode is not None:
        out["text"] = decode(list(result.output_ids))
    return out


def result_from_json(item: dict[str, Any], *, request: GenerateRequest) -> GenerateResult:
    """SGLang response item -> GenerateResult. Needs `return_logprob` to have been set."""
    try:
        meta = item["meta_info"]
        lp_triples = meta["output_token_logprobs"]
        ids = item.get("output_ids")
        if ids is None:  # some SGLang versions only return ids inside the logprob triples
            ids = [t[1] for t in lp_triples]
        if [t[1] for t in lp_triples] != list(ids):
            raise ProtocolError("output_token_logprobs token ids disagree with output_ids")
        reason = meta["finish_reason"]["type"] if meta.get("finish_reason") else "abort"
    except (KeyError, TypeError, IndexError) as e:
        raise ProtocolError(f"malformed /generate response item: missing {e}") from None
    if reason not in ("stop", "length", "abort"):
        raise ProtocolError(f"finish_reason.type={reason!r}; expected stop, length or abort")
    return GenerateResult(output_ids=tuple(ids), logprobs=tuple(float(t[0]) for t in lp_triples),
                          finish_reason=reason,
                          prompt_tokens=int(meta.get("prompt_tokens", len(request.input_ids))),
                          weight_version=str(meta.get("weight_version", "")),
                          rid=meta.get("id", request.rid))


def request_to_json(requests: Sequence[GenerateRequest]) -> dict[str, Any]:
    """A batch of requests -> one SGLang `/generate` body (batched form, logprobs on)."""
    body: dict[str, Any] = {
        "input_ids": [list(r.input_ids) for r in requests],
        "sampling_params": [sampling_to_json(r.sampling) for r in requests],
        "return_logprob": True,
    }
    if all(r.rid is not None for r in requests):
        body["rid"] = [r.rid for r in requests]
    return body
