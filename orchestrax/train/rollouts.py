"""The trainer's rollout drivers: one training episode, start to verdict, and where episodes run.

`play` is the whole life of one rollout: the environment's user (if it has one) opens the
conversation, the episode runs, the environment scores it. `DirectRollouts` runs it on the
trainer's own event loop (`rollout.workers == 0`); `PooledRollouts` inside the worker processes
of an `EpisodePool` (`rollout.workers > 0`), where `EpisodePlayer` rebuilds the environment and
tokenizer from the run's config and talks to the sampler over HTTP: the SGLang fleet, or the
trainer's embedded sampler served on a loopback port (`orchestrax.rollout.server`). Sub-agent
mode's driver is `train.flow.FlowRunner`. Every driver has the same face (`RolloutDriver`), so
the trainer picks one when it starts and never asks which it has.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import pathlib
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sequence

import numpy as np

from orchestrax.agent.fanout import fan_out
from orchestrax.agent.pool import EpisodePool

from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig, run_episode
from orchestrax.agent.executor import ToolExecutor
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import Environment, play_task
from orchestrax.rollout.sampler import Sampler

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EpisodeJob:
    """What a worker needs to know about one rollout (picklable)."""

    task: Task
    episode: EpisodeConfig


async def play(env: Environment, sampler: Sampler, codec: Codec, executor: ToolExecutor,
               job: EpisodeJob) -> tuple[Trajectory, float]:
    """(trajectory, outcome) of one token-in/token-out episode of `job.task` (`play_task`:
    never raises but on cancellation; a failure is a failed trajectory the step's filters
    drop)."""
    async def run(start: Task, tools, user) -> Trajectory:
        return await run_episode(sampler, codec, start, tools, config=job.episode,
                                 executor=executor, user=user)

    return await play_task(env, job.task, run)


def sum_counters(deltas: Iterable[dict[str, int]]) -> dict[str, int]:
    """Key-wise sum of client counter deltas (`SGLangClient.take_counters`), e.g. the ones each
    worker episode brings back."""
    total = collections.Counter()
    for delta in deltas:
        total.update(delta)  # update, not +: keeps the zero counts
    return dict(total)


def drop_stale(trajectories: Iterable[Trajectory], version: str) -> dict[str, float]:
    """Fail every trajectory with a turn the sampler reported from weights other than `version`
    (a server whose weight sync failed keeps serving the old policy): its tokens would train on
    another policy's logprobs. A failed trajectory has no answer, so the step's filters drop it
    like any other invalid rollout. A sampler that reports no version ("") is trusted.
    Returns the counts for the step's metrics."""
    dropped = stale_turns = 0
    for traj in trajectories:
        stale = [t.weight_version for t in traj.turns if t.weight_version not in ("", version)]
        if stale:
            dropped += 1
            stale_turns += len(stale)
            traj.final_answer, traj.end_reason = None, "error"
            traj.error = (f"{len(stale)} turn(s) sampled from stale weights "
                          f"{sorted(set(stale))}; the trainer published {version!r}")
    return {"rollout/stale_trajectories": float(dropped), "rollout/stale_turns": float(stale_turns)}


class EpisodePlayer:
    """Runs in each `EpisodePool` worker: the run's environment and tokenizer, rebuilt from its
    config, and an SGLang client for the sampler at `sampler_urls`. The tokenizer is loaded with
    the `tokenizers` library alone: a worker never imports transformers (nor torch through it),
    which took most of a worker's start-up."""

    def __init__(self, cfg: Any, sampler_urls: tuple[str, ...],
                 make_executor: Callable[[], ToolExecutor] = ToolExecutor):
        from orchestrax import registry
        from orchestrax.rollout.sampler import SamplerConfig
        from orchestrax.train import setup

        self.env = setup.make_env(cfg)
        self.codec = registry.build_codec(cfg.tokenizer)
        self.sampler = registry.build_sampler(SamplerConfig(backend="sglang", urls=sampler_urls))
        self.make_executor = make_executor
        self.executor: ToolExecutor | None = None

    async def play(self, job: EpisodeJob) -> tuple[Trajectory, float, dict[str, int]]:
        """(trajectory, outcome, client counters): the counters are this worker's SGLang client's
        requests, retries and failed requests since the previous episode that ended here. The
        episodes of a worker share its client, so one episode's deltas may include a concurrent
        episode's retries; every retry is reported once, by the first episode to end after it,
        and the sum over a batch is exact (all its requests are done when its last episode ends).
        """
        if self.executor is None:  # made inside the worker's event loop
            self.executor = self.make_executor()
        trajectory, outcome = await play(self.env, self.sampler, self.codec, self.executor, job)
        return trajectory, outcome, self.sampler.take_counters()

    async def aclose(self) -> None:
        await self.sampler.aclose()


def uncounted(n: int) -> None:
    """A rollout's `on_done` when nothing counts its finished episodes."""


def counted(fn: Callable[[Any], Awaitable[Any]], on_done: Callable[[int], object]
            ) -> Callable[[Any], Awaitable[Any]]:
    """`fn` calling `on_done(1)` after each call returns (a progress bar's update)."""
    async def one(item):
        result = await fn(item)
        on_done(1)
        return result

    return one


class RolloutDriver(Protocol):
    """What the trainer asks of a rollout driver: G rollouts per task (`on_done(n)` as n more
    finish), their batch, their clock and the sampler's counters since the last ask."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def rollout(self, tasks: Sequence[Task], group: int, episode: EpisodeConfig,
                      seeds: np.ndarray, on_done: Callable[[int], object] = uncounted
                      ) -> tuple[list[list[Any]], np.ndarray]: ...

    def make_batch(self, tasks: Sequence[Task], groups: Sequence[Sequence[Any]],
                   outcome_QG: np.ndarray, pad_id: int
                   ) -> tuple[dict[str, np.ndarray], dict[str, float]]: ...

    def clock_s(self, rollout: Any) -> float: ...

    def take_counters(self) -> dict[str, int]: ...


def grouped(played: Sequence[tuple[Any, float]], num_tasks: int, group: int
            ) -> tuple[list[list[Any]], np.ndarray]:
    """(rollout, outcome) pairs, task-major, as Q groups of G and the outcomes [Q, G]."""
    rollouts = [r for r, _ in played]
    outcome = np.asarray([o for _, o in played], np.float32).reshape(num_tasks, group)
    return [rollouts[i * group:(i + 1) * group] for i in range(num_tasks)], outcome


def direct_batch(cfg: Any, env: Environment, tasks: Sequence[Task],
                 groups: Sequence[Sequence[Trajectory]], outcome: np.ndarray, pad_id: int
                 ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """`rl.direct_batch` over the tasks' own tool subsets and preference vectors, plus the
    environment's statistics of the step (`env_stats`)."""
    from orchestrax import rl  # the trainer's process only: episode workers never load JAX
    for task in tasks:
        if task.preference is None:  # no silent outcome-only fallback
            raise ValueError(f"task {task.task_id!r} has no preference vector; keep "
                             "TrainConfig.instances.preferences=True or give tasks their P")
    # Tool-count columns are aligned by tool name across the instances' tool subsets.
    batch, stats = rl.batch.direct_batch(
        groups, outcome, task_tool_names(env, tasks), [t.preference for t in tasks], cfg.grpo,
        pad_id=pad_id, max_len=cfg.rollout.context_tokens,
        seconds_per_token=cfg.rollout.seconds_per_token)
    return batch, stats | env_stats(env, tasks, groups)


def task_tool_names(env: Environment, tasks: Sequence[Task]) -> list[list[str]]:
    """The names of each task's tools (its instance's subset), in the env's order."""
    return [[tool.spec.name for tool in env.tools(t)] for t in tasks]


def env_stats(env: Environment, tasks: Sequence[Task], groups: Sequence[Sequence[Any]]
              ) -> dict[str, float]:
    """The environment's own statistics of a step's groups as row keys: `env/<name>`."""
    return {f"env/{k}": v for k, v in env.stats(tasks, groups).items()}


class DirectRollouts:
    """Direct-mode episodes on the trainer's event loop, at most `rollout.max_in_flight` at
    once. `make_executor` builds the tool executor every episode shares."""

    def __init__(self, cfg: Any, env: Environment, sampler: Sampler, codec: Codec,
                 make_executor: Callable[[], ToolExecutor] = ToolExecutor):
        self.cfg, self.env, self.sampler, self.codec = cfg, env, sampler, codec
        self.make_executor = make_executor
        self.executor = make_executor()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def _play(self, jobs: list[EpisodeJob], on_done: Callable[[int], object]
                    ) -> list[tuple[Trajectory, float]]:
        async def one(job):
            return await play(self.env, self.sampler, self.codec, self.executor, job)

        return await fan_out(counted(one, on_done), jobs,
                             max_in_flight=self.cfg.rollout.max_in_flight)

    async def rollout(self, tasks: Sequence[Task], group: int, episode: EpisodeConfig,
                      seeds: np.ndarray, on_done: Callable[[int], object] = uncounted
                      ) -> tuple[list[list[Trajectory]], np.ndarray]:
        """G episodes per task; episode k samples with seed `seeds[k]` (its turns seed + turn)."""
        jobs = [EpisodeJob(task=t, episode=dataclasses.replace(
                    episode, sampling=dataclasses.replace(episode.sampling,
                                                          sampling_seed=int(seed))))
                for t, seed in zip((t for t in tasks for _ in range(group)), seeds)]
        return grouped(await self._play(jobs, on_done), len(tasks), group)

    def make_batch(self, tasks, groups, outcome_QG, pad_id: int):
        return direct_batch(self.cfg, self.env, tasks, groups, outcome_QG, pad_id)

    def clock_s(self, trajectory: Trajectory) -> float:
        return trajectory.clock_s(self.cfg.rollout.seconds_per_token)

    def take_counters(self) -> dict[str, int]:
        return self.sampler.take_counters()


class PooledRollouts(DirectRollouts):
    """Direct-mode episodes in `rollout.workers` `EpisodePool` processes. Their SGLang clients
    call the fleet (this process's share of `server_urls`), or, for the embedded sampler, a
    loopback server on the trainer's own sampler (same object, so weight updates apply)."""

    def __init__(self, cfg: Any, env: Environment, sampler: Sampler, codec: Codec, *,
                 urls: tuple[str, ...], tokenizer: Any, model_dir: pathlib.Path,
                 make_executor: Callable[[], ToolExecutor] = ToolExecutor):
        super().__init__(cfg, env, sampler, codec, make_executor)
        self.urls, self.tokenizer, self.model_dir = urls, tokenizer, model_dir
        self.pool: EpisodePool | None = None
        self._server = None
        self._worker_counters: dict[str, int] = {}  # workers' client counters not yet taken

    async def start(self) -> None:
        r, urls = self.cfg.rollout, self.urls
        if r.backend == "embedded":
            from orchestrax.rollout import server
            self._server = await server.start(server.ServerState(
                sampler=self.sampler, model_path=str(self.model_dir), tokenizer=self.tokenizer))
            urls = (f"http://127.0.0.1:{server.bound_port(self._server)}",)
        build = functools.partial(EpisodePlayer, self.cfg, urls, self.make_executor)
        self.pool = await asyncio.to_thread(
            EpisodePool, build, workers=r.workers,
            max_in_flight=max(1, r.max_in_flight // r.workers))
        log.info("%d episode workers started (sampler at %s)", r.workers, ", ".join(urls))

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._server is not None:
            await self._server.cleanup()  # also closes the sampler it serves
            self._server = None

    async def _play(self, jobs: list[EpisodeJob], on_done: Callable[[int], object]
                    ) -> list[tuple[Trajectory, float]]:
        played = await self.pool.play(jobs, on_done)
        # Each episode brings its worker's client counters back; the next row logs them.
        self._worker_counters = sum_counters(
            [self._worker_counters, *(counters for _, _, counters in played)])
        return [(traj, outcome) for traj, outcome, _ in played]

    def take_counters(self) -> dict[str, int]:
        """The trainer's own client's counters plus the episode workers' (theirs come back with
        the episodes)."""
        total = sum_counters([self.sampler.take_counters(), self._worker_counters])
        self._worker_counters = {}
        return total
