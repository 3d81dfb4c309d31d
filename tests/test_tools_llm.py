"""LLM-as-tool: against `orchestrax serve` on loopback (a tiny JAX model), and against a small
OpenAI-shaped aiohttp server for the behaviours a random tiny model cannot show (code writing,
errors, <think> stripping)."""

import asyncio
import dataclasses
import shutil

import pytest
from aiohttp import web
from loopback import ScriptedChatServer, run_serve, serve_app

from orchestrax.tools.tool import Pricing, ToolError
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.llm_tool import ROLES, LLMTool, LLMToolConfig, extract_code
from orchestrax.tools.sandbox import SandboxConfig
from orchestrax.tools.sheets import load_sheet

PRICE = Pricing(kind="per_token", usd_per_m_input=1.25, usd_per_m_output=10.0)


def replying(text: str) -> ScriptedChatServer:
    """An OpenAI-shaped server that answers `text` to everything, billing 11 + 7 tokens."""
    return ScriptedChatServer(lambda body: text, usage=(11, 7))


def tool_for(url, role="generalist", **kw):
    return LLMTool(LLMToolConfig(name=f"{role}_llm", role=role,
                                 chat=ChatEndpoint(base_url=url, model="gpt-5", max_tokens=64), **kw),
                   PRICE)


def test_against_orchestrax_serve_cost_is_tokens_times_prices():
    from orchestrax import models
    from orchestrax.agent.scripted import tiny_qwen3_tokenizer
    from agent_fixtures import qwen3_chat_template
    from orchestrax.rollout.embedded import ContinuousSampler
    from orchestrax.rollout.server import ServerState

    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    sheet = load_sheet("train_list")

    def state():
        sampler = ContinuousSampler(cfg, models.init_params(cfg, seed=0), max_batch=4,
                                    max_len=160)
        return ServerState(sampler=sampler, model_path="tiny", tokenizer=tok,
                           chat_template=qwen3_chat_template())

    async def scenario(http, url, _):
        tool = LLMTool(LLMToolConfig(
            name="qwen3_32b", role="generalist", price_model="qwen3-32b",
            chat=ChatEndpoint(base_url=url, model="orchestrax", max_tokens=8, seed=0)),
            sheet.model_pricing("qwen3-32b"))
        return tool, await tool({"query": "What is 2 + 2?"})

    tool, res = run_serve(state, scenario)
    prompt = tok.apply_chat_template(tool.messages({"query": "What is 2 + 2?"}),
                                     add_generation_prompt=True, tokenize=True,
                                     chat_template=qwen3_chat_template())
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    assert res.input_tokens == len(prompt)
    assert 1 <= res.output_tokens <= 8
    row = sheet.models["qwen3-32b"]
    want = (res.input_tokens * row.usd_per_m_input + res.output_tokens * row.usd_per_m_output) / 1e6
    assert res.cost == pytest.approx(want, rel=1e-12) and res.cost > 0
    assert res.latency > 0 and isinstance(res.observation, str)


def test_request_shape_think_stripping_and_cost():
    async def scenario():
        async with replying("<think>hmm, 6*7</think>\nThe answer is 42.") as srv:
            res = await tool_for(srv.base_url)({"query": "6*7?", "context": "integers"})
            return res, srv.requests

    res, seen = asyncio.run(scenario())
    assert res.observation == "The answer is 42."
    assert seen[0]["model"] == "gpt-5" and seen[0]["max_tokens"] == 64
    assert seen[0]["temperature"] == 0.0
    assert seen[0]["messages"][0] == {"role": "system", "content": ROLES["generalist"].system}
    assert seen[0]["messages"][1]["content"] == "6*7?\n\nContext:\nintegers"
    assert (res.input_tokens, res.output_tokens) == (11, 7)
    assert res.cost == pytest.approx((11 * 1.25 + 7 * 10.0) / 1e6)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_coder_role_runs_the_written_code_in_the_sandbox():
    reply = ("First try:\n```python\nprint('draft')\n```\nBetter:\n```python\n"
             "import math, os\nprint(math.factorial(10), os.getuid())\n```")

    async def scenario():
        async with replying(reply) as srv:
            good = await tool_for(srv.base_url, "coder",
                                  sandbox=SandboxConfig(wall_timeout_s=5))({"query": "10!"})
        async with replying("I cannot write code today.") as srv:
            none = await tool_for(srv.base_url, "coder")({"query": "10!"})
        return good, none

    good, none = asyncio.run(scenario())
    assert "Output:\n3628800 65534" in good.observation  # ran sandboxed, as uid 65534
    assert "draft" not in good.observation
    assert good.cost == pytest.approx((11 * 1.25 + 7 * 10.0) / 1e6)
    assert none.observation.startswith("[the model wrote no ```python block]")
    assert ROLES["coder"].category == "specialist" and ROLES["generalist"].category == "generalist"


@pytest.mark.parametrize("status,transient", [(400, False), (429, True), (503, True)])
def test_http_errors_are_tool_errors(status, transient):
    async def scenario():
        async with ScriptedChatServer(lambda body: (status, "boom")) as srv:
            with pytest.raises(ToolError) as err:
                await tool_for(srv.base_url)({"query": "q"})
            return err.value

    err = asyncio.run(scenario())
    assert err.transient is transient and str(status) in str(err)


def test_dead_server_malformed_body_and_bad_arguments():
    dead = tool_for("http://127.0.0.1:9")
    with pytest.raises(ToolError) as err:
        asyncio.run(dead({"query": "q"}))
    assert err.value.transient

    async def no_usage():
        app = web.Application()

        async def h(request):
            return web.json_response({"choices": [{"message": {"content": "hi"}}]})

        app.router.add_post("/v1/chat/completions", h)
        async with serve_app(app) as url:
            await tool_for(url)({"query": "q"})

    with pytest.raises(ToolError, match="unexpected body") as err:
        asyncio.run(no_usage())
    assert not err.value.transient
    with pytest.raises(ToolError, match="query"):
        asyncio.run(dead({"question": "q"}))


def test_config_validation():
    with pytest.raises(ValueError, match="role"):
        LLMToolConfig(name="x", role="poet", chat=ChatEndpoint(base_url="http://h", model="m"))
    with pytest.raises(ValueError, match="base_url"):
        ChatEndpoint(base_url="localhost:8000", model="m")
    with pytest.raises(ValueError, match="per_token"):
        LLMTool(LLMToolConfig(name="x", role="generalist",
                              chat=ChatEndpoint(base_url="http://h", model="m")), Pricing())
    assert extract_code("no code") is None
    assert extract_code("```py\nx = 1\n```") == "x = 1"


def test_latency_is_the_sheets_figure_never_the_response_time():
    """At the sheet's 0.1 s per output token a reply of n tokens costs 0.1·n s, whatever the
    endpoint took; a sheet without a speed charges the nominal 5 s per call. `reprice` carries
    the speed of the new sheet's model."""
    from orchestrax.tools.randomize import reprice
    from orchestrax.tools.sheets import sheet_from_json

    sheet = sheet_from_json({"name": "s", "split": "train", "models": {"gpt-5": {
        "provider": "p", "usd_per_m_input": 1.25, "usd_per_m_output": 10.0,
        "seconds_per_output_token": 0.1}}})

    async def scenario(tool):
        async with replying("The answer is 42.") as srv:
            tool.config = dataclasses.replace(
                tool.config, chat=dataclasses.replace(tool.config.chat, base_url=srv.base_url))
            return await tool({"query": "6*7?"})

    plain = tool_for("http://unused")
    assert asyncio.run(scenario(plain)).latency == 5.0
    timed = reprice(plain, sheet)
    res = asyncio.run(scenario(timed))
    assert res.output_tokens > 0 and res.latency == pytest.approx(0.1 * res.output_tokens)
    with pytest.raises(ValueError, match=r"ModelPrice.seconds_per_output_token=-1; must be >= 0"):
        sheet_from_json({"name": "s", "split": "train", "models": {"m": {
            "provider": "p", "usd_per_m_input": 1, "usd_per_m_output": 1,
            "seconds_per_output_token": -1}}})
