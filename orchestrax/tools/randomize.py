"""Per-instance tool configuration: a random subset of the catalog and a random pricing sheet,
reproducible from an integer seed (Python's `random.Random(int)` is stable across platforms).

The held-out evaluation sheets are never drawn for training (only `split="train"` by default).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import random
from typing import Any, Mapping

from orchestrax.tools.tool import Tool
from orchestrax.tools.llm_tool import LLMTool
from orchestrax.tools.sheets import PricingSheet, bundled_sheets, load_sheet


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomizeConfig:
    min_tools: int = 1
    max_tools: int | None = None           # None: the whole catalog
    always: tuple[str, ...] = ()           # tools every instance keeps (e.g. a domain's own)
    sheets: tuple[str, ...] | None = None  # None: every bundled training sheet

    def __post_init__(self):
        if self.min_tools < 0:
            raise ValueError(f"RandomizeConfig.min_tools={self.min_tools}; must be >= 0")
        if self.max_tools is not None and self.max_tools < max(self.min_tools, len(self.always)):
            raise ValueError(f"RandomizeConfig.max_tools={self.max_tools}; must be >= min_tools "
                             f"({self.min_tools}) and >= len(always) ({len(self.always)})")
        if self.sheets is not None and not self.sheets:
            raise ValueError("RandomizeConfig.sheets is empty; give at least one sheet or None")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolConfigSample:
    tools: tuple[str, ...]    # sorted
    sheet: str


def instance_seed(base_seed: int, *keys: object) -> int:
    """A stable per-instance seed, e.g. instance_seed(run_seed, task_id, epoch)."""
    digest = hashlib.sha256(repr((base_seed, *keys)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def sample_config(names: list[str] | tuple[str, ...], seed: int,
                  config: RandomizeConfig = RandomizeConfig()) -> ToolConfigSample:
    """Subset size uniform in [max(min_tools, |always|), max_tools], members uniform given size."""
    pool = sorted(set(names))
    missing = set(config.always) - set(pool)
    if missing:
        raise ValueError(f"RandomizeConfig.always names tools not in the catalog: {sorted(missing)}")
    hi = len(pool) if config.max_tools is None else min(config.max_tools, len(pool))
    lo = max(config.min_tools, len(config.always))
    if lo > hi:
        raise ValueError(f"cannot pick >= {lo} tools from a catalog of {len(pool)}")
    sheets = sorted(config.sheets) if config.sheets is not None else bundled_sheets("train")
    rng = random.Random(seed)
    k = rng.randint(lo, hi)
    optional = [n for n in pool if n not in config.always]
    chosen = set(config.always) | set(rng.sample(optional, k - len(config.always)))
    return ToolConfigSample(tools=tuple(sorted(chosen)), sheet=rng.choice(sheets))


def reprice(tool: Tool, sheet: PricingSheet) -> Tool:
    """A shallow copy of `tool` billed by `sheet` (LLM tools by model, basic tools by name);
    a tool the sheet does not mention keeps its price."""
    if isinstance(tool, LLMTool):
        pricing = sheet.model_pricing(tool.config.pricing_key)
    elif tool.spec.name in sheet.tools:
        pricing = sheet.tools[tool.spec.name]
    else:
        return tool
    out = copy.copy(tool)
    out.spec = dataclasses.replace(tool.spec, pricing=pricing)
    if isinstance(tool, LLMTool):
        out.seconds_per_token = sheet.model_seconds_per_token(tool.config.pricing_key)
    return out


def apply_config(catalog: Mapping[str, Tool], sample: ToolConfigSample) -> dict[str, Tool]:
    sheet = load_sheet(sample.sheet)
    return {name: reprice(catalog[name], sheet) for name in sample.tools}


TOOL_CONFIG_KEY = "tool_config"  # Task.metadata key: {"tools": [names], "sheet": sheet name}


def with_tool_config(task: Any, sample: ToolConfigSample) -> Any:
    """`task` (a data.records.Task) carrying its instance's tool subset and sheet in metadata, so
    every process that rebuilds its tools (trainer, episode workers, eval) gets the same ones."""
    meta = dict(task.metadata) | {TOOL_CONFIG_KEY: {"tools": list(sample.tools),
                                                    "sheet": sample.sheet}}
    return dataclasses.replace(task, metadata=meta)


def instance_tools(catalog: Mapping[str, Tool], task: Any) -> list[Tool]:
    """The catalog's tools in name order, or the subset and sheet the task instance carries."""
    spec = task.metadata.get(TOOL_CONFIG_KEY)
    if spec is None:
        return [catalog[name] for name in sorted(catalog)]
    missing = sorted(set(spec["tools"]) - set(catalog))
    if missing:
        raise ValueError(f"task {task.task_id!r}: tool_config names tools not in the catalog: "
                         f"{missing}; catalog: {sorted(catalog)}")
    sample = ToolConfigSample(tools=tuple(sorted(spec["tools"])), sheet=spec["sheet"])
    return list(apply_config(catalog, sample).values())
