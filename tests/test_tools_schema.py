"""The fast schema predicate agrees with jsonschema (Draft 2020-12) on every verdict, and
`schema_error` returns exactly what the jsonschema-only path returns; `check_arguments` coerces
what it accepts and names the field of what it refuses."""

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrax.tools import schema
from test_agent_parser import _bfcl_nested, _bfcl_value, _load_bfcl

SIMPLE_TYPES = ["object", "array", "string", "integer", "number", "boolean", "null"]


def reference_valid(s, instance) -> bool:
    return jsonschema.Draft202012Validator(s).is_valid(instance)


def reference_error(tool, instance):
    """The message `schema_error` gave before the fast path: jsonschema alone, on the very same
    compiled validator (best_match breaks ties by keyword order, and `validator_for` sorts keys,
    so a validator built from the unsorted schema may pick a different, equally relevant error)."""
    return schema.schema_error(tool.schema_validator, instance)


def assert_agrees(s, instance):
    """Predicate verdict == jsonschema's, and `schema_error` is unchanged by the fast path."""
    valid = reference_valid(s, instance)
    tool = schema.validator_for("t", s)
    assert tool.predicate is not None, s
    assert tool.predicate(instance) is valid, (s, instance)
    error = schema.schema_error(tool, instance)
    assert (error is None) is valid, (s, instance, error)
    assert error == reference_error(tool, instance)


# ---- (a) differential property test -------------------------------------------------------------

_names = st.sampled_from(["a", "b", "c", "ms", "query", "anyOf", "type"])
_words = st.sampled_from(["x", "y", "zz", "", "1", "true", "null"])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.integers()
    | st.integers(-1000, 1000).map(float) | st.floats() | _words | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_names | _words, inner, max_size=3),
    max_leaves=6)


def _annotated(node: st.SearchStrategy) -> st.SearchStrategy:
    """Sprinkle annotation keywords (which must not change any verdict) over schema nodes."""
    annotations = st.fixed_dictionaries({}, optional={
        "description": st.text(max_size=5), "title": _words, "default": json_values,
        "examples": st.lists(json_values, max_size=2),
        "format": st.sampled_from(["date", "email", "uri", "int32"]), "$comment": _words,
        "$schema": st.just("https://json-schema.org/draft/2020-12/schema")})
    return st.tuples(node, annotations).map(lambda pair: {**pair[1], **pair[0]})


_type_keyword = st.sampled_from(SIMPLE_TYPES) | st.lists(
    st.sampled_from(SIMPLE_TYPES), min_size=1, max_size=3, unique=True)
_enum = st.lists(_words, max_size=4, unique=True)

_leaf_schemas = _annotated(
    st.fixed_dictionaries({}, optional={"type": _type_keyword, "enum": _enum})) | st.booleans()


def _container_schemas(inner: st.SearchStrategy) -> st.SearchStrategy:
    obj = st.fixed_dictionaries(
        {"properties": st.dictionaries(_names, inner, max_size=4)},
        optional={"type": st.just("object") | _type_keyword,
                  "additionalProperties": st.booleans() | inner,
                  "enum": _enum}).flatmap(
        lambda node: st.lists(_names, unique=True, max_size=4).map(
            lambda required: {**node, "required": required} if required else node))
    arr = st.fixed_dictionaries({"items": inner},
                                optional={"type": st.just("array") | _type_keyword})
    return _annotated(obj) | _annotated(arr)


subschemas = st.recursive(_leaf_schemas, _container_schemas, max_leaves=8)
top_schemas = st.recursive(_leaf_schemas, _container_schemas, max_leaves=8).filter(
    lambda s: isinstance(s, dict))


def _value_of_type(name: str, s: dict) -> st.SearchStrategy:
    if name == "object":
        return _shaped_object(s)
    if name == "array":
        return st.lists(shaped(s.get("items", True)), max_size=3)
    # Each type also gets its near misses: bools for numbers, integral floats for integers,
    # 0/1 for booleans, falsy values for null.
    return {"string": st.sampled_from(s.get("enum") or ["x"]) | _words,
            "integer": st.integers(-3, 3) | st.integers(-3, 3).map(float) | st.floats(-3, 3)
            | st.booleans(),
            "number": st.integers(-3, 3) | st.floats() | st.booleans(),
            "boolean": st.booleans() | st.sampled_from([0, 1, 0.0, 1.0]),
            "null": st.sampled_from([None, False, 0, "", []])}[name]


def _shaped_object(s: dict) -> st.SearchStrategy:
    """Dicts that carry the required keys, draw property values from their own subschemas, and
    sometimes add keys that additionalProperties then judges."""
    properties = s.get("properties", {})
    extra = s.get("additionalProperties", True)
    value = lambda key: shaped(properties.get(key, extra))  # noqa: E731
    required = {key: value(key) for key in s.get("required", [])}
    optional = {key: value(key) for key in properties if key not in required}
    extras = st.dictionaries(_words, shaped(extra), max_size=2)
    return st.tuples(st.fixed_dictionaries(required, optional=optional), extras).map(
        lambda pair: {**pair[1], **pair[0]})


def shaped(s) -> st.SearchStrategy:
    """Instances built to follow `s`'s shape (so many are valid), mixed with arbitrary JSON."""
    if not isinstance(s, dict):
        return json_values
    types = s.get("type", SIMPLE_TYPES)
    types = [types] if isinstance(types, str) else types
    options = [_value_of_type(t, s) for t in types]
    if s.get("enum"):
        options.append(st.sampled_from(s["enum"]))
    return st.one_of(*options) | json_values


@settings(max_examples=400, deadline=None)
@given(data=st.data(), s=top_schemas)
def test_predicate_matches_jsonschema_on_random_schemas(data, s):
    for _ in range(4):
        assert_agrees(s, data.draw(shaped(s)))


@settings(max_examples=200, deadline=None)
@given(s=subschemas, instance=json_values)
def test_boolean_and_nested_subschemas_compile_to_the_same_verdict(s, instance):
    predicate = schema.compile_predicate(s)
    assert predicate is not None
    assert predicate(instance) is reference_valid(s, instance)


# ---- (b) anything outside the subset is left to jsonschema -------------------------------------

UNSUPPORTED = [
    {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    {"oneOf": [{"type": "string"}]},
    {"allOf": [{"type": "string"}]},
    {"not": {"type": "string"}},
    {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
    {"type": "string", "pattern": "^a"},
    {"type": "string", "minLength": 2},
    {"type": "integer", "minimum": 0},
    {"const": "a"},
    {"type": "array", "prefixItems": [{"type": "string"}]},
    {"enum": [1, "a"]},
    {"enum": [None]},
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"type": "string", "optional": True}}},
    {"type": "object", "properties": {"a": {"type": "array", "items": {"maximum": 3}}}},
    {"type": "object", "additionalProperties": {"anyOf": [{"type": "string"}]}},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "integer"},
    # jsonschema switches dialect inside the schema too: draft 4 rejects 1.0 as an integer
    {"type": "object",
     "properties": {"a": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}}},
]


@pytest.mark.parametrize("s", UNSUPPORTED, ids=lambda s: json.dumps(s)[:60])
def test_unsupported_keywords_fall_back_to_jsonschema(s):
    tool = schema.validator_for("t", s)
    assert tool.predicate is None
    validator_cls = jsonschema.validators.validator_for(s)
    for instance in [None, True, 1, 1.0, 2.5, "a", "b", [], ["a"], [5], {}, {"a": 1}, {"x": 1}]:
        error = schema.schema_error(tool, instance)
        assert error == reference_error(tool, instance)
        assert (error is None) is validator_cls(s).is_valid(instance)


# ---- (c) hand-written cases ---------------------------------------------------------------------

SLEEP = {"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]}
CLOSED = {"type": "object", "properties": {"q": {"type": "string"}}, "additionalProperties": False}


@pytest.mark.parametrize("s,instance,message", [
    (SLEEP, {"ms": 57}, None),
    (SLEEP, {"ms": 57.0}, None),  # an integral float is an integer
    (SLEEP, {"ms": True}, "arguments.ms must be an integer, got True"),  # bool is not
    (SLEEP, {"ms": 57.5}, "arguments.ms must be an integer, got 57.5"),
    (SLEEP, {}, "arguments is missing required field(s) ['ms']"),
    (SLEEP, {"ms": 1, "other": "ok"}, None),  # additionalProperties defaults to allowed
    (CLOSED, {"q": "a"}, None),
    (CLOSED, {"q": "a", "x": 1},
     "arguments has unknown field(s) ['x']; allowed: ['q']"),
    ({"type": "number"}, True, "arguments must be a number, got True"),
    ({"type": "number"}, 3, None),
    ({"type": ["string", "null"]}, None, None),
    ({"type": "string", "enum": ["c", "f"]}, "k", "arguments='k'; allowed values: ['c', 'f']"),
    ({"type": "array", "items": {"type": "integer"}}, [1, 2.0, "3"],
     "arguments[2] must be an integer, got '3'"),
    ({"type": "object", "properties": {"anyOf": {"type": "string"}}}, {"anyOf": 1},
     "arguments.anyOf must be a string, got 1"),  # a property named like a keyword is fine
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
     {"d": "not a date"}, None),  # format is an annotation without a format checker
    ({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"}, 1.0, None),
    ({"type": "object", "properties": {
        "a": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"}}},
     {"a": 1.0}, None),
    ({"type": "dict", "properties": {"f": {"type": "float"}, "t": {"type": "tuple"}}},
     {"f": 1, "t": [1]}, None),  # BFCL's Python type names, normalised first
])
def test_hand_written_cases(s, instance, message):
    tool = schema.validator_for("t", s)
    assert tool.predicate is not None
    assert tool.predicate(instance) is (message is None)
    assert schema.schema_error(tool, instance) == message


@pytest.mark.parametrize("s,arguments,expected", [
    (SLEEP, {"ms": 57.0, "extra": 1}, {"ms": 57}),          # integral float -> int, unknown dropped
    ({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}},
                                       "f": {"type": "number"}}},
     {"xs": [1.0, 2], "f": 2.0}, {"xs": [1, 2], "f": 2.0}),  # a number stays a float
    ({"type": "object", "properties": {"o": {"type": "object"}}}, {"o": {"k": 1}}, {"o": {"k": 1}}),
])
def test_check_arguments_coerces_what_it_accepts(s, arguments, expected):
    out = schema.check_arguments(s, arguments)
    assert out == expected and [type(v) for v in out.values()] == [type(v) for v in expected.values()]


@pytest.mark.parametrize("arguments, needle", [
    ({"ms": "5"}, "arguments.ms must be an integer, got '5'"),
    ({}, "missing required field(s) ['ms']"),
    ([1], "arguments must be an object, got [1]"),
])
def test_check_arguments_names_the_field(arguments, needle):
    with pytest.raises(schema.ArgumentError) as e:
        schema.check_arguments(SLEEP, arguments)
    assert needle in str(e.value)


def test_invalid_schema_still_names_the_tool():
    with pytest.raises(ValueError, match="tool 'bad'"):
        schema.validator_for("bad", {"type": "object", "required": "ms"})


def test_bare_jsonschema_validator_is_still_accepted():
    assert schema.schema_error(jsonschema.Draft202012Validator(SLEEP), {}) == (
        "arguments is missing required field(s) ['ms']")


# ---- (d) BFCL function docs ---------------------------------------------------------------------

def _argument_variants(arg_options):
    """The first acceptable value of every argument, then each other acceptable value of each
    argument in turn, so more of the ground truth's alternatives are checked."""
    base = {k: _bfcl_value(v) for k, v in arg_options.items()}
    base = {k: v for k, v in base.items() if v is not None}
    yield base
    for key, candidates in arg_options.items():
        for candidate in candidates[1:]:
            if candidate != "":
                yield {**base, key: _bfcl_nested(candidate)}


@pytest.mark.parametrize("split", ["simple_python", "multiple", "parallel"])
def test_bfcl_function_docs_agree_on_ground_truth(shared_data, split):
    rows = _load_bfcl(shared_data / "bfcl", split)
    docs = compilable = checked = 0
    disagreements = []
    for q, truth in rows:
        functions = {f["name"]: schema.to_json_schema(f["parameters"]) for f in q["function"]}
        tools = {f["name"]: schema.validator_for(f["name"], f["parameters"]) for f in q["function"]}
        docs += len(tools)
        compilable += sum(t.predicate is not None for t in tools.values())
        calls = [(name, args) for gt in truth for name, options in gt.items()
                 for args in _argument_variants(options)]
        calls += [(name, {}) for name in tools]  # usually missing required arguments
        for name, args in calls:
            tool, reference = tools[name], jsonschema.Draft202012Validator(functions[name])
            checked += 1
            fast = None if tool.predicate is None else tool.predicate(args)
            if fast is not None and fast is not reference.is_valid(args):
                disagreements.append((q["id"], name, args))
            if schema.schema_error(tool, args) != reference_error(tool, args):
                disagreements.append((q["id"], name, args, "message"))
    assert not disagreements, disagreements
    # Measured: 397/400, 535/557, 198/200 (the rest use BFCL's non-standard "optional" keyword
    # or "maximum", which keep them on the jsonschema path).
    assert compilable >= 0.95 * docs and checked > docs
