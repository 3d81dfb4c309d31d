"""The Qwen3 conversation format, rendered by our own code.

`render_messages` reproduces Qwen3's original chat template character for character (tests check
it against the template shipped in `trl` through `transformers.apply_chat_template`); with
`keep_thinking=True` it reproduces trl's prefix-preserving training variant instead, which is what
a token-in/token-out rollout actually fed the model. The `*_delta` functions render the text that
continues a conversation after the sampler stopped on `<|im_end|>`: they start with the "\n" that
follows `<|im_end|>`, so that newline is never dropped at assistant→tool boundaries.

Messages are OpenAI-style dicts: role in {system, user, assistant, tool}; assistant messages may
carry `tool_calls` ([{"function": {"name", "arguments"}}] or [{"name", "arguments"}]) and
`reasoning_content`.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from orchestrax.tools.tool import ToolSpec

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")

_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n"
                 "<tools>")
_TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name "
                 "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                 "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
_EMPTY_THINK = "<think>\n\n</think>\n\n"


def to_json(x: Any) -> str:
    """JSON exactly as the chat template's `tojson` filter writes it (non-ASCII kept)."""
    return json.dumps(x, ensure_ascii=False)


def tool_schema(tool: ToolSpec | Mapping[str, Any]) -> dict[str, Any]:
    return tool.to_openai() if isinstance(tool, ToolSpec) else dict(tool)


def system_prompt(system: str | None, tools: Sequence[ToolSpec | Mapping[str, Any]]) -> str:
    """The whole system turn, `<|im_start|>system\n…<|im_end|>\n`; '' when there is nothing."""
    if not tools:
        return "" if system is None else f"{IM_START}system\n{system}{IM_END}\n"
    body = "" if system is None else system + "\n\n"
    body += _TOOLS_HEADER + "".join("\n" + to_json(tool_schema(t)) for t in tools) + _TOOLS_FOOTER
    return f"{IM_START}system\n{body}{IM_END}\n"


def render_tool_call(name: str, arguments: Any) -> str:
    """One `<tool_call>` block; `arguments` is a dict (JSON-encoded here) or a raw JSON string."""
    args = arguments if isinstance(arguments, str) else to_json(arguments)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def _is_tool_response_only(content: str) -> bool:
    return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _validate(messages: Sequence[Mapping[str, Any]]) -> None:
    if not messages:
        raise ValueError("render_messages: messages is empty; need at least one message")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}].role={m.get('role')!r}; allowed: {', '.join(ROLES)}")


def _split_thinking(message: Mapping[str, Any], content: str) -> tuple[str, str]:
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, content
    if "</think>" in content:
        head, tail = content.split("</think>")[0], content.split("</think>")[-1]
        return head.rstrip("\n").split("<think>")[-1].lstrip("\n"), tail.lstrip("\n")
    return "", content


def _render_assistant(message: Mapping[str, Any], content: str, *, think: bool,
                      think_if_nonempty: bool) -> str:
    reasoning, content = _split_thinking(message, content)
    out = f"{IM_START}assistant\n"
    if think or (think_if_nonempty and reasoning):
        out += "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
    else:
        out += content
    for k, call in enumerate(message.get("tool_calls") or ()):
        if (k == 0 and content) or k > 0:
            out += "\n"
        fn = call.get("function", call)
        out += render_tool_call(fn["name"], fn["arguments"])
    return out + f"{IM_END}\n"


def render_messages(messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[ToolSpec | Mapping[str, Any]] = (),
                    add_generation_prompt: bool = False, enable_thinking: bool = True,
                    keep_thinking: bool = False) -> str:
    """Render a conversation in Qwen3's chat format.

    keep_thinking=False: the original template (drops reasoning of assistant turns before the
    last real user query, and empty think blocks of earlier tool-calling turns).
    keep_thinking=True: every assistant turn keeps its think block (trl's training variant).
    """
    _validate(messages)
    first_is_system = messages[0]["role"] == "system"
    out = system_prompt(_content(messages[0]) if first_is_system else None, tools)

    last_query = len(messages) - 1
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if (m["role"] == "user" and isinstance(m.get("content"), str)
                and not _is_tool_response_only(m["content"])):
            last_query = i
            break

    n = len(messages)
    for i, m in enumerate(messages):
        role, content = m["role"], _content(m)
        if role == "user" or (role == "system" and i > 0):
            out += f"{IM_START}{role}\n{content}{IM_END}\n"
        elif role == "assistant":
            after_query = i > last_query
            out += _render_assistant(
                m, content, think=keep_thinking or (after_query and i == n - 1),
                think_if_nonempty=after_query)
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out += f"{IM_START}user"
            out += f"\n<tool_response>\n{content}\n</tool_response>"
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                out += f"{IM_END}\n"
    if add_generation_prompt:
        out += generation_prompt(enable_thinking=enable_thinking)
    return out


def prompt_parts(messages: Sequence[Mapping[str, Any]], *,
                 tools: Sequence[ToolSpec | Mapping[str, Any]] = (),
                 enable_thinking: bool = True) -> list[str]:
    """`render_messages(..., add_generation_prompt=True)` as [scaffolding, content, ...,
    scaffolding], the odd items being the verbatim contents of the system, user and tool
    messages (a task's question, a simulated user's opening line), so the codec keeps tag text in
    them from becoming structure. Assistant turns stay in the scaffolding. When a content cannot
    be located where the format puts it, the whole render is one scaffolding part."""
    text = render_messages(messages, tools=tools, add_generation_prompt=True,
                           enable_thinking=enable_thinking)
    parts, pos = [], 0
    for m in messages:
        content = _content(m)
        if m["role"] == "assistant" or not content:
            continue
        head = "\n<tool_response>\n" if m["role"] == "tool" else f"{IM_START}{m['role']}\n"
        start = pos
        while True:  # the next header followed by this content (an assistant turn may quote one)
            found = text.find(head, start)
            if found < 0:
                return [text]
            start = found + len(head)
            if text.startswith(content, start):
                break
        parts += [text[pos:start], content]
        pos = start + len(content)
    return parts + [text[pos:]]


def generation_prompt(*, enable_thinking: bool = True) -> str:
    """`<|im_start|>assistant\n`, plus an empty think block when thinking is off."""
    return f"{IM_START}assistant\n" + ("" if enable_thinking else _EMPTY_THINK)


def tool_response_parts(observations: Sequence[str], *, enable_thinking: bool = True
                        ) -> list[str]:
    """What follows an assistant turn that ended on `<|im_end|>` and called tools (the newline,
    one user turn holding every `<tool_response>` block, the next generation prompt), as
    [scaffolding, observation, scaffolding, ..., scaffolding]: odd items are the observations
    verbatim, so the codec can keep any tag text inside them from becoming structure."""
    if not observations:
        raise ValueError("tool_response_parts: observations is empty; need at least one")
    parts = [f"\n{IM_START}user"]
    for observation in observations:
        parts[-1] += "\n<tool_response>\n"
        parts += [observation, "\n</tool_response>"]
    parts[-1] += f"{IM_END}\n" + generation_prompt(enable_thinking=enable_thinking)
    return parts


def user_parts(text: str, *, enable_thinking: bool = True) -> list[str]:
    """What follows an assistant turn that ended on `<|im_end|>` when the user replies, as
    [scaffolding, reply, scaffolding]."""
    return [f"\n{IM_START}user\n", text,
            f"{IM_END}\n" + generation_prompt(enable_thinking=enable_thinking)]


def tool_response_delta(observations: Sequence[str], *, enable_thinking: bool = True) -> str:
    """`tool_response_parts` joined: the text a full render of the conversation would add."""
    return "".join(tool_response_parts(observations, enable_thinking=enable_thinking))


def user_delta(text: str, *, enable_thinking: bool = True) -> str:
    """`user_parts` joined."""
    return "".join(user_parts(text, enable_thinking=enable_thinking))
