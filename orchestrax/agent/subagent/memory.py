"""Structured memory of one query in sub-agent mode, and the orchestrator prompt rebuilt from it.

Four typed sections (the paper's "Reconstructed State", after AgentFlow):

    query analysis   the orchestrator's plan from its first turn
    previous steps   one compact record per dispatch: sub-agent, sub-goal, brief result, ok
    tool results     the concise result each sub-agent returned (capped), keyed by step
    sub-goals        every sub-goal the orchestrator set, with its status

The orchestrator and the sub-agents write (through `Memory`'s methods); only the orchestrator
reads, through `render`. Raw tool outputs (search passages, program stdout) never enter memory:
a sub-agent condenses them into its result first. Each orchestrator turn is a fresh two-message
prompt (`orchestrator_messages`), so its length grows by one short record per step instead of by
the whole history.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from orchestrax.checks import at_least

GoalStatus = Literal["pending", "done", "failed"]


def clip(text: str, limit: int) -> str:
    """`text` on one line, at most `limit` characters (an ellipsis marks a cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:max(0, limit - 3)].rstrip() + "..."


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRecord:
    step: int                  # 1-based dispatch number
    agent: str                 # sub-agent name
    sub_goal: str
    brief: str                 # one-line summary of the result (or of the failure)
    ok: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolResultEntry:
    step: int
    agent: str
    result: str                # the sub-agent's returned result, capped


@dataclasses.dataclass(kw_only=True)
class SubGoal:
    text: str
    agent: str
    status: GoalStatus = "pending"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryLimits:
    """Character caps per entry; they bound how fast the orchestrator prompt grows per step."""

    analysis_chars: int = 600
    sub_goal_chars: int = 200
    brief_chars: int = 120
    result_chars: int = 400

    def __post_init__(self):
        at_least(self, 16, *(f.name for f in dataclasses.fields(self)))


@dataclasses.dataclass(kw_only=True)
class Memory:
    query: str
    limits: MemoryLimits = MemoryLimits()
    query_analysis: str = ""
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    tool_results: list[ToolResultEntry] = dataclasses.field(default_factory=list)
    sub_goals: list[SubGoal] = dataclasses.field(default_factory=list)

    def set_analysis(self, text: str) -> None:
        """Written once, by the orchestrator's first turn; later calls are ignored."""
        if not self.query_analysis and text.strip():
            self.query_analysis = clip(text, self.limits.analysis_chars)

    def open_goal(self, agent: str, sub_goal: str) -> int:
        """Record a dispatched sub-goal (pending); returns the step number it will be."""
        self.sub_goals.append(SubGoal(text=clip(sub_goal, self.limits.sub_goal_chars),
                                      agent=agent))
        return len(self.steps) + 1

    def close_goal(self, *, agent: str, result: str, ok: bool) -> StepRecord:
        """The sub-agent's write: closes the newest pending goal, adds its step and result."""
        goal = next((g for g in reversed(self.sub_goals) if g.status == "pending"), None)
        if goal is None:
            raise ValueError("Memory.close_goal: no pending sub-goal; call open_goal first")
        goal.status = "done" if ok else "failed"
        step = StepRecord(step=len(self.steps) + 1, agent=agent, sub_goal=goal.text,
                          brief=clip(result, self.limits.brief_chars) or "(empty result)", ok=ok)
        self.steps.append(step)
        if ok:
            self.tool_results.append(ToolResultEntry(
                step=step.step, agent=agent, result=clip(result, self.limits.result_chars)))
        return step

    def note_error(self, text: str) -> StepRecord:
        """An orchestrator turn that dispatched nothing usable (malformed call, unknown
        sub-agent): a failed step the orchestrator reads next turn."""
        step = StepRecord(step=len(self.steps) + 1, agent="orchestrator", sub_goal="(none)",
                          brief=clip(text, self.limits.brief_chars), ok=False)
        self.steps.append(step)
        return step


def render(memory: Memory) -> str:
    """The user turn of the orchestrator's prompt: the query and the four sections."""
    lines = [f"Question: {memory.query}", "", "## Query analysis",
             memory.query_analysis or "(not yet written)", "", "## Previous steps"]
    lines += [f"{s.step}. [{s.agent}] {s.sub_goal} -> {'ok' if s.ok else 'FAILED'}: {s.brief}"
              for s in memory.steps] or ["(none)"]
    lines += ["", "## Tool results"]
    lines += [f"Step {r.step} ({r.agent}): {r.result}" for r in memory.tool_results] or ["(none)"]
    lines += ["", "## Sub-goals"]
    lines += [f"- [{g.status}] {g.text} ({g.agent})" for g in memory.sub_goals] or ["(none)"]
    return "\n".join(lines)


def orchestrator_messages(system: str, memory: Memory) -> list[dict[str, str]]:
    """The fresh two-message prompt of one orchestrator turn."""
    return [{"role": "system", "content": system}, {"role": "user", "content": render(memory)}]
