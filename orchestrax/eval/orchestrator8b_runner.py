"""The `orchestrator8b` eval runner (`orchestrax eval --agent orchestrator8b --experts FILE`): the
policy plays the released Orchestrator-8B protocol (`agent.orchestrator8b_protocol`) instead of the
multi-turn tool loop, its `model` arguments routed to the experts of `--experts`.

A token-level policy (a run or HF directory, `sglang:URL`) samples each round token-in/token-out;
an `openai:URL` policy (e.g. vLLM serving the released checkpoint) gets the same rendered system
turn as text (the Qwen3 tools block in the system message, as `eval.policy.ChatPolicy` sends it)
and needs `--tokenizer` for the context budget. The environment supplies the tasks and grades
the answer; its own tools are not offered (the protocol brings its three).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from orchestrax.agent import chat
from orchestrax.agent.orchestrator8b_protocol import (TOOL_NAMES, ContextBudget, Experts,
                                                      RoundOutput, Tokens, play_rounds,
                                                      token_rounds)
from orchestrax.checks import at_least_or_none
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import Environment, play_task
from orchestrax.eval.episode_records import EpisodeRecord, record_from_trajectory
from orchestrax.eval.policy import ChatPolicy, TokenPolicy
from orchestrax.tools.tool import Tool
from orchestrax.tools.chat_client import ChatError
from orchestrax.tools.chat_client import chat as chat_completion


@dataclasses.dataclass(frozen=True, kw_only=True)
class Orchestrator8BOptions:
    experts: Experts
    # None: agent.orchestrator8b_protocol.default_tools
    tools: tuple[Mapping[str, Any], ...] | None = None
    budget: ContextBudget = ContextBudget()
    tokens: Tokens | None = None     # an openai: policy's tokenizer (token policies bring theirs)
    # Rounds in a row without a usable call that end an episode; None: none do, as the released
    # evaluation plays on to its round limit.
    max_format_errors: int | None = None

    def __post_init__(self):
        at_least_or_none(self, 1, "max_format_errors")


def _chat_rounds(policy: ChatPolicy, cfg: Any):
    async def generate(messages, schemas, n: int) -> RoundOutput | str:
        system = chat.system_prompt(messages[0]["content"], schemas)
        body = system.removeprefix(f"{chat.IM_START}system\n").removesuffix(f"{chat.IM_END}\n")
        wire = [{"role": "system", "content": body}, messages[1]]
        try:
            reply = await chat_completion(policy.endpoint, wire, max_tokens=cfg.max_new_tokens,
                                          temperature=cfg.sampling.temperature)
        except ChatError as e:
            return f"policy endpoint failed: {e}"
        return RoundOutput(text=reply.raw, tokens_in=reply.input_tokens,
                           tokens_out=reply.output_tokens, seconds=reply.seconds)
    return generate


def _rounds(policy: Any, opts: Orchestrator8BOptions, cfg: Any, task_id: str):
    if isinstance(policy, TokenPolicy):
        return token_rounds(policy.sampler, policy.codec, cfg, task_id), policy.codec
    if isinstance(policy, ChatPolicy):
        if opts.tokens is None:
            raise ValueError("--agent orchestrator8b with an openai: policy needs --tokenizer "
                             "(the context budget is counted in the policy's tokens)")
        return _chat_rounds(policy, cfg), opts.tokens
    raise ValueError(f"--agent orchestrator8b: policy {type(policy).__name__} cannot play it")


async def run_orchestrator8b(task: Task, env: Environment, policy: Any, tools: Sequence[Tool],
                             cfg: Any) -> EpisodeRecord:
    """One task in the protocol; `cfg` is an `eval.runners.EvalConfig` whose `agent_options`
    is an `Orchestrator8BOptions`. Rounds are bounded by the episode's max_turns."""
    opts = cfg.agent_options
    if not isinstance(opts, Orchestrator8BOptions):
        raise ValueError("--agent orchestrator8b needs its experts (--experts FILE)")
    ep = cfg.episode
    generate, tokens = _rounds(policy, opts, ep, task.task_id)

    async def run(start: Task, _tools: Sequence[Tool], _user) -> Trajectory:
        return await play_rounds(generate, start, opts.experts, tokens, max_rounds=ep.max_turns,
                                 max_format_errors=opts.max_format_errors, budget=opts.budget,
                                 tools=opts.tools)

    traj, outcome = await play_task(env, task, run, tools=tools)
    measured = [t.generation_s for t in traj.turns]
    seconds = (measured if cfg.seconds_per_token is None else
               [cfg.seconds_per_token * t.tokens_out for t in traj.turns])
    return record_from_trajectory(
        traj, outcome, task_set="", tool_names=TOOL_NAMES, preference=task.preference,
        turn_limit=ep.max_turns, turn_seconds=seconds, policy_pricing=cfg.policy_pricing)
