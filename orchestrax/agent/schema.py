"""JSON-schema validators for tool arguments, compiled once per distinct schema.

Function-calling datasets (BFCL, some OpenAPI exports) write Python type names — "dict", "float",
"tuple", "any" — where JSON Schema expects "object", "number", "array" or no type at all;
`to_json_schema` maps them so their function docs validate as written.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any, Mapping

import jsonschema

_TYPE_ALIASES = {"dict": "object", "float": "number", "tuple": "array", "list": "array",
                 "int": "integer", "bool": "boolean", "str": "string"}


def _normalize(node: Any) -> None:
    if not isinstance(node, dict):
        return
    t = node.get("type")
    if t == "any":
        del node["type"]
    elif isinstance(t, str):
        node["type"] = _TYPE_ALIASES.get(t, t)
    elif isinstance(t, list):
        node["type"] = [_TYPE_ALIASES.get(x, x) for x in t if isinstance(x, str)]
    props = node.get("properties")
    if isinstance(props, dict):
        for sub in props.values():
            _normalize(sub)
    items = node.get("items")
    for sub in (items if isinstance(items, list) else [items]):
        _normalize(sub)
    _normalize(node.get("additionalProperties"))
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key) or ():
            _normalize(sub)


def to_json_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `parameters` with Python-style type names mapped to JSON Schema's."""
    out = copy.deepcopy(dict(parameters))
    _normalize(out)
    return out


@functools.lru_cache(maxsize=4096)
def _compiled(schema_json: str) -> jsonschema.protocols.Validator:
    schema = to_json_schema(json.loads(schema_json))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def validator_for(name: str, parameters: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    """Compiled validator for one tool's parameters; raises ValueError naming the tool when the
    schema itself is invalid (that is the tool author's bug, not the policy's)."""
    try:
        return _compiled(json.dumps(parameters, sort_keys=True))
    except jsonschema.SchemaError as e:
        raise ValueError(f"tool {name!r}: parameters is not a valid JSON schema: {e.message}") from e


def schema_error(validator: jsonschema.protocols.Validator, arguments: Any) -> str | None:
    """A one-line description of the most relevant violation, or None when `arguments` is valid."""
    err = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path)
    return err.message + (f" (at '{where}')" if where else "")
