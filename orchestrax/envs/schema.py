"""A small JSON-schema subset for checking tool arguments before a domain function runs.

Covers what tool specs use: object/array/string/integer/number/boolean, `enum`, `required`,
`items`, `properties`. Integers accept integral floats (3.0 -> 3), numbers accept ints, like
pydantic's lax mode, so a model writing `"amount": 100.0` is not punished for style.
"""

from __future__ import annotations

from typing import Any


class ArgumentError(ValueError):
    """An argument does not match the tool's schema; the message names the field."""


_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "a boolean", "array": "a list", "object": "an object"}


def check_arguments(schema: dict[str, Any], arguments: Any, *, where: str = "arguments") -> Any:
    """Returns `arguments` coerced to `schema` (integral floats -> int, ints -> float for
    "number"); raises ArgumentError naming the offending field otherwise."""
    kind = schema.get("type")
    if "enum" in schema and arguments not in schema["enum"]:
        raise ArgumentError(f"{where}={arguments!r}; allowed values: {schema['enum']}")
    if kind == "object":
        if not isinstance(arguments, dict):
            raise ArgumentError(f"{where} must be an object, got {type(arguments).__name__}")
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", []) if k not in arguments]
        if missing:
            raise ArgumentError(f"{where} is missing required field(s) {missing}")
        out = {}
        for key, value in arguments.items():
            if key not in props:
                if schema.get("additionalProperties", True) is False:
                    raise ArgumentError(f"{where}.{key} is not a known field; allowed: {sorted(props)}")
                continue  # dropped: pydantic's default for unknown fields
            out[key] = check_arguments(props[key], value, where=f"{where}.{key}")
        return out
    if kind == "array":
        if not isinstance(arguments, list):
            raise ArgumentError(f"{where} must be a list, got {type(arguments).__name__}")
        item_schema = schema.get("items", {})
        return [check_arguments(item_schema, v, where=f"{where}[{i}]") for i, v in enumerate(arguments)]
    if kind == "string":
        if not isinstance(arguments, str):
            raise ArgumentError(f"{where} must be {_TYPE_NAMES[kind]}, got {arguments!r}")
        return arguments
    if kind == "integer":
        if isinstance(arguments, bool) or not isinstance(arguments, (int, float)):
            raise ArgumentError(f"{where} must be an integer, got {arguments!r}")
        if isinstance(arguments, float):
            if not arguments.is_integer():
                raise ArgumentError(f"{where} must be an integer, got {arguments!r}")
            return int(arguments)
        return arguments
    if kind == "number":
        if isinstance(arguments, bool) or not isinstance(arguments, (int, float)):
            raise ArgumentError(f"{where} must be a number, got {arguments!r}")
        return arguments
    if kind == "boolean":
        if not isinstance(arguments, bool):
            raise ArgumentError(f"{where} must be a boolean, got {arguments!r}")
        return arguments
    return arguments
