"""The shape of a domain function (all three domains), its face as an orchestrax tool, helpers
for writing JSON-schema parameters, and the two tools retail and airline share (`CALCULATE`,
`TRANSFER_TO_HUMAN_AGENTS`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

from orchestrax.envs.tau2.db import safe_calculate
from orchestrax.tools.tool import Pricing, ToolError, ToolResult, ToolSpec

# read/write/generic: tools a model may call; env: a task's setup function and assert: an
# assertion returning a bool (telecom only)
Kind = Literal["read", "write", "generic", "env", "assert"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DomainFunction:
    """One function of a domain. `fn(db, arguments)` (retail, airline: a `DomainDB`; telecom: a
    `TelecomState`) validates everything before it mutates, and raises `Rejected` for anything
    the domain refuses."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: Kind
    fn: Callable[[Any, dict[str, Any]], Any]

    @property
    def is_tool(self) -> bool:
        return self.kind in ("read", "write", "generic")


def named(fn: Callable[[Any, dict[str, Any]], Any], kind: Kind, description: str,
          parameters: dict[str, Any] | None = None) -> DomainFunction:
    """A DomainFunction called by its Python function's name; no `parameters`: no arguments."""
    return DomainFunction(name=fn.__name__, description=description, kind=kind, fn=fn,
                          parameters=obj({}) if parameters is None else parameters)


def tool_spec(fn: DomainFunction) -> ToolSpec:
    """A domain function as an orchestrax tool: free and instant, category "domain"."""
    return ToolSpec(name=fn.name, description=fn.description, parameters=fn.parameters,
                    category="domain", pricing=Pricing(kind="per_call"), latency_s=0.0)


def tool_result(ok: bool, observation: str) -> ToolResult:
    """A domain call's outcome for the executor. A refusal raises `ToolError` (non-transient),
    which the executor reports to the model with its own "Error: tool ... failed:" prefix."""
    if not ok:
        raise ToolError(observation.removeprefix("Error: "))
    return ToolResult(observation=observation, cost=0.0, latency=0.0)


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required}


def s(description: str, enum: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "description": description}
    if enum is not None:
        out["enum"] = enum
    return out


def i(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description}


def arr(items: dict[str, Any], description: str) -> dict[str, Any]:
    return {"type": "array", "items": items, "description": description}


# What the retail and airline tools say before a write, and the two tools they share.
CONFIRM = " Explain the details and get explicit user confirmation (yes) first."
CALCULATE = DomainFunction(
    name="calculate", kind="generic",
    description="Evaluate an arithmetic expression (numbers, + - * /, parentheses); result "
                "rounded to 2 decimals.",
    parameters=obj({"expression": s("Such as '2 + 2'.")}),
    fn=lambda db, a: safe_calculate(a["expression"]))
TRANSFER_TO_HUMAN_AGENTS = DomainFunction(
    name="transfer_to_human_agents", kind="generic", fn=lambda db, a: "Transfer successful",
    description="Transfer the user to a human agent with a summary; only if the user asks for "
                "one or the request cannot be handled under the policy.",
    parameters=obj({"summary": s("A summary of the user's issue.")}))
