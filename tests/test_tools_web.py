"""The Tavily client against a real aiohttp server on 127.0.0.1 answering in Tavily's shape."""

import asyncio
import contextlib

import pytest
from aiohttp import web
from loopback import serve_app

from orchestrax.tools.tool import ToolError
from orchestrax.tools.web_search import USD_PER_CREDIT, WebSearchConfig, WebSearchTool

KEY = "tvly-test-key"


@contextlib.asynccontextmanager
async def tavily_server(status: int = 200):
    seen = []

    async def search(request):
        body = await request.json()
        seen.append((request.headers.get("Authorization"), body))
        if status != 200:
            return web.json_response({"detail": {"error": "nope"}}, status=status)
        results = [{"title": f"Result {i} for {body['query']}", "url": f"https://example.org/{i}",
                    "content": "lorem ipsum " * 100, "score": 0.9 - 0.1 * i, "raw_content": None}
                   for i in range(body["max_results"])]
        return web.json_response({"query": body["query"], "follow_up_questions": None,
                                  "answer": "Paris" if body.get("include_answer") else None,
                                  "images": [], "results": results, "response_time": 0.42})

    app = web.Application()
    app.router.add_post("/search", search)
    async with serve_app(app) as url:
        yield url, seen


def test_search_formats_results_and_bills_per_credit(monkeypatch):
    monkeypatch.setenv("TAVILY_API_KEY", KEY)

    async def scenario():
        async with tavily_server() as (url, seen):
            tool = WebSearchTool(WebSearchConfig(base_url=url, content_chars=40, include_answer=True))
            res = await tool({"query": "capital of France", "max_results": 3})
            deep = WebSearchTool(WebSearchConfig(base_url=url, search_depth="advanced"))
            res2 = await deep({"query": "x"})
            return res, res2, seen

    res, res2, seen = asyncio.run(scenario())
    assert seen[0][0] == f"Bearer {KEY}"
    assert seen[0][1] == {"query": "capital of France", "search_depth": "basic", "max_results": 3,
                          "include_answer": True}
    assert res.observation.startswith("Answer: Paris\n\n[1] Result 0 for capital of France "
                                      "(https://example.org/0)")
    assert "[3] " in res.observation and "[4] " not in res.observation
    assert " ..." in res.observation  # content cut to content_chars
    assert res.cost == pytest.approx(USD_PER_CREDIT)
    assert res2.cost == pytest.approx(2 * USD_PER_CREDIT) and seen[1][1]["max_results"] == 5


@pytest.mark.parametrize("status,transient", [(401, False), (429, True), (502, True)])
def test_http_errors_become_tool_errors(monkeypatch, status, transient):
    monkeypatch.setenv("TAVILY_API_KEY", KEY)

    async def scenario():
        async with tavily_server(status) as (url, _):
            with pytest.raises(ToolError) as err:
                await WebSearchTool(WebSearchConfig(base_url=url))({"query": "q"})
            return err.value

    err = asyncio.run(scenario())
    assert err.transient is transient
    assert str(status) in str(err)


def test_dead_server_is_transient_and_bad_arguments_are_not(monkeypatch):
    monkeypatch.setenv("TAVILY_API_KEY", KEY)
    tool = WebSearchTool(WebSearchConfig(base_url="http://127.0.0.1:9", timeout_s=2))
    with pytest.raises(ToolError) as err:
        asyncio.run(tool({"query": "q"}))
    assert err.value.transient and "unreachable" in str(err.value)
    with pytest.raises(ToolError, match="max_results") as err:
        asyncio.run(tool({"query": "q", "max_results": 0}))
    assert not err.value.transient


def test_no_key_no_tool_and_config_validation(monkeypatch):
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    with pytest.raises(ValueError, match="TAVILY_API_KEY"):
        WebSearchTool(WebSearchConfig())
    with pytest.raises(ValueError, match="search_depth"):
        WebSearchConfig(search_depth="deep")
    with pytest.raises(ValueError, match="max_results"):
        WebSearchConfig(max_results=50)
