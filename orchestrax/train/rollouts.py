"""One training episode, start to verdict, and where episodes run.

`play` is the whole life of one rollout: the environment's user (if it has one) opens the
conversation, the episode runs, the environment scores it. The trainer runs it either on its own
event loop (`rollout.workers == 0`) or inside the worker processes of an `EpisodePool`
(`rollout.workers > 0`), where `EpisodePlayer` rebuilds the environment and tokenizer from the
run's config and talks to the sampler over HTTP: the SGLang fleet, or the trainer's embedded
sampler served on a loopback port (`orchestrax.rollout.server`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable

from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig, run_episode
from orchestrax.agent.executor import ToolExecutor
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.base import Environment, play_task
from orchestrax.rollout.base import Sampler


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


def tool_totals(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    """Calls and dollars per tool over `trajectories` (failed calls counted, at what they
    cost): `tools/<name>/calls`, `tools/<name>/cost_usd`."""
    out: dict[str, float] = {}
    for traj in trajectories:
        for call in traj.tool_calls:
            out[f"tools/{call.name}/calls"] = out.get(f"tools/{call.name}/calls", 0.0) + 1
            key = f"tools/{call.name}/cost_usd"
            out[key] = out.get(key, 0.0) + float(call.cost)
    return out


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

    def __init__(self, cfg: Any, sampler_urls: tuple[str, ...]):
        from orchestrax import registry
        from orchestrax.rollout.base import SamplerConfig
        from orchestrax.train import setup

        self.env = setup.make_env(cfg)
        self.codec = registry.build_codec(cfg.tokenizer)
        self.sampler = registry.build_sampler(SamplerConfig(backend="sglang", urls=sampler_urls))
        self.executor: ToolExecutor | None = None

    async def play(self, job: EpisodeJob) -> tuple[Trajectory, float, dict[str, int]]:
        """(trajectory, outcome, client counters): the counters are this worker's SGLang client's
        requests, retries and failed requests since the previous episode that ended here. The
        episodes of a worker share its client, so one episode's deltas may include a concurrent
        episode's retries; every retry is reported once, by the first episode to end after it,
        and the sum over a batch is exact (all its requests are done when its last episode ends).
        """
        if self.executor is None:  # made inside the worker's event loop
            self.executor = ToolExecutor()
        trajectory, outcome = await play(self.env, self.sampler, self.codec, self.executor, job)
        return trajectory, outcome, self.sampler.take_counters()

    async def aclose(self) -> None:
        await self.sampler.aclose()
