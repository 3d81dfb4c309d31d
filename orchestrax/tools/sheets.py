"""Pricing sheets: data files (orchestrax/tools/pricing/*.json) that price every model per provider
($/M input tokens, $/M output tokens, $/call) and every basic tool, for one training or evaluation
configuration.

File shape: {"name", "split": "train"|"eval", "note",
             "models": {model: {"provider", "usd_per_m_input", "usd_per_m_output", "usd_per_call"?,
                                "seconds_per_output_token"?}},
             "tools": {tool_name: <pricing JSON, see specs.py>}}
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Any, Literal

from orchestrax.checks import at_least, at_least_or_none, one_of
from orchestrax.tools.tool import Pricing
from orchestrax.tools.specs import pricing_from_json

SHEET_DIR = pathlib.Path(__file__).resolve().parent / "pricing"
Split = Literal["train", "eval"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelPrice:
    provider: str
    usd_per_m_input: float
    usd_per_m_output: float
    usd_per_call: float = 0.0
    # The model's generation speed as an LLM tool's latency (None: the tool's nominal per-call
    # figure); a sheet figure, so the reward's clock never reads a provider's response time.
    seconds_per_output_token: float | None = None

    def __post_init__(self):
        at_least(self, 0, "usd_per_m_input", "usd_per_m_output", "usd_per_call")
        at_least_or_none(self, 0, "seconds_per_output_token")

    def pricing(self) -> Pricing:
        return Pricing(kind="per_token", usd_per_call=self.usd_per_call,
                       usd_per_m_input=self.usd_per_m_input, usd_per_m_output=self.usd_per_m_output)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PricingSheet:
    name: str
    split: Split
    models: dict[str, ModelPrice]
    tools: dict[str, Pricing]
    note: str = ""

    def __post_init__(self):
        one_of(self, "split", self.split, ("train", "eval"))

    def model_pricing(self, model: str) -> Pricing:
        if model not in self.models:
            raise KeyError(f"pricing sheet {self.name!r} has no model {model!r}; "
                           f"it prices: {sorted(self.models)}")
        return self.models[model].pricing()

    def model_seconds_per_token(self, model: str) -> float | None:
        """The sheet's generation speed of `model` (None when it gives none or lacks it)."""
        row = self.models.get(model)
        return None if row is None else row.seconds_per_output_token

    def tool_pricing(self, tool: str, default: Pricing) -> Pricing:
        return self.tools.get(tool, default)


def sheet_from_json(data: dict[str, Any]) -> PricingSheet:
    for key in ("name", "split", "models"):
        if key not in data:
            raise ValueError(f"pricing sheet is missing the field {key!r}")
    models = {}
    for model, row in data["models"].items():
        try:
            models[model] = ModelPrice(**row)
        except TypeError as e:
            raise ValueError(f"pricing sheet {data['name']!r} model {model!r}: {e}") from None
    tools = {name: pricing_from_json(p) for name, p in data.get("tools", {}).items()}
    return PricingSheet(name=data["name"], split=data["split"], models=models, tools=tools,
                        note=data.get("note", ""))


@functools.lru_cache(maxsize=64)
def load_sheet(name_or_path: str | pathlib.Path) -> PricingSheet:
    """A bundled sheet by name ("train_list") or any JSON file by path; read once per process
    (every episode reprices its tools), so treat the returned sheet as read-only."""
    path = pathlib.Path(name_or_path)
    if not path.suffix:
        path = SHEET_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise FileNotFoundError(f"pricing sheet {str(name_or_path)!r} not found; bundled sheets: "
                                f"{bundled_sheets()}")
    return sheet_from_json(json.loads(path.read_text()))


def bundled_sheets(split: Split | None = None) -> list[str]:
    names = sorted(p.stem for p in SHEET_DIR.glob("*.json"))
    if split is None:
        return names
    return [n for n in names if load_sheet(n).split == split]
