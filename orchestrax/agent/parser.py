"""Reading an assistant turn: reasoning, `<tool_call>` blocks outside `<think>`, and the answer.

`ToolCallParser.parse` never raises on any input string: malformed JSON, integers too long to
convert, nesting too deep, unknown tools and arguments that fail the tool's JSON schema become
`ParsedCall.error` messages written for the model to read (they go back to it as tool responses).
Its time is linear in the text: tags are found with `str.find` from a moving position, never
with a lazy regex that rescans the rest of the text from every opening tag (quadratic on a
model that writes thousands of unclosed `<tool_call>` tags).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from typing import Any, Sequence

from orchestrax.tools import schema
from orchestrax.tools.tool import ToolSpec

_THINK_RE = re.compile(r"<think>|</think>")
# Deeper JSON parses, but then fails to pickle (an `EpisodePool` worker sends trajectories back
# pickled) or to validate; no real tool takes arguments nested anywhere near this.
MAX_NESTING = 64
MAX_CALLS_PER_TURN = 16   # calls run from one turn; the rest become one error observation
MAX_ECHO_CHARS = 200      # of a model-written name or value repeated in an error message
CALL_FORMAT = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParsedCall:
    name: str                          # "" when the block had no readable name
    arguments: dict[str, Any]
    raw: str                           # the block's text between the tags
    error: str | None = None           # set: the call is not executed; this is the observation


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParsedTurn:
    reasoning: str                     # text inside <think>…</think>
    content: str                       # visible text (outside <think>), tool_call blocks included
    calls: tuple[ParsedCall, ...]      # in order of appearance, valid and invalid
    answer: str | None                 # set only when the turn has no tool_call block

    @property
    def format_error(self) -> str | None:
        errors = [c.error for c in self.calls if c.error is not None]
        return "; ".join(errors) if errors else None


def split_thinking(text: str) -> tuple[str, str]:
    """(reasoning, visible). A `</think>` with no opening tag closes a block that the prompt
    opened; an unclosed `<think>` runs to the end of the text."""
    reasoning, visible, inside, pos = [], [], False, 0
    for m in _THINK_RE.finditer(text):
        chunk = text[pos:m.start()]
        if m.group() == "<think>":
            (reasoning if inside else visible).append(chunk)
            inside = True
        else:
            if inside:
                reasoning.append(chunk)
            else:  # everything so far was thinking the prompt had opened
                reasoning.extend(visible + [chunk])
                visible = []
            inside = False
        pos = m.end()
    (reasoning if inside else visible).append(text[pos:])
    return "".join(reasoning), "".join(visible)


class ToolCallParser:
    """Parses turns against a fixed set of tools; schemas are compiled once, at construction."""

    def __init__(self, specs: Sequence[ToolSpec], max_calls: int = MAX_CALLS_PER_TURN):
        if not isinstance(max_calls, int) or max_calls < 1:
            raise ValueError(f"ToolCallParser max_calls={max_calls!r}; must be an int >= 1")
        self.max_calls = max_calls
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; duplicated: {', '.join(dupes)}")
        self._validators = {s.name: schema.validator_for(s.name, s.parameters) for s in specs}
        self._available = ", ".join(names) if names else "(none)"

    def parse(self, text: str) -> ParsedTurn:
        reasoning, visible = split_thinking(text)
        blocks, unclosed = tagged_blocks(visible, "<tool_call>", "</tool_call>")
        calls = [self._parse_call(raw) for raw in blocks[:self.max_calls]]
        if len(blocks) > self.max_calls:
            extra = len(blocks) - self.max_calls
            calls.append(ParsedCall(name="", arguments={}, raw="", error=(
                f"Error: {len(blocks)} tool calls in one turn; at most {self.max_calls} run per "
                f"turn, so the last {extra} were not run. Make fewer calls per turn.")))
        if unclosed is not None:
            calls.append(ParsedCall(name="", arguments={}, raw=unclosed, error=(
                "Error: a <tool_call> block was opened but never closed with </tool_call>. "
                f"Write each call as {CALL_FORMAT}")))
        answer = None if calls else extract_answer(visible)
        return ParsedTurn(reasoning=reasoning, content=visible, calls=tuple(calls), answer=answer)

    def _parse_call(self, raw: str) -> ParsedCall:
        def bad(msg: str, name: str = "", args: dict | None = None) -> ParsedCall:
            return ParsedCall(name=name, arguments=args or {}, raw=raw, error=msg)

        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as e:
            return bad(f"Error: the tool call is not valid JSON ({_json_problem(e)}). "
                       f"Write each call as {CALL_FORMAT}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return bad('Error: a tool call must be a JSON object with a string "name" and an '
                       f'"arguments" object. Write each call as {CALL_FORMAT}')
        name, args = obj["name"], obj.get("arguments", {})
        shown = clip(name)
        args = decoded_arguments(args)
        if not isinstance(args, dict):
            return bad(f'Error: "arguments" of tool {shown} must be a JSON object, got '
                       f"{type(args).__name__}.", name)
        if nested_deeper_than(args, MAX_NESTING):
            return bad(f'Error: "arguments" of tool {shown} are nested more than {MAX_NESTING} '
                       "levels deep.", name)
        validator = self._validators.get(name)
        if validator is None:
            return bad(f"Error: unknown tool {shown}. Available tools: {self._available}.",
                       name, args)
        try:
            problem = schema.schema_error(validator, args)
        except RecursionError:
            problem = "arguments nested too deeply"
        if problem is not None:
            return bad(f"Error: invalid arguments for tool {shown}: "
                       f"{clip(problem, 2 * MAX_ECHO_CHARS, quote=False)}.", name, args)
        return ParsedCall(name=name, arguments=args, raw=raw)


def clip(text: str, limit: int = MAX_ECHO_CHARS, quote: bool = True) -> str:
    """`text` (repr'd when `quote`) cut to `limit` characters, saying how long it was: an error
    observation must not hand a megabyte the model wrote back to it."""
    shown = repr(text) if quote else text
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}... ({len(text)} characters)"


def _json_problem(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at line {e.lineno} column {e.colno}"
    if isinstance(e, RecursionError):
        return "nesting too deep"
    if "digits" in str(e):  # int() refuses literals longer than this interpreter's limit
        return f"an integer has more than {sys.get_int_max_str_digits()} digits"
    return str(e)[:200]


def nested_deeper_than(obj: Any, limit: int) -> bool:
    """True when lists/dicts inside `obj` nest more than `limit` levels (iterative: no
    recursion limit to hit)."""
    stack = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (
                node.values() if isinstance(node, dict) else node))
    return False


def tagged_blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], str | None]:
    """(bodies of the `open…close` blocks, left to right, each ending at the first close tag
    after its opening; the text after an opening tag that is never closed, or None).

    Linear in len(text): every `find` starts where the previous one stopped, and once an
    opening tag has no close tag after it no later one can have one either."""
    blocks, pos = [], 0
    while (start := text.find(open_tag, pos)) >= 0:
        body = start + len(open_tag)
        end = text.find(close_tag, body)
        if end < 0:
            return blocks, text[body:]
        blocks.append(text[body:end])
        pos = end + len(close_tag)
    return blocks, None


def extract_answer(visible: str) -> str:
    """The last complete `<answer>…</answer>` if there is one, else the visible text, stripped."""
    blocks, _ = tagged_blocks(visible, "<answer>", "</answer>")
    return (blocks[-1] if blocks else visible).strip()


def decoded_arguments(args: Any) -> Any:
    """A call's "arguments" with one JSON string layer removed: some models JSON-encode the
    arguments twice. Anything that does not decode comes back as it was."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except (ValueError, RecursionError):
            pass
    return args
