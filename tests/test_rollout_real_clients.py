"""The real clients: the published `openai` client and the real `sglang-router` in
front of two `orchestrax serve --tiny` processes, on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import openai
import pytest
from loopback import post_sync

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "Name three prime numbers."}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> tuple[int, dict]:
    return post_sync(url, body, timeout=60)


@pytest.fixture(scope="module")
def fleet():
    """Two `serve --tiny` processes (same seed, so the same weights) and sglang-router in front
    of them, round robin."""
    procs, urls = [], []
    try:
        for _ in range(2):
            port = _free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "orchestrax.cli", "serve", "--tiny", "--port", str(port),
                 "--max-len", "768", "--max-batch", "8"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
            urls.append(f"http://127.0.0.1:{port}")
        for p in procs:
            assert "listening" in p.stdout.readline()
        rport = _free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *urls,
             "--host", "127.0.0.1", "--port", str(rport), "--policy", "round_robin",
             "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        router = f"http://127.0.0.1:{rport}"
        deadline = time.monotonic() + 120
        while True:  # the router registers workers asynchronously after it starts
            try:
                workers = _get(f"{router}/workers")["workers"]
                if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "sglang-router did not register both workers"
            time.sleep(0.5)
        yield router, urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def _served_requests(url: str) -> int:
    return _get(f"{url}/server_info")["internal_states"][0]["requests"]


def test_sglang_router_routes_generate_and_chat_to_both_servers(fleet):
    router, urls = fleet
    before = [_served_requests(u) for u in urls]
    gens = [_post(f"{router}/generate", {
        "text": "The capital of France is", "return_logprob": True,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0}}) for _ in range(4)]
    chats = [_post(f"{router}/v1/chat/completions", {
        "model": "orchestrax", "messages": MESSAGES, "max_tokens": 5, "temperature": 0})
        for _ in range(2)]
    after = [_served_requests(u) for u in urls]
    assert all(status == 200 for status, _ in gens + chats), gens + chats
    first = gens[0][1]
    assert all(g["output_ids"] == first["output_ids"] for _, g in gens)  # same weights, greedy
    assert [t[1] for t in first["meta_info"]["output_token_logprobs"]] == first["output_ids"]
    assert all(c["choices"][0]["message"]["role"] == "assistant" for _, c in chats)
    assert all(a > b for a, b in zip(after, before))  # both servers answered some
    # A bad value is refused through the router, by the router's own schema (422) or by the
    # server (400), never generated from.
    status, body = _post(f"{router}/generate", {"text": "x",
                                                "sampling_params": {"max_new_tokens": 2.5}})
    assert status in (400, 422) and "max_new_tokens" in json.dumps(body), (status, body)
    status, body = _post(f"{router}/generate", {"text": "x",
                                                "sampling_params": {"top_p": 1.5}})
    assert status in (400, 422) and "top_p" in json.dumps(body), (status, body)


def test_openai_client_standard_parameters(fleet):
    _, urls = fleet
    client = openai.OpenAI(base_url=f"{urls[0]}/v1", api_key="unused", max_retries=0)
    kw = dict(model="orchestrax", messages=MESSAGES, max_tokens=12, temperature=0)

    free = client.chat.completions.create(**kw)
    text = free.choices[0].message.content
    assert free.choices[0].finish_reason == "length" and len(text) > 4
    # stop: the text ends where the stop string starts, and generation ends there.
    stop = text[2:4]
    cut = client.chat.completions.create(**kw, stop=[stop, "never-seen-zzz"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[:text.index(stop)]
    assert cut.usage.completion_tokens < free.usage.completion_tokens

    # logprobs / top_logprobs: real values; greedy picks the most likely token.
    lp = client.chat.completions.create(**kw, logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert item.logprob == pytest.approx(tops[0], abs=1e-6)
        assert item.token == item.top_logprobs[0].token

    # stream=True with include_usage: the same text, then a usage chunk.
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == free.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == free.usage.prompt_tokens

    # Penalties are applied (numbers checked in test_rollout_embedded); tools with
    # parallel_tool_calls and a text response_format are accepted.
    pen = client.chat.completions.create(**kw, presence_penalty=2.0, frequency_penalty=2.0)
    assert pen.choices[0].message.content
    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]
    with_tools = client.chat.completions.create(**kw, tools=tools, parallel_tool_calls=False,
                                                response_format={"type": "text"}, n=2, seed=5)
    assert len(with_tools.choices) == 2
    assert with_tools.usage.prompt_tokens > free.usage.prompt_tokens  # tools were rendered

    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(**kw, response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(**{**kw, "max_tokens": 0})
    models = client.models.list()
    assert [m.id for m in models.data] == ["orchestrax"]
