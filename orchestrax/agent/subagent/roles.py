"""The sub-agents: Web Searcher, Coder and File Inspector.

A sub-agent gets one sub-goal from the orchestrator and nothing else (no history, no other
sub-agent's output unless the orchestrator wrote it into the sub-goal), runs a short loop with
only its own tools on its own sampler (possibly a smaller model), and returns one concise result.
The loop is the ordinary token-in/token-out episode (`agent.episode.run_episode`) with the role's
system prompt; its tokens are counted but never trained (sub-agents are frozen).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Mapping, Sequence

from orchestrax.checks import at_least
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig, run_episode
from orchestrax.agent.executor import ToolExecutor
from orchestrax.agent.subagent.accounting import ModelCall, priced_call
from orchestrax.agent.subagent.files import FileReadTool
from orchestrax.data.records import Task, Trajectory
from orchestrax.rollout.sampler import Sampler, SamplingParams
from orchestrax.tools.tool import Pricing, Tool, ToolSpec

_ANSWER_RULE = ("When done, reply with only the result inside <answer></answer>: the facts or "
                "numbers the task asks for, in at most three sentences.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Role:
    name: str
    description: str           # what the orchestrator reads about this sub-agent
    system: str                # the sub-agent's own system prompt
    tool_names: tuple[str, ...]  # the tools this role may hold


ROLES: dict[str, Role] = {r.name: r for r in (
    Role(name="web_searcher",
         description="Web Searcher: finds facts with search engines (local encyclopedia, web).",
         system="You are a web searcher. Search for what the task asks and report the facts "
                "you found, with their source titles. " + _ANSWER_RULE,
         tool_names=("local_search", "web_search")),
    Role(name="coder",
         description="Coder: writes and runs Python for calculation, algorithms and checks.",
         system="You are a coder. Write a short Python program for the task, run it with the "
                "python tool, and report its output. " + _ANSWER_RULE,
         tool_names=("python",)),
    Role(name="file_inspector",
         description="File Inspector: reads attached files (plain text, CSV, PDF).",
         system="You are a file inspector. Read the attached file the task names and report "
                "the content the task asks for. " + _ANSWER_RULE,
         tool_names=("read_file",)),
)}


def holdable(tools: Sequence[Tool]) -> list[Tool]:
    """The tools some sub-agent can hold; the rest (LLM-as-tool, domain functions) have no place
    in sub-agent mode, where the orchestrator itself calls no tool."""
    return [t for t in tools if any(t.spec.name in r.tool_names for r in ROLES.values())]


def query_tools(task: Task, own: Sequence[Tool], shared: Sequence[Tool] = ()) -> list[Tool]:
    """The tools one query's sub-agents hold, one per name: the task's `own` holdable tools,
    then the `shared` ones it does not already name (the task's own win), then `read_file` over
    the task's attachments (metadata["attachments"]) if it has any."""
    files = task.metadata.get("attachments") or ()
    tools = {t.spec.name: t for t in holdable(own)}
    for tool in [*shared, *([FileReadTool(files)] if files else [])]:
        tools.setdefault(tool.spec.name, tool)
    return list(tools.values())


def assign_tools(tools: Sequence[Tool]) -> dict[str, list[Tool]]:
    """Role name -> the given tools that role holds (roles with none are left out). Tools no
    role takes are an error: in sub-agent mode the orchestrator itself calls no tool."""
    out: dict[str, list[Tool]] = {}
    for tool in tools:
        role = next((r for r in ROLES.values() if tool.spec.name in r.tool_names), None)
        if role is None:
            held = {r.name: r.tool_names for r in ROLES.values()}
            raise ValueError(f"tool {tool.spec.name!r} belongs to no sub-agent; roles hold {held}")
        out.setdefault(role.name, []).append(tool)
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class SubAgentConfig:
    max_steps: int = 3                 # model calls per dispatch (tool call(s), then the answer)
    max_new_tokens: int = 512
    context_tokens: int = 8192
    enable_thinking: bool = False
    sampling: SamplingParams = SamplingParams(temperature=0.0)
    pricing: Pricing | None = None     # per-token price of the sub-agents' model, if priced

    def __post_init__(self):
        at_least(self, 1, "max_steps", "max_new_tokens", "context_tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SubAgentReport:
    agent: str
    sub_goal: str
    result: str                # what goes back to the orchestrator (via memory)
    ok: bool
    trajectory: Trajectory | None
    model_calls: tuple[ModelCall, ...]
    seconds: float


class SubAgent:
    def __init__(self, role: Role, sampler: Sampler, codec: Codec, tools: Sequence[Tool],
                 config: SubAgentConfig = SubAgentConfig(), executor: ToolExecutor | None = None):
        unknown = [t.spec.name for t in tools if t.spec.name not in role.tool_names]
        if unknown:
            raise ValueError(f"sub-agent {role.name!r} cannot hold tools {unknown}; "
                             f"allowed: {list(role.tool_names)}")
        self.role, self.sampler, self.codec = role, sampler, codec
        self.tools, self.config = list(tools), config
        self.executor = executor or ToolExecutor()
        self.episode = EpisodeConfig(max_turns=config.max_steps,
                                     context_tokens=config.context_tokens,
                                     max_new_tokens=config.max_new_tokens,
                                     enable_thinking=config.enable_thinking,
                                     sampling=config.sampling, max_format_errors=config.max_steps)

    @property
    def name(self) -> str:
        return self.role.name

    def dispatch_spec(self) -> ToolSpec:
        """How the orchestrator calls this sub-agent: one tool with a `task` string."""
        return dispatch_spec(self.role)

    def messages(self, sub_goal: str) -> tuple[dict[str, str], ...]:
        return ({"role": "system", "content": self.role.system},
                {"role": "user", "content": sub_goal})

    async def run(self, sub_goal: str, *, rid: str) -> SubAgentReport:
        """Never raises except on cancellation: a failure becomes a report with ok=False."""
        t0 = time.monotonic()
        task = Task(task_id=f"{rid}/{self.name}", messages=self.messages(sub_goal))
        try:
            traj = await run_episode(self.sampler, self.codec, task, self.tools,
                                     config=self.episode, executor=self.executor)
        except Exception as e:  # noqa: BLE001 - a broken sub-agent must not end the query
            return SubAgentReport(agent=self.name, sub_goal=sub_goal, ok=False, trajectory=None,
                                  result=f"sub-agent crashed: {type(e).__name__}: {e}",
                                  model_calls=(), seconds=time.monotonic() - t0)
        calls = tuple(priced_call(self.name, t.tokens_in, t.tokens_out, self.config.pricing)
                      for t in traj.turns)
        ok = traj.end_reason == "answer" and bool((traj.final_answer or "").strip())
        if ok:
            result = traj.final_answer.strip()
        elif traj.end_reason == "error":
            result = f"sub-agent failed: {traj.error}"
        else:
            last = traj.tool_calls[-1].observation if traj.tool_calls else ""
            result = f"no answer ({traj.end_reason})" + (f"; last tool output: {last}" if last
                                                         else "")
        return SubAgentReport(agent=self.name, sub_goal=sub_goal, result=result, ok=ok,
                              trajectory=traj, model_calls=calls,
                              seconds=time.monotonic() - t0)


def dispatch_spec(role: Role) -> ToolSpec:
    return ToolSpec(name=role.name, description=role.description, category="specialist",
                    parameters={"type": "object", "required": ["task"], "properties": {
                        "task": {"type": "string", "minLength": 1,
                                 "description": "one self-contained sub-task for this sub-agent"}}})


def build_subagents(tools: Sequence[Tool], sampler: Sampler, codec: Codec,
                    config: SubAgentConfig = SubAgentConfig(), *,
                    executor: ToolExecutor | None = None,
                    exclude: Sequence[str] = ()) -> dict[str, SubAgent]:
    """One sub-agent per role that holds at least one of `tools`, minus the `exclude`d roles
    (the component ablation), all on `sampler`."""
    bad = sorted(set(exclude) - set(ROLES))
    if bad:
        raise ValueError(f"exclude={bad}: unknown sub-agents; allowed: {sorted(ROLES)}")
    executor = executor or ToolExecutor()
    return {name: SubAgent(ROLES[name], sampler, codec, held, config, executor)
            for name, held in assign_tools(tools).items() if name not in exclude}


def role_order(agents: Mapping[str, SubAgent]) -> list[str]:
    """Sub-agent names in the fixed ROLES order (prompt and reward-feature order)."""
    return [name for name in ROLES if name in agents]
