"""What `orchestrax serve` holds, and how it runs one admitted request on the embedded sampler:
stop strings, streamed updates, early exit.

A stop string is found on the decoded text after each engine step; the request then leaves the
sampler's stream, which drops its row from the running batch, so tokens past the stop are not
generated beyond the current step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any, AsyncIterator, Callable

from orchestrax import models
from orchestrax.rollout.sampler import GenerateRequest, GenerateResult, TopLogprobs
from orchestrax.rollout.detok import StopMatcher
from orchestrax.rollout.embedded import ContinuousSampler
from orchestrax.rollout.prompt_logprobs import PromptScorer
from orchestrax.rollout.validate import ProtocolError, ServeLimits


@dataclasses.dataclass(kw_only=True)
class ServerState:
    sampler: ContinuousSampler
    model_path: str
    tokenizer: Any = None                  # a transformers tokenizer; needed for text and chat
    tokenizer_path: str | None = None
    chat_template: str | None = None       # overrides the tokenizer's own template when given
    served_model_name: str = "orchestrax"
    # (path) -> (cfg, params); default reads an HF safetensors directory with models.load_hf.
    load_weights: Callable[[str], tuple[models.ModelConfig, Any]] | None = None
    limits: ServeLimits = ServeLimits()
    api_key: str | None = None             # when set, every route but /health needs the bearer
    weight_roots: tuple[str, ...] = ()     # update_weights_from_disk loads only below these
    weight_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    weight_updates: int = 0                # successful update_weights_from_disk calls
    released: frozenset[str] = frozenset()   # memory tags given back by release_memory_occupation
    host_params: Any = None                # (host copy, shardings) of released weights
    _scorer: PromptScorer | None = None

    @property
    def scorer(self) -> PromptScorer:
        """Prompt logprobs with the sampler's current params."""
        if self._scorer is None:
            self._scorer = PromptScorer(self.sampler.cfg, lambda: self.sampler.params)
        return self._scorer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def admit(self, requests: list[GenerateRequest]) -> None:
        """ProtocolError for the first request the sampler would refuse; nothing is queued."""
        for r in requests:
            why = self.sampler.admit_error(r)
            if why is not None:
                raise ProtocolError(why)

    async def tokenize(self, texts: list[str], name: str = "text") -> list[tuple[int, ...]]:
        """Tokenise in a worker thread (long text takes a while; other clients keep being
        served), then check each against the context length."""
        ids = await asyncio.to_thread(lambda: [tuple(self.encode(t)) for t in texts])
        for i, x in enumerate(ids):
            if len(x) >= self.sampler.max_len:
                where = name if len(ids) == 1 else f"{name}[{i}]"
                raise ProtocolError(f"{where} is {len(x)} tokens; the context length is "
                                    f"{self.sampler.max_len}")
        return ids


@dataclasses.dataclass(frozen=True)
class Update:
    """One step of a running request: `text` is newly final text; the token lists are
    cumulative. `done` is set on the last update, with `result` cut at a matched stop string."""
    text: str
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[TopLogprobs, ...]
    done: bool = False
    result: GenerateResult | None = None
    final_text: str | None = None     # None without a tokenizer
    matched: str | None = None        # the stop string that ended generation


async def stream_request(st: ServerState, req: GenerateRequest, stop: tuple[str, ...] = (),
                         no_stop_trim: bool = False, client: Any = None) -> AsyncIterator[Update]:
    """`client` keys the sampler's fair queue: the requests of one HTTP call share a turn."""
    match = StopMatcher(st.decode, stop, no_stop_trim) if st.tokenizer is not None else None
    ids: list[int] = []
    lps: list[float] = []
    top: list[TopLogprobs] = []
    async with contextlib.aclosing(st.sampler.stream(req, client)) as deltas:
        async for d in deltas:
            ids += d.output_ids
            lps += d.logprobs
            top += d.top_logprobs
            text = match.feed(d.output_ids) if match is not None else ""
            if match is not None and match.matched is not None:
                k = match.kept_tokens
                cut = GenerateResult(output_ids=tuple(ids[:k]), logprobs=tuple(lps[:k]),
                                     top_logprobs=tuple(top[:k]), finish_reason="stop",
                                     prompt_tokens=len(req.input_ids),
                                     weight_version=d.weight_version, rid=req.rid)
                yield Update(text, cut.output_ids, cut.logprobs, cut.top_logprobs, done=True,
                             result=cut, final_text=match.final_text, matched=match.matched)
                return  # leaving the stream drops the row from its batch
            if d.result is not None:
                text += match.flush() if match is not None else ""
                yield Update(text, tuple(ids), tuple(lps), tuple(top), done=True,
                             result=d.result,
                             final_text=match.final_text if match is not None else None)
                return
            yield Update(text, tuple(ids), tuple(lps), tuple(top))


async def run_request(st: ServerState, req: GenerateRequest, stop: tuple[str, ...] = (),
                      no_stop_trim: bool = False, client: Any = None) -> Update:
    """The final Update of one request (no intermediate text needed)."""
    if not stop:
        res = (await st.sampler.generate([req], client))[0]
        text = st.decode(list(res.output_ids)) if st.tokenizer is not None else None
        return Update("", res.output_ids, res.logprobs, res.top_logprobs, done=True, result=res,
                      final_text=text)
    async for u in stream_request(st, req, stop, no_stop_trim, client):
        if u.done:
            return u
    raise AssertionError("a request's stream ended without a result")
