"""The records that cross layers: a `Task` (what an episode is asked) and the `Trajectory` it
leaves behind, with its per-turn and per-call records.

They sit below both `orchestrax.agent` (which fills trajectories) and `orchestrax.envs` (which
makes tasks and verifies trajectories), and import nothing from the package.

Token-in/token-out: `Trajectory.token_ids` is the prompt followed by every id the sampler produced
and every id of every tool-response block, in order, exactly as the model saw them.
`loss_mask[i] == 1` only where the policy generated `token_ids[i]`; `logprobs[i]` is the
sampler's logprob there (0.0 elsewhere).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    task_id: str
    messages: tuple[dict[str, Any], ...]       # system (without the tools block) and user turns
    preference: tuple[float, ...] | None = None  # P = (tools..., outcome, compute, latency)
    preference_instruction: str | None = None
    answer: Any = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


EndReason = Literal["answer", "max_turns", "context", "format_errors", "user_stop", "error"]


@dataclasses.dataclass(kw_only=True)
class ToolCallRecord:
    name: str
    arguments: dict[str, Any]
    observation: str
    cost: float = 0.0          # US dollars
    latency: float = 0.0       # seconds
    ok: bool = True            # False: the call failed, timed out or was malformed
    input_tokens: int = 0
    output_tokens: int = 0


@dataclasses.dataclass(kw_only=True)
class TurnRecord:
    text: str                  # the assistant's decoded text for this turn
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    format_error: str | None = None
    tokens_in: int = 0         # context length the sampler saw
    tokens_out: int = 0        # tokens it generated
    generation_s: float = 0.0  # wall-clock seconds of the sampler call that produced the turn
                               # (a metric: queueing and machine load are in it)
    weight_version: str = ""   # the policy version the sampler reported ("" if it did not)


@dataclasses.dataclass(kw_only=True)
class Trajectory:
    task_id: str
    prompt_len: int = 0
    token_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)
    final_answer: str | None = None    # None: no answer (an empty one counts as none)
    end_reason: EndReason | None = None
    error: str | None = None   # what went wrong when end_reason == "error"
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # readable log only

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        return [c for t in self.turns for c in t.tool_calls]

    @property
    def assistant_texts(self) -> list[str]:
        return [t.text for t in self.turns]

    @property
    def cost(self) -> float:
        return sum(c.cost for c in self.tool_calls)

    @property
    def latency(self) -> float:
        """Wall-clock seconds charged to tools; calls of one turn overlap, so a turn costs its
        slowest call."""
        return sum(max((c.latency for c in t.tool_calls), default=0.0) for t in self.turns)

    @property
    def generation_s(self) -> float:
        """Wall-clock seconds the policy spent generating, measured around each sampler call
        (queueing at the sampler included): a metric, never reward — see `clock_s`."""
        return sum(t.generation_s for t in self.turns)

    @property
    def tokens_out(self) -> int:
        """Tokens the policy generated, over every turn."""
        return sum(t.tokens_out for t in self.turns)

    def clock_s(self, seconds_per_token: float) -> float:
        """The episode's deterministic clock (the reward's latency): the tools' `latency` plus
        `seconds_per_token` for every generated token, the policy's speed from the pricing
        sheet or a measured profile. The same trajectory always gets the same clock, whoever
        shared the sampler with it and however loaded the machine was."""
        return self.latency + seconds_per_token * self.tokens_out

    @property
    def format_errors(self) -> int:
        return sum(t.format_error is not None for t in self.turns)

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    def check(self) -> None:
        """Raise ValueError when the token, mask and logprob columns disagree."""
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"Trajectory {self.task_id!r}: token_ids/loss_mask/logprobs lengths "
                             f"{n}/{len(self.loss_mask)}/{len(self.logprobs)} differ")
        if not 0 <= self.prompt_len <= n or any(self.loss_mask[:self.prompt_len]):
            raise ValueError(f"Trajectory {self.task_id!r}: prompt_len={self.prompt_len} invalid "
                             "or prompt tokens carry loss")
