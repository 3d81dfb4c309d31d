"""The `subagent` eval runner: the policy is the orchestrator of sub-agent mode (agent/subagent),
its sub-agents run on the same policy's sampler or on another one, and the record counts every
model call (orchestrator and sub-agents), as the paper's Appendix C does.

Its settings travel in `EvalConfig.agent_options` as a `SubagentOptions`; `ABLATIONS` names the
paper's component ablation (Table 2).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Sequence

from orchestrax.agent.subagent import (THINKING, OrchestratorConfig, SubAgentConfig,
                                       build_subagents, query_tools, run_query, thinking_flags)
from orchestrax.agent.checks import at_least
from orchestrax.data.records import Task
from orchestrax.envs.base import Environment
from orchestrax.eval.policy import TokenPolicy
from orchestrax.eval.episode_records import EpisodeRecord
from orchestrax.tools.base import Pricing, Tool

# name -> (sub-agents left out, structured memory on)
ABLATIONS: dict[str, tuple[tuple[str, ...], bool]] = {
    "none": ((), True), "no_web_searcher": (("web_searcher",), True),
    "no_coder": (("coder",), True), "no_file_inspector": (("file_inspector",), True),
    "no_memory": ((), False)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SubagentOptions:
    thinking: str = "orchestrator"          # none | subagents | orchestrator | all
    ablation: str = "none"                  # a key of ABLATIONS
    subagent_steps: int = 3
    subagent_new_tokens: int = 1024
    subagent_policy: Any = None             # a token-in/token-out policy; None: the orchestrator's
    subagent_pricing: Pricing | None = None  # the sub-agents' model, when it is a priced one

    def __post_init__(self):
        if self.thinking not in THINKING:
            raise ValueError(f"SubagentOptions.thinking={self.thinking!r}; allowed: {THINKING}")
        if self.ablation not in ABLATIONS:
            raise ValueError(f"SubagentOptions.ablation={self.ablation!r}; allowed: "
                             f"{sorted(ABLATIONS)}")
        at_least(self, 1, "subagent_steps", "subagent_new_tokens")


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
    orch_think, sub_think = thinking_flags(opts.thinking)
    exclude, memory = ABLATIONS[opts.ablation]
    sampler, codec = _token_policy(policy, "policy")
    sub_sampler, sub_codec = (_token_policy(opts.subagent_policy, "subagent_policy")
                              if opts.subagent_policy is not None else (sampler, codec))
    held = query_tools(task, tools)
    ep = cfg.episode
    agents = build_subagents(held, sub_sampler, sub_codec, SubAgentConfig(
        max_steps=opts.subagent_steps, max_new_tokens=opts.subagent_new_tokens,
        context_tokens=ep.context_tokens, enable_thinking=sub_think, sampling=ep.sampling,
        pricing=opts.subagent_pricing), exclude=exclude)
    rollout = await run_query(task, agents, sampler, codec, OrchestratorConfig(
        max_turns=ep.max_turns, max_new_tokens=ep.max_new_tokens, turn_tokens=ep.context_tokens,
        enable_thinking=orch_think, memory=memory, sampling=ep.sampling,
        pricing=cfg.policy_pricing))
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
