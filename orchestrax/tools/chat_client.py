"""A minimal OpenAI-compatible `/v1/chat/completions` client over aiohttp (SGLang, vLLM, OpenAI,
`orchestrax serve`). Reads `choices[0].message.content` and `usage.{prompt,completion}_tokens`."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any

import aiohttp

from orchestrax.tools.base import ToolError

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatConfig:
    base_url: str                        # server root, e.g. http://127.0.0.1:30000 (no /v1)
    model: str
    api_key_env: str | None = None       # env var holding a bearer key; None sends none
    max_tokens: int = 1024
    temperature: float = 0.0
    seed: int | None = None
    timeout_s: float = 120.0

    def __post_init__(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"ChatConfig.base_url={self.base_url!r}; must start with http(s)://")
        if self.max_tokens < 1:
            raise ValueError(f"ChatConfig.max_tokens={self.max_tokens}; must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"ChatConfig.temperature={self.temperature}; must be >= 0")
        if self.timeout_s <= 0:
            raise ValueError(f"ChatConfig.timeout_s={self.timeout_s}; must be > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatReply:
    text: str                 # content with any <think>...</think> block removed
    raw: str                  # content as returned
    input_tokens: int
    output_tokens: int
    finish_reason: str | None
    seconds: float


async def chat(config: ChatConfig, messages: list[dict[str, Any]], *,
               max_tokens: int | None = None) -> ChatReply:
    """One completion. Connection failures, timeouts, 429 and 5xx are transient `ToolError`s."""
    body: dict[str, Any] = {"model": config.model, "messages": messages,
                            "max_tokens": max_tokens or config.max_tokens,
                            "temperature": config.temperature}
    if config.seed is not None:
        body["seed"] = config.seed
    headers = {}
    if config.api_key_env:
        key = os.environ.get(config.api_key_env)
        if not key:
            raise ToolError(f"LLM endpoint {config.base_url} needs an API key in "
                            f"${config.api_key_env}")
        headers["Authorization"] = f"Bearer {key}"
    url = config.base_url.rstrip("/") + "/v1/chat/completions"
    t0 = time.monotonic()
    try:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=config.timeout_s)) as session:
            async with session.post(url, json=body, headers=headers) as resp:
                if resp.status >= 400:
                    raise ToolError(f"LLM endpoint {url} answered HTTP {resp.status}: "
                                    f"{(await resp.text())[:300]}",
                                    transient=resp.status == 429 or resp.status >= 500)
                data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise ToolError(f"LLM endpoint {url} unreachable ({e!r})", transient=True) from e
    try:
        choice = data["choices"][0]
        raw = choice["message"].get("content") or ""
        usage = data["usage"]
        reply = ChatReply(text=_THINK.sub("", raw).strip(), raw=raw,
                          input_tokens=int(usage["prompt_tokens"]),
                          output_tokens=int(usage["completion_tokens"]),
                          finish_reason=choice.get("finish_reason"),
                          seconds=time.monotonic() - t0)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ToolError(f"LLM endpoint {url} returned an unexpected body ({e!r}): "
                        f"{str(data)[:200]}") from e
    return reply
