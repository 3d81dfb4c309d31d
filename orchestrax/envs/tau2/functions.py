"""The shape of a domain function, helpers for writing their JSON-schema parameters, and the
two tools retail and airline share (`CALCULATE`, `TRANSFER_TO_HUMAN_AGENTS`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

from orchestrax.envs.tau2.db import DomainDB, safe_calculate

Kind = Literal["read", "write", "generic"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DomainFunction:
    """One tool of a domain. `fn(db, arguments)` validates everything before it mutates, and
    raises `Rejected` for anything the domain refuses."""

    name: str
    description: str
    parameters: dict[str, Any]
    kind: Kind
    fn: Callable[[DomainDB, dict[str, Any]], Any]


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
