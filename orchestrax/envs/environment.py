"""The base of every task environment: its tasks, the tools an episode may call, a verifier, and
the optional hooks the trainer and `orchestrax eval` call on every environment.

`tools(task)` is called once per episode and returns fresh tool instances, so stateful domains
(a tau2 database) start every rollout from the same state. The optional hooks have defaults that
mean "not used here": no simulated user, the task's own opening, no demonstrations, no extra
metrics; an environment overrides the ones it has.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import types
from typing import TYPE_CHECKING, Awaitable, Callable, ClassVar, Mapping, Sequence

import numpy as np

from orchestrax.data.records import Task, Trajectory
from orchestrax.tools.tool import Tool

if TYPE_CHECKING:  # only a type: environments sit above the agent layer, never the reverse
    from orchestrax.agent.episode import UserResponder

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """The typed config of one environment kind, defined next to its environment and checking
    its own fields; `orchestrax.registry` builds the environment from it."""

    # Whether the orchestrator's tool catalog (TrainConfig.tools) is offered next to the
    # environment's own tools; an environment that brings all of its tools says False.
    takes_catalog: ClassVar[bool] = True


class Environment(abc.ABC):
    # The orchestrator's tools this environment offers next to its own, by name (what
    # per-instance tool subsets are drawn from); empty for one that brings all of its tools.
    catalog: Mapping[str, Tool] = types.MappingProxyType({})

    @abc.abstractmethod
    def tasks(self, split: str = "train") -> Sequence[Task]:
        """The tasks of `split` ("train" or "eval"), in a fixed order."""

    @abc.abstractmethod
    def tools(self, task: Task) -> list[Tool]:
        """Fresh tool instances for one episode of `task`."""

    @abc.abstractmethod
    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        """Outcome in {0.0, 1.0}."""

    def user_for(self, task: Task) -> UserResponder | None:
        """The simulated user of a conversational task, or None when the episode ends at the
        policy's first answer."""
        return None

    async def open(self, task: Task, user: UserResponder) -> Task:
        """The task as the episode starts it, once `user_for` gave a user: conversational
        domains let the user speak first and return the task with that message appended."""
        return task

    async def release(self, tools: Sequence[Tool]) -> None:
        """Free what one episode's `tools(task)` hold (a domain worker process); called once
        the episode is over, verdict included."""

    def demonstration(self, task: Task, rng: np.random.Generator) -> list[str] | None:
        """Scripted assistant turns that solve `task`, for the SFT warm start (played through the
        real episode loop); None: this environment has no demonstrations."""
        return None

    def stats(self, tasks: Sequence[Task], groups: Sequence[Sequence[Trajectory]]
              ) -> dict[str, float]:
        """Extra metrics for a step's groups (one group of trajectories per task)."""
        return {}

    def task_stream(self, num_tasks: int, tasks_per_step: int, *, seed: int,
                    process_index: int = 0, process_count: int = 1):
        """The RL steps' indices into `tasks("train")` for this process (a grain MapDataset):
        uniform, no task twice in a step."""
        from orchestrax.data import tasks
        return tasks.task_stream(num_tasks, tasks_per_step, seed=seed,
                                 process_index=process_index, process_count=process_count)


# One episode between the opening and the verdict: (the task as opened, its tools, its user or
# None) -> the trajectory. The token loop (`agent.episode.run_episode`) or an eval policy's.
EpisodeRun = Callable[[Task, Sequence[Tool], "UserResponder | None"], Awaitable[Trajectory]]


async def play_task(env: Environment, task: Task, run: EpisodeRun, *,
                    tools: Sequence[Tool] | None = None) -> tuple[Trajectory, float]:
    """(trajectory, outcome) of one episode of `task`, start to verdict, for training and
    evaluation alike: the environment's user (if any) opens the conversation, `run` plays it,
    the environment scores it. `tools`: the episode's tools when the caller made them (and frees
    them); by default the environment's fresh tools for the opened task, freed here once the
    verdict is in. Never raises except on cancellation: an environment hook, the episode or the
    verifier failing makes a failed trajectory (`end_reason="error"`, no answer, outcome 0.0),
    so one bad episode never aborts a training step or an evaluation."""
    trajectory, own = None, []
    try:
        user = env.user_for(task)
        start = task if user is None else await env.open(task, user)  # the user speaks first
        if tools is None:
            tools = own = env.tools(start)
        trajectory = await run(start, tools, user)
        return trajectory, float(await env.verify(task, trajectory))
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.warning("episode of task %s failed", task.task_id, exc_info=True)
        failed = trajectory if trajectory is not None else Trajectory(task_id=task.task_id)
        failed.final_answer, failed.end_reason = None, "error"
        failed.error = f"{type(e).__name__}: {e}"
        return failed, 0.0
    finally:
        await asyncio.shield(env.release(own))
