"""Preference instructions and their vectors P (the paper's Pairs_train / Pairs_eval).

A profile is a weight on each objective (outcome, compute = low cost, latency) plus, for
tool-specific wishes, a weight on one named tool. Each profile has several phrasings; training
and evaluation get different phrasings, so no (instruction, P) pair — and no instruction text —
is shared between the pools, and eval measures whether a policy follows wishes it has not read.

For one task instance, `draw` picks a pair with a seed and lays P out over that instance's tools:
P = (one weight per tool in the instance's order, outcome, compute, latency), tool weights 0
except the tool a tool-specific wish names (chosen among the instance's non-domain tools).
"""

from __future__ import annotations

from orchestrax.checks import require
import dataclasses
import random
from typing import Literal, Sequence

Pool = Literal["train", "eval"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreferencePair:
    instruction: str           # may contain "{tool}": the tool a tool-specific wish names
    outcome: float
    compute: float
    latency: float
    tool: float = 0.0          # weight on the named tool (only with "{tool}" in the text)

    def __post_init__(self):
        for name in ("outcome", "compute", "latency", "tool"):
            v = getattr(self, name)
            require(0.0 <= v <= 1.0, self, name, v, "in [0, 1]")
        if (self.tool > 0) != ("{tool}" in self.instruction):
            raise ValueError(f"PreferencePair {self.instruction!r}: a tool weight needs a "
                             "{tool} slot in the instruction and vice versa")

    @property
    def names_tool(self) -> bool:
        return "{tool}" in self.instruction


# (outcome, compute, latency, tool): phrasings; the first three train, the rest evaluate.
_PROFILES: dict[tuple[float, float, float, float], tuple[str, ...]] = {
    (1.0, 0.0, 0.0, 0.0): (
        "Getting the answer right is all that matters to me.",
        "Accuracy first; cost and speed do not matter.",
        "Please focus only on solving the task correctly.",
        "I only care that the result is correct, whatever it takes.",
        "Spend what you need: correctness is my sole concern."),
    (1.0, 1.0, 0.0, 0.0): (
        "I want to be cost efficient if possible.",
        "Keep the cost low, please.",
        "Money is tight: use the cheapest way that works.",
        "Please minimise the dollars spent on this.",
        "Be frugal with paid tools and models."),
    (1.0, 0.0, 1.0, 0.0): (
        "I need the answer fast.",
        "Please keep latency as low as you can.",
        "Speed matters most to me; avoid slow tools.",
        "Respond quickly, even if it costs more.",
        "Time is short: pick the fastest route to an answer."),
    (1.0, 0.5, 0.5, 0.0): (
        "Balance cost and speed.",
        "Try to be both cheap and quick.",
        "Keep both the bill and the waiting time reasonable.",
        "Neither waste money nor time, please.",
        "Aim for a good trade-off between price and latency."),
    (1.0, 0.0, 0.0, 1.0): (
        "Please use {tool} where you can.",
        "I prefer {tool} for this.",
        "Rely on {tool} whenever it helps.",
        "If possible, let {tool} do the work.",
        "My preferred tool here is {tool}."),
    (1.0, 1.0, 0.0, 1.0): (
        "Use {tool} if it helps, and keep the cost down.",
        "Prefer {tool}, and be cost conscious.",
        "Go with {tool} where you can, cheaply.",
        "Lean on {tool} but do not overspend.",
        "Favour {tool} and keep expenses low."),
}
_TRAIN_PHRASINGS = 3


def _pool(split: Pool) -> tuple[PreferencePair, ...]:
    out = []
    for (outcome, compute, latency, tool), texts in _PROFILES.items():
        chosen = texts[:_TRAIN_PHRASINGS] if split == "train" else texts[_TRAIN_PHRASINGS:]
        out += [PreferencePair(instruction=t, outcome=outcome, compute=compute, latency=latency,
                               tool=tool) for t in chosen]
    return tuple(out)


PAIRS_TRAIN = _pool("train")
PAIRS_EVAL = _pool("eval")


def pairs(split: Pool) -> tuple[PreferencePair, ...]:
    if split not in ("train", "eval"):
        raise ValueError(f"preference pool split={split!r}; allowed: 'train', 'eval'")
    return PAIRS_TRAIN if split == "train" else PAIRS_EVAL


def instructions(split: Pool, nameable: Sequence[str]) -> list[str]:
    """Every instruction `draw` can give an instance whose nameable tools are `nameable`."""
    out = []
    for pair in pairs(split):
        if not pair.names_tool:
            out.append(pair.instruction)
        else:
            out += [pair.instruction.format(tool=tool) for tool in nameable]
    return out


def draw(split: Pool, tool_names: Sequence[str], seed: int, *,
         nameable: Sequence[str] | None = None) -> tuple[tuple[float, ...], str]:
    """(P, instruction) for one instance whose tools are `tool_names` (P's tool order).
    `nameable`: the tools a tool-specific wish may name (default: all); with none, only
    wishes about outcome, cost and latency are drawn."""
    nameable = list(tool_names if nameable is None else nameable)
    unknown = sorted(set(nameable) - set(tool_names))
    if unknown:
        raise ValueError(f"preferences.draw nameable={unknown} not among tool_names")
    candidates = [p for p in pairs(split) if nameable or not p.names_tool]
    rng = random.Random(seed)
    pair = rng.choice(candidates)
    weights = [0.0] * len(tool_names)
    text = pair.instruction
    if pair.names_tool:
        tool = rng.choice(sorted(nameable))
        weights[list(tool_names).index(tool)] = pair.tool
        text = text.format(tool=tool)
    return (*weights, pair.outcome, pair.compute, pair.latency), text
