"""The protocol of the released Orchestrator-8B (ToolOrchestra's official evaluation), selectable
next to the multi-turn loop of `agent.episode`.

Every round the orchestrator sees a fresh two-message conversation, never its earlier turns:
system `SYSTEM_PROMPT`, and a user turn holding the problem, what the experts found so far
(documents, Python code with its output) and the closing line "Choose an appropriate tool.".
Three tools are rendered in Qwen3's tools block (`agent.chat`, the template vLLM and SGLang
apply), each with one string argument `model` that names an expert slot (`SLOTS`): `search`
(the expert writes a query, a retriever returns documents), `enhance_reasoning` (the expert
writes Python, which runs; code and output join the context) and `answer` (the expert answers;
the episode ends). The turn's first `<tool_call>` naming a known tool and a slot it offers is
run; a round without one is a format error and the next round starts from the same context (the
released evaluation plays on to its round limit; `max_format_errors` can end the episode after
that many such rounds in a row instead).

Token-in/token-out still holds per round: each round's prompt is rendered and tokenised once and
the sampler's ids are kept as returned. A `RoundsTrajectory` keeps every round as a training
sample (`samples`: its exact prompt ids, loss on the ids it sampled, as Flow-GRPO trains sub-agent
mode's turns) and its last round as its own token columns (one valid sequence); every round's
text, call, tokens and time are in `turns`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from orchestrax.agent import chat
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig, sample_turn
from orchestrax.agent.parser import clip, decoded_arguments, split_thinking, tagged_blocks
from orchestrax.agent.subagent.orchestrator import TurnSample
from orchestrax.data.records import Task, ToolCallRecord, Trajectory, TurnRecord
from orchestrax.rollout.sampler import Sampler

SYSTEM_PROMPT = "You are good at using tools."
CLOSING = "Choose an appropriate tool."
TOOL_NAMES = ("enhance_reasoning", "answer", "search")   # the order the released tools file has
SLOTS: dict[str, tuple[str, ...]] = {
    "enhance_reasoning": ("reasoner-1", "reasoner-2", "reasoner-3"),
    "answer": ("answer-math-1", "answer-math-2", "answer-1", "answer-2", "answer-3", "answer-4"),
    "search": ("search-1", "search-2", "search-3"),
}
# (input $, output $ per million tokens, average seconds per call): the released table the
# orchestrator was trained to read; the default price and latency charged for each slot.
SLOT_FIGURES: dict[str, tuple[float, float, float]] = {
    "reasoner-1": (1.25, 10.0, 31.0), "reasoner-2": (0.25, 2.0, 25.0),
    "reasoner-3": (0.8, 0.8, 9.0),
    "answer-1": (1.25, 10.0, 96.0), "answer-2": (0.25, 2.0, 27.0), "answer-3": (0.9, 0.9, 15.0),
    "answer-4": (0.8, 0.8, 11.0), "answer-math-1": (0.9, 0.9, 13.0),
    "answer-math-2": (0.2, 0.2, 9.0),
    "search-1": (1.25, 10.0, 22.0), "search-2": (0.25, 2.0, 16.0), "search-3": (0.8, 0.8, 8.0),
}
_PURPOSE = {
    "enhance_reasoning": ("Have an expert model study the problem, write Python code and run it; "
                          "the code and its printed intermediate results join the context."),
    "answer": ("Have an expert model give the final answer from the context gathered so far; "
               "call it only once documents are present."),
    "search": "Have an expert model write a search query for the missing information.",
}


def _slot_table(tool: str) -> str:
    rows = [f"{s} | ${SLOT_FIGURES[s][0]:g} | ${SLOT_FIGURES[s][1]:g} | {SLOT_FIGURES[s][2]:g}s"
            for s in SLOTS[tool]]
    return (f"The expert to use. Choices: {list(SLOTS[tool])}.\nModel | price per million input "
            "tokens | price per million output tokens | average latency\n" + "\n".join(rows))


def default_tools() -> list[dict[str, Any]]:
    """The three tools in the released shape (one required string `model`, keys in its order);
    the descriptions are this package's, with the released slot names and figures. Pass the
    released `tools.json` through `load_tools` to render its own wording."""
    return [{"type": "function", "function": {
        "name": name, "description": _PURPOSE[name],
        "parameters": {"properties": {"model": {"description": _slot_table(name),
                                                "type": "string"}},
                       "required": ["model"], "title": "parameters", "type": "object"}}}
        for name in TOOL_NAMES]


def load_tools(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The tool list of a `tools.json` in the official evaluation's format, checked: the three
    tool names, each taking a `model` string."""
    where = f"orchestrator8b tools file {path}"
    try:
        tools = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: cannot read it as JSON ({e})") from None
    names = []
    for i, t in enumerate(tools if isinstance(tools, list) else ()):
        fn = t.get("function", {}) if isinstance(t, dict) else {}
        props = fn.get("parameters", {}).get("properties", {})
        if fn.get("name") not in SLOTS or "model" not in props:
            raise ValueError(f"{where}: entry {i} must be one of {list(SLOTS)} with a 'model' "
                             "parameter")
        names.append(fn["name"])
    if sorted(names) != sorted(SLOTS):
        raise ValueError(f"{where}: needs exactly the tools {list(SLOTS)}, got {names}")
    return tools


def user_prompt(problem: str, context: str) -> str:
    return f"Problem: {problem}\n\n{context}\n\n{CLOSING}"


def round_messages(problem: str, context: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_prompt(problem, context)}]


class Tokens(Protocol):
    """What the context budget counts with: the policy's tokenizer (a `Codec`)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def keep_tail(tokens: Tokens, text: str, limit: int) -> tuple[str, int]:
    """(the last `limit` tokens of `text` as text, its length in tokens)."""
    if not text:
        return "", 0
    ids = tokens.encode(text)
    return (text if len(ids) <= limit else tokens.decode(ids[-limit:])), len(ids)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContextBudget:
    """Token and character caps of the context text (the official evaluation's figures by
    default)."""

    total_tokens: int = 27_000    # documents + code, less the problem's own tokens
    code_tokens: int = 12_000     # code and outputs, kept from the end
    doc_chars: int = 1_200        # of each document


@dataclasses.dataclass(kw_only=True)
class RoundContext:
    """What the experts have found in one episode, in order."""

    docs: list[str] = dataclasses.field(default_factory=list)
    code: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (code, output)

    def add_docs(self, found: Sequence[str]) -> None:
        """The retriever's best hit is listed last, so it ends up nearest the question."""
        for doc in reversed(found):
            if doc not in self.docs:
                self.docs.append(doc)

    def code_text(self) -> str:
        return "".join(f"```python\n{c}\n```\n\n```output\n{o}\n```\n\n" for c, o in self.code)

    def doc_text(self, doc_chars: int | None, marker: str = "") -> str:
        return "".join(f"Doc {i}: {d if doc_chars is None else d[:doc_chars]}{marker}\n\n"
                       for i, d in enumerate(self.docs, 1))

    def render(self, problem: str, tokens: Tokens, budget: ContextBudget) -> str:
        """The context the orchestrator sees: documents (each cut to `doc_chars`), then code
        and outputs under its own cap, all cut from the front to the total budget."""
        code, code_len = keep_tail(tokens, self.code_text(), budget.code_tokens)
        if code and not code.startswith("```"):
            code = "```\n" + code
        room = budget.total_tokens - len(tokens.encode(problem))
        if code_len >= room:
            return code
        docs = self.doc_text(budget.doc_chars, " ...")
        body = docs + "\npython code and execution outputs:\n" + code if code else docs
        text, _ = keep_tail(tokens, body, max(room, 1))
        return "Documents:\n" + text if docs else text

    def expert_context(self, problem: str, tokens: Tokens, *, total_tokens: int,
                       code_tokens: int, doc_chars: int | None) -> str:
        """The context an expert gets: its own caps (a small expert sees shorter documents)."""
        code, _ = keep_tail(tokens, self.code_text(), code_tokens)
        if code and not code.startswith("```"):
            code = "```\n" + code
        docs = self.doc_text(doc_chars)
        text, _ = keep_tail(tokens, docs + code,
                            max(total_tokens - len(tokens.encode(problem)), 1))
        return "Documents:\n" + text if docs else text


@dataclasses.dataclass(frozen=True)
class Choice:
    tool: str
    slot: str
    raw: str


def parse_choice(text: str, offered: Sequence[str] = TOOL_NAMES) -> Choice | str:
    """The first `<tool_call>` outside `<think>` that names an offered tool and one of its slots
    (later calls are ignored, as the official evaluation runs one per round); otherwise the
    reason, written for the log."""
    _, visible = split_thinking(text)
    blocks, unclosed = tagged_blocks(visible, "<tool_call>", "</tool_call>")
    problems = []
    for raw in blocks:
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            problems.append(f"not JSON: {clip(raw.strip())}")
            continue
        name = obj.get("name") if isinstance(obj, dict) else None
        args = decoded_arguments(obj.get("arguments", {})) if isinstance(obj, dict) else None
        if name not in offered:
            problems.append(f"unknown tool {clip(str(name))}; offered: {', '.join(offered)}")
        elif not isinstance(args, dict) or args.get("model") not in SLOTS[name]:
            got = args.get("model") if isinstance(args, dict) else args
            problems.append(f"{name}: model={clip(str(got))}; allowed: {', '.join(SLOTS[name])}")
        else:
            return Choice(tool=name, slot=args["model"], raw=raw)
    if unclosed is not None:
        problems.append("a <tool_call> block was never closed")
    return "; ".join(problems) if problems else "no tool call"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundOutput:
    """One orchestrator turn: its text, the token columns when the policy is token-level (prompt
    ids, output ids, output logprobs), and its size and wall time."""

    text: str
    tokens_in: int
    tokens_out: int
    seconds: float
    prompt_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    weight_version: str = ""


# (the round's messages, the tools to render, the round index) -> its output, or why it failed.
RoundGenerator = Callable[[list[dict[str, str]], list[dict[str, Any]], int],
                          Awaitable["RoundOutput | str"]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertOutcome:
    """What an expert call did: its record (cost, latency, observation) and, for `answer`, the
    final answer ("" when the expert gave none)."""

    record: ToolCallRecord
    answer: str | None = None


class Experts(Protocol):
    """Runs the expert a slot names; updates `context` (documents, code) in place."""

    async def call(self, choice: Choice, problem: str, context: RoundContext) -> ExpertOutcome:
        ...


@dataclasses.dataclass(kw_only=True)
class RoundsTrajectory(Trajectory):
    """A trajectory of the protocol: its rounds as training samples (token-level policies)."""

    samples: list[TurnSample] = dataclasses.field(default_factory=list)


def problem_of(task: Task) -> str:
    """The question: a QA task's own text, else its last user message."""
    question = task.metadata.get("question")
    if isinstance(question, str) and question:
        return question
    users = [m.get("content") for m in task.messages if m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError(f"task {task.task_id}: the orchestrator8b protocol needs a question "
                         "(metadata 'question' or a user message)")
    return users[-1]


async def play_rounds(generate: RoundGenerator, task: Task, experts: Experts, tokens: Tokens, *,
                      max_rounds: int, max_format_errors: int | None = None,
                      budget: ContextBudget = ContextBudget(),
                      tools: Sequence[Mapping[str, Any]] | None = None) -> RoundsTrajectory:
    """One episode in the protocol: rounds until an `answer` call or `max_rounds`, `search`
    offered only while no document has been found; a round
    without a usable call is skipped, as the released evaluation skips it, unless it is the
    `max_format_errors`-th such round in a row (then the episode ends, `format_errors`)."""
    if max_format_errors is not None and max_format_errors < 1:
        raise ValueError(f"max_format_errors={max_format_errors}; must be >= 1 or None (play "
                         "on to the round limit)")
    problem = problem_of(task)
    every = [dict(t) for t in (tools if tools is not None else default_tools())]
    context = RoundContext()
    traj = RoundsTrajectory(task_id=task.task_id)
    streak = 0
    for n in range(max_rounds):
        # Once documents are found, `search` is no longer offered (the released evaluation
        # renders and accepts the other tools only).
        schemas = [t for t in every if not (context.docs and t["function"]["name"] == "search")]
        offered = tuple(t["function"]["name"] for t in schemas)
        messages = round_messages(problem, context.render(problem, tokens, budget))
        out = await generate(messages, schemas, n)
        if isinstance(out, str):
            traj.end_reason, traj.error = "error", out
            return traj
        if out.prompt_ids:
            traj.samples.append(TurnSample(turn=n, prompt_ids=list(out.prompt_ids),
                                           output_ids=list(out.output_ids),
                                           logprobs=list(out.logprobs),
                                           prompt_text=messages[1]["content"]))
        traj.prompt_len = len(out.prompt_ids)
        traj.token_ids = [*out.prompt_ids, *out.output_ids]
        traj.loss_mask = [0] * len(out.prompt_ids) + [1] * len(out.output_ids)
        traj.logprobs = [0.0] * len(out.prompt_ids) + list(out.logprobs)
        record = TurnRecord(text=out.text, tokens_in=out.tokens_in, tokens_out=out.tokens_out,
                            generation_s=out.seconds, weight_version=out.weight_version)
        traj.turns.append(record)
        traj.messages += [messages[1], {"role": "assistant", "content": out.text}]
        choice = parse_choice(out.text, offered)
        if isinstance(choice, str):
            record.format_error = f"Error: {choice}"
            streak += 1
            if max_format_errors is not None and streak >= max_format_errors:
                traj.end_reason = "format_errors"
                return traj
            continue
        streak = 0
        done = await experts.call(choice, problem, context)
        record.tool_calls.append(done.record)
        if choice.tool == "answer":
            traj.final_answer = done.answer or None
            traj.end_reason = "answer"
            return traj
    traj.end_reason = "max_turns"
    return traj


def token_rounds(sampler: Sampler, codec: Codec, config: EpisodeConfig, rid: str
                 ) -> RoundGenerator:
    """Rounds sampled token-in/token-out: the round's two messages and tools rendered in Qwen3's
    format (thinking as `config` says), tokenised once, sampled like any episode turn."""

    async def generate(messages, schemas, n: int) -> RoundOutput | str:
        ids = codec.encode_prompt(chat.prompt_parts(messages, tools=schemas,
                                                    enable_thinking=config.enable_thinking))
        room = config.context_tokens - len(ids)
        if room < 1:
            return f"round {n}: the prompt has {len(ids)} tokens, over context_tokens"
        got = await sample_turn(sampler, ids, config.sampling, codec.stop_ids, turn=n,
                                max_new_tokens=min(config.max_new_tokens, room),
                                rid=f"{rid}/{n}", attempts=config.sampler_attempts,
                                backoff_s=config.sampler_backoff_s)
        if isinstance(got, str):
            return got
        result, seconds = got
        out = list(result.output_ids)
        stopped = result.finish_reason == "stop" and bool(out) and out[-1] in codec.stop_ids
        return RoundOutput(text=codec.decode(out[:-1] if stopped else out), tokens_in=len(ids),
                           tokens_out=len(out), seconds=seconds, prompt_ids=tuple(ids),
                           output_ids=tuple(out), logprobs=tuple(result.logprobs),
                           weight_version=result.weight_version)

    return generate
