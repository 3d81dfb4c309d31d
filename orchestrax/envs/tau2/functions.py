"""The shape of a domain function and helpers for writing their JSON-schema parameters."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

from orchestrax.envs.tau2.db import DomainDB

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
