"""Web search through Tavily's REST API (POST {base_url}/search, bearer key from the environment).

Response shape used: {"query", "answer"?, "results": [{"title", "url", "content", "score"}],
"response_time"}. No key means no tool: `build_catalog` leaves it out rather than faking results.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Literal

import aiohttp

from orchestrax.checks import above, one_of, require
from orchestrax.tools.tool import Pricing, ToolError, ToolResult, ToolSpec
from orchestrax.tools.specs import check_arguments, object_schema

# Tavily pay-as-you-go: $0.008 per credit; a basic search costs 1 credit, an advanced one 2
USD_PER_CREDIT = 0.008
DEFAULT_PRICING = Pricing(kind="per_call", usd_per_call=USD_PER_CREDIT)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebSearchConfig:
    base_url: str = "https://api.tavily.com"
    api_key_env: str = "TAVILY_API_KEY"
    search_depth: Literal["basic", "advanced"] = "basic"
    max_results: int = 5
    include_answer: bool = False
    content_chars: int = 500
    timeout_s: float = 20.0

    def __post_init__(self):
        one_of(self, "search_depth", self.search_depth, ("basic", "advanced"))
        require(1 <= self.max_results <= 20, self, "max_results", self.max_results, "in [1, 20]")
        above(self, 0, "content_chars", "timeout_s")

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None


def web_search_spec(pricing: Pricing = DEFAULT_PRICING, *, name: str = "web_search") -> ToolSpec:
    return ToolSpec(
        name=name,
        description="Search the web (Tavily) and return titles, URLs and content snippets.",
        parameters=object_schema({
            "query": {"type": "string", "minLength": 1, "description": "search query"},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}, ("query",)),
        category="basic", pricing=pricing, latency_s=1.5)


def format_response(data: dict[str, Any], content_chars: int) -> str:
    try:
        results = data["results"]
        lines = [f"Answer: {data['answer']}"] if data.get("answer") else []
        for n, r in enumerate(results, 1):
            content = str(r.get("content", ""))
            if len(content) > content_chars:
                content = content[:content_chars].rstrip() + " ..."
            lines.append(f"[{n}] {r['title']} ({r['url']})\n{content}")
    except (KeyError, TypeError) as e:
        raise ToolError(f"web_search: unexpected response body from the search API ({e!r})") from e
    return "\n\n".join(lines) if lines else "No results."


class WebSearchTool:
    def __init__(self, config: WebSearchConfig = WebSearchConfig(), *,
                 pricing: Pricing | None = None, name: str = "web_search"):
        key = config.api_key()
        if key is None:
            raise ValueError(f"web search needs an API key in ${config.api_key_env}")
        credits = 2 if config.search_depth == "advanced" else 1
        self.config, self._key = config, key
        self.spec = web_search_spec(
            pricing or Pricing(kind="per_call", usd_per_call=USD_PER_CREDIT * credits), name=name)

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        args = check_arguments(self.spec, arguments)
        body = {"query": args["query"], "search_depth": self.config.search_depth,
                "max_results": args.get("max_results", self.config.max_results),
                "include_answer": self.config.include_answer}
        url = self.config.base_url.rstrip("/") + "/search"
        t0 = time.monotonic()
        try:
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.config.timeout_s)) as session:
                async with session.post(url, json=body,
                                        headers={"Authorization": f"Bearer {self._key}"}) as resp:
                    if resp.status in (401, 403):
                        raise ToolError(f"web_search: the search API rejected the key "
                                        f"(HTTP {resp.status}); check ${self.config.api_key_env}")
                    if resp.status >= 400:
                        raise ToolError(f"web_search: HTTP {resp.status}: {(await resp.text())[:200]}",
                                        transient=resp.status == 429 or resp.status >= 500)
                    data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ToolError(f"web_search: {url} unreachable ({e!r})", transient=True) from e
        seconds = time.monotonic() - t0
        return ToolResult(observation=format_response(data, self.config.content_chars),
                          cost=self.spec.pricing.cost(seconds=seconds), latency=seconds)
