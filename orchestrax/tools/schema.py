"""The one validator of tool arguments: JSON-schema validators compiled once per distinct schema,
errors that name the field, the value and what is allowed, and `check_arguments`, which also
coerces what it accepted (integral floats to int, unknown fields dropped) for tools that want
exact Python types. The episode's parser, the tools' own checks (`specs.check_arguments`) and
the tau2 domain functions all go through it.

Function-calling datasets (BFCL, some OpenAPI exports) write Python type names — "dict", "float",
"tuple", "any" — where JSON Schema expects "object", "number", "array" or no type at all;
`to_json_schema` maps them so their function docs validate as written.

Validation runs on every tool call of every rollout turn, and jsonschema's general machinery costs
several to tens of microseconds even for a one-field object. Most function-calling schemas use only a few
keywords, so those are also compiled to a plain Python predicate (`compile_predicate`) that answers
"valid?" in about a microsecond. jsonschema stays the authority: it writes every error message and
is consulted whenever the predicate says "invalid" or the schema uses anything outside the subset.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import numbers
from typing import Any, Callable, Mapping

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


Predicate = Callable[[Any], bool]

# Keywords that never change a verdict under Draft 2020-12 without a format checker (we never pass
# one, so "format" is an annotation too). "$schema" is one only while it names 2020-12 itself; see
# `_names_draft_2020_12`.
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "format", "$schema",
                          "$comment"})
_SUPPORTED = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties", "items",
                             "enum"}


class _NotCompilable(Exception):
    """The schema uses something outside the subset `compile_predicate` mirrors."""


def _names_draft_2020_12(node: dict[str, Any]) -> bool:
    """jsonschema switches dialect at any (sub)schema whose $schema names another draft (its
    `evolve` re-picks the validator class), and older drafts differ inside our subset — draft 4
    rejects 1.0 as an integer — so the predicate accepts $schema only when it names 2020-12."""
    dialect = jsonschema.validators.validator_for(node, default=None)
    return dialect is jsonschema.Draft202012Validator


def _accept(instance: Any) -> bool:
    return True


def _reject(instance: Any) -> bool:
    return False


def _is_integer(instance: Any) -> bool:
    """Draft 6+ integers: bool is not one, an integral float (1.0) is."""
    if isinstance(instance, bool):
        return False
    return isinstance(instance, int) or (isinstance(instance, float) and instance.is_integer())


def _is_number(instance: Any) -> bool:
    return not isinstance(instance, bool) and isinstance(instance, numbers.Number)


_TYPE_PREDICATES: dict[str, Predicate] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "integer": _is_integer,
    "number": _is_number,
}


def _type_check(types: Any) -> Predicate:
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not names or any(
            not isinstance(n, str) or n not in _TYPE_PREDICATES for n in names):
        raise _NotCompilable(f"type {types!r}")
    checks = tuple(_TYPE_PREDICATES[n] for n in dict.fromkeys(names))
    if len(checks) == 1:
        return checks[0]
    return lambda x: any(check(x) for check in checks)


def _enum_check(members: Any) -> Predicate:
    """Only all-string enums: jsonschema compares a string member with `==`, so membership is a
    plain string lookup; other members bring its bool/number/container equality rules."""
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise _NotCompilable("enum with non-string members")
    allowed = frozenset(members)
    return lambda x: isinstance(x, str) and x in allowed


def _object_check(node: dict[str, Any]) -> Predicate:
    """`properties`, `required` and `additionalProperties` together; all three ignore non-dicts,
    a property's subschema applies only when its key is present, and additionalProperties to the
    keys `properties` does not name."""
    properties = node.get("properties", {})
    required = node.get("required", [])
    if not isinstance(properties, dict):
        raise _NotCompilable("properties is not an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _NotCompilable("required is not a list of strings")
    known = {key: _compile(sub) for key, sub in properties.items()}
    extra = _compile(node["additionalProperties"]) if "additionalProperties" in node else _accept
    needed = tuple(dict.fromkeys(required))

    def check(instance: Any) -> bool:
        if not isinstance(instance, dict):
            return True
        for key in needed:
            if key not in instance:
                return False
        for key, value in instance.items():
            if not known.get(key, extra)(value):
                return False
        return True

    return check


def _array_check(items: Any) -> Predicate:
    item = _compile(items)
    return lambda x: not isinstance(x, list) or all(item(v) for v in x)


def _all_of(checks: list[Predicate]) -> Predicate:
    if not checks:
        return _accept
    if len(checks) == 1:
        return checks[0]
    bound = tuple(checks)

    def check(instance: Any) -> bool:
        for each in bound:
            if not each(instance):
                return False
        return True

    return check


def _compile(node: Any) -> Predicate:
    """The predicate for one (sub)schema; raises `_NotCompilable` outside the subset."""
    if node is True:
        return _accept
    if node is False:
        return _reject
    if not isinstance(node, dict):
        raise _NotCompilable(f"schema {node!r}")
    unknown = sorted(set(node) - _SUPPORTED)
    if unknown:
        raise _NotCompilable(f"keywords {unknown}")
    if "$schema" in node and not _names_draft_2020_12(node):
        raise _NotCompilable(f"$schema {node['$schema']!r}")
    checks = []
    if "type" in node:
        checks.append(_type_check(node["type"]))
    if "enum" in node:
        checks.append(_enum_check(node["enum"]))
    if {"properties", "required", "additionalProperties"} & node.keys():
        checks.append(_object_check(node))
    if "items" in node:
        checks.append(_array_check(node["items"]))
    return _all_of(checks)


def compile_predicate(schema: Any) -> Predicate | None:
    """A plain `instance -> bool` equivalent to Draft 2020-12 validation of `schema` (already
    normalised by `to_json_schema`), or None when the schema uses anything beyond type,
    properties, required, additionalProperties, a single-schema items, an all-string enum and
    annotations. None means "ask jsonschema"; the subset is kept small so that agreeing with
    jsonschema is easy to check (tests/test_tools_schema.py does, differentially)."""
    try:
        return _compile(schema)
    except (_NotCompilable, RecursionError):
        return None


@dataclasses.dataclass(frozen=True)
class ToolValidator:
    """One tool's compiled schema: jsonschema's validator, which is authoritative and writes the
    messages, plus the fast predicate when the schema is within the compilable subset."""

    schema_validator: jsonschema.protocols.Validator
    predicate: Predicate | None


@functools.lru_cache(maxsize=4096)
def _compiled(schema_json: str) -> ToolValidator:
    schema = to_json_schema(json.loads(schema_json))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return ToolValidator(schema_validator=cls(schema), predicate=compile_predicate(schema))


def validator_for(name: str, parameters: Mapping[str, Any]) -> ToolValidator:
    """Compiled validator for one tool's parameters; raises ValueError naming the tool when the
    schema itself is invalid (that is the tool author's bug, not the policy's)."""
    try:
        return _compiled(json.dumps(parameters, sort_keys=True))
    except jsonschema.SchemaError as e:
        raise ValueError(f"tool {name!r}: parameters is not a valid JSON schema: {e.message}") from e


def schema_error(validator: ToolValidator | jsonschema.protocols.Validator,
                 arguments: Any) -> str | None:
    """A one-line description of the most relevant violation (see `describe`), or None when
    `arguments` is valid.

    The fast predicate only short-circuits the valid case; an "invalid" from it is re-checked by
    jsonschema, so a predicate bug could cost time but never invent an error. A bare jsonschema
    validator is still accepted."""
    if isinstance(validator, ToolValidator):
        if validator.predicate is not None and validator.predicate(arguments):
            return None
        validator = validator.schema_validator
    err = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    return None if err is None else describe(err)


_TYPE_NAMES = {"object": "an object", "array": "a list", "string": "a string",
               "integer": "an integer", "number": "a number", "boolean": "a boolean",
               "null": "null"}


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) or len(value) < 20 else (
        f"<{type(value).__name__} of {len(value)}>")
    return text if len(text) <= limit else text[:limit] + "..."


def describe(err: jsonschema.ValidationError) -> str:
    """One violation as the model (or a caller) reads it: the field as a path from `arguments`,
    the value it got, and what is allowed; jsonschema's own words for rarer keywords."""
    where = "arguments" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                                  for p in err.absolute_path)
    wanted = err.validator_value
    if err.validator == "type":
        names = [wanted] if isinstance(wanted, str) else list(wanted)
        allowed = " or ".join(_TYPE_NAMES.get(n, repr(n)) for n in names)
        return f"{where} must be {allowed}, got {_short(err.instance)}"
    if err.validator == "enum":
        return f"{where}={_short(err.instance)}; allowed values: {_short(wanted, 400)}"
    if err.validator == "required" and isinstance(err.instance, dict):
        missing = [k for k in wanted if k not in err.instance]
        return f"{where} is missing required field(s) {missing}"
    if err.validator == "additionalProperties" and wanted is False and isinstance(
            err.instance, dict):
        known = err.schema.get("properties", {})
        extra = [k for k in err.instance if k not in known]
        return f"{where} has unknown field(s) {_short(extra)}; allowed: {sorted(known)}"
    return f"{where}: {err.message if len(err.message) <= 200 else err.message[:200] + '...'}"


class ArgumentError(ValueError):
    """Arguments that do not match a tool's schema; the message names the field."""


def check_arguments(parameters: Mapping[str, Any], arguments: Any, *,
                    tool: str = "(unnamed)") -> Any:
    """`arguments` validated against `parameters` and coerced to it: an integral float where an
    integer is wanted becomes an int (Draft 2020-12 accepts 3.0 as an integer, so a model writing
    `"amount": 3.0` is not punished for style), and fields the schema does not name are dropped
    (pydantic's default). Raises `ArgumentError` naming the field otherwise."""
    validator = validator_for(tool, parameters)
    problem = schema_error(validator, arguments)
    if problem is not None:
        raise ArgumentError(problem)
    return _coerce(validator.schema_validator.schema, arguments)


def _coerce(node: Any, value: Any) -> Any:
    if not isinstance(node, dict):
        return value
    if isinstance(value, dict):
        props = node.get("properties")
        if not isinstance(props, dict):
            return value
        return {k: _coerce(props[k], v) for k, v in value.items() if k in props}
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [_coerce(node["items"], v) for v in value]
    types = node.get("type")
    if isinstance(value, float) and value.is_integer() and (
            types == "integer" or isinstance(types, list) and "integer" in types
            and "number" not in types):
        return int(value)
    return value
