"""Minimal OpenAI-compatible `/v1/chat/completions` client (SGLang, vLLM, OpenAI, `orchestrax
serve`) for the environments' own LLM needs: the QA judge and the tau2 user simulator.

Transient failures (connection errors, timeouts, 429, 5xx) are retried with exponential
backoff; other HTTP errors raise at once with the server's message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any, Sequence

import aiohttp


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatEndpoint:
    base_url: str                      # e.g. "http://127.0.0.1:30000/v1" (with or without /v1)
    model: str
    api_key_env: str | None = None     # name of the env var holding the key; None: no auth
    temperature: float = 0.0
    max_tokens: int = 512
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 0.5

    def __post_init__(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"ChatEndpoint.base_url={self.base_url!r}; must start with http:// or https://")
        if not self.model:
            raise ValueError("ChatEndpoint.model must be a non-empty model name")
        if self.temperature < 0:
            raise ValueError(f"ChatEndpoint.temperature={self.temperature}; must be >= 0")
        for name in ("max_tokens", "timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ChatEndpoint.{name}={getattr(self, name)}; must be > 0")
        if self.max_retries < 0 or self.backoff_s < 0:
            raise ValueError("ChatEndpoint.max_retries and backoff_s must be >= 0")

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        return (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatReply:
    text: str
    input_tokens: int = 0
    output_tokens: int = 0


class ChatError(RuntimeError):
    def __init__(self, message: str, *, transient: bool):
        super().__init__(message)
        self.transient = transient


async def _once(session: aiohttp.ClientSession, ep: ChatEndpoint, body: dict) -> ChatReply:
    headers = {}
    if ep.api_key_env is not None:
        key = os.environ.get(ep.api_key_env)
        if not key:
            raise ChatError(f"environment variable {ep.api_key_env} (API key for {ep.url}) is unset",
                            transient=False)
        headers["Authorization"] = f"Bearer {key}"
    try:
        async with session.post(ep.url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=ep.timeout_s)) as resp:
            if resp.status == 429 or resp.status >= 500:
                raise ChatError(f"{ep.url} answered {resp.status}: {(await resp.text())[:300]}",
                                transient=True)
            if resp.status != 200:
                raise ChatError(f"{ep.url} answered {resp.status}: {(await resp.text())[:300]}",
                                transient=False)
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ChatError(f"{ep.url}: {type(e).__name__}: {e}", transient=True) from None
    try:
        text = data["choices"][0]["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ChatError(f"{ep.url} returned no choices[0].message: {str(data)[:300]}",
                        transient=False) from None
    usage = data.get("usage") or {}
    return ChatReply(text=text, input_tokens=int(usage.get("prompt_tokens", 0)),
                     output_tokens=int(usage.get("completion_tokens", 0)))


async def chat(ep: ChatEndpoint, messages: Sequence[dict[str, Any]], *,
               session: aiohttp.ClientSession | None = None, **overrides: Any) -> ChatReply:
    """One completion; `overrides` go into the request body (e.g. temperature, seed)."""
    body = {"model": ep.model, "messages": list(messages), "temperature": ep.temperature,
            "max_tokens": ep.max_tokens} | overrides
    own = session is None
    session = aiohttp.ClientSession() if own else session
    try:
        for attempt in range(ep.max_retries + 1):
            try:
                return await _once(session, ep, body)
            except ChatError as e:
                if not e.transient or attempt == ep.max_retries:
                    raise
                await asyncio.sleep(ep.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")
    finally:
        if own:
            await session.close()
