"""The `subagent` eval runner: the policy is the orchestrator of sub-agent mode (agent/subagent),
its sub-agents run on the same policy's sampler or on another one, and the record counts every
model call (orchestrator and sub-agents), as the paper's Appendix C does.

Its settings travel in `EvalConfig.agent_options` as a `SubagentOptions`, the system's settings
that training uses too (`agent.subagent.SystemConfig`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Sequence

from orchestrax.agent.subagent import SystemConfig, build_subagents, query_tools, run_query
from orchestrax.data.records import Task
from orchestrax.envs.environment import Environment
from orchestrax.eval.policy import TokenPolicy
from orchestrax.eval.episode_records import EpisodeRecord
from orchestrax.tools.tool import Pricing, Tool

@dataclasses.dataclass(frozen=True, kw_only=True)
class SubagentOptions(SystemConfig):
    """The system's settings (`SystemConfig`: thinking, memory, exclude, sub-agent budget; a
    component ablation through `with_ablation`) plus the sub-agents' model for an evaluation."""

    subagent_new_tokens: int = 1024
    subagent_policy: Any = None             # a token-in/token-out policy; None: the orchestrator's
    subagent_pricing: Pricing | None = None  # the sub-agents' model, when it is a priced one


def _token_policy(policy: Any, what: str):
    if not isinstance(policy, TokenPolicy):
        raise ValueError(f"{what} {getattr(policy, 'name', policy)!r} is a "
                         f"{type(policy).__name__}, not token-in/token-out; sub-agent mode needs "
                         "a run directory, an HF directory or sglang:URL (a TokenPolicy)")
    return policy.sampler, policy.codec


async def run_subagent(task: Task, env: Environment, policy: Any, tools: Sequence[Tool],
                       cfg: Any) -> EpisodeRecord:
    """One task in sub-agent mode. `cfg` is an `eval.runners.EvalConfig`: its episode settings
    bound the orchestrator (turns, tokens, sampling), `agent_options` the rest."""
    opts = cfg.agent_options or SubagentOptions(
        thinking="orchestrator" if cfg.episode.enable_thinking else "none")
    sampler, codec = _token_policy(policy, "policy")
    sub_sampler, sub_codec = (_token_policy(opts.subagent_policy, "subagent_policy")
                              if opts.subagent_policy is not None else (sampler, codec))
    held = query_tools(task, tools)
    ep = cfg.episode
    orchestrator, subagent = opts.configs(
        max_turns=ep.max_turns, max_new_tokens=ep.max_new_tokens,
        context_tokens=ep.context_tokens, sampling=ep.sampling, subagent_sampling=ep.sampling,
        pricing=cfg.policy_pricing, subagent_pricing=opts.subagent_pricing)
    agents = build_subagents(held, sub_sampler, sub_codec, subagent, exclude=opts.exclude)
    rollout = await run_query(task, agents, sampler, codec, orchestrator)
    outcome = await env.verify(task, rollout.trajectory)
    return subagent_record(rollout, outcome, tools=held, preference=task.preference,
                           turn_limit=ep.max_turns, seconds_per_token=cfg.seconds_per_token)


def subagent_record(rollout, outcome: float, *, tools: Sequence[Tool],
                    preference: tuple[float, ...] | None, turn_limit: int,
                    seconds_per_token: float | None) -> EpisodeRecord:
    """Tokens over every model call; `calls` holds tool calls per tool plus `dispatch:<agent>`
    counts; latency is the query's wall clock (tools + generation), or with
    `seconds_per_token` the tools' reported latency plus that charge per generated token."""
    acc = rollout.account
    orch = [c for c in acc.model_calls if c.role == "orchestrator"]
    tool_latency = sum(r.trajectory.latency for r in rollout.reports if r.trajectory is not None)
    policy_latency = (max(0.0, acc.latency_s - tool_latency) if seconds_per_token is None
                      else seconds_per_token * acc.completion_tokens)
    calls = Counter(acc.calls_per_tool())
    calls.update({f"dispatch:{k}": v for k, v in acc.dispatches.items()})
    traj = rollout.trajectory
    return EpisodeRecord(
        task_id=traj.task_id, task_set="", outcome=float(outcome),
        tool_cost_usd=acc.cost_usd - sum(c.cost_usd for c in orch),
        policy_cost_usd=sum(c.cost_usd for c in orch), tool_latency_s=tool_latency,
        policy_latency_s=policy_latency, prompt_tokens=acc.prompt_tokens,
        completion_tokens=acc.completion_tokens, turns=acc.turns, calls=dict(calls),
        tool_names=tuple(t.spec.name for t in tools), preference=preference,
        end_reason=traj.end_reason, final_answer=traj.final_answer, error=traj.error,
        turn_limit=turn_limit, turn_seconds=[], trajectory=traj)
