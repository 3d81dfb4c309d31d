"""The orchestrator loop of sub-agent mode ("Can Small Agents Collaborate", Sec. 3).

Each orchestrator turn renders a fresh two-message prompt from the structured memory (or, in the
memory ablation, a replay of the conversation), samples one turn, and either answers or
dispatches exactly one sub-task to one sub-agent. The sub-agent's result is written to memory;
the orchestrator reads it on its next turn. Sub-agents never see each other.

Every orchestrator turn is kept as its own token-in/token-out sample (`TurnSample`: the exact
prompt ids it saw, the ids it produced, their logprobs), which is what Flow-GRPO trains on.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import time
from typing import Any, Literal, Mapping

from orchestrax.agent import chat
from orchestrax.checks import at_least
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import prompt_messages, sample_turn
from orchestrax.agent.parser import ToolCallParser
from orchestrax.agent.subagent.accounting import QueryAccount, priced_call
from orchestrax.agent.subagent.memory import Memory, MemoryLimits, clip, orchestrator_messages
from orchestrax.agent.subagent.roles import SubAgent, SubAgentReport, role_order
from orchestrax.data.records import EndReason, Task, ToolCallRecord, Trajectory, TurnRecord
from orchestrax.rollout.sampler import Sampler, SamplingParams
from orchestrax.tools.tool import Pricing

Thinking = Literal["none", "subagents", "orchestrator", "all"]
THINKING: tuple[str, ...] = ("none", "subagents", "orchestrator", "all")

SYSTEM_PROMPT = (
    "You are the orchestrator of a team of sub-agents. Plan how to answer the question, then "
    "work one step at a time: each turn, either dispatch exactly one self-contained sub-task to "
    "one sub-agent (a tool call), or give the final answer. On your first turn, write a short "
    "analysis of the question (what is needed, which sub-agents, in what order) before your "
    "call. You see the question and a memory of the steps so far, not the raw tool outputs.")
_CALL_BLOCK = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


def thinking_flags(placement: str) -> tuple[bool, bool]:
    """(orchestrator thinks, sub-agents think) for a placement name."""
    if placement not in THINKING:
        raise ValueError(f"thinking={placement!r}; allowed: {', '.join(THINKING)}")
    return placement in ("orchestrator", "all"), placement in ("subagents", "all")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OrchestratorConfig:
    max_turns: int = 10
    max_new_tokens: int = 1024         # per orchestrator turn
    turn_tokens: int = 8192            # prompt + completion of one turn; a longer prompt ends
                                       # the query ("context"; an error on the first turn)
    enable_thinking: bool = True
    memory: bool = True                # False: the memory ablation (prompt replays the history)
    limits: MemoryLimits = MemoryLimits()
    max_format_errors: int = 3         # consecutive turns without a usable dispatch or answer
    sampling: SamplingParams = SamplingParams()
    pricing: Pricing | None = None     # per-token price of the orchestrator model, if priced
    system: str = SYSTEM_PROMPT
    sampler_attempts: int = 3          # a failed generate() is retried, then the query ends
    sampler_backoff_s: float = 0.5

    def __post_init__(self):
        at_least(self, 1, "max_turns", "max_new_tokens", "turn_tokens", "max_format_errors",
                 "sampler_attempts")
        at_least(self, 0, "sampler_backoff_s")


@dataclasses.dataclass(kw_only=True)
class TurnSample:
    """One orchestrator turn as a training sample: loss on `output_ids` only."""

    turn: int
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]              # sampler logprobs of output_ids
    prompt_text: str

    def as_trajectory(self, task_id: str) -> Trajectory:
        n, m = len(self.prompt_ids), len(self.output_ids)
        return Trajectory(task_id=f"{task_id}#turn{self.turn}", prompt_len=n,
                          token_ids=self.prompt_ids + self.output_ids,
                          loss_mask=[0] * n + [1] * m,
                          logprobs=[0.0] * n + list(self.logprobs))


@dataclasses.dataclass(kw_only=True)
class SubagentRollout:
    """A whole query: the per-turn samples, the memory, the accounting, the sub-agents' reports,
    and `trajectory`, an aggregate the environments' verifiers read (final answer; each turn's
    tool calls are the calls its sub-agent made)."""

    task_id: str
    samples: list[TurnSample]
    memory: Memory
    account: QueryAccount
    reports: list[SubAgentReport]
    trajectory: Trajectory

    # What the trainer and the evaluators read (and `drop_stale` writes), named as on a Direct
    # trajectory.
    @property
    def final_answer(self) -> str | None:
        return self.trajectory.final_answer

    @final_answer.setter
    def final_answer(self, value: str | None) -> None:
        self.trajectory.final_answer = value

    @property
    def end_reason(self) -> EndReason | None:
        return self.trajectory.end_reason

    @end_reason.setter
    def end_reason(self, value: EndReason | None) -> None:
        self.trajectory.end_reason = value

    @property
    def error(self) -> str | None:
        return self.trajectory.error

    @error.setter
    def error(self, value: str | None) -> None:
        self.trajectory.error = value

    @property
    def turns(self) -> list[TurnRecord]:
        return self.trajectory.turns

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        return self.trajectory.tool_calls

    @property
    def format_errors(self) -> int:
        return self.trajectory.format_errors

    @property
    def cost(self) -> float:
        return self.account.cost_usd

    @property
    def latency(self) -> float:
        """Measured wall clock of the query (a metric; the reward reads `clock_s`)."""
        return self.account.latency_s

    def clock_s(self, seconds_per_token: float, subagent_seconds_per_token: float) -> float:
        """The query's deterministic clock: the orchestrator's generated tokens at its speed,
        plus each dispatch's sub-agent episode on its own clock (its tokens at the sub-agents'
        speed plus its tools' latency). Dispatches run one after another."""
        own = sum(t.tokens_out for t in self.trajectory.turns)
        return seconds_per_token * own + sum(
            r.trajectory.clock_s(subagent_seconds_per_token) for r in self.reports
            if r.trajectory is not None)


def query_of(task: Task) -> str:
    users = [m for m in task.messages if m.get("role") == "user"]
    if not users:
        raise ValueError(f"task {task.task_id!r} has no user message to orchestrate")
    query = str(users[-1].get("content") or "")
    files = task.metadata.get("attachments") or ()
    if files:
        query += "\nAttached files: " + ", ".join(pathlib.Path(f).name for f in files)
    return query


class _Query:
    def __init__(self, task: Task, agents: Mapping[str, SubAgent], sampler: Sampler, codec: Codec,
                 config: OrchestratorConfig):
        self.task, self.sampler, self.codec, self.config = task, sampler, codec, config
        self.agents = {name: agents[name] for name in role_order(agents)}
        self.specs = [a.dispatch_spec() for a in self.agents.values()]
        self.parser = ToolCallParser(self.specs)
        messages = prompt_messages(task)
        task_system = next((m["content"] for m in messages if m["role"] == "system"), "")
        self.system = config.system + ("\n\n" + task_system if task_system else "")
        self.memory = Memory(query=query_of(task), limits=config.limits)
        self.history: list[dict[str, Any]] = []   # only for the memory ablation's replay
        self.account = QueryAccount()
        self.traj = Trajectory(task_id=task.task_id)
        self.samples: list[TurnSample] = []
        self.reports: list[SubAgentReport] = []

    def messages(self) -> list[dict[str, Any]]:
        if self.config.memory:
            return orchestrator_messages(self.system, self.memory)
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": self.memory.query}, *self.history]

    def _end(self, reason: EndReason, error: str | None = None) -> None:
        self.traj.end_reason, self.traj.error = reason, error

    def _feedback(self, text: str, observation: str) -> None:
        """A failed or finished step, written where the next prompt reads it."""
        self.history += [{"role": "assistant", "content": text},
                         {"role": "tool", "content": observation}]

    async def run(self) -> None:
        cfg, codec = self.config, self.codec
        streak = 0
        for turn in range(cfg.max_turns):
            prompt = chat.render_messages(self.messages(), tools=self.specs,
                                          add_generation_prompt=True,
                                          enable_thinking=cfg.enable_thinking)
            ids = codec.encode(prompt)
            room = cfg.turn_tokens - len(ids)
            if room < 1 and turn == 0:   # the task cannot be played at this budget: not a zero
                return self._end("error", f"the first prompt ({len(ids)} tokens) leaves no room "
                                          f"in turn_tokens={cfg.turn_tokens}; raise it")
            if room < 1:
                return self._end("context")
            generated = await sample_turn(
                self.sampler, ids, cfg.sampling, codec.stop_ids, turn=turn,
                max_new_tokens=min(cfg.max_new_tokens, room),
                rid=f"{self.task.task_id}/orchestrator/{turn}", attempts=cfg.sampler_attempts,
                backoff_s=cfg.sampler_backoff_s)
            if isinstance(generated, str):
                return self._end("error", generated)
            result, _ = generated   # the query's wall clock (account.latency_s) includes it
            out = list(result.output_ids)
            self.samples.append(TurnSample(turn=turn, prompt_ids=ids, output_ids=out,
                                           logprobs=list(result.logprobs), prompt_text=prompt))
            self.account.model_calls.append(priced_call("orchestrator", len(ids), len(out),
                                                        cfg.pricing))
            self.account.turns += 1
            stopped = result.finish_reason == "stop" and bool(out) and out[-1] in codec.stop_ids
            text = codec.decode(out[:-1] if stopped else out)
            record = TurnRecord(text=text, tokens_in=len(ids), tokens_out=len(out),
                                weight_version=result.weight_version)
            self.traj.turns.append(record)
            if result.finish_reason == "abort":
                return self._end("error", "generation aborted by the sampler")
            parsed = self.parser.parse(text)
            if turn == 0:
                visible = _CALL_BLOCK.sub("", parsed.content).strip()
                self.memory.set_analysis(visible or parsed.reasoning)
            if stopped and not parsed.calls:
                self.traj.final_answer = parsed.answer
                return self._end("answer")
            if not stopped:
                record.format_error = (f"Error: the turn was cut off after {len(out)} tokens; "
                                       "keep turns shorter.")
            elif parsed.format_error is not None or len(parsed.calls) > 1:
                record.format_error = parsed.format_error or (
                    f"Error: {len(parsed.calls)} calls in one turn; dispatch exactly one "
                    "sub-task per turn.")
            if record.format_error is not None:
                streak += 1
                self.memory.note_error(record.format_error)
                self._feedback(text, record.format_error)
                if streak >= cfg.max_format_errors:
                    return self._end("format_errors")
                continue
            streak = 0
            await self._dispatch(turn, parsed.calls[0], record, text)
        self._end("max_turns")

    async def _dispatch(self, turn: int, call, record: TurnRecord, text: str) -> None:
        agent = self.agents[call.name]
        sub_goal = call.arguments["task"]
        self.memory.open_goal(agent.name, sub_goal)
        report = await agent.run(sub_goal, rid=f"{self.task.task_id}/{turn}")
        self.memory.close_goal(agent=agent.name, result=report.result, ok=report.ok)
        self.reports.append(report)
        self.account.dispatches[agent.name] += 1
        self.account.model_calls.extend(report.model_calls)
        calls = report.trajectory.tool_calls if report.trajectory is not None else []
        self.account.tool_calls.extend(calls)
        record.tool_calls = list(calls)
        status = "" if report.ok else "FAILED: "
        self._feedback(text, status + clip(report.result, self.config.limits.result_chars))


async def run_query(task: Task, agents: Mapping[str, SubAgent], sampler: Sampler, codec: Codec,
                    config: OrchestratorConfig = OrchestratorConfig()) -> SubagentRollout:
    """Orchestrate one query to its end (never raises except on cancellation or bad
    configuration). `agents` are the sub-agents this query may dispatch to; with none (an
    ablation that removed every one) the orchestrator can only answer."""
    t0 = time.monotonic()
    q = _Query(task, agents, sampler, codec, config)
    await q.run()
    q.account.latency_s = time.monotonic() - t0
    return SubagentRollout(task_id=task.task_id, samples=q.samples, memory=q.memory,
                           account=q.account, reports=q.reports, trajectory=q.traj)
