"""The embedded JAX sampler: concurrent `generate` calls share batched forward passes.

Every coroutine that calls `generate` puts its requests on one asyncio queue; a single batcher
task drains up to `max_batch` of them, pads them into bucketed shapes (so jit compiles once per
bucket, not per call), dispatches `decode.generate_batch` and polls for completion so the event
loop keeps serving other coroutines (HTTP handlers, tools) while the device works.

Params are read at the start of each batch, from the reference or getter given (never copied),
so a trainer's in-place update is seen by the next batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from orchestrax import models
from orchestrax.rollout.base import GenerateRequest, GenerateResult
from orchestrax.rollout.decode import generate_batch


def bucket(n: int, *, lo: int, hi: int) -> int:
    """Smallest power of two >= n (at least `lo`), capped at `hi`."""
    b = lo
    while b < n:
        b *= 2
    return min(b, hi)


@dataclasses.dataclass(eq=False)
class _Pending:
    request: GenerateRequest
    seed: int
    max_new: int                      # max_new_tokens clipped to the context budget
    future: asyncio.Future


class EmbeddedSampler:
    """Sampler protocol over `models.forward_with_cache` on whatever mesh the params live on."""

    def __init__(self, cfg: models.ModelConfig, params_or_getter: Any, *, max_batch: int = 64,
                 max_len: int = 4096, weight_version: str = "0", seed: int = 0,
                 min_bucket: int = 16, gather_s: float = 0.0, poll_s: float = 0.0005):
        if max_batch < 1:
            raise ValueError(f"EmbeddedSampler.max_batch={max_batch}; must be >= 1")
        if max_len < 2:
            raise ValueError(f"EmbeddedSampler.max_len={max_len}; must be >= 2")
        if min_bucket < 1:
            raise ValueError(f"EmbeddedSampler.min_bucket={min_bucket}; must be >= 1")
        self.cfg = cfg
        self.max_batch, self.max_len, self.min_bucket = max_batch, max_len, min_bucket
        self.gather_s, self.poll_s = gather_s, poll_s
        self.weight_version = weight_version
        self._params = None if callable(params_or_getter) else params_or_getter
        self._getter: Callable[[], Any] = (params_or_getter if callable(params_or_getter)
                                           else lambda: self._params)
        self._rng = np.random.default_rng(seed)
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._running: list[_Pending] = []
        self._task: asyncio.Task | None = None
        self.stats = {"batches": 0, "requests": 0, "tokens": 0}

    # --- public API ----------------------------------------------------------------------------
    @property
    def params(self) -> Any:
        return self._getter()

    def set_params(self, params: Any, weight_version: str) -> None:
        """Serve `params` from the next batch on (a batch in flight finishes on the old ones)."""
        self._params = params
        self._getter = lambda: self._params
        self.weight_version = weight_version

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        pendings = [self._admit(r) for r in requests]  # validate all before queueing any
        self._ensure_task()
        for p in pendings:
            self._queue.put_nowait(p)
        return list(await asyncio.gather(*(p.future for p in pendings)))

    def abort(self, rid: str | None = None) -> int:
        """Finish queued and running requests with `rid` (all when None) as 'abort' now; a running
        batch completes on the device but its result for them is dropped. Returns the count."""
        n = 0
        kept: list[_Pending] = []
        while not self._queue.empty():
            kept.append(self._queue.get_nowait())
        for p in kept + self._running:
            if (rid is None or p.request.rid == rid) and not p.future.done():
                p.future.set_result(self._result(p, (), (), "abort"))
                n += 1
        for p in kept:
            if not p.future.done():
                self._queue.put_nowait(p)
        return n

    async def aclose(self) -> None:
        self.abort()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    @property
    def outstanding(self) -> int:
        return self._queue.qsize() + sum(not p.future.done() for p in self._running)

    # --- internals -----------------------------------------------------------------------------
    def _admit(self, r: GenerateRequest) -> _Pending:
        n = len(r.input_ids)
        if n < 1 or n >= self.max_len:
            raise ValueError(f"GenerateRequest.input_ids has {n} tokens; must be in "
                             f"[1, max_len={self.max_len})")
        bad = [t for t in r.input_ids if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"GenerateRequest.input_ids holds {bad[:5]} outside the vocabulary "
                             f"[0, {self.cfg.vocab_size})")
        seed = r.sampling.sampling_seed
        if seed is None:
            seed = int(self._rng.integers(0, 2**31 - 1))
        return _Pending(request=r, seed=seed % (2**32),
                        max_new=min(r.sampling.max_new_tokens, self.max_len - n),
                        future=asyncio.get_running_loop().create_future())

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._batch_loop())

    async def _batch_loop(self) -> None:
        while True:
            first = await self._queue.get()
            if self.gather_s > 0:
                await asyncio.sleep(self.gather_s)
            else:
                await asyncio.sleep(0)  # let coroutines woken together join this batch
            batch = [first]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [p for p in batch if not p.future.done()]
            if not batch:
                continue
            self._running = batch
            try:
                await self._run(batch)
            except Exception as e:  # a device failure fails this batch's callers, not the loop
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
            finally:
                self._running = []

    async def _run(self, batch: list[_Pending]) -> None:
        # At least 8 rows: decode is memory-bound, so padding rows is nearly free and saves
        # compiles.
        rows = bucket(len(batch), lo=min(8, self.max_batch), hi=self.max_batch)
        t = bucket(max(len(p.request.input_ids) for p in batch), lo=self.min_bucket,
                   hi=self.max_len)
        n_new = bucket(max(p.max_new for p in batch), lo=self.min_bucket, hi=self.max_len)
        n_stop = bucket(max(len(p.request.sampling.stop_token_ids) for p in batch), lo=4,
                        hi=1 << 30)
        prompt = np.zeros((rows, t), np.int32)
        mask = np.zeros((rows, t), np.int32)
        mask[:, -1] = 1  # padding rows see one token so their attention is never empty
        temp = np.zeros((rows,), np.float32)
        top_p = np.ones((rows,), np.float32)
        top_k = np.full((rows,), -1, np.int32)
        seeds = np.zeros((rows,), np.uint32)
        max_new = np.zeros((rows,), np.int32)
        stop = np.full((rows, n_stop), -1, np.int32)
        for i, p in enumerate(batch):
            ids, sp = p.request.input_ids, p.request.sampling
            prompt[i, t - len(ids):] = ids
            mask[i, t - len(ids):] = 1
            temp[i], top_p[i], top_k[i] = sp.temperature, sp.top_p, sp.top_k
            seeds[i], max_new[i] = p.seed, p.max_new
            stop[i, :len(sp.stop_token_ids)] = sp.stop_token_ids
        version = self.weight_version
        out = generate_batch(self.cfg, self._getter(), prompt, mask, temperature_B=temp,
                             top_k_B=top_k, top_p_B=top_p, seeds_B=seeds, max_new_B=max_new,
                             stop_ids_BS=stop, max_new=n_new)
        # Dispatch is asynchronous: poll instead of blocking so the event loop stays live.
        while not all(x.is_ready() for x in jax.tree.leaves(out)):
            await asyncio.sleep(self.poll_s)
        tokens, logprobs, length, stopped = jax.device_get(tuple(out))
        self.stats["batches"] += 1
        for i, p in enumerate(batch):
            n = int(length[i])
            self.stats["requests"] += 1
            self.stats["tokens"] += n
            if not p.future.done():
                p.future.set_result(self._result(
                    p, tuple(int(x) for x in tokens[i, :n]),
                    tuple(float(x) for x in logprobs[i, :n]),
                    "stop" if stopped[i] else "length", version))

    def _result(self, p: _Pending, ids: tuple[int, ...], logprobs: tuple[float, ...],
                reason: str, version: str | None = None) -> GenerateResult:
        return GenerateResult(output_ids=ids, logprobs=logprobs, finish_reason=reason,
                              prompt_tokens=len(p.request.input_ids),
                              weight_version=self.weight_version if version is None else version,
                              rid=p.request.rid)
