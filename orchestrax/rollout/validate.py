"""Strict JSON field checks for the served APIs, and the limits a client can hit.

JSON gives us bools that are ints, floats that are whole, strings that look like numbers and
non-standard NaN/Infinity literals; none of them is a valid token count or temperature. Every
check raises `ProtocolError` naming the field, the value and what is allowed, so one request's
bad value becomes its own 400 before it can reach a batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


class ProtocolError(ValueError):
    """A request that does not fit the supported API; the server answers 400 with the message."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """What one client may ask of `orchestrax serve`; checked before any tokenising or batching."""
    max_body_bytes: int = 32 << 20     # larger bodies get 413 before they are read
    max_text_chars: int = 1 << 20      # all text of one request (prompts or chat messages)
    max_n: int = 64                    # copies of one prompt (`n`)
    max_requests: int = 1024           # prompts x n in one call
    max_stop: int = 64                 # stop ids, and stop strings, per request
    max_json_depth: int = 64           # nesting of arrays/objects in a body
    read_timeout_s: float = 60.0       # to receive a whole request body
    idle_timeout_s: float = 60.0       # a connection with no request in flight is closed

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"ServeLimits.{f.name}={v!r}; must be a number > 0")


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(value: Any, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """A JSON integer (not a bool, float or string) in [lo, hi]."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"{name}={_describe(value)} ({type(value).__name__}); must be an "
                            "integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ProtocolError(f"{name}={_describe(value)}; must be in "
                            f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]")
    return value


def number(value: Any, name: str, *, lo: float, hi: float, lo_open: bool = False) -> float:
    """A finite JSON number (int or float, not a bool or string) in [lo, hi] (or (lo, hi])."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ProtocolError(f"{name}={_describe(value)} ({type(value).__name__}); must be a "
                            "number")
    x = float(value)
    if not math.isfinite(x):
        raise ProtocolError(f"{name}={x}; must be a finite number")
    if x < lo or x > hi or (lo_open and x == lo):
        raise ProtocolError(f"{name}={x}; must be in {'(' if lo_open else '['}{lo}, {hi}]")
    return x


def boolean(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{name}={_describe(value)}; must be true or false")
    return value


def token_ids(value: Any, name: str, *, vocab_size: int, allow_empty: bool = False
              ) -> tuple[int, ...]:
    """A JSON list of token ids in [0, vocab_size)."""
    if not isinstance(value, list) or (not value and not allow_empty):
        raise ProtocolError(f"{name} must be a {'' if allow_empty else 'non-empty '}list of "
                            f"token ids, got {_describe(value)}")
    for i, t in enumerate(value):
        integer(t, f"{name}[{i}]", lo=0, hi=vocab_size - 1)
    return tuple(value)


def unicode_text(value: str, name: str) -> str:
    """A string a tokenizer can encode: JSON's \\ud800 escapes can smuggle in lone surrogates,
    which are not Unicode text."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ProtocolError(f"{name} holds a lone surrogate at character {e.start}; must be "
                            "valid Unicode text") from None
    return value


def json_depth_error(value: Any, limit: int) -> str | None:
    """Why `value` nests deeper than `limit` arrays/objects, or None (iterative: a deep body
    must not exhaust the interpreter's stack here either)."""
    stack = [(value, 1)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, (list, dict)):
            if depth > limit:
                return f"request body nests arrays/objects deeper than {limit} levels"
            stack.extend((y, depth + 1) for y in (x.values() if isinstance(x, dict) else x)
                         if isinstance(y, (list, dict)))
    return None


def optional(body: dict, key: str, check, default: Any, *args: Any, name: str | None = None,
             **kw: Any) -> Any:
    """`check(body[key], name, ...)`, or `default` when the key is absent or null."""
    value = body.get(key)
    return default if value is None else check(value, name or key, *args, **kw)


def request_ids_error(r: Any, *, vocab_size: int, max_len: int) -> str | None:
    """What every sampler refuses in a `GenerateRequest`'s ids (naming the field), or None."""
    n = len(r.input_ids)
    if n < 1 or n >= max_len:
        return (f"input_ids has {n} tokens; must be in [1, max_len={max_len}) "
                "(the server's context length)")
    for name, ids in (("input_ids", r.input_ids), ("stop_token_ids", r.sampling.stop_token_ids)):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            return f"{name} holds {bad[:5]} outside the vocabulary [0, {vocab_size})"
    top_k = r.sampling.top_k
    if top_k != -1 and not 1 <= top_k <= vocab_size:
        return f"top_k={top_k}; must be -1 or in [1, {vocab_size}] (the vocabulary)"
    if not 1 <= r.sampling.max_new_tokens <= 2**31 - 1:
        return f"max_new_tokens={r.sampling.max_new_tokens}; must be in [1, {2**31 - 1}]"
    return None
