"""A weighted mixture of task sources (tau2 and ToolScale domains, QA sets) as one environment.

Each task carries its source's name in `metadata["source"]`, and every hook goes to that
source's environment. How often each source is drawn is the trainer's task stream
(data.tasks.mixture_stream over `sizes()` and `weights`); `stats` reports each source's share
of a step's tasks as `mix/<source>`, next to each source's own stats as `<source>/<key>`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np

from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.base import Environment
from orchestrax.tools.base import Tool

if TYPE_CHECKING:
    from orchestrax.agent.episode import UserResponder


class MixtureEnv(Environment):
    def __init__(self, sources: Sequence[tuple[str, float, Environment]]):
        """`sources`: (name, weight > 0, environment), names unique."""
        names = [name for name, _, _ in sources]
        if not sources or len(set(names)) != len(names):
            raise ValueError(f"MixtureEnv sources {names}: need at least one, names unique")
        bad = [(n, w) for n, w, _ in sources if not w > 0]
        if bad:
            raise ValueError(f"MixtureEnv weights {bad}: each must be > 0")
        self.names = tuple(names)
        self.weights = tuple(float(w) for _, w, _ in sources)
        self._envs = {name: env for name, _, env in sources}

    def _env(self, task: Task) -> Environment:
        return self._envs[task.metadata["source"]]

    def tasks(self, split: str = "train") -> list[Task]:
        """Every source's tasks of `split`, source after source in the order given."""
        return [dataclasses.replace(t, metadata={**t.metadata, "source": name})
                for name in self.names for t in self._envs[name].tasks(split)]

    def sizes(self, split: str = "train") -> tuple[int, ...]:
        return tuple(len(self._envs[name].tasks(split)) for name in self.names)

    def tools(self, task: Task) -> list[Tool]:
        return self._env(task).tools(task)

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        return await self._env(task).verify(task, trajectory)

    def user_for(self, task: Task) -> UserResponder | None:
        return self._env(task).user_for(task)

    async def open(self, task: Task, user: UserResponder) -> Task:
        return await self._env(task).open(task, user)

    async def release(self, tools: Sequence[Tool]) -> None:
        # Each environment frees only the tools of its own kind.
        for env in self._envs.values():
            await env.release(tools)

    def demonstration(self, task: Task, rng: np.random.Generator) -> list[str] | None:
        return self._env(task).demonstration(task, rng)

    def stats(self, tasks: Sequence[Task], groups: Sequence[Sequence[Trajectory]]
              ) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in self.names:
            mine = [i for i, t in enumerate(tasks) if t.metadata["source"] == name]
            out[f"mix/{name}"] = len(mine) / max(1, len(tasks))
            if mine:
                sub = self._envs[name].stats([tasks[i] for i in mine], [groups[i] for i in mine])
                out |= {f"{name}/{k}": v for k, v in sub.items()}
        return out
