"""The experts behind the Orchestrator-8B protocol's `model` argument: each slot (`search-2`,
`answer-1`, ...) is routed to a configured OpenAI-compatible endpoint.

`search`: the expert writes a query inside <query></query>, a retriever (any search `Tool`, e.g.
the catalog's local_search) returns a document. `enhance_reasoning`: the expert writes a
```python block, which runs in the sandbox; code and output join the context when it printed
something. `answer`: the expert answers from the context, inside <answer></answer> or in
\\boxed{} (`answer_format`); the episode ends with that answer. A call is billed its tokens at the
slot's price per million and charged the slot's nominal latency (the table the orchestrator
reads, `orchestrator8b.SLOT_FIGURES`, unless configured), plus the sandbox's run time.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Awaitable, Callable, Literal, Mapping

from orchestrax.agent.orchestrator8b_protocol import (SLOT_FIGURES, SLOTS, Choice, ExpertOutcome,
                                             RoundContext, Tokens)
from orchestrax.agent.parser import tagged_blocks
from orchestrax.data.records import ToolCallRecord
from orchestrax.tools.tool import Tool
from orchestrax.tools.chat_client import ChatEndpoint, ChatError, chat
from orchestrax.tools.llm_tool import extract_code
from orchestrax.tools.sandbox import SandboxConfig, check_available, run_python

AnswerFormat = Literal["tags", "boxed"]
Retriever = Callable[[str], Awaitable[str]]
MIN_QUERY_CHARS = 5      # a shorter query is not searched
MAX_QUERY_CHARS = 390    # a longer one is cut


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertConfig:
    """One slot's expert. None prices and latency: the slot's row of the released table."""

    endpoint: ChatEndpoint
    answer_format: AnswerFormat = "tags"
    input_per_million: float | None = None     # US dollars
    output_per_million: float | None = None
    latency_s: float | None = None
    context_tokens: int = 24_000               # documents + code it is shown
    code_tokens: int = 12_000
    doc_chars: int | None = 1_000              # of each document; None: whole documents

    def __post_init__(self):
        if self.answer_format not in ("tags", "boxed"):
            raise ValueError(f"ExpertConfig.answer_format={self.answer_format!r}; allowed: "
                             "tags, boxed")
        for name in ("input_per_million", "output_per_million", "latency_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"ExpertConfig.{name}={value}; must be >= 0 or None")
        for name in ("context_tokens", "code_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"ExpertConfig.{name}={getattr(self, name)}; must be >= 1")


def load_experts(path: str | pathlib.Path) -> dict[str, ExpertConfig]:
    """`{slot: {"base_url", "model", optional "api_key_env", "answer_format", prices,
    "latency_s", "max_tokens", "temperature", ...}}` from a JSON file (the official evaluation
    maps slots to models the same way); slot "default" serves every slot not listed."""
    where = f"experts file {path}"
    try:
        rows = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: cannot read it as JSON ({e})") from None
    if not isinstance(rows, dict) or not rows:
        raise ValueError(f"{where}: must be a JSON object of slot -> endpoint")
    known = {s for slots in SLOTS.values() for s in slots} | {"default"}
    endpoint_keys = {f.name for f in dataclasses.fields(ChatEndpoint)}
    out = {}
    for slot, row in rows.items():
        if slot not in known:
            raise ValueError(f"{where}: slot {slot!r}; allowed: {', '.join(sorted(known))}")
        if not isinstance(row, dict):
            raise ValueError(f"{where}: {slot} must be an object with base_url and model")
        try:
            endpoint = ChatEndpoint(**{k: v for k, v in row.items() if k in endpoint_keys})
            out[slot] = ExpertConfig(endpoint=endpoint, **{k: v for k, v in row.items()
                                                           if k not in endpoint_keys})
        except TypeError as e:
            raise ValueError(f"{where}: {slot}: {e}") from None
    return out


def tool_retriever(tool: Tool) -> Retriever:
    """A search `Tool` as the protocol's retriever: its observation is one document."""

    async def retrieve(query: str) -> str:
        return (await tool({"query": query})).observation

    return retrieve


def boxed(text: str) -> str:
    """The content of the last \\boxed{...}, braces balanced; "" when there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return ""
    depth, pos = 1, start + len("\\boxed{")
    for i in range(pos, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[pos:i].strip()
    return ""


def tagged(text: str, tag: str) -> str:
    """The last complete <tag>...</tag> block, else the whole text, stripped."""
    blocks, _ = tagged_blocks(text, f"<{tag}>", f"</{tag}>")
    return (blocks[-1] if blocks else text).strip()


class ExpertPool:
    """`Experts` over configured endpoints. `tokens` (the policy's tokenizer) measures the
    experts' context budgets; `retriever` serves `search`, `sandbox` runs `enhance_reasoning`'s
    code (None: neither can run, and such calls are recorded as failed)."""

    def __init__(self, experts: Mapping[str, ExpertConfig], tokens: Tokens, *,
                 retriever: Retriever | None = None, sandbox: SandboxConfig | None = None):
        if sandbox is not None:
            check_available(sandbox)
        self.experts, self.tokens = dict(experts), tokens
        self.retriever, self.sandbox = retriever, sandbox

    def expert(self, slot: str) -> ExpertConfig | None:
        return self.experts.get(slot, self.experts.get("default"))

    async def call(self, choice: Choice, problem: str, context: RoundContext) -> ExpertOutcome:
        record = ToolCallRecord(name=choice.tool, arguments={"model": choice.slot},
                                observation="")
        expert = self.expert(choice.slot)
        if expert is None:
            return self._failed(choice, record, f"no expert is configured for {choice.slot}")
        shown = context.expert_context(problem, self.tokens, total_tokens=expert.context_tokens,
                                       code_tokens=expert.code_tokens,
                                       doc_chars=expert.doc_chars).strip()
        record.arguments["expert"] = expert.endpoint.model
        messages = _messages(choice.tool, expert.answer_format, shown, problem)
        try:
            reply = await chat(expert.endpoint, messages)
        except ChatError as e:
            return self._failed(choice, record, f"expert {expert.endpoint.model} failed: {e}")
        fin, fout, flat = SLOT_FIGURES[choice.slot]
        record.input_tokens, record.output_tokens = reply.input_tokens, reply.output_tokens
        record.cost = (reply.input_tokens * _or(expert.input_per_million, fin)
                       + reply.output_tokens * _or(expert.output_per_million, fout)) / 1e6
        record.latency = _or(expert.latency_s, flat)
        if choice.tool == "answer":
            answer = (boxed(reply.text) if expert.answer_format == "boxed"
                      else tagged(reply.text, "answer"))
            record.observation = answer or "[no answer]"
            return ExpertOutcome(record=record, answer=answer)
        if choice.tool == "search":
            return await self._search(choice, record, tagged(reply.text, "query"), context)
        return await self._run_code(choice, record, extract_code(reply.raw), context)

    async def _search(self, choice, record, query: str, context: RoundContext) -> ExpertOutcome:
        record.arguments["query"] = query
        if len(query) < MIN_QUERY_CHARS:
            record.observation = f"[query too short to search: {query!r}]"
            return ExpertOutcome(record=record)
        if self.retriever is None:
            return self._failed(choice, record, "no retriever is configured for search")
        doc = await self.retriever(query[:MAX_QUERY_CHARS])
        context.add_docs([doc])
        record.observation = doc
        return ExpertOutcome(record=record)

    async def _run_code(self, choice, record, code: str | None, context: RoundContext
                        ) -> ExpertOutcome:
        if not code:
            record.observation = "[the expert wrote no ```python block]"
            return ExpertOutcome(record=record)
        record.arguments["code"] = code
        if self.sandbox is None:
            return self._failed(choice, record, "no sandbox is configured to run code")
        run = await run_python(code, self.sandbox)
        record.latency += run.seconds
        record.observation = run.observation()
        if run.stdout.strip():
            context.code.append((code, run.stdout))
        return ExpertOutcome(record=record)

    @staticmethod
    def _failed(choice: Choice, record: ToolCallRecord, why: str) -> ExpertOutcome:
        record.ok, record.observation = False, f"Error: {why}"
        return ExpertOutcome(record=record, answer="" if choice.tool == "answer" else None)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _messages(tool: str, answer_format: AnswerFormat, context: str, problem: str
              ) -> list[dict[str, Any]]:
    """The expert's prompt: the context, then the problem and what to write."""
    head = context + "\n\n" if context else ""
    if tool == "search":
        return [{"role": "user", "content": (
            f"{head}Question: {problem}\nDo not answer the question. Write a search query for one "
            "piece of information that is relevant and still missing: a few keywords or a short "
            "sentence, inside <query> and </query>.")}]
    if tool == "enhance_reasoning":
        return [{"role": "user", "content": (
            f"{head}Question: {problem}\nDo not answer the question directly. Write Python code "
            "that prints intermediate results toward the answer, inside ```python and ```. The "
            "code must run on its own, imports and set-up included.")}]
    if answer_format == "boxed":
        return [{"role": "system", "content": ("Reason step by step and put the final answer "
                                               "inside \\boxed{}.")},
                {"role": "user", "content": f"{head}Problem:\n{problem}"}]
    return [{"role": "user", "content": (
        f"{head}Problem:\n{problem}\n\nThink it through inside <think> and </think>, then give "
        "only the exact answer, with no explanation, inside <answer> and </answer>.")}]
