"""Training in the released Orchestrator-8B protocol (`agent.mode="orchestrator8b"`): GRPO from the
released checkpoint (`hf_path`) or any model, on rollouts played as its evaluation plays them.

Each round has its own prompt, so each round is its own sample, as in sub-agent mode: the
rollout's ToolOrchestra reward (features: calls per protocol tool, outcome, cost, latency) gives
a group advantage that every round of the rollout carries (`rl.turn_batch`, the loss weighed by
`agent.flow_agg`). P weighs only outcome, cost and latency: a task's P is over its
environment's tools, which the protocol does not offer, so its tool weights are left at 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from orchestrax.agent.fanout import fan_out
from orchestrax.agent.orchestrator8b_protocol import TOOL_NAMES, play_rounds, token_rounds
from orchestrax.agent.orchestrator8b_experts import ExpertPool, load_experts, tool_retriever
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import play_task
from orchestrax.train.flow import shared_tools
from orchestrax.train.rollouts import DirectRollouts, EpisodeJob, counted


def protocol_preferences(tasks: Sequence[Task]) -> list[list[float]]:
    """[Q, 3 + 3]: no weight on any tool, the task's own outcome, compute and latency weights
    (outcome alone when it has no P)."""
    return [[0.0] * len(TOOL_NAMES) + (list(t.preference[-3:]) if t.preference is not None
                                       else [1.0, 0.0, 0.0]) for t in tasks]


class Orchestrator8BRollouts(DirectRollouts):
    """The `train.rollouts.RolloutDriver` of the protocol: rounds sampled token-in/token-out on
    the trainer's sampler, experts from `agent.experts`, the retriever over `agent.search_corpus`
    (BM25) and the sandbox of `agent.sandbox`."""

    def __init__(self, cfg: Any, env, sampler, codec, make_executor):
        super().__init__(cfg, env, sampler, codec, make_executor)
        a = cfg.agent
        search = next((t for t in shared_tools(dataclasses.replace(a, sandbox=None))), None)
        sandbox = None
        if a.sandbox is not None:
            from orchestrax.tools.sandbox import SandboxConfig
            sandbox = SandboxConfig(mode=a.sandbox)
        self.experts = ExpertPool(load_experts(a.experts), codec, sandbox=sandbox,
                                  retriever=None if search is None else tool_retriever(search))
        self.max_turn_tokens = a.train_turn_tokens or cfg.rollout.context_tokens

    async def _play(self, jobs: list[EpisodeJob], on_done: Callable[[int], object]
                    ) -> list[tuple[Trajectory, float]]:
        async def one(job: EpisodeJob):
            ep = job.episode

            async def run(start: Task, _tools, _user) -> Trajectory:
                rounds = token_rounds(self.sampler, self.codec, ep, start.task_id)
                return await play_rounds(
                    rounds, start, self.experts, self.codec, max_rounds=ep.max_turns,
                    max_format_errors=self.cfg.agent.protocol_format_errors)

            return await play_task(self.env, job.task, run, tools=[])

        return await fan_out(counted(one, on_done), jobs,
                             max_in_flight=self.cfg.rollout.max_in_flight)

    def make_batch(self, tasks, groups, outcome_QG, pad_id: int):
        return rounds_batch(tasks, groups, outcome_QG, self.cfg.grpo, pad_id=pad_id,
                            max_turn_tokens=self.max_turn_tokens,
                            seconds_per_token=self.cfg.rollout.seconds_per_token)


def rounds_batch(tasks: Sequence[Task], groups: Sequence[Sequence[Any]], outcome_QG: np.ndarray,
                 grpo, *, pad_id: int, max_turn_tokens: int, seconds_per_token: float
                 ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Reward, filters and advantages over [Q, G] protocol rollouts (`rl.score_groups`), then
    one row per round carrying its rollout's advantage; returns (batch, stats)."""
    from orchestrax import rl  # the trainer's process only
    q, g = outcome_QG.shape
    scores = rl.score_groups(groups, outcome_QG, [list(TOOL_NAMES)] * q,
                             protocol_preferences(tasks), grpo,
                             seconds_per_token=seconds_per_token)
    batch, info = rl.turn_batch(groups, scores.advantages_QG, scores.keep_QG, pad_id=pad_id,
                             max_turn_tokens=max_turn_tokens, row_multiple=q * g)
    flat = [tr for gr in groups for tr in gr]
    stats = rl.rollout_stats(scores, outcome_QG, flat) | {
        "flow/turn_samples": float((info["rollout"] >= 0).sum()),
        "flow/dropped_over_budget": float(info["dropped"].sum())}
    counters = {k: float(np.asarray(v)) for k, v in scores.counters.items()}
    return batch, stats | counters | rl.tool_totals(flat, TOOL_NAMES)
