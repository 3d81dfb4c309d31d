"""A weighted mixture of task sources (tau2 and ToolScale domains, QA sets) as one environment.

Each task carries its source's name in `metadata["source"]`, and every hook goes to that
source's environment. How often each source is drawn is the trainer's task stream
(data.tasks.mixture_stream over `sizes()` and `weights`); `stats` reports each source's share
of a step's tasks as `mix/<source>`, next to each source's own stats as `<source>/<key>`.
"""

from __future__ import annotations

import dataclasses
import types
from typing import TYPE_CHECKING, Sequence

import numpy as np

from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import EnvConfig, Environment
from orchestrax.tools.tool import Tool

if TYPE_CHECKING:
    from orchestrax.agent.episode import UserResponder


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixSource:
    name: str                  # its tasks' metadata["source"] and its metrics' prefix
    weight: float              # its share of a step's tasks is weight / sum of weights
    env: EnvConfig             # any registered env config but a mixture


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixConfig(EnvConfig):
    sources: tuple[MixSource, ...]

    def __post_init__(self):
        if not isinstance(self.sources, tuple) or not self.sources \
                or not all(isinstance(s, MixSource) for s in self.sources):
            raise ValueError(f"MixConfig.sources={self.sources!r}; give a non-empty tuple of "
                             "MixSource(name=..., weight=..., env=...)")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"MixConfig.sources: names {names} repeat")
        for s in self.sources:
            if isinstance(s.weight, bool) or not isinstance(s.weight, (int, float)) \
                    or not s.weight > 0:
                raise ValueError(f"MixConfig.sources: {s.name!r} has weight={s.weight!r}; "
                                 "must be > 0")
            if isinstance(s.env, MixConfig) or not isinstance(s.env, EnvConfig):
                raise ValueError(f"MixConfig.sources: {s.name!r} has env={s.env!r}; allowed: "
                                 "any env config but MixConfig")


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
        # The one orchestrator catalog the sources that take it share: what per-instance tool
        # subsets and sheets are drawn from (without it every instance got every tool).
        offered = {name: sorted(env.catalog) for name, env in self._envs.items() if env.catalog}
        if len({tuple(c) for c in offered.values()}) > 1:
            raise ValueError(f"MixtureEnv sources offer different tool catalogs {offered}; "
                             "every source that takes a catalog must get the same one")
        self.catalog = types.MappingProxyType(
            next((dict(self._envs[name].catalog) for name in offered), {}))

    def _env(self, task: Task) -> Environment:
        return self._envs[task.metadata["source"]]

    def tasks(self, split: str = "train") -> list[Task]:
        """Every source's tasks of `split`, source after source in the order given."""
        return [dataclasses.replace(t, metadata={**t.metadata, "source": name})
                for name in self.names for t in self._envs[name].tasks(split)]

    def sizes(self, split: str = "train") -> tuple[int, ...]:
        return tuple(len(self._envs[name].tasks(split)) for name in self.names)

    def task_stream(self, num_tasks: int, tasks_per_step: int, *, seed: int,
                    process_index: int = 0, process_count: int = 1):
        """Each source's `weights` share of every step (data.tasks.mixture_stream)."""
        from orchestrax.data import tasks
        return tasks.mixture_stream(self.sizes(), self.weights, tasks_per_step, seed=seed,
                                    process_index=process_index, process_count=process_count)

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
