"""SGLang native `/generate` wire format, shared by the HTTP client and `orchestrax serve`.

Field names follow SGLang's `GenerateReqInput` (managers/io_struct.py), `SamplingParams`
(sampling/sampling_params.py) and the finish-reason `to_json` of managers/schedule_batch.py:
`{"type": "stop", "matched": id}`, `{"type": "length", "length": n}`, `{"type": "abort", ...}`.
`meta_info.output_token_logprobs` is a list of `[logprob, token_id, text_or_null]`;
`input_token_logprobs` (asked with `logprob_start_len` >= 0) the same for the prompt from that
position on, the first entry's logprob null. `max_new_tokens=0` scores the prompt only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from orchestrax.rollout.sampler import (MAX_TOKEN_ID, MAX_TOP_LOGPROBS, GenerateRequest,
                                     GenerateResult, SamplingParams)
from orchestrax.rollout.validate import (ProtocolError, ServeLimits, boolean, integer, number,
                                         optional, token_ids, unicode_text)

# Sampling keys the embedded sampler implements (`stop` strings are matched by the server).
SUPPORTED_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids",
                           "sampling_seed", "n", "presence_penalty", "frequency_penalty", "stop",
                           "no_stop_trim", "stream_interval")
# Further SGLang sampling keys, accepted only at their SGLang default (where they change nothing),
# so clients that send a full parameter dict still work.
NEUTRAL_SAMPLING_DEFAULTS: dict[str, Any] = {
    "min_p": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0, "ignore_eos": False,
    "skip_special_tokens": True, "spaces_between_special_tokens": True, "stop_regex": None,
    "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None, "logit_bias": None,
    "custom_params": None,
}
ALLOWED_SAMPLING_KEYS = SUPPORTED_SAMPLING_KEYS + tuple(NEUTRAL_SAMPLING_DEFAULTS)
# SGLang `/generate` keys whose meaning this server cannot honour: refused when set. Other
# unknown top-level keys are ignored, as SGLang's request model does (sglang-router adds `model`).
UNSUPPORTED_GENERATE_KEYS = ("image_data", "video_data", "audio_data", "input_embeds",
                             "lora_path", "lora_id", "return_hidden_states",
                             "custom_logit_processor", "session_params")
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when the key is absent
_GREEDY_EPS = 1e-6                   # SGLang treats temperature below this as greedy
MAX_TEMPERATURE = 100.0
MAX_STOP_CHARS = 1000


def sampling_to_json(sp: SamplingParams) -> dict[str, Any]:
    """SamplingParams -> SGLang `sampling_params` dict (no `n`)."""
    d: dict[str, Any] = {"max_new_tokens": sp.max_new_tokens, "temperature": sp.temperature,
                         "top_p": sp.top_p, "top_k": sp.top_k}
    if sp.stop_token_ids:
        d["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.sampling_seed is not None:
        d["sampling_seed"] = sp.sampling_seed
    for key in ("presence_penalty", "frequency_penalty"):
        if getattr(sp, key):
            d[key] = getattr(sp, key)
    return d


def _is_neutral(key: str, value: Any) -> bool:
    default = NEUTRAL_SAMPLING_DEFAULTS[key]
    return value == default or (default is None and value in ([], "", {}))


def stop_strings(value: Any, name: str, limits: ServeLimits) -> tuple[str, ...]:
    """OpenAI/SGLang `stop`: null, one string or a list of strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > limits.max_stop or not all(
            isinstance(x, str) and 0 < len(x) <= MAX_STOP_CHARS for x in items):
        raise ProtocolError(f"{name} must be a string or a list of at most {limits.max_stop} "
                            f"non-empty strings of at most {MAX_STOP_CHARS} characters")
    return tuple(items)


def sampling_params(*, temperature: Any = None, top_p: Any = None, top_k: Any = None,
                    max_new_tokens: Any = None, stop_token_ids: Any = None, seed: Any = None,
                    presence_penalty: Any = None, frequency_penalty: Any = None,
                    vocab_size: int, limits: ServeLimits, prefix: str = "",
                    names: dict[str, str] | None = None) -> SamplingParams:
    """Checked JSON values -> SamplingParams; errors name `prefix + field` (or `names[field]`)."""
    def name(key: str) -> str:
        return prefix + (names or {}).get(key, key)

    t = 1.0 if temperature is None else number(temperature, name("temperature"), lo=0.0,
                                               hi=MAX_TEMPERATURE)
    stops = () if stop_token_ids is None else stop_token_ids
    if not isinstance(stops, list) and stops != ():
        raise ProtocolError(f"{name('stop_token_ids')} must be a list of token ids")
    if len(stops) > limits.max_stop:
        raise ProtocolError(f"{name('stop_token_ids')} has {len(stops)} ids; at most "
                            f"{limits.max_stop}")
    for i, tok in enumerate(stops):
        integer(tok, f"{name('stop_token_ids')}[{i}]", lo=0, hi=min(vocab_size - 1, MAX_TOKEN_ID))
    return SamplingParams(
        temperature=0.0 if t < _GREEDY_EPS else t,
        top_p=1.0 if top_p is None else number(top_p, name("top_p"), lo=0.0, hi=1.0,
                                               lo_open=True),
        # Every integer here reaches an int32 device array: bounded so none can overflow it.
        top_k=-1 if top_k is None or top_k == -1 else integer(
            top_k, name("top_k"), lo=1, hi=min(vocab_size, MAX_TOKEN_ID)),
        max_new_tokens=(SGLANG_DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None
                        else integer(max_new_tokens, name("max_new_tokens"), lo=1,
                                     hi=MAX_TOKEN_ID)),
        stop_token_ids=tuple(sorted(set(stops))),
        sampling_seed=None if seed is None else integer(seed, name("sampling_seed"),
                                                        lo=-2**63, hi=2**63 - 1),
        presence_penalty=0.0 if presence_penalty is None else number(
            presence_penalty, name("presence_penalty"), lo=-2.0, hi=2.0),
        frequency_penalty=0.0 if frequency_penalty is None else number(
            frequency_penalty, name("frequency_penalty"), lo=-2.0, hi=2.0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParsedSampling:
    params: SamplingParams
    n: int
    stop: tuple[str, ...]       # stop strings, matched on the decoded text by the server
    no_stop_trim: bool
    score_only: bool = False    # max_new_tokens=0: nothing is generated (prompt logprobs only)


def parse_sampling_params(d: Any, *, vocab_size: int = MAX_TOKEN_ID + 1,
                          limits: ServeLimits = ServeLimits(), prefix: str = "sampling_params."
                          ) -> ParsedSampling:
    """SGLang `sampling_params` dict -> ParsedSampling. Raises ProtocolError naming the key."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ProtocolError(f"{prefix.rstrip('.')} must be an object, got {type(d).__name__}")
    for key, value in d.items():
        if key not in ALLOWED_SAMPLING_KEYS:
            raise ProtocolError(f"unknown {prefix}{key!r}; allowed: "
                                f"{', '.join(ALLOWED_SAMPLING_KEYS)}")
        if key in NEUTRAL_SAMPLING_DEFAULTS and not _is_neutral(key, value):
            what = ("constrained decoding is not supported" if key in
                    ("json_schema", "regex", "ebnf", "structural_tag") else "is not supported")
            raise ProtocolError(f"{prefix}{key}={value!r}: {what} (only its default "
                                f"{NEUTRAL_SAMPLING_DEFAULTS[key]!r}); supported keys: "
                                f"{', '.join(SUPPORTED_SAMPLING_KEYS)}")
    optional(d, "stream_interval", integer, None, name=prefix + "stream_interval", lo=1)
    score_only = d.get("max_new_tokens") == 0 and not isinstance(d.get("max_new_tokens"), bool)
    sp = sampling_params(temperature=d.get("temperature"), top_p=d.get("top_p"),
                         top_k=d.get("top_k"),
                         max_new_tokens=1 if score_only else d.get("max_new_tokens"),
                         stop_token_ids=d.get("stop_token_ids"), seed=d.get("sampling_seed"),
                         presence_penalty=d.get("presence_penalty"),
                         frequency_penalty=d.get("frequency_penalty"),
                         vocab_size=vocab_size, limits=limits, prefix=prefix)
    return ParsedSampling(
        params=sp, n=optional(d, "n", integer, 1, name=prefix + "n", lo=1, hi=limits.max_n),
        stop=stop_strings(d.get("stop"), prefix + "stop", limits),
        no_stop_trim=optional(d, "no_stop_trim", boolean, False, name=prefix + "no_stop_trim"),
        score_only=score_only)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateItem:
    """One request of a `/generate` call, after `n` expansion (prompt-major)."""
    request: GenerateRequest
    stop: tuple[str, ...]
    no_stop_trim: bool
    return_logprob: bool
    logprob_start_len: int = -1     # -1: no prompt logprobs
    score_only: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateCall:
    """One parsed `/generate` body. Text prompts stay text until the server tokenises them
    (off the event loop, after every limit was checked): `items(ids)` builds the requests."""
    prompts: tuple[tuple[int, ...] | str, ...]
    sampling: tuple[ParsedSampling, ...]        # per prompt
    rids: tuple[str | None, ...]                # per prompt
    return_logprob: tuple[bool, ...]            # per prompt
    top_logprobs_num: tuple[int, ...]           # per prompt
    logprob_start_len: tuple[int, ...]          # per prompt; -1: output logprobs only
    batched: bool                               # answer with a list
    return_text_in_logprobs: bool
    stream: bool

    def items(self, ids: Sequence[tuple[int, ...]]) -> list[GenerateItem]:
        out = []
        for i, (prompt_ids, ps) in enumerate(zip(ids, self.sampling)):
            for j in range(ps.n):
                # Copies of one prompt must differ, so a given seed is offset per copy.
                sp = ps.params if j == 0 or ps.params.sampling_seed is None else \
                    dataclasses.replace(ps.params, sampling_seed=ps.params.sampling_seed + j)
                base = self.rids[i]
                rid = None if base is None else (base if ps.n == 1 else f"{base}-{j}")
                out.append(GenerateItem(
                    request=GenerateRequest(input_ids=tuple(prompt_ids), sampling=sp, rid=rid,
                                            top_logprobs=self.top_logprobs_num[i]),
                    stop=ps.stop, no_stop_trim=ps.no_stop_trim,
                    return_logprob=self.return_logprob[i],
                    logprob_start_len=(self.logprob_start_len[i] if self.return_logprob[i]
                                       else -1),
                    score_only=ps.score_only))
        return out


def _per_item(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise ProtocolError(f"{name} has {len(value)} entries for {count} prompts")
        return value
    return [value] * count


def parse_generate(body: Any, *, vocab_size: int = MAX_TOKEN_ID + 1, has_tokenizer: bool = True,
                   limits: ServeLimits = ServeLimits()) -> GenerateCall:
    """Parse and check a `/generate` JSON body; nothing is tokenised here."""
    if not isinstance(body, dict):
        raise ProtocolError("the /generate body must be a JSON object")
    for key in UNSUPPORTED_GENERATE_KEYS:
        if body.get(key) not in (None, False, [], ""):
            raise ProtocolError(f"/generate key {key!r} is not supported by this server")
    if (body.get("input_ids") is None) == (body.get("text") is None):
        raise ProtocolError("give exactly one of input_ids, text")
    prompts: list[tuple[int, ...] | str]
    if body.get("input_ids") is not None:
        raw = body["input_ids"]
        batched = isinstance(raw, list) and bool(raw) and isinstance(raw[0], list)
        prompts = ([token_ids(p, f"input_ids[{i}]", vocab_size=vocab_size)
                    for i, p in enumerate(raw)] if batched
                   else [token_ids(raw, "input_ids", vocab_size=vocab_size)])
    else:
        if not has_tokenizer:
            raise ProtocolError("text prompts need a tokenizer; start the server with one or send "
                                "input_ids")
        raw = body["text"]
        batched = isinstance(raw, list)
        prompts = raw if batched else [raw]
        if not prompts or not all(isinstance(t, str) for t in prompts):
            raise ProtocolError("text must be a string or a non-empty list of strings")
        for i, t in enumerate(prompts):
            unicode_text(t, f"text[{i}]" if batched else "text")
        chars = sum(len(t) for t in prompts)
        if chars > limits.max_text_chars:
            raise ProtocolError(f"text has {chars} characters; at most {limits.max_text_chars} "
                                "per request")
    count = len(prompts)
    if count > limits.max_requests:
        raise ProtocolError(f"{count} prompts in one call; at most {limits.max_requests}")
    sampling = [parse_sampling_params(
        sp, vocab_size=vocab_size, limits=limits,
        prefix=f"sampling_params[{i}]." if batched and isinstance(body.get("sampling_params"), list)
        else "sampling_params.")
        for i, sp in enumerate(_per_item(body.get("sampling_params"), count, "sampling_params"))]
    total = sum(s.n for s in sampling)
    if total > limits.max_requests:
        raise ProtocolError(f"prompts x n = {total} requests in one call; at most "
                            f"{limits.max_requests}")
    want_lp = [boolean(x, "return_logprob") for x in
               _per_item(body.get("return_logprob") or False, count, "return_logprob")]
    top = [integer(x, "top_logprobs_num", lo=0, hi=MAX_TOP_LOGPROBS) for x in
           _per_item(body.get("top_logprobs_num") or 0, count, "top_logprobs_num")]
    starts = [-1 if x is None else integer(x, "logprob_start_len", lo=-1, hi=MAX_TOKEN_ID)
              for x in _per_item(body.get("logprob_start_len"), count, "logprob_start_len")]
    if any(s.score_only and s.n > 1 for s in sampling):
        raise ProtocolError("sampling_params.max_new_tokens=0 scores the prompt once; n must be 1")
    rids = body.get("rid")
    if isinstance(rids, list):
        rids = _per_item(rids, count, "rid")
    else:  # SGLang expands one string into per-item ids with it as a prefix
        rids = [rids if count == 1 or rids is None else f"{rids}-{i}" for i in range(count)]
    if not all(r is None or isinstance(r, str) for r in rids):
        raise ProtocolError("rid must be a string or a list of strings")
    return GenerateCall(
        prompts=tuple(prompts), sampling=tuple(sampling), rids=tuple(rids),
        return_logprob=tuple(want_lp), top_logprobs_num=tuple(top),
        logprob_start_len=tuple(starts),
        batched=batched or total > count,
        return_text_in_logprobs=optional(body, "return_text_in_logprobs", boolean, False),
        stream=optional(body, "stream", boolean, False))


def finish_reason_json(result: GenerateResult, matched: str | None = None) -> dict[str, Any]:
    """`matched` is the stop string that ended generation, if one did."""
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": matched if matched is not None
                else result.output_ids[-1]}
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.output_ids)}
    return {"type": "abort", "message": "aborted"}


def result_to_json(result: GenerateResult, *, return_logprob: bool, rid: str,
                   text: str | None = None, matched: str | None = None, decode=None,
                   text_in_logprobs: bool = False, e2e_latency: float | None = None,
                   prompt_ids: Sequence[int] = (), prompt_logprobs: Any = None
                   ) -> dict[str, Any]:
    """GenerateResult -> SGLang response item `{text?, output_ids, meta_info}`. `text` is the
    decoded (stop-trimmed) output when the server has a tokenizer; `prompt_logprobs` a
    `PromptLogprobs` of `prompt_ids` when `logprob_start_len` asked for them."""
    def lp_text(tok: int) -> str | None:
        return decode([tok]) if (decode and text_in_logprobs) else None

    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason_json(result, matched),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.output_ids),
        "cached_tokens": result.cached_tokens,
        "weight_version": result.weight_version,
    }
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, lp_text(tok)]
                                         for lp, tok in zip(result.logprobs, result.output_ids)]
        if result.top_logprobs:
            meta["output_top_logprobs"] = [[[lp, tok, lp_text(tok)] for tok, lp in top]
                                           for top in result.top_logprobs]
        pl = prompt_logprobs
        meta["input_token_logprobs"] = [] if pl is None else [
            [lp, tok, lp_text(tok)] for lp, tok in zip(pl.logprobs, prompt_ids[pl.start:])]
        if pl is not None and pl.top:
            meta["input_top_logprobs"] = [
                None if top is None else [[lp, tok, lp_text(tok)] for tok, lp in top]
                for top in pl.top]
    out: dict[str, Any] = {"output_ids": list(result.output_ids), "meta_info": meta}
    if text is not None:
        out["text"] = text
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
                          rid=meta.get("id", request.rid),
                          cached_tokens=int(meta.get("cached_tokens") or 0))


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
