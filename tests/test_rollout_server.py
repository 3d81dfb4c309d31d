"""`orchestrax serve` on loopback (in-process aiohttp, real HTTP) and the SGLang wire format."""

import asyncio
import json

import numpy as np
import pytest
from agent_fixtures import qwen3_chat_template
from loopback import run_serve

from orchestrax import models
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.rollout import protocol
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams
from orchestrax.rollout.embedded import ContinuousSampler
from orchestrax.rollout.server import ServerState
from orchestrax.rollout.sglang_client import SGLangClient, SGLangClientConfig
from orchestrax.rollout.weight_sync import WeightSync

TOK = tiny_qwen3_tokenizer()
CFG = models.tiny_config(vocab_size=len(TOK), tie_embeddings=False)


def params(seed):
    p = models.init_params(CFG, seed=seed)
    return {**p, "lm_head": p["lm_head"] * 20.0}


def run(fn, **state_kw):
    """`fn(http, url, sampler)` against a tiny model's server; `state_kw` go to ServerState."""
    def make_state():
        # Small engine steps, so streamed answers arrive in several pieces.
        sampler = ContinuousSampler(CFG, params(0), max_batch=8, max_len=96, decode_steps=4)
        return ServerState(sampler=sampler, model_path="tiny", tokenizer=TOK, **state_kw)
    return run_serve(make_state, lambda http, url, state: fn(http, url, state.sampler))


PROMPT = [5, 17, 40, 99, 3]


def test_generate_single_batch_n_and_fields():
    async def fn(http, url, sampler):
        async with http.post(f"{url}/generate", json={
                "input_ids": PROMPT, "return_logprob": True, "rid": "abc",
                "sampling_params": {"temperature": 0, "max_new_tokens": 6}}) as r:
            assert r.status == 200
            single = await r.json()
        async with http.post(f"{url}/generate", json={
                "input_ids": [PROMPT, PROMPT[:2]], "return_logprob": [True, False],
                "sampling_params": {"temperature": 0.8, "max_new_tokens": 4, "n": 2,
                                    "sampling_seed": 3}}) as r:
            batch = await r.json()
        async with http.post(f"{url}/generate", json={
                "text": "the answer is", "sampling_params": {"max_new_tokens": 3}}) as r:
            text = await r.json()
        return single, batch, text
    single, batch, text = run(fn)
    meta = single["meta_info"]
    assert meta["id"] == "abc" and meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["weight_version"] == "0" and meta["cached_tokens"] == 0
    assert [t[1] for t in meta["output_token_logprobs"]] == single["output_ids"]
    assert single["text"] == TOK.decode(single["output_ids"], skip_special_tokens=True)
    assert len(batch) == 4 and "output_token_logprobs" not in batch[2]["meta_info"]
    assert batch[0]["output_ids"] != batch[1]["output_ids"]  # n copies get distinct seeds
    assert text["meta_info"]["prompt_tokens"] == len(TOK.encode("the answer is"))


def test_bad_requests_get_400_naming_the_key():
    async def fn(http, url, sampler):
        out = []
        for body in ({"input_ids": PROMPT, "sampling_params": {"temprature": 0.5}},
                     {"input_ids": PROMPT, "sampling_params": {"min_p": 0.3}},
                     {"input_ids": PROMPT, "sampling_params": {"top_p": 0}},
                     {"input_ids": PROMPT, "lora_path": "x"},
                     {"input_ids": [1, 10**6]}):
            async with http.post(f"{url}/generate", json=body) as r:
                out.append((r.status, (await r.json())["error"]["message"]))
        async with http.post(f"{url}/generate", data=b"{not json") as r:
            out.append((r.status, (await r.json())["error"]["message"]))
        return out
    out = run(fn)
    assert all(status == 400 for status, _ in out)
    assert "'temprature'" in out[0][1] and "temperature" in out[0][1]
    assert "min_p" in out[1][1] and "top_p" in out[2][1] and "'lora_path'" in out[3][1]
    assert "input_ids[1]" in out[4][1] and "JSON" in out[5][1]


def test_stream_info_health_flush_abort_and_models():
    async def fn(http, url, sampler):
        async with http.post(f"{url}/generate", json={
                "input_ids": PROMPT, "stream": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": 3}}) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = [line for line in (await r.text()).split("\n\n") if line]
        info = await (await http.get(f"{url}/model_info")).json()
        sinfo = await (await http.get(f"{url}/server_info")).json()
        codes = [(await http.get(f"{url}/health")).status,
                 (await http.post(f"{url}/flush_cache")).status,
                 (await http.post(f"{url}/abort_request", json={"abort_all": True})).status,
                 (await http.post(f"{url}/abort_request", json={})).status]
        mods = await (await http.get(f"{url}/v1/models")).json()
        return events, info, sinfo, codes, mods
    events, info, sinfo, codes, mods = run(fn)
    assert events[-1] == "data: [DONE]"
    # Cumulative: the prefill's token, then the 2 of the next engine step, with the result.
    data = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert [len(d["output_ids"]) for d in data] == [1, 3]
    assert data[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert info["weight_version"] == "0" and info["is_generation"] is True
    assert sinfo["max_running_requests"] == 8 and sinfo["context_length"] == 96
    assert sinfo["engine"] == "continuous"
    assert codes == [200, 200, 200, 400]
    assert mods["data"][0]["id"] == "orchestrax"


def test_abort_request_returns_abort_finish_reason():
    async def fn(http, url, sampler):
        async def gen(rid, n):
            async with http.post(f"{url}/generate", json={
                    "input_ids": PROMPT, "rid": rid,
                    "sampling_params": {"temperature": 0, "max_new_tokens": n}}) as r:
                return await r.json()
        # r11 asks for 80 tokens (20 engine steps), the others 8: it is still running when the
        # abort comes. The wait is on r11 itself (a count of 12 raced the first batch's finish
        # under load and hung) and fails instead of hanging.
        tasks = [asyncio.create_task(gen(f"r{i}", 80 if i == 11 else 8)) for i in (11, *range(11))]
        async with asyncio.timeout(60):
            while not any(p.request.rid == "r11" for p in sampler._pending()):
                await asyncio.sleep(0.005)
        async with http.post(f"{url}/abort_request", json={"rid": "r11"}) as r:
            assert r.status == 200
        return await asyncio.gather(*tasks)
    out = run(fn)
    reasons = {o["meta_info"]["id"]: o["meta_info"]["finish_reason"]["type"] for o in out}
    assert reasons["r11"] == "abort" and list(reasons.values()).count("abort") == 1


def test_chat_completions_uses_the_template_and_reports_usage():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the area of a triangle?"}]

    async def fn(http, url, sampler):
        async with http.post(f"{url}/v1/chat/completions", json={
                "model": "orchestrax", "messages": messages, "max_tokens": 7,
                "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}) as r:
            ok = await r.json()
        async with http.post(f"{url}/v1/chat/completions", json={
                "messages": messages, "frequency_penalty": 2.5}) as r:
            bad = (r.status, await r.json())
        return ok, bad
    ok, bad = run(fn, chat_template=qwen3_chat_template())
    prompt = TOK.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                     enable_thinking=False, chat_template=qwen3_chat_template())
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    usage = ok["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 7
    assert ok["choices"][0]["message"]["role"] == "assistant"
    assert bad[0] == 400 and "frequency_penalty" in bad[1]["error"]["message"]


def test_weight_sync_through_client_changes_version_and_tokens(tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    async def fn(http, url, sampler):
        req = GenerateRequest(input_ids=tuple(PROMPT),
                              sampling=SamplingParams(temperature=0.0, max_new_tokens=8))
        sync = WeightSync(model=CFG, root=str(tmp_path))
        async with SGLangClient(SGLangClientConfig(urls=(url,)), weight_sync=sync) as client:
            before = (await client.generate([req]))[0]
            path = await client.publish(params(1), "step-1")
            after = (await client.generate([req]))[0]
            info = await (await http.get(f"{url}/model_info")).json()
        async with http.post(f"{url}/update_weights_from_disk",
                             json={"model_path": str(tmp_path / "missing")}) as r:
            failed = (r.status, await r.json())
        # A path outside the roots (also through a symlink inside them) is refused unread.
        (tmp_path / "link").symlink_to(outside, target_is_directory=True)
        refused = []
        for p in (outside, tmp_path / "link", tmp_path / ".." / outside.name):
            async with http.post(f"{url}/update_weights_from_disk",
                                 json={"model_path": str(p)}) as r:
                refused.append((r.status, (await r.json())["message"]))
        return before, after, info, path, failed, refused
    before, after, info, path, failed, refused = run(fn, weight_roots=(str(tmp_path),))
    assert (before.weight_version, after.weight_version) == ("0", "step-1")
    assert before.output_ids != after.output_ids
    assert info["weight_version"] == "step-1" and info["model_path"] == str(path.resolve())
    assert failed[0] == 400 and failed[1]["success"] is False
    assert all(status == 403 and "outside the weight roots" in msg for status, msg in refused)


def test_weight_sync_rechecks_servers_marked_down_before_giving_up(tmp_path):
    """A server marked down by a health check that timed out while the trainer's event loop was
    blocked (a train step) still gets the weights: the sync checks it again instead of failing
    the step. A server that is really gone still fails it, naming the weights."""
    from orchestrax.rollout.sglang_client import WeightSyncError

    async def fn(http, url, sampler):
        sync = WeightSync(model=CFG, root=str(tmp_path))
        quiet = SGLangClientConfig(urls=(url,), health_interval_s=3600.0)  # no check between
        async with SGLangClient(quiet, weight_sync=sync) as client:
            await client._recheck(client.servers[0])     # the start's check, done
            client.servers[0].healthy = False
            await client.publish(params(1), "step-1")
            up = client.servers[0].healthy, client.servers[0].weight_version
        dead = SGLangClientConfig(urls=("http://127.0.0.1:9",), health_timeout_s=1.0)
        async with SGLangClient(dead, weight_sync=sync) as client:
            try:
                await client.publish(params(2), "step-2")
            except WeightSyncError as e:
                return up, str(e)
        return up, None
    up, error = run(fn, weight_roots=(str(tmp_path),))
    assert up == (True, "step-1")
    assert error is not None and "step-2" in error


def test_client_logprobs_match_embedded_sampler():
    """The HTTP path returns exactly what the embedded sampler produced."""
    req = GenerateRequest(input_ids=tuple(PROMPT),
                          sampling=SamplingParams(temperature=0.9, max_new_tokens=6,
                                                  sampling_seed=11))

    async def fn(http, url, sampler):
        async with SGLangClient(SGLangClientConfig(urls=(url,))) as client:
            via_http = (await client.generate([req]))[0]
        direct = (await sampler.generate([req]))[0]
        return via_http, direct
    via_http, direct = run(fn)
    assert via_http.output_ids == direct.output_ids
    np.testing.assert_allclose(via_http.logprobs, direct.logprobs, rtol=0, atol=1e-7)


def test_protocol_round_trip_and_errors():
    sp = SamplingParams(temperature=0.5, top_p=0.9, top_k=20, max_new_tokens=7,
                        stop_token_ids=(3, 9), sampling_seed=4)
    parsed = protocol.parse_sampling_params(protocol.sampling_to_json(sp))
    assert (parsed.params, parsed.n) == (sp, 1)
    assert protocol.parse_sampling_params({"temperature": 1e-9}).params.temperature == 0.0
    assert protocol.parse_sampling_params({}).params.max_new_tokens == 128  # SGLang's default
    assert protocol.parse_sampling_params({"min_p": 0.0, "stop": []}).n == 1
    for bad, field in (({"top_k": 0}, "top_k"), ({"n": 0}, "n"), ({"stop_token_ids": ["x"]},
                       "stop_token_ids"), ({"max_new_tokens": -1}, "max_new_tokens")):
        with pytest.raises(protocol.ProtocolError, match=field):
            protocol.parse_sampling_params(bad)
    with pytest.raises(protocol.ProtocolError, match="exactly one"):
        protocol.parse_generate({"sampling_params": {}})
    with pytest.raises(protocol.ProtocolError, match="tokenizer"):
        protocol.parse_generate({"text": "hi"}, has_tokenizer=False)
    call = protocol.parse_generate({"input_ids": [[1, 2], [3]], "rid": "x",
                                    "sampling_params": {"n": 2}})
    reqs = [it.request for it in call.items(call.prompts)]
    assert [r.rid for r in reqs] == ["x-0-0", "x-0-1", "x-1-0", "x-1-1"]
    assert call.batched and [r.input_ids for r in reqs] == [(1, 2)] * 2 + [(3,)] * 2


def test_chat_stream_with_stop_and_logprobs_equals_the_whole_answer():
    body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 14,
            "temperature": 0, "logprobs": True, "top_logprobs": 2}

    async def fn(http, url, sampler):
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            free = await r.json()
        text = free["choices"][0]["message"]["content"]
        stop = text[3:5]
        async with http.post(f"{url}/v1/chat/completions", json=body | {"stop": stop}) as r:
            whole = await r.json()
        async with http.post(f"{url}/v1/chat/completions",
                             json=body | {"stop": stop, "stream": True,
                                          "stream_options": {"include_usage": True}}) as r:
            events = [json.loads(line[len("data: "):]) for line in (await r.text()).split("\n\n")
                      if line.startswith("data: {")]
        return text, stop, whole, events

    text, stop, whole, events = run(fn, chat_template=qwen3_chat_template())
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == \
        text[:text.index(stop)]
    deltas = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(d["delta"].get("content", "") for d in deltas) == choice["message"]["content"]
    streamed_lp = [t for d in deltas if d["logprobs"] for t in d["logprobs"]["content"]]
    assert streamed_lp == choice["logprobs"]["content"]
    assert len(streamed_lp) == whole["usage"]["completion_tokens"]
    assert events[-1]["usage"] == whole["usage"]
