"""The `/v1/chat/completions` and `/v1/models` routes of `orchestrax serve` (wire format in
openai_chat.py): render with the tokenizer's chat template in a worker thread, run each choice
on the sampler, answer whole or as OpenAI stream chunks."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

from aiohttp import web

from orchestrax.rollout import openai_chat as oai
from orchestrax.rollout.sampler import GenerateRequest
from orchestrax.rollout.http_io import (STATE, client_of, error, json_response, merge, read_json,
                                        sse)
from orchestrax.rollout.serving import ServerState, Update, run_request, stream_request
from orchestrax.rollout.validate import ProtocolError


def _end_of_turn_ids(tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids


def _render(st: ServerState, call: oai.ChatCall) -> list[int]:
    try:
        ids = st.tokenizer.apply_chat_template(call.messages, tools=call.tools,
                                               add_generation_prompt=True, tokenize=True,
                                               chat_template=st.chat_template,
                                               **call.template_kwargs)
    except Exception as e:  # template errors (bad roles, bad content) are the caller's input
        raise ProtocolError(f"messages could not be rendered by the chat template: {e}") from None
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: a mapping
    if not all(isinstance(t, int) for t in ids):
        raise ProtocolError("messages and chat_template_kwargs did not render to a list of token "
                            "ids")
    return ids


async def chat_completions(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    if st.tokenizer is None:
        return error("/v1/chat/completions needs a tokenizer; start the server with one")
    try:
        call = oai.parse_chat(await read_json(request), vocab_size=st.sampler.cfg.vocab_size,
                              limits=st.limits)
        ids = await asyncio.to_thread(_render, st, call)
        if len(ids) >= st.sampler.max_len:
            raise ProtocolError(f"messages render to {len(ids)} tokens; the context length is "
                                f"{st.sampler.max_len}")
        stops = _end_of_turn_ids(st.tokenizer)
        sp = dataclasses.replace(call.sampling, stop_token_ids=tuple(sorted(
            stops | set(call.sampling.stop_token_ids))))
        reqs = [GenerateRequest(
            input_ids=tuple(ids), rid=uuid.uuid4().hex, top_logprobs=call.top_logprobs,
            sampling=sp if sp.sampling_seed is None or j == 0 else
            dataclasses.replace(sp, sampling_seed=sp.sampling_seed + j)) for j in range(call.n)]
        st.admit(reqs)
    except ProtocolError as e:
        return error(str(e))
    cid, model = oai.completion_id(), st.served_model_name
    client = client_of(request)

    def token_text(tok: int) -> str:
        return st.tokenizer.decode([tok])

    def choice(j: int, u: Update) -> dict[str, Any]:
        content, calls = u.final_text, []
        if call.tools is not None:
            content, calls = oai.split_tool_calls(u.final_text, call.parallel_tool_calls)
        lp = (oai.logprobs_json(u.output_ids, u.logprobs, u.top_logprobs, 0, call.top_logprobs,
                                token_text) if call.logprobs else None)
        return {"index": j, "logprobs": lp,
                "finish_reason": oai.finish_reason(u.result, u.matched is not None, bool(calls)),
                "message": {"role": "assistant", "content": content, "tool_calls": calls or None}}

    if not call.stream:
        done = await asyncio.gather(*(run_request(st, r, call.stop, client=client) for r in reqs))
        return await json_response(oai.completion_json(
            cid, model, [choice(j, u) for j, u in enumerate(done)], len(ids),
            sum(len(u.output_ids) for u in done)))

    async def events():
        sent = [0] * len(reqs)        # tokens already streamed per choice
        used = [0] * len(reqs)
        for j in range(len(reqs)):
            yield oai.chunk_json(cid, model, [{"index": j, "delta": {"role": "assistant",
                                                                     "content": ""},
                                               "logprobs": None, "finish_reason": None}])
        async for j, u in merge([stream_request(st, r, call.stop, client=client)
                                       for r in reqs]):
            used[j] = len(u.output_ids)
            if u.done and call.tools is not None:
                # Tool calls are only known once the text is complete: send it whole.
                c = choice(j, u)
                delta = {"content": c["message"]["content"]}
                if c["message"]["tool_calls"]:
                    delta["tool_calls"] = [{**tc, "index": k} for k, tc in
                                           enumerate(c["message"]["tool_calls"])]
                yield oai.chunk_json(cid, model, [{"index": j, "delta": delta,
                                                   "logprobs": c["logprobs"],
                                                   "finish_reason": c["finish_reason"]}])
                continue
            if call.tools is not None:
                continue
            lp = None
            # With stop strings, tokens are final only when the request ends (a stop string
            # can cut tokens already decoded), so their logprobs wait until then.
            if call.logprobs and len(u.output_ids) > sent[j] and (u.done or not call.stop):
                lp = oai.logprobs_json(u.output_ids, u.logprobs, u.top_logprobs, sent[j],
                                       call.top_logprobs, token_text)
            if lp is not None:
                sent[j] = len(u.output_ids)
            if u.text or lp is not None or u.done:
                yield oai.chunk_json(cid, model, [{
                    "index": j, "delta": {"content": u.text} if u.text else {}, "logprobs": lp,
                    "finish_reason": (oai.finish_reason(u.result, u.matched is not None, False)
                                      if u.done else None)}])
        if call.include_usage:
            total = sum(used)
            yield oai.chunk_json(cid, model, [], usage={
                "prompt_tokens": len(ids), "completion_tokens": total,
                "total_tokens": len(ids) + total})
    return await sse(request, events())


async def list_models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return web.json_response({"object": "list", "data": [
        {"id": st.served_model_name, "object": "model", "owned_by": "orchestrax",
         "root": st.served_model_name, "max_model_len": st.sampler.max_len}]})

