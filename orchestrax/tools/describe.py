"""The paper's capability-description procedure for an LLM tool: sample tasks, run the tool model
on each, then have a describer model write the tool description from those trajectories and their
outcomes. `tools/describe_llm_tool.py` is the command line around `describe_tool`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import random
import re
import string
from typing import Any, Callable, Sequence

from orchestrax.tools.tool import Tool, ToolError
from orchestrax.tools.chat_client import ChatEndpoint, chat

Grader = Callable[[str, str], bool]   # (tool output, reference answer) -> correct?

DESCRIBER_SYSTEM = (
    "You write tool descriptions for an orchestrator model that decides which tool or model to "
    "call. Read the tool's attempts at sample tasks and whether each was correct, then describe "
    "in 2-4 sentences what the tool is good at, where it fails, and when to call it. Be concrete; "
    "do not mention these particular tasks. Reply with the description only.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt:
    task: str
    answer: str
    output: str
    correct: bool
    cost: float
    latency: float


def normalize(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _boxed(text: str) -> str | None:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1] if found else None


def contains_answer(output: str, answer: str) -> bool:
    """Exact match on the last \\boxed{} when there is one, else normalised containment."""
    boxed = _boxed(output)
    if boxed is not None:
        return normalize(boxed) == normalize(answer)
    return bool(normalize(answer)) and normalize(answer) in normalize(output)


def load_tasks(path: str | pathlib.Path) -> list[tuple[str, str]]:
    """(question, answer) pairs from QA JSONL: {problem|question, answer}."""
    out = []
    for n, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        question = row.get("problem") or row.get("question")
        if not isinstance(question, str) or "answer" not in row:
            raise ValueError(f"{path}:{n}: need 'problem' or 'question' and 'answer' fields")
        out.append((question, str(row["answer"])))
    return out


async def run_attempts(tool: Tool, tasks: Sequence[tuple[str, str]], grade: Grader,
                       *, concurrency: int = 4) -> list[Attempt]:
    """A failed call is an attempt with its error as output (the describer should know)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(question: str, answer: str) -> Attempt:
        async with gate:
            try:
                res = await tool({"query": question})
            except ToolError as e:
                return Attempt(task=question, answer=answer, output=f"[tool error] {e}",
                               correct=False, cost=0.0, latency=0.0)
        return Attempt(task=question, answer=answer, output=res.observation,
                       correct=grade(res.observation, answer), cost=res.cost,
                       latency=res.latency or 0.0)

    return list(await asyncio.gather(*(one(q, a) for q, a in tasks)))


def describer_prompt(tool_name: str, attempts: Sequence[Attempt], *, chars: int = 800) -> str:
    lines = [f"Tool: {tool_name}. Sample attempts ({sum(a.correct for a in attempts)}/"
             f"{len(attempts)} correct):"]
    for n, a in enumerate(attempts, 1):
        output = a.output if len(a.output) <= chars else a.output[:chars] + " ..."
        lines.append(f"\n### Attempt {n}: {'CORRECT' if a.correct else 'WRONG'}"
                     f" (reference answer: {a.answer}; cost ${a.cost:.6f}; {a.latency:.1f} s)\n"
                     f"Task: {a.task}\nTool output: {output}")
    lines.append("\nWrite the tool description now.")
    return "\n".join(lines)


async def describe_tool(tool: Tool, describer: ChatEndpoint, tasks: Sequence[tuple[str, str]], *,
                        n: int = 10, seed: int = 0, grade: Grader = contains_answer
                        ) -> tuple[str, list[Attempt]]:
    """-> (description, attempts). Samples `n` tasks with `seed`."""
    if not 1 <= n <= len(tasks):
        raise ValueError(f"n={n}; must be in [1, {len(tasks)}] (the number of tasks given)")
    sample = random.Random(seed).sample(list(tasks), n)
    attempts = await run_attempts(tool, sample, grade)
    prompt = describer_prompt(tool.spec.name, attempts)
    reply = await chat(describer, [{"role": "system", "content": DESCRIBER_SYSTEM},
                                   {"role": "user", "content": prompt}])
    if not reply.text:
        raise ToolError("the describer model returned an empty description")
    return reply.text, attempts


def attempts_to_json(attempts: Sequence[Attempt]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(a) for a in attempts]
