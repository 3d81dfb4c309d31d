"""The local-search tool: top-k passages from a `SearchIndex` as numbered observation text."""

from __future__ import annotations

import time
from typing import Any

from orchestrax.tools.tool import Clock, Pricing, ToolResult, ToolSpec, check_clock, clocked
from orchestrax.tools.search_index import SearchIndex
from orchestrax.tools.specs import check_arguments, object_schema

DEFAULT_PRICING = Pricing(kind="per_call", usd_per_call=1e-4)
MAX_K = 20


def local_search_spec(pricing: Pricing = DEFAULT_PRICING, *, name: str = "local_search") -> ToolSpec:
    return ToolSpec(
        name=name,
        description=("Search a local encyclopedia (Wikipedia summaries) and return the most "
                     "relevant passages with their titles."),
        parameters=object_schema({
            "query": {"type": "string", "minLength": 1, "description": "what to look for"},
            "k": {"type": "integer", "minimum": 1, "maximum": MAX_K,
                  "description": "number of passages (default 5)"}}, ("query",)),
        category="basic", pricing=pricing, latency_s=0.05)


def format_hits(hits, passage_chars: int) -> str:
    if not hits:
        return "No results."
    lines = []
    for n, (p, _score) in enumerate(hits, 1):
        text = p.text if len(p.text) <= passage_chars else p.text[:passage_chars].rstrip() + " ..."
        lines.append(f"[{n}] {p.title}\n{text}")
    return "\n\n".join(lines)


class LocalSearchTool:
    def __init__(self, index: SearchIndex, *, pricing: Pricing = DEFAULT_PRICING,
                 default_k: int = 5, passage_chars: int = 600, name: str = "local_search",
                 clock: Clock = "measured"):
        if not 1 <= default_k <= MAX_K:
            raise ValueError(f"LocalSearchTool default_k={default_k}; must be in [1, {MAX_K}]")
        if passage_chars <= 0:
            raise ValueError(f"LocalSearchTool passage_chars={passage_chars}; must be > 0")
        self.index, self.default_k, self.passage_chars = index, default_k, passage_chars
        self.clock = check_clock(clock)
        self.spec = local_search_spec(pricing, name=name)

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        args = check_arguments(self.spec, arguments)
        t0 = time.monotonic()
        hits = await self.index.search(args["query"], args.get("k", self.default_k))
        seconds = clocked(self.clock, time.monotonic() - t0, self.spec.latency_s)
        return ToolResult(observation=format_hits(hits, self.passage_chars), latency=seconds,
                          cost=self.spec.pricing.cost(seconds=seconds))
