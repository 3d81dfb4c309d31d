"""Runners: how one task instance is played and measured. A runner is

    async (task, env, policy, tools, cfg) -> EpisodeRecord

and `RUNNERS` maps the `--agent` name to it. The direct runner lets the policy orchestrate the
tools itself; other modes (e.g. an orchestrator with sub-agents) register their own runner here
without touching the evaluation core.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable, Sequence

from orchestrax.agent.episode import EpisodeConfig
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import Environment, play_task
from orchestrax.eval.policy import Policy
from orchestrax.eval.episode_records import EpisodeRecord, record_from_trajectory
from orchestrax.eval.orchestrator8b_runner import run_orchestrator8b  # the released protocol
from orchestrax.eval.subagent_runner import run_subagent  # the orchestrator + sub-agents system
from orchestrax.tools.tool import Pricing, Tool


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    episode: EpisodeConfig = EpisodeConfig(max_turns=50)
    # The orchestrator's own tokens: None is free (self-hosted); a hosted baseline is priced.
    policy_pricing: Pricing | None = None
    # Policy latency per turn: None measures generation wall time; a number charges this many
    # seconds per generated token (deterministic, for comparisons across machines and tests).
    seconds_per_token: float | None = None
    # A runner's own settings (the "subagent" runner: eval.subagent_runner.SubagentOptions).
    agent_options: Any = None
    samples: int = 1                  # episodes per task (a training run's eval_samples)
    # (run seed, checkpoint step): episode k of a task set (task-major) samples with the seed
    # the run's eval at that step gave its episode k (`run_info.episode_seeds`); None: the
    # sampler draws each request's seed from its own stream.
    seed_schedule: tuple[int, int] | None = None

    def __post_init__(self):
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"EvalConfig.samples={self.samples!r}; must be an int >= 1")
        if self.seconds_per_token is not None and not self.seconds_per_token >= 0:
            raise ValueError(f"EvalConfig.seconds_per_token={self.seconds_per_token}; must be "
                             ">= 0 or None (measure)")


Runner = Callable[[Task, Environment, Policy, Sequence[Tool], EvalConfig],
                  Awaitable[EpisodeRecord]]


def turn_seconds(measured: Sequence[float], tokens_out: Sequence[int],
                 cfg: EvalConfig) -> list[float]:
    if cfg.seconds_per_token is None:
        return list(measured)
    return [cfg.seconds_per_token * n for n in tokens_out]


async def run_direct(task: Task, env: Environment, policy: Policy, tools: Sequence[Tool],
                     cfg: EvalConfig) -> EpisodeRecord:
    """The policy is the orchestrator: it sees `tools` and calls them itself. Conversational
    environments (tau2) get their simulated user, who opens the conversation (`play_task`, as
    in training: a failing episode is a failed record, outcome 0)."""
    measured: list[float] = []

    async def run(start: Task, tools: Sequence[Tool], user) -> Trajectory:
        played = await policy.episode(start, tools, config=cfg.episode, user=user)
        measured.extend(played.turn_seconds)
        return played.trajectory

    traj, outcome = await play_task(env, task, run, tools=tools)
    seconds = turn_seconds(measured, [t.tokens_out for t in traj.turns], cfg)
    return record_from_trajectory(
        traj, outcome, task_set="", tool_names=tuple(t.spec.name for t in tools),
        preference=task.preference, turn_limit=cfg.episode.max_turns, turn_seconds=seconds,
        policy_pricing=cfg.policy_pricing)


RUNNERS: dict[str, Runner] = {"direct": run_direct, "subagent": run_subagent,
                              "orchestrator8b": run_orchestrator8b}
