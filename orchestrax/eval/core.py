"""Play every task of a task set with one policy and runner; derive the turn-limit sweep.

Episodes run concurrently (up to `max_in_flight`); a tqdm bar shows running accuracy and dollars.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Sequence

from tqdm import tqdm

from orchestrax.agent.fanout import fan_out
from orchestrax.data.records import Task
from orchestrax.envs.environment import Environment
from orchestrax.eval.policy import Policy
from orchestrax.eval.episode_records import EpisodeRecord, record_from_trajectory, truncate
from orchestrax.eval.runners import RUNNERS, EvalConfig
from orchestrax.train import run_info


@dataclasses.dataclass(kw_only=True)
class TaskSet:
    name: str
    env: Environment
    tasks: list[Task]


def episode_configs(cfg: EvalConfig, num_tasks: int) -> list[EvalConfig]:
    """The config of each of the num_tasks x cfg.samples episodes (task-major): `cfg`, with its
    episode's sampling seed from `cfg.seed_schedule` when it has one."""
    n = num_tasks * cfg.samples
    if cfg.seed_schedule is None:
        return [cfg] * n
    seeds = run_info.episode_seeds(*cfg.seed_schedule, run_info.EVAL_SALT, n)
    sampling = cfg.episode.sampling
    return [dataclasses.replace(cfg, episode=dataclasses.replace(
        cfg.episode, sampling=dataclasses.replace(sampling, sampling_seed=int(s))))
        for s in seeds]


async def evaluate(task_set: TaskSet, policy: Policy, cfg: EvalConfig, *, runner: str = "direct",
                   max_in_flight: int = 64, progress: bool = True) -> list[EpisodeRecord]:
    """`cfg.samples` records per task, in task order (a task's samples side by side)."""
    if runner not in RUNNERS:
        raise ValueError(f"runner={runner!r}; registered: {sorted(RUNNERS)}")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight}; must be >= 1")
    play = RUNNERS[runner]
    jobs = list(zip((t for t in task_set.tasks for _ in range(cfg.samples)),
                    episode_configs(cfg, len(task_set.tasks))))
    bar = tqdm(total=len(jobs), desc=f"{task_set.name} [{policy.name}]",
               disable=not progress, leave=False)
    done, solved, dollars = 0, 0.0, 0.0

    async def one(job: tuple[Task, EvalConfig]) -> EpisodeRecord:
        nonlocal done, solved, dollars
        task, episode_cfg = job
        tools = task_set.env.tools(task)
        try:
            record = await play(task, task_set.env, policy, tools, episode_cfg)
        finally:
            await asyncio.shield(task_set.env.release(tools))
        record.task_set = task_set.name
        done, solved, dollars = done + 1, solved + record.outcome, dollars + record.cost_usd
        bar.update(1)
        bar.set_postfix(acc=f"{solved / done:.3f}", usd=f"{dollars:.4f}")
        return record

    try:
        return await fan_out(one, jobs, max_in_flight=max_in_flight)
    finally:
        bar.close()


async def at_turn_limit(records: Sequence[EpisodeRecord], task_set: TaskSet, limit: int,
                        cfg: EvalConfig) -> list[EpisodeRecord]:
    """The records a run with `limit` turns would have produced, derived from a run with a
    larger limit: an episode that ended within `limit` turns is unchanged; a longer one is cut
    to its first `limit` turns (no answer) and verified again, so its outcome, cost, latency,
    tokens and calls are those of the cut. Exact for deterministic policies and tools
    (temperature 0); each record must carry its trajectory."""
    by_id = {t.task_id: t for t in task_set.tasks}
    out = []
    for r in records:
        if r.turn_limit < limit:
            raise ValueError(f"record {r.task_id} ran with turn limit {r.turn_limit} < {limit}")
        if r.turns <= limit and r.end_reason != "max_turns":
            out.append(dataclasses.replace(r, turn_limit=limit))
            continue
        if r.trajectory is None:
            raise ValueError(f"record {r.task_id} has no trajectory to cut at {limit} turns")
        cut = truncate(r.trajectory, limit)
        task = by_id[r.task_id]
        outcome = await task_set.env.verify(task, cut)
        new = record_from_trajectory(cut, outcome, task_set=r.task_set, tool_names=r.tool_names,
                                     preference=r.preference, turn_limit=limit,
                                     turn_seconds=r.turn_seconds,
                                     policy_pricing=cfg.policy_pricing)
        out.append(new)
    return out
