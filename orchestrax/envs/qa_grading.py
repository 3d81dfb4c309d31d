"""Answer graders for QA tasks: SQuAD-style normalised exact match, `math-verify` for math,
and an LLM judge through any OpenAI-compatible endpoint. Each returns 1.0 or 0.0."""

from __future__ import annotations

import re
import string
from typing import Sequence

import aiohttp

from orchestrax.tools.chat_client import ChatEndpoint, chat

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, squeeze whitespace."""
    return " ".join(_ARTICLES.sub(" ", str(text).lower().translate(_PUNCT)).split())


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    if prediction is None:
        return 0.0
    boxed = last_boxed(prediction)
    candidates = {normalize_answer(prediction)} | ({normalize_answer(boxed)} if boxed else set())
    return float(any(normalize_answer(g) in candidates for g in golds))


def math_match(prediction: str | None, golds: Sequence[str]) -> float:
    """Symbolic equivalence via `math-verify` (LaTeX or plain numbers; \\boxed{} preferred)."""
    from math_verify import parse, verify

    if not prediction:
        return 0.0
    target = parse(prediction if "\\boxed" in prediction or "$" in prediction else f"${prediction}$")
    for gold in golds:
        try:
            if verify(parse(f"${gold}$"), target):
                return 1.0
        except Exception:  # math-verify raises on malformed LaTeX or timeouts: not a match
            continue
    return exact_match(prediction, golds)


JUDGE_PROMPT = """You grade answers. Decide whether the response gives the same final answer as \
the reference (equivalent wording, units or formatting are fine; a different or missing answer \
is not).

Question: {question}
Reference answer: {gold}
Response: {prediction}

Reply with one line of reasoning, then a final line: VERDICT: CORRECT or VERDICT: INCORRECT."""
_VERDICT = re.compile(r"VERDICT:\s*(CORRECT|INCORRECT)", re.IGNORECASE)


def parse_verdict(text: str) -> float | None:
    found = _VERDICT.findall(text)
    return None if not found else float(found[-1].upper() == "CORRECT")


async def judge_match(endpoint: ChatEndpoint, question: str, prediction: str | None,
                      golds: Sequence[str], *, session: aiohttp.ClientSession | None = None) -> float:
    """1.0/0.0 from the judge model; raises `ChatError` when the endpoint fails after retries
    and ValueError when the judge's reply has no verdict."""
    if not prediction:
        return 0.0
    prompt = JUDGE_PROMPT.format(question=question, gold=" OR ".join(golds), prediction=prediction)
    reply = await chat(endpoint, [{"role": "user", "content": prompt}], session=session)
    verdict = parse_verdict(reply.text)
    if verdict is None:
        raise ValueError(f"judge reply has no 'VERDICT: CORRECT|INCORRECT' line: {reply.text[-200:]!r}")
    return verdict
