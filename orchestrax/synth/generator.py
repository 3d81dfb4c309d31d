"""The generator LLM of the synth pipeline: any OpenAI-compatible endpoint, called through the
project's one chat client (aiohttp, retries on transient failures), at most `concurrency`
requests at once, with every completed call appended to a ledger (`calls.jsonl`: stage,
tokens, dollars, seconds, text). A rerun reads the ledger first and answers a request it has
already paid for from there, so a killed run resumes without repeating a paid call; the budget
counts the ledger's dollars too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import pathlib
from typing import Any, Sequence

import aiohttp
from tqdm import tqdm

from orchestrax.tools.chat_client import ChatEndpoint, chat


@dataclasses.dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    """Prices in US dollars per million tokens; `budget_usd=None`: no limit."""

    endpoint: ChatEndpoint
    concurrency: int = 8
    usd_per_m_input: float = 0.0
    usd_per_m_output: float = 0.0
    budget_usd: float | None = None

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"GeneratorConfig.concurrency={self.concurrency}; must be >= 1")
        for field in ("usd_per_m_input", "usd_per_m_output"):
            if not getattr(self, field) >= 0:
                raise ValueError(f"GeneratorConfig.{field}={getattr(self, field)}; must be >= 0")
        if self.budget_usd is not None and not self.budget_usd > 0:
            raise ValueError(f"GeneratorConfig.budget_usd={self.budget_usd}; must be > 0 or None")


class BudgetExhausted(RuntimeError):
    """The dollars spent (this run and the ledger's) reached `budget_usd`."""


def request_key(stage: str, model: str, messages: Sequence[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps([stage, model, list(messages)], sort_keys=True)
                          .encode()).hexdigest()


class Generator:
    """`text = await gen.complete("tasks", messages)`; use as `async with Generator(...)`."""

    def __init__(self, config: GeneratorConfig, ledger: str | pathlib.Path, *,
                 progress: bool = True):
        self.config = config
        self.ledger = pathlib.Path(ledger)
        self._done: dict[str, dict[str, Any]] = {}
        if self.ledger.is_file():
            for line in self.ledger.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                self._done[row["key"]] = row
        self.spent_usd = sum(r["cost_usd"] for r in self._done.values())
        self.calls = self.reused = self.failed = 0
        self._gate = asyncio.Semaphore(config.concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._bar = tqdm(desc="synth", unit="call", disable=not progress, leave=False)

    async def __aenter__(self) -> "Generator":
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._session.close()
        self._bar.close()

    def _check_budget(self) -> None:
        budget = self.config.budget_usd
        if budget is not None and self.spent_usd >= budget:
            raise BudgetExhausted(f"--budget-usd {budget:g} reached (spent ${self.spent_usd:.4f})")

    async def complete(self, stage: str, messages: Sequence[dict[str, Any]], **body: Any) -> str:
        ep = self.config.endpoint
        key = request_key(stage, ep.model, [*messages, body] if body else messages)
        if key in self._done:
            self.reused += 1
            return self._done[key]["text"]
        self._check_budget()
        async with self._gate:
            self._check_budget()  # others may have spent it while this one waited
            try:
                reply = await chat(ep, messages, session=self._session, **body)
            except Exception:
                self.failed += 1
                raise
        cost = (reply.input_tokens * self.config.usd_per_m_input
                + reply.output_tokens * self.config.usd_per_m_output) / 1e6
        row = {"key": key, "stage": stage, "input_tokens": reply.input_tokens,
               "output_tokens": reply.output_tokens, "cost_usd": cost,
               "seconds": round(reply.seconds, 3), "text": reply.text}
        with self.ledger.open("a") as f:  # one line per paid call, flushed as it lands
            f.write(json.dumps(row) + "\n")
        self._done[key] = row
        self.spent_usd += cost
        self.calls += 1
        self._bar.update(1)
        self._bar.set_postfix(usd=f"{self.spent_usd:.4f}", reused=self.reused)
        return reply.text

    def stats(self) -> dict[str, float]:
        return {"calls": self.calls, "reused_calls": self.reused, "failed_calls": self.failed,
                "spent_usd": round(self.spent_usd, 6)}
