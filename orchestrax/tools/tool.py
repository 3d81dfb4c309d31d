"""The one interface every tool implements: an async callable with a spec.

A tool returns a `ToolResult` (observation text, cost in US dollars, latency in seconds) or
raises `ToolError`; the executor in `orchestrax.agent` turns errors into observations, so a tool
never has to catch its own failures just to keep an episode alive.
"""

from __future__ import annotations

from orchestrax.checks import one_of
import dataclasses
from typing import Any, Literal, Protocol

Category = Literal["basic", "specialist", "generalist", "domain"]
PricingKind = Literal["per_call", "per_second", "per_token"]
# The seconds a locally run tool is charged: wall time measured here, or its spec's nominal.
Clock = Literal["measured", "nominal"]
CLOCKS = ("measured", "nominal")


def check_clock(clock: str) -> str:
    if clock not in CLOCKS:
        raise ValueError(f"clock={clock!r}; allowed: {', '.join(CLOCKS)}")
    return clock


def clocked(clock: str, measured: float, nominal: float) -> float:
    """The seconds to charge under `clock`."""
    return measured if clock == "measured" else nominal


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pricing:
    """How a call is billed. Token prices are dollars per million tokens."""

    kind: PricingKind = "per_call"
    usd_per_call: float = 0.0
    usd_per_second: float = 0.0
    usd_per_m_input: float = 0.0
    usd_per_m_output: float = 0.0

    def __post_init__(self):
        one_of(self, "kind", self.kind, ("per_call", "per_second", "per_token"))

    def cost(self, *, seconds: float = 0.0, input_tokens: int = 0, output_tokens: int = 0) -> float:
        if self.kind == "per_call":
            return self.usd_per_call
        if self.kind == "per_second":
            return self.usd_per_call + self.usd_per_second * seconds
        return (self.usd_per_call + self.usd_per_m_input * input_tokens / 1e6
                + self.usd_per_m_output * output_tokens / 1e6)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """What the policy sees of a tool (name, description, JSON-schema parameters) plus the
    metadata the reward and the executor use (category, pricing, typical latency in seconds)."""

    name: str
    description: str
    parameters: dict[str, Any]
    category: Category = "basic"
    pricing: Pricing = Pricing()
    latency_s: float = 0.0

    def to_openai(self) -> dict[str, Any]:
        """The `{"type": "function", "function": {...}}` form chat templates render."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolResult:
    """`latency=None` means "measure me": the executor fills in the wall time it observed.
    Simulated tools report their nominal latency instead of sleeping through it."""

    observation: str
    cost: float = 0.0
    latency: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0


class ToolError(Exception):
    """A failed call. `transient=True` (timeouts, 5xx, connection resets) is retried with backoff;
    anything else becomes an observation straight away."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class Tool(Protocol):
    spec: ToolSpec

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult: ...
