"""A task environment: tasks, the tools an episode may call, and a verifier.

`tools(task)` is called once per episode and returns fresh tool instances, so stateful domains
(a tau2 database) start every rollout from the same state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

from orchestrax.agent.trajectory import Trajectory
from orchestrax.tools.base import Tool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    task_id: str
    messages: tuple[dict[str, Any], ...]       # system (without the tools block) and user turns
    preference: tuple[float, ...] | None = None  # P = (tools..., outcome, compute, latency)
    preference_instruction: str | None = None
    answer: Any = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


class Environment(Protocol):
    def tasks(self, split: str = "train") -> Sequence[Task]: ...

    def tools(self, task: Task) -> list[Tool]: ...

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        """Outcome in {0.0, 1.0}."""
        ...
