"""`build_catalog(config) -> {name: Tool}`: every tool this package offers, priced by one sheet.

Tools that cannot run are left out with a one-line notice rather than faked (web search without a
key); tools whose configuration is broken raise (a sandbox without bwrap, an unknown model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from orchestrax.checks import one_of
from orchestrax.tools.tool import CLOCKS, Clock, Tool
from orchestrax.tools.llm_tool import LLMTool, LLMToolConfig
from orchestrax.tools import local_search, python_tool, web_search
from orchestrax.tools.sandbox import SandboxConfig
from orchestrax.tools.search_index import SearchIndex, SearchIndexConfig, build_index
from orchestrax.tools.sheets import load_sheet

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CatalogConfig:
    """None switches a basic tool off. `sheet` is a bundled sheet name or a JSON path."""

    python: SandboxConfig | None = SandboxConfig()
    search: SearchIndexConfig | None = None
    web: web_search.WebSearchConfig | None = web_search.WebSearchConfig()
    llms: tuple[LLMToolConfig, ...] = ()
    sheet: str = "train_list"
    # The seconds a tool that runs here (sandbox, local search, the coder's sandbox run) is
    # charged and billed by: "measured" wall time, or "nominal" (its spec's latency): the same
    # call then costs the same under any load, so a rerun of a step reproduces its rewards.
    clock: Clock = "measured"

    def __post_init__(self):
        one_of(self, "clock", self.clock, CLOCKS)
        names = [c.name for c in self.llms]
        dupes = sorted({n for n in names if names.count(n) > 1}
                       | (set(names) & {"python", "local_search", "web_search"}))
        if dupes:
            raise ValueError(f"CatalogConfig.llms: duplicate tool names {dupes}")


def build_catalog(config: CatalogConfig, *,
                  search_index: SearchIndex | None = None) -> dict[str, Tool]:
    """Call outside a running event loop, or pass a prebuilt `search_index`."""
    sheet = load_sheet(config.sheet)
    tools: dict[str, Tool] = {}
    if config.python is not None:
        tools["python"] = python_tool.PythonTool(
            config.python, pricing=sheet.tool_pricing("python", python_tool.DEFAULT_PRICING),
            clock=config.clock)
    if search_index is None and config.search is not None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            search_index = build_index(config.search)
        else:
            raise RuntimeError("build_catalog cannot build the search index inside a running event "
                               "loop; pass search_index=await build_index_async(config.search)")
    if search_index is not None:
        tools["local_search"] = local_search.LocalSearchTool(
            search_index, pricing=sheet.tool_pricing("local_search", local_search.DEFAULT_PRICING),
            clock=config.clock)
    if config.web is not None:
        if config.web.api_key() is None:
            log.info("web_search left out of the catalog: $%s is not set", config.web.api_key_env)
        else:
            tools["web_search"] = web_search.WebSearchTool(
                config.web, pricing=sheet.tool_pricing("web_search", web_search.DEFAULT_PRICING))
    for llm in config.llms:
        tools[llm.name] = LLMTool(llm, sheet.model_pricing(llm.pricing_key),
                                  sheet.model_seconds_per_token(llm.pricing_key),
                                  clock=config.clock)
    return tools
