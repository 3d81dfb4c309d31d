"""What one evaluated episode leaves behind: the numbers every report is made of.

Units: dollars and seconds here; reports convert to cents and minutes (the paper's units).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Sequence

from orchestrax.data.records import Trajectory
from orchestrax.tools.tool import Pricing


@dataclasses.dataclass(kw_only=True)
class EpisodeRecord:
    task_id: str
    task_set: str
    outcome: float                     # 0.0 or 1.0
    tool_cost_usd: float               # every tool call, LLM tools' tokens included, as billed
    policy_cost_usd: float = 0.0       # the orchestrator's own tokens (0 unless priced)
    tool_latency_s: float = 0.0        # per turn, the slowest of its concurrent calls
    policy_latency_s: float = 0.0      # the orchestrator's generation time (see EvalConfig)
    prompt_tokens: int = 0             # orchestrator: context tokens read, summed over turns
    completion_tokens: int = 0         # orchestrator: tokens generated
    tool_input_tokens: int = 0         # LLM tools
    tool_output_tokens: int = 0
    turns: int = 0
    calls: dict[str, int] = dataclasses.field(default_factory=dict)
    tool_names: tuple[str, ...] = ()   # the tools offered, in the order P's tool entries use
    preference: tuple[float, ...] | None = None
    end_reason: str | None = None
    final_answer: str | None = None
    error: str | None = None
    turn_limit: int = 0
    turn_seconds: list[float] = dataclasses.field(default_factory=list)  # policy time per turn
    trajectory: Trajectory | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def cost_usd(self) -> float:
        return self.tool_cost_usd + self.policy_cost_usd

    @property
    def latency_s(self) -> float:
        return self.tool_latency_s + self.policy_latency_s

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "trajectory"}
        out["tool_names"] = list(self.tool_names)
        out["preference"] = None if self.preference is None else list(self.preference)
        return out | {"cost_usd": self.cost_usd, "latency_s": self.latency_s}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> "EpisodeRecord":
        names = {f.name for f in dataclasses.fields(cls)} - {"trajectory"}
        missing = {"task_id", "task_set", "outcome", "tool_cost_usd"} - set(row)
        if missing:
            raise ValueError(f"episode record is missing {sorted(missing)}; got {sorted(row)}")
        kw = {k: v for k, v in row.items() if k in names}
        kw["tool_names"] = tuple(kw.get("tool_names", ()))
        if kw.get("preference") is not None:
            kw["preference"] = tuple(kw["preference"])
        return cls(**kw)


def record_from_trajectory(traj: Trajectory, outcome: float, *, task_set: str,
                           tool_names: tuple[str, ...], preference: tuple[float, ...] | None,
                           turn_limit: int, turn_seconds: Sequence[float],
                           policy_pricing: Pricing | None = None) -> EpisodeRecord:
    """`turn_seconds[i]`: the orchestrator's generation time for turn i (only the first
    len(traj.turns) are used); `policy_pricing` bills its own tokens (a hosted baseline);
    None: free (self-hosted)."""
    prompt = sum(t.tokens_in for t in traj.turns)
    completion = sum(t.tokens_out for t in traj.turns)
    calls = traj.tool_calls
    policy_cost = (0.0 if policy_pricing is None else
                   sum(policy_pricing.cost(input_tokens=t.tokens_in, output_tokens=t.tokens_out)
                       for t in traj.turns))
    return EpisodeRecord(
        task_id=traj.task_id, task_set=task_set, outcome=float(outcome),
        tool_cost_usd=traj.cost, policy_cost_usd=policy_cost, tool_latency_s=traj.latency,
        policy_latency_s=float(sum(turn_seconds[:len(traj.turns)])),
        turn_seconds=[float(s) for s in turn_seconds[:len(traj.turns)]],
        prompt_tokens=prompt, completion_tokens=completion,
        tool_input_tokens=sum(c.input_tokens for c in calls),
        tool_output_tokens=sum(c.output_tokens for c in calls), turns=len(traj.turns),
        calls=dict(Counter(c.name for c in calls if c.name in tool_names)),
        tool_names=tuple(tool_names), preference=preference, end_reason=traj.end_reason,
        final_answer=traj.final_answer, error=traj.error, turn_limit=turn_limit, trajectory=traj)


def truncate(traj: Trajectory, turns: int) -> Trajectory:
    """The trajectory a run with turn limit `turns` would have left, for a deterministic policy
    whose run went longer: its first `turns` turns, no answer, ended by the limit."""
    if len(traj.turns) <= turns:
        return traj
    kept, seen = [], 0
    for m in traj.messages:  # up to the last kept assistant turn; what followed it never happened
        if m.get("role") == "assistant":
            seen += 1
            if seen > turns:
                break
        kept.append(m)
    return dataclasses.replace(traj, turns=traj.turns[:turns], messages=kept, final_answer=None,
                               end_reason="max_turns", error=None)
