"""What one query cost in sub-agent mode: every model call's tokens, tool calls, dispatches,
turns, wall-clock latency and dollars.

Tokens follow the paper's Appendix C.1: prompt tokens are the tokenised length of the input of
each model call, completion tokens the length of its output, summed over the orchestrator's turns
and every sub-agent call of the query.
"""

from __future__ import annotations

import collections
import dataclasses

from orchestrax.data.records import ToolCallRecord
from orchestrax.tools.tool import Pricing


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelCall:
    role: str                  # "orchestrator" or a sub-agent's name
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float = 0.0      # from the role's pricing-sheet entry; 0 for unpriced local models


def priced_call(role: str, prompt_tokens: int, completion_tokens: int,
                pricing: Pricing | None) -> ModelCall:
    cost = 0.0 if pricing is None else pricing.cost(input_tokens=prompt_tokens,
                                                    output_tokens=completion_tokens)
    return ModelCall(role=role, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     cost_usd=cost)


@dataclasses.dataclass(kw_only=True)
class QueryAccount:
    model_calls: list[ModelCall] = dataclasses.field(default_factory=list)
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)  # sub-agents' tools
    dispatches: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    turns: int = 0             # orchestrator turns
    latency_s: float = 0.0     # wall clock, query start to end

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.model_calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.model_calls)

    @property
    def cost_usd(self) -> float:
        """Priced model calls plus every tool call's own cost."""
        return (sum(c.cost_usd for c in self.model_calls)
                + sum(c.cost for c in self.tool_calls))

    def tokens_by_role(self) -> dict[str, tuple[int, int]]:
        """role -> (prompt tokens, completion tokens)."""
        out: dict[str, tuple[int, int]] = {}
        for c in self.model_calls:
            p, q = out.get(c.role, (0, 0))
            out[c.role] = (p + c.prompt_tokens, q + c.completion_tokens)
        return out

    def calls_per_tool(self) -> dict[str, int]:
        return dict(collections.Counter(c.name for c in self.tool_calls))
