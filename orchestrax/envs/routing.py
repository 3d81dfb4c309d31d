"""Synthetic tool-routing tasks for the CPU demo: the preference vector decides the right tool.

Each task asks for the value stored under a key ("Value of k42?"). Every lookup tool returns the
right value (deliberately: no tool is unreliable, so the outcome never depends on luck and the
only thing to learn beyond the format is routing). The tools differ in simulated price and
latency, reported through `ToolResult` without sleeping:

    lookup_cheap    $0.001 / call   4.0 s     right when P weighs compute (cost)
    lookup_fast     $0.020 / call   0.2 s     right when P weighs latency
    lookup_premium  $0.050 / call   2.0 s     dominated; right only when P names it

P = (one weight per tool, in `tools()` order, outcome, compute, latency), values in [0, 1].
Everything is a function of (seed, split): two environments with the same config agree.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

from orchestrax.agent.trajectory import Trajectory
from orchestrax.envs.base import Task
from orchestrax.tools.base import Pricing, ToolError, ToolResult, ToolSpec

SYSTEM_PROMPT = "Call one lookup tool, then reply <answer>value</answer>."


@dataclasses.dataclass(frozen=True, kw_only=True)
class LookupTool:
    name: str
    usd_per_call: float
    latency_s: float


DEFAULT_TOOLS = (LookupTool(name="lookup_cheap", usd_per_call=0.001, latency_s=4.0),
                 LookupTool(name="lookup_fast", usd_per_call=0.02, latency_s=0.2),
                 LookupTool(name="lookup_premium", usd_per_call=0.05, latency_s=2.0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingConfig:
    seed: int = 0
    num_train: int = 256
    num_eval: int = 32
    tools: tuple[LookupTool, ...] = DEFAULT_TOOLS
    # "cost", "latency", or a tool name (the user asks for that tool); tasks cycle through them
    preferences: tuple[str, ...] = ("cost", "latency")

    def __post_init__(self):
        if self.num_train < 1 or self.num_eval < 1:
            raise ValueError(f"RoutingConfig.num_train={self.num_train}, num_eval={self.num_eval}; "
                             "both must be >= 1")
        names = [t.name for t in self.tools]
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"RoutingConfig.tools must be >= 2 tools with distinct names; got {names}")
        if any(t.usd_per_call < 0 or t.latency_s < 0 for t in self.tools):
            raise ValueError("RoutingConfig.tools: usd_per_call and latency_s must be >= 0")
        allowed = ["cost", "latency", *names]
        bad = [p for p in self.preferences if p not in allowed]
        if not self.preferences or bad:
            raise ValueError(f"RoutingConfig.preferences={self.preferences!r}; allowed: {allowed}")
        for kind in ("cost", "latency"):
            if kind in self.preferences:
                key = (lambda t: t.usd_per_call) if kind == "cost" else (lambda t: t.latency_s)
                best = sorted(key(t) for t in self.tools)
                if best[0] == best[1]:
                    raise ValueError(f"RoutingConfig.tools: preference {kind!r} needs one tool "
                                     "strictly best on it")


def preferred_tool(config: RoutingConfig, kind: str) -> str:
    if kind == "cost":
        return min(config.tools, key=lambda t: t.usd_per_call).name
    if kind == "latency":
        return min(config.tools, key=lambda t: t.latency_s).name
    return kind


def preference_vector(config: RoutingConfig, kind: str) -> tuple[float, ...]:
    tools = [1.0 if t.name == kind else 0.0 for t in config.tools]
    return (*tools, 1.0, float(kind == "cost"), float(kind == "latency"))


def preference_text(kind: str) -> str:
    return {"cost": "Preference: low cost.", "latency": "Preference: low latency."}.get(
        kind, f"Preference: use {kind}.")


class _Lookup:
    """One lookup tool bound to one task's key-value table."""

    def __init__(self, tool: LookupTool, table: dict[str, str]):
        self.spec = ToolSpec(
            name=tool.name, description=f"Lookup. ${tool.usd_per_call:g}, {tool.latency_s:g}s.",
            # kept minimal: every schema token is prompt the tiny demo model must read
            parameters={"type": "object", "properties": {"key": {"type": "string"}}},
            category="basic", pricing=Pricing(kind="per_call", usd_per_call=tool.usd_per_call),
            latency_s=tool.latency_s)
        self._table = table

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        key = arguments.get("key") if isinstance(arguments, dict) else None
        if not isinstance(key, str) or key not in self._table:
            raise ToolError(f"{self.spec.name}: no entry for key={key!r}; keys look like 'k42'")
        # simulated: charge the price and report the nominal latency instead of sleeping
        return ToolResult(observation=self._table[key], cost=self.spec.pricing.cost(),
                          latency=self.spec.latency_s)


def _answer_text(answer: str | None) -> str:
    text = (answer or "").strip()
    if text.startswith("<answer>") and text.endswith("</answer>"):
        text = text[len("<answer>"):-len("</answer>")].strip()
    return text


class RoutingEnv:
    def __init__(self, config: RoutingConfig = RoutingConfig()):
        self.config = config
        self._splits = {"train": self._make("train", config.num_train),
                        "eval": self._make("eval", config.num_eval)}

    def _make(self, split: str, n: int) -> list[Task]:
        rng = random.Random(f"routing/{self.config.seed}/{split}")
        keys = rng.sample(range(100), min(n, 100))
        tasks = []
        for i in range(n):
            key = f"k{keys[i % len(keys)]:02d}"
            value = str(rng.randrange(100, 1000))
            kind = self.config.preferences[i % len(self.config.preferences)]
            tasks.append(Task(
                task_id=f"routing/{split}/{i}",
                messages=({"role": "system", "content": SYSTEM_PROMPT},
                          {"role": "user", "content": f"Value of {key}?"}),
                preference=preference_vector(self.config, kind),
                preference_instruction=preference_text(kind), answer=value,
                metadata={"key": key, "preference_kind": kind,
                          "preferred_tool": preferred_tool(self.config, kind)}))
        return tasks

    def tasks(self, split: str = "train") -> list[Task]:
        """`split`: train, or eval (alias test)."""
        split = "eval" if split == "test" else split
        if split not in self._splits:
            raise ValueError(f"routing split={split!r}; allowed: train, eval, test")
        return list(self._splits[split])

    def tools(self, task: Task) -> list[_Lookup]:
        table = {task.metadata["key"]: task.answer}
        return [_Lookup(t, table) for t in self.config.tools]

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        return float(_answer_text(trajectory.final_answer) == task.answer)

    def demonstration(self, task: Task, rng) -> list[str]:
        """Assistant turns of a correct episode with a uniformly random tool (format and task,
        no preference): a call, then the answer. `rng`: a numpy Generator."""
        tool = self.config.tools[int(rng.integers(len(self.config.tools)))].name
        call = ('<tool_call>\n{"name": "%s", "arguments": {"key": "%s"}}\n</tool_call>'
                % (tool, task.metadata["key"]))
        return [call, f"<answer>{task.answer}</answer>"]

    def stats(self, tasks: Sequence[Task], groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        """preferred_tool_rate_<kind>: share of episodes whose calls all went to the preferred
        tool (at least one call); tool_calls_mean: calls per episode."""
        hits: dict[str, list[float]] = {}
        calls = []
        for task, group in zip(tasks, groups):
            want = task.metadata["preferred_tool"]
            for traj in group:
                names = [c.name for c in traj.tool_calls]
                calls.append(len(names))
                hits.setdefault(task.metadata["preference_kind"], []).append(
                    float(bool(names) and all(n == want for n in names)))
        out = {f"preferred_tool_rate_{k}": sum(v) / len(v) for k, v in hits.items()}
        if calls:
            out["tool_calls_mean"] = sum(calls) / len(calls)
        return out
