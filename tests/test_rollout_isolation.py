"""`orchestrax serve` isolates clients: one request's bad value is its own 400 naming
the field and never touches its batch-mates; caps are checked before tokenising, tokenising runs
off the event loop, a disconnected client's rows leave the batch, half-open connections are
closed, the bearer token and the weight roots are enforced."""

import asyncio
import json
import threading

import aiohttp
from loopback import post, run_serve

from orchestrax import models
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.rollout.embedded import ContinuousSampler
from orchestrax.rollout.server import ServerState
from orchestrax.rollout.validate import ServeLimits

TOK = tiny_qwen3_tokenizer()
CFG = models.tiny_config(vocab_size=len(TOK), tie_embeddings=False)
PARAMS = models.init_params(CFG, seed=0)
PROMPT = [5, 17, 40, 99, 3]


def run(fn, *, sampler_kw=None, **state_kw):
    """`fn(http, url, state)` against a tiny model's server; `state_kw` override ServerState's."""
    def make_state():
        kw = dict(max_batch=8, max_len=96) | (sampler_kw or {})
        return ServerState(**{"sampler": ContinuousSampler(CFG, PARAMS, **kw),
                              "model_path": "tiny", "tokenizer": TOK} | state_kw)
    return run_serve(make_state, fn)


def gen(sp, ids=PROMPT, **top):
    return {"input_ids": ids, "sampling_params": sp, **top}


def test_a_bad_request_fails_alone_and_its_batch_mates_are_unchanged():
    good = [gen({"temperature": 0.9, "max_new_tokens": 6, "sampling_seed": s}) for s in range(4)]
    bad = [gen({"max_new_tokens": 6, "stop_token_ids": [2**40]}),
           gen({"max_new_tokens": 6, "stop_token_ids": [CFG.vocab_size]})]

    async def fn(http, url, st):
        alone = [await post(http, url, b) for b in good]
        together = await asyncio.gather(*(post(http, url, b) for b in good + bad))
        return alone, together, st.sampler.stats

    # The six arrive together and would share engine steps (with seeds, the good ones' tokens do
    # not depend on who shares their steps).
    alone, together, stats = run(fn)
    assert [s for s, _ in together] == [200] * 4 + [400, 400]
    assert [b["output_ids"] for _, b in together[:4]] == [b["output_ids"] for _, b in alone]
    for _, b in together[4:]:
        assert "sampling_params.stop_token_ids[0]" in b["error"]["message"]
    assert str(2**40) in together[4][1]["error"]["message"]
    assert stats["requests"] == 8  # the bad ones never reached the sampler


BAD_GENERATE = [
    ('{"input_ids": [5, 6], "sampling_params": {"temperature": NaN}}', "temperature"),
    ('{"input_ids": [5, 6], "sampling_params": {"temperature": Infinity}}', "temperature"),
    (gen({"temperature": -0.5}), "temperature"),
    (gen({"max_new_tokens": "5"}), "max_new_tokens"),
    (gen({"max_new_tokens": 2.7}), "max_new_tokens"),
    (gen({"max_new_tokens": True}), "max_new_tokens"),
    (gen({"max_new_tokens": -1}), "max_new_tokens"),
    (gen({"top_p": 1.5}), "top_p"),
    (gen({"top_k": 0}), "top_k"),
    (gen({"n": 0}), "n"),
    (gen({"n": 100000}), "n"),
    (gen({"sampling_seed": "7"}), "sampling_seed"),
    (gen({"presence_penalty": 3}), "presence_penalty"),
    (gen({"stop": [""]}), "stop"),
    (gen({"stop_token_ids": [True]}), "stop_token_ids"),
    (gen({"temprature": 0.5}), "temprature"),
    (gen({}, ids=[5, -1]), "input_ids[1]"),
    (gen({}, ids=[5, "6"]), "input_ids[1]"),
    (gen({}, return_logprob="yes"), "return_logprob"),
    (gen({}, top_logprobs_num=21), "top_logprobs_num"),
    (gen({}, stream=1), "stream"),
    ({"input_ids": [PROMPT] * 20, "sampling_params": {"n": 60}}, "requests in one call"),
    ('{"input_ids": [5, ' + "9" * 5000 + "]}", "JSON"),
]
BAD_CHAT = [
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"temperature": float("nan")}, "temperature"),
    ({"n": 65}, "n"),
    ({"seed": 1.5}, "seed"),
    ({"logprobs": "true"}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"messages": [{"content": "no role"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
]


def test_bad_values_get_400_naming_the_field():
    messages = [{"role": "user", "content": "hi"}]

    async def fn(http, url, st):
        gen_out = [await post(http, url, b) for b, _ in BAD_GENERATE]
        chat_out = [await post(http, url, json.dumps({"messages": messages, **b}),
                               "/v1/chat/completions") for b, _ in BAD_CHAT]
        return gen_out, chat_out, st.sampler.stats["requests"]

    gen_out, chat_out, requests = run(fn)
    for (body, field), (status, out) in zip(BAD_GENERATE + BAD_CHAT, gen_out + chat_out):
        assert status == 400, (body, out)
        assert field in out["error"]["message"], (field, out)
    assert requests == 0  # none reached the sampler


def test_caps_are_checked_before_tokenising_and_tokenising_is_off_the_loop():
    limits = ServeLimits(max_text_chars=1000, max_body_bytes=50_000)
    calls = []
    release = threading.Event()

    def slow_encode(text):  # blocks until the test has seen /health answer meanwhile
        calls.append(len(text))
        assert release.wait(30)
        return TOK.encode(text, add_special_tokens=False)

    async def fn(http, url, st):
        st.encode = slow_encode
        too_long = await post(http, url, {"text": "x" * 1001})
        too_big = await post(http, url, {"input_ids": [5] * 20_000})
        chat_long = await post(http, url, {"messages": [{"role": "user", "content": "y" * 1001}]},
                               "/v1/chat/completions")
        assert calls == []
        pending = asyncio.create_task(post(http, url, gen({"max_new_tokens": 2}) | {
            "text": "the answer is", "input_ids": None}))
        while not calls:
            await asyncio.sleep(0.01)
        async with http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
            health = r.status
        release.set()
        return too_long, too_big, chat_long, health, await pending

    too_long, too_big, chat_long, health, ok = run(fn, limits=limits)
    assert too_long[0] == 400 and "1001 characters" in too_long[1]["error"]["message"]
    assert too_big[0] == 413
    assert chat_long[0] == 400 and "at most 1000" in chat_long[1]["error"]["message"]
    assert health == 200 and ok[0] == 200


def test_a_disconnected_client_stops_its_rows():
    async def fn(http, url, st):
        body = gen({"max_new_tokens": 90, "temperature": 1.0, "n": 8})
        task = asyncio.create_task(post(http, url, body))
        while st.sampler.stats["tokens"] == 0:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        task.cancel()  # closes the connection: the client left
        for _ in range(400):
            if st.sampler.outstanding == 0 and not st.sampler.engine.busy:
                break
            await asyncio.sleep(0.01)
        return st.sampler.outstanding, st.sampler.engine.busy, st.sampler.stats

    outstanding, busy, stats = run(fn, sampler_kw={"decode_steps": 2, "max_len": 256})
    assert outstanding == 0 and not busy
    # 8 rows x 90 tokens were asked for; they left the engine once their client was gone.
    assert stats["tokens"] < 8 * 90 and stats["requests"] == 0


def test_half_open_connections_are_closed():
    limits = ServeLimits(read_timeout_s=0.5, idle_timeout_s=0.5)

    async def fn(http, url, st):
        host, port = url.removeprefix("http://").split(":")

        async def half_open(payload: bytes) -> bytes:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(payload)
            await writer.drain()
            try:
                return await asyncio.wait_for(reader.read(), timeout=20)
            finally:
                writer.close()

        silent = await half_open(b"")
        partial_headers = await half_open(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        partial_body = await half_open(b"POST /generate HTTP/1.1\r\nHost: x\r\n"
                                       b"Content-Type: application/json\r\n"
                                       b"Content-Length: 100\r\n\r\n{\"input_ids\"")
        return silent, partial_headers, partial_body

    silent, partial_headers, partial_body = run(fn, limits=limits)
    # Each read returned (the server closed the socket) well before the 20 s client timeout.
    assert silent == b"" and partial_headers == b""
    assert partial_body.startswith(b"HTTP/1.1 408")


def test_bearer_token_guards_every_route_but_health():
    async def fn(http, url, st):
        out = {}
        for name, headers in (("none", {}), ("wrong", {"Authorization": "Bearer nope"}),
                              ("right", {"Authorization": "Bearer s3cret"})):
            async with http.post(f"{url}/generate", json=gen({"max_new_tokens": 2}),
                                 headers=headers) as r:
                out[name] = r.status
            async with http.get(f"{url}/model_info", headers=headers) as r:
                out[name + "_info"] = r.status
        async with http.get(f"{url}/health") as r:
            out["health"] = r.status
        return out

    out = run(fn, api_key="s3cret")
    assert out == {"none": 401, "none_info": 401, "wrong": 401, "wrong_info": 401,
                   "right": 200, "right_info": 200, "health": 200}


def test_weight_updates_without_roots_are_refused(tmp_path):
    async def fn(http, url, st):
        return await post(http, url, {"model_path": str(tmp_path)}, "/update_weights_from_disk")

    status, body = run(fn)
    assert status == 403 and body["success"] is False and "--weight-root" in body["message"]


def test_ids_only_server_refuses_text_and_stop_strings():
    async def fn(http, url, st):
        return (await post(http, url, {"text": "hi"}),
                await post(http, url, gen({"stop": "x"})))

    a, b = run(fn, tokenizer=None)
    assert a[0] == 400 and "tokenizer" in a[1]["error"]["message"]
    assert b[0] == 400 and "tokenizer" in b[1]["error"]["message"]
