"""OpenAI's legacy `/v1/completions` on `orchestrax serve`: raw prompts (text, a list of texts,
ids or a list of id lists), `echo` and `logprobs` (an int, alternatives per position), so
loglikelihood scorers (lm-eval's `local-completions`) work. `echo` with `logprobs` reports the
prompt's tokens too, the first with a null logprob, as OpenAI does; `max_tokens=0` with `echo`
scores the prompt alone. Not supported (400 naming it): stream, suffix, best_of > 1,
logit_bias."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any

from aiohttp import web

from orchestrax.rollout.sampler import MAX_TOP_LOGPROBS, GenerateRequest
from orchestrax.rollout.chat_route import _end_of_turn_ids
from orchestrax.rollout.http_io import STATE, client_of, error, json_response, read_json
from orchestrax.rollout.protocol import sampling_params, stop_strings
from orchestrax.rollout.serving import run_request
from orchestrax.rollout.validate import ProtocolError, boolean, integer, optional, token_ids

DEFAULT_MAX_TOKENS = 16   # OpenAI's


def _prompts(value: Any, vocab_size: int) -> list[str | tuple[int, ...]]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return [tuple(token_ids(value, "prompt", vocab_size=vocab_size))]
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return list(value)
    if isinstance(value, list) and value and all(isinstance(x, list) for x in value):
        return [tuple(token_ids(x, f"prompt[{i}]", vocab_size=vocab_size))
                for i, x in enumerate(value)]
    raise ProtocolError("prompt must be a string, a list of strings, a list of token ids or a "
                        "list of token id lists")


def _logprobs_json(tokens, lps, tops, offset0: int, text_of) -> dict[str, Any]:
    texts = [text_of(t) for t in tokens]
    offsets, at = [], offset0
    for t in texts:
        offsets.append(at)
        at += len(t)
    return {"tokens": texts, "token_logprobs": list(lps),
            "top_logprobs": [None if top is None else {text_of(tok): lp for tok, lp in top}
                             for top in tops],
            "text_offset": offsets}


async def completions(request: web.Request) -> web.Response:
    st = request.app[STATE]
    if st.tokenizer is None:
        return error("/v1/completions needs a tokenizer; start the server with one")
    try:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ProtocolError("the completion body must be a JSON object")
        for key, ok in (("stream", not body.get("stream")), ("suffix", not body.get("suffix")),
                        ("best_of", body.get("best_of") in (None, 1)),
                        ("logit_bias", not body.get("logit_bias"))):
            if not ok:
                raise ProtocolError(f"{key}={body[key]!r} is not supported by /v1/completions")
        prompts = _prompts(body.get("prompt"), st.sampler.cfg.vocab_size)
        if len(prompts) > st.limits.max_requests:
            raise ProtocolError(f"{len(prompts)} prompts; at most {st.limits.max_requests}")
        texts = [p for p in prompts if isinstance(p, str)]
        tokenized = iter(await st.tokenize(texts, "prompt") if texts else [])
        ids = [next(tokenized) if isinstance(p, str) else p for p in prompts]
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        echo = optional(body, "echo", boolean, False)
        top = body.get("logprobs")
        top = None if top is None else integer(top, "logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
        score_only = max_tokens == 0 and not isinstance(max_tokens, bool)
        if score_only and not echo:
            raise ProtocolError("max_tokens=0 generates nothing; it needs echo=true")
        sp = sampling_params(
            temperature=body.get("temperature"), top_p=body.get("top_p"),
            top_k=body.get("top_k"), max_new_tokens=1 if score_only else max_tokens,
            stop_token_ids=body.get("stop_token_ids"), seed=body.get("seed"),
            presence_penalty=body.get("presence_penalty"),
            frequency_penalty=body.get("frequency_penalty"), vocab_size=st.sampler.cfg.vocab_size,
            limits=st.limits, names={"max_new_tokens": "max_tokens", "sampling_seed": "seed"})
        sp = dataclasses.replace(sp, stop_token_ids=tuple(sorted(
            _end_of_turn_ids(st.tokenizer) | set(sp.stop_token_ids))))
        n = optional(body, "n", integer, 1, lo=1, hi=st.limits.max_n)
        if score_only and n > 1:
            raise ProtocolError("max_tokens=0 scores each prompt once; n must be 1")
        stop = stop_strings(body.get("stop"), "stop", st.limits)
        reqs = [[GenerateRequest(input_ids=tuple(p), rid=uuid.uuid4().hex, top_logprobs=top or 0,
                                 sampling=sp if sp.sampling_seed is None or j == 0 else
                                 dataclasses.replace(sp, sampling_seed=sp.sampling_seed + j))
                 for j in range(n)] for p in ids]
        st.admit([r for rs in reqs for r in rs])
        if st.released:
            raise ProtocolError("memory released; POST /resume_memory_occupation first")
    except ProtocolError as e:
        return error(str(e))
    await st.sampler.unpaused.wait()
    client = client_of(request)
    scored = (await st.scorer.ascore(ids, [0] * len(ids), [top or 0] * len(ids))
              if echo and top is not None else [None] * len(ids))
    if score_only:
        done = [[None] for _ in ids]
    else:
        flat = await asyncio.gather(*(run_request(st, r, stop, client=client)
                                      for rs in reqs for r in rs))
        done = [flat[i * n:(i + 1) * n] for i in range(len(ids))]

    def text_of(tok: int) -> str:
        return st.tokenizer.decode([tok])

    choices, used = [], 0
    for i, (p, prompt_ids) in enumerate(zip(prompts, ids)):
        prompt_text = p if isinstance(p, str) else st.tokenizer.decode(list(prompt_ids))
        for j, u in enumerate(done[i]):
            out_ids = () if u is None else u.output_ids
            used += len(out_ids)
            text = "" if u is None else u.final_text
            lp = None
            if top is not None:
                out_tops = list(u.top_logprobs) if u is not None and top else [()] * len(out_ids)
                lp = _logprobs_json(out_ids, () if u is None else u.logprobs, out_tops,
                                    len(prompt_text) if echo else 0, text_of)
                if echo:
                    pl = scored[i]
                    head = _logprobs_json(prompt_ids, pl.logprobs, list(pl.top) if top else
                                          [None] + [()] * (len(prompt_ids) - 1), 0, text_of)
                    lp = {k: head[k] + lp[k] for k in lp}
            reason = "length" if u is None else (
                "stop" if u.result.finish_reason == "stop" or u.matched is not None else
                "length" if u.result.finish_reason == "length" else "abort")
            choices.append({"index": i * n + j, "text": (prompt_text if echo else "") + text,
                            "logprobs": lp, "finish_reason": reason})
    prompt_tokens = sum(map(len, ids))
    return await json_response({
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
        "created": int(time.time()), "model": st.served_model_name, "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used,
                  "total_tokens": prompt_tokens + used}})
