"""Reading an assistant turn: reasoning, `<tool_call>` blocks outside `<think>`, and the answer.

`ToolCallParser.parse` never raises on any input string: malformed JSON, unknown tools and
arguments that fail the tool's JSON schema become `ParsedCall.error` messages written for the
model to read (they go back to it as tool responses).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Sequence

from orchestrax.agent import schema
from orchestrax.tools.base import ToolSpec

_THINK_RE = re.compile(r"<think>|</think>")
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
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

    def __init__(self, specs: Sequence[ToolSpec]):
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique; duplicated: {', '.join(dupes)}")
        self._validators = {s.name: schema.validator_for(s.name, s.parameters) for s in specs}
        self._available = ", ".join(names) if names else "(none)"

    def parse(self, text: str) -> ParsedTurn:
        reasoning, visible = split_thinking(text)
        calls = [self._parse_call(m.group(1)) for m in _CALL_RE.finditer(visible)]
        tail = _CALL_RE.sub("", visible)
        if "<tool_call>" in tail:
            raw = tail.split("<tool_call>", 1)[1]
            calls.append(ParsedCall(name="", arguments={}, raw=raw, error=(
                "Error: a <tool_call> block was opened but never closed with </tool_call>. "
                f"Write each call as {CALL_FORMAT}")))
        answer = None if calls else extract_answer(visible)
        return ParsedTurn(reasoning=reasoning, content=visible, calls=tuple(calls), answer=answer)

    def _parse_call(self, raw: str) -> ParsedCall:
        def bad(msg: str, name: str = "", args: dict | None = None) -> ParsedCall:
            return ParsedCall(name=name, arguments=args or {}, raw=raw, error=msg)

        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            detail = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(
                e, json.JSONDecodeError) else "nesting too deep"
            return bad(f"Error: the tool call is not valid JSON ({detail}). "
                       f"Write each call as {CALL_FORMAT}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return bad('Error: a tool call must be a JSON object with a string "name" and an '
                       f'"arguments" object. Write each call as {CALL_FORMAT}')
        name, args = obj["name"], obj.get("arguments", {})
        if isinstance(args, str):  # some models JSON-encode the arguments twice
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                pass
        if not isinstance(args, dict):
            return bad(f'Error: "arguments" of tool {name!r} must be a JSON object, got '
                       f"{type(args).__name__}.", name)
        validator = self._validators.get(name)
        if validator is None:
            return bad(f"Error: unknown tool {name!r}. Available tools: {self._available}.",
                       name, args)
        try:
            problem = schema.schema_error(validator, args)
        except RecursionError:
            problem = "arguments nested too deeply"
        if problem is not None:
            return bad(f"Error: invalid arguments for tool {name!r}: {problem}.", name, args)
        return ParsedCall(name=name, arguments=args, raw=raw)


def extract_answer(visible: str) -> str:
    """The last `<answer>…</answer>` if present, else the visible text, stripped."""
    found = _ANSWER_RE.findall(visible)
    return (found[-1] if found else visible).strip()
