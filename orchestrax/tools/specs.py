"""The one JSON form of a tool spec, and a tool's own check of its arguments.

JSON form (what `spec_to_json` writes and `spec_from_json` reads):
  {"name", "description", "parameters": <JSON schema>, "category": basic|specialist|generalist|domain,
   "pricing": {"kind": per_call|per_second|per_token, "usd_per_call", "usd_per_second",
               "usd_per_m_input", "usd_per_m_output"},
   "latency_s": typical seconds per call}
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonschema

from orchestrax.tools import schema
from orchestrax.tools.tool import Pricing, ToolError, ToolSpec

CATEGORIES = ("basic", "specialist", "generalist", "domain")
_PRICING_FIELDS = tuple(f.name for f in dataclasses.fields(Pricing))
_SPEC_FIELDS = ("name", "description", "parameters", "category", "pricing", "latency_s")


def _no_unknown_fields(data: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
    unknown = set(data) - set(allowed)
    if unknown:
        raise ValueError(f"{what} has unknown fields {sorted(unknown)}; allowed: {list(allowed)}")


def pricing_to_json(pricing: Pricing) -> dict[str, Any]:
    return dataclasses.asdict(pricing)


def pricing_from_json(data: dict[str, Any]) -> Pricing:
    _no_unknown_fields(data, _PRICING_FIELDS, "pricing")
    for key, value in data.items():
        if key != "kind" and (not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"pricing.{key}={value!r}; must be a number >= 0")
    return Pricing(**data)


def spec_to_json(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "parameters": spec.parameters,
            "category": spec.category, "pricing": pricing_to_json(spec.pricing),
            "latency_s": spec.latency_s}


def spec_from_json(data: dict[str, Any]) -> ToolSpec:
    """Inverse of `spec_to_json`; names the offending field on bad input."""
    _no_unknown_fields(data, _SPEC_FIELDS, "tool spec")
    for key in ("name", "description", "parameters"):
        if key not in data:
            raise ValueError(f"tool spec is missing the field {key!r}")
    if not isinstance(data["name"], str) or not data["name"]:
        raise ValueError(f"tool spec name={data['name']!r}; must be a non-empty string")
    category = data.get("category", "basic")
    if category not in CATEGORIES:
        raise ValueError(f"tool spec category={category!r}; allowed: {list(CATEGORIES)}")
    try:
        jsonschema.Draft202012Validator.check_schema(data["parameters"])
    except jsonschema.SchemaError as e:
        raise ValueError(f"tool spec parameters is not a valid JSON schema: {e.message}") from None
    latency = data.get("latency_s", 0.0)
    if not isinstance(latency, (int, float)) or latency < 0:
        raise ValueError(f"tool spec latency_s={latency!r}; must be a number >= 0")
    return ToolSpec(name=data["name"], description=data["description"],
                    parameters=data["parameters"], category=category,
                    pricing=pricing_from_json(data.get("pricing", {})), latency_s=float(latency))


def object_schema(properties: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    """A closed JSON-schema object (no extra keys), the shape every tool's parameters take."""
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


def check_arguments(spec: ToolSpec, arguments: Any) -> dict[str, Any]:
    """Validate a call's arguments with the one argument validator (`tools.schema`) and return
    them coerced to the schema; a violation is a non-transient `ToolError` naming the field,
    which the executor shows to the policy as the observation."""
    try:
        return schema.check_arguments(spec.parameters, arguments, tool=spec.name)
    except schema.ArgumentError as e:
        raise ToolError(f"{spec.name}: {e}") from None
