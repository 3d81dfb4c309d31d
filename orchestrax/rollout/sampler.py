"""The sampler interface: token ids in, token ids + logprobs + finish reason out.

Field names follow SGLang's native `/generate` API so the embedded sampler, the SGLang HTTP
client and `orchestrax serve` are interchangeable. Logprobs are log_softmax(logits / T) over the
full vocabulary, SGLang's convention; greedy (T == 0) reports log_softmax(logits).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Protocol, Sequence

FinishReason = Literal["stop", "length", "abort"]
TopLogprobs = tuple[tuple[int, float], ...]   # (token id, logprob), most likely first
MAX_TOKEN_ID = 2**31 - 1                        # ids travel as int32
MAX_TOP_LOGPROBS = 20                           # alternatives per position (OpenAI's cap)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float = 1.0          # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1                   # -1 means the whole vocabulary
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    sampling_seed: int | None = None  # per-request seed; None draws from the sampler's stream
    presence_penalty: float = 0.0     # OpenAI semantics, on generated tokens; in [-2, 2]
    frequency_penalty: float = 0.0

    def __post_init__(self):
        # `not (x >= lo)` rather than `x < lo` so NaN is refused too.
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"SamplingParams.temperature={self.temperature}; must be finite "
                             "and >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p}; must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k={self.top_k}; must be -1 or >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens}; must be >= 1")
        if not all(0 <= t <= MAX_TOKEN_ID for t in self.stop_token_ids):
            raise ValueError(f"SamplingParams.stop_token_ids={list(self.stop_token_ids)[:8]}; "
                             f"each must be in [0, {MAX_TOKEN_ID}]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)}; must be in "
                                 "[-2, 2]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateRequest:
    input_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()
    rid: str | None = None
    top_logprobs: int = 0             # alternatives reported per output position


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerateResult:
    """`output_ids` keeps the stop token when generation stopped on one (SGLang does the same)."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    weight_version: str = "0"
    rid: str | None = None
    top_logprobs: tuple[TopLogprobs, ...] = ()   # one per output token when requested
    cached_tokens: int = 0            # prompt tokens whose KV was reused, not computed


class Sampler(Protocol):
    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]: ...

    async def publish(self, params: Any, version: str) -> None:
        """Serve `params` from the next request on, and report `version` as every later result's
        `weight_version` (the trainer's push after each update). The default refuses: a sampler
        whose output does not come from trainable weights cannot serve new ones."""
        raise NotImplementedError(f"{type(self).__name__} does not serve trainable weights")

    def drop_params(self) -> None:
        """Free the weights this sampler holds until the next `publish` (the trainer's step
        needs the memory; nothing is generated in between). The default holds none."""

    def take_counters(self) -> dict[str, int]:
        """Requests, retries and failures since the previous call, for per-step metrics; the
        default counts nothing."""
        return {}

    def warm(self, sampling: Sequence[SamplingParams] | None = None) -> int:
        """Compile what serving requests sampled with `sampling` (None: any settings) can need,
        before the first one; returns how many programs. The default has nothing to compile."""
        return 0

    async def aclose(self) -> None:
        """Release what the sampler holds (HTTP sessions, health-check tasks); its owner awaits
        this once, when done with it. The default does nothing, for samplers that hold nothing;
        a class inherits it by naming `Sampler` as a base (a Protocol's defaults are not
        inherited structurally)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """What `registry.build_sampler` needs to build any registered backend; each backend reads
    the fields it uses."""

    backend: str = "embedded"          # a key of registry.SAMPLERS
    urls: tuple[str, ...] = ()         # HTTP backends: the servers (or one router)
    max_batch: int = 64                # embedded: rows decoded together
    max_len: int = 4096                # embedded: prompt + output tokens of one request
    seed: int = 0
    # embedded continuous: cache positions a decode dispatch may read per row (steps x span);
    # None: always its decode_steps (ContinuousEngine.steps_at)
    dispatch_reads: int | None = None
    weight_version: str = "0"          # what results report until the first `publish`
    # HTTP backends that `publish`: a safetensors directory per version is written here
    weight_sync_dir: str | None = None
    tokenizer_dir: str | None = None   # copied next to each published version

    def __post_init__(self):
        for name, optional in (("max_batch", False), ("max_len", False),
                               ("dispatch_reads", True)):
            value = getattr(self, name)
            if optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SamplerConfig.{name}={value!r}; must be an int >= 1"
                                 + (" or None" if optional else ""))
