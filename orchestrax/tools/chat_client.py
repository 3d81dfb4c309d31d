"""The one OpenAI-compatible `/v1/chat/completions` client (SGLang, vLLM, OpenAI, `orchestrax
serve`), for LLM-as-tool, the tool describer, the QA judge, the tau2 user simulator and eval.

Transient failures (connection errors, timeouts, 429, 5xx) are retried with exponential backoff
up to `max_retries` times; other HTTP errors and malformed bodies raise at once. Every failure is
a `ChatError`, which is a `ToolError`, so an LLM tool's failure reaches the executor as it is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import time
from typing import Any, Sequence

import aiohttp

from orchestrax.tools.tool import ToolError

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatEndpoint:
    base_url: str                      # server root or its /v1, e.g. http://127.0.0.1:30000/v1
    model: str
    api_key_env: str | None = None     # name of the env var holding a bearer key; None sends none
    temperature: float = 0.0
    max_tokens: int = 1024
    seed: int | None = None
    timeout_s: float = 120.0           # per attempt
    max_retries: int = 3               # transient failures only
    backoff_s: float = 0.5             # first retry waits this; doubles each retry

    def __post_init__(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"ChatEndpoint.base_url={self.base_url!r}; must start with "
                             "http:// or https://")
        if not self.model:
            raise ValueError("ChatEndpoint.model must be a non-empty model name")
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"ChatEndpoint.temperature={self.temperature}; must be >= 0")
        if self.max_tokens < 1:
            raise ValueError(f"ChatEndpoint.max_tokens={self.max_tokens}; must be >= 1")
        if not self.timeout_s > 0:
            raise ValueError(f"ChatEndpoint.timeout_s={self.timeout_s}; must be > 0")
        if self.max_retries < 0:
            raise ValueError(f"ChatEndpoint.max_retries={self.max_retries}; must be >= 0")
        if not self.backoff_s >= 0:
            raise ValueError(f"ChatEndpoint.backoff_s={self.backoff_s}; must be >= 0")

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        return base.removesuffix("/v1") + "/v1/chat/completions"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatReply:
    text: str                 # content with any <think>...</think> block removed, stripped
    raw: str                  # content as returned
    input_tokens: int
    output_tokens: int
    finish_reason: str | None
    seconds: float            # wall time of the successful attempt


class ChatError(ToolError):
    """A failed completion; `transient` says whether trying again later may succeed."""


def _headers(ep: ChatEndpoint) -> dict[str, str]:
    if ep.api_key_env is None:
        return {}
    key = os.environ.get(ep.api_key_env)
    if not key:
        raise ChatError(f"environment variable {ep.api_key_env} (API key for {ep.url}) is unset",
                        transient=False)
    return {"Authorization": f"Bearer {key}"}


async def _once(session: aiohttp.ClientSession, ep: ChatEndpoint, body: dict) -> ChatReply:
    headers = _headers(ep)
    t0 = time.monotonic()
    try:
        async with session.post(ep.url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=ep.timeout_s)) as resp:
            if resp.status != 200:
                raise ChatError(f"{ep.url} answered {resp.status}: {(await resp.text())[:300]}",
                                transient=resp.status == 429 or resp.status >= 500)
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ChatError(f"{ep.url} unreachable: {type(e).__name__}: {e}", transient=True) from None
    except ValueError as e:  # a 200 whose body is not JSON
        raise ChatError(f"{ep.url} returned an unexpected body: {e}", transient=False) from None
    try:
        choice = data["choices"][0]
        raw = choice["message"].get("content") or ""
        usage = data["usage"]
        return ChatReply(text=_THINK.sub("", raw).strip(), raw=raw,
                         input_tokens=int(usage["prompt_tokens"]),
                         output_tokens=int(usage["completion_tokens"]),
                         finish_reason=choice.get("finish_reason"),
                         seconds=time.monotonic() - t0)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ChatError(f"{ep.url} returned an unexpected body ({e!r}): {str(data)[:300]}",
                        transient=False) from None


async def chat(ep: ChatEndpoint, messages: Sequence[dict[str, Any]], *,
               session: aiohttp.ClientSession | None = None, retries: int | None = None,
               **overrides: Any) -> ChatReply:
    """One completion. `overrides` go into the request body (e.g. max_tokens, stop, seed);
    `retries` replaces `ep.max_retries` (0 where a caller retries itself, like the executor)."""
    body: dict[str, Any] = {"model": ep.model, "messages": list(messages),
                            "temperature": ep.temperature, "max_tokens": ep.max_tokens}
    if ep.seed is not None:
        body["seed"] = ep.seed
    body |= overrides
    retries = ep.max_retries if retries is None else retries
    own = session is None
    session = aiohttp.ClientSession() if own else session
    try:
        for attempt in range(retries + 1):
            try:
                return await _once(session, ep, body)
            except ChatError as e:
                if not e.transient or attempt == retries:
                    raise
            await asyncio.sleep(ep.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")
    finally:
        if own:
            await session.close()
