"""Synthetic tool routing: the CPU demo's environment.

Every task asks for the secret code of a key. Only a lookup tool knows the code (it is drawn
per task, so it cannot be memorised), and three tools know it equally well:

    lookup_cheap    $0.001 per call, 4.0 s
    lookup_fast     $0.020 per call, 0.3 s
    lookup_premium  $0.050 per call, 6.0 s   (dominated: dear and slow, the "always ask the
                                               frontier model" habit)

Each task carries a preference vector P = (cheap, fast, premium, outcome, compute, latency) and
its instruction: half the tasks weigh cost (P = 0,0,0,1,1,0, "keep the cost low"), half weigh
latency (P = 0,0,0,1,0,1, "answer quickly"). Under the ToolOrchestra reward the right call is
then lookup_cheap or lookup_fast respectively, and a policy that routes by the instruction scores
highest. Latency is simulated (reported, not slept) so rollouts stay fast.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from orchestrax.agent.trajectory import Trajectory
from orchestrax.envs.base import Task
from orchestrax.tools.base import Pricing, ToolResult, ToolSpec

KEYS = ("sky", "tree", "river", "stone", "cloud", "fire", "moon", "sand", "leaf", "wolf",
        "bird", "rain", "snow", "star", "lake", "hill")
TOOLS = (("lookup_cheap", 0.001, 4.0), ("lookup_fast", 0.02, 0.3), ("lookup_premium", 0.05, 6.0))
INSTRUCTIONS = {"cost": "Keep the cost low.", "latency": "Answer quickly."}
PREFERENCES = {"cost": (0.0, 0.0, 0.0, 1.0, 1.0, 0.0), "latency": (0.0, 0.0, 0.0, 1.0, 0.0, 1.0)}
PREFERRED_TOOL = {"cost": "lookup_cheap", "latency": "lookup_fast"}
SYSTEM = "Find the code with a tool, then reply <answer>code</answer>."


class LookupTool:
    """Knows one task's code; any other key is an error observation (ok=False is not needed:
    a wrong key simply leads to a wrong answer)."""

    def __init__(self, name: str, usd: float, seconds: float, key: str, code: str):
        self.spec = ToolSpec(
            name=name, description=f"Code of a key. ${usd} per call, {seconds} s.",
            parameters={"type": "object", "properties": {"key": {"type": "string"}},
                        "required": ["key"]},
            category="basic", pricing=Pricing(kind="per_call", usd_per_call=usd),
            latency_s=seconds)
        self._key, self._code = key, code

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        key = str(arguments.get("key", "")).strip().lower()
        text = self._code if key == self._key else f"no code for key {key!r}"
        return ToolResult(observation=text, cost=self.spec.pricing.cost(),
                          latency=self.spec.latency_s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingConfig:
    num_train: int = 512
    num_eval: int = 32
    seed: int = 0

    def __post_init__(self):
        if self.num_train < 1 or self.num_eval < 1:
            raise ValueError(f"RoutingConfig num_train={self.num_train}, num_eval={self.num_eval};"
                             " both must be >= 1")


class RoutingEnv:
    """Environment protocol (see envs/base.py) plus `demonstration` and `stats` for the demo."""

    def __init__(self, config: RoutingConfig = RoutingConfig()):
        self.config = config
        self._splits = {"train": self._make(config.num_train, config.seed * 2 + 1),
                        "eval": self._make(config.num_eval, config.seed * 2 + 2)}

    @staticmethod
    def _make(n: int, seed: int) -> list[Task]:
        rng = np.random.default_rng(seed)
        tasks = []
        for i in range(n):
            key = KEYS[rng.integers(len(KEYS))]
            mode = ("cost", "latency")[i % 2]
            code = str(rng.integers(10, 100))
            tasks.append(Task(
                task_id=f"routing-{seed}-{i}",
                messages=({"role": "system", "content": SYSTEM},
                          {"role": "user", "content": f"Code of {key}?"}),
                preference=PREFERENCES[mode], preference_instruction=INSTRUCTIONS[mode],
                answer=code, metadata={"key": key, "mode": mode}))
        return tasks

    def tasks(self, split: str = "train") -> Sequence[Task]:
        if split not in self._splits:
            raise ValueError(f"RoutingEnv split={split!r}; allowed: {sorted(self._splits)}")
        return self._splits[split]

    def tools(self, task: Task) -> list[LookupTool]:
        return [LookupTool(name, usd, s, task.metadata["key"], task.answer)
                for name, usd, s in TOOLS]

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        answer = (trajectory.final_answer or "").strip()
        return float(answer == task.answer)

    def demonstration(self, task: Task, rng: np.random.Generator) -> list[str]:
        """Assistant turns of a correct episode with a uniformly random tool: the warm start
        teaches the format and the copy, not the preference."""
        name = TOOLS[rng.integers(len(TOOLS))][0]
        call = '{"name": "%s", "arguments": {"key": "%s"}}' % (name, task.metadata["key"])
        return [f"<tool_call>\n{call}\n</tool_call>", f"<answer>{task.answer}</answer>"]

    def stats(self, tasks: Sequence[Task], groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        """preferred_tool_rate: share of episodes whose first call is the tool P favours; and the
        same split by mode, the number the demo is about."""
        hits = {"cost": [], "latency": []}
        for task, group in zip(tasks, groups):
            for tr in group:
                calls = tr.tool_calls
                hits[task.metadata["mode"]].append(
                    bool(calls) and calls[0].name == PREFERRED_TOOL[task.metadata["mode"]])
        out = {f"preferred_tool_rate_{m}": float(np.mean(h)) for m, h in hits.items() if h}
        out["preferred_tool_rate"] = float(np.mean(hits["cost"] + hits["latency"]))
        return out
