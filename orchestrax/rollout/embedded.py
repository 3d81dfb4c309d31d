"""The embedded JAX samplers: concurrent `generate` calls share batched forward passes.

Two batchers behind one interface (`generate`, `stream`, `abort`, `set_params`), picked by
`engine` in `make_embedded_sampler`: "static" (`EmbeddedSampler`, below) and "continuous"
(`ContinuousSampler`, at the end of this file, over `rollout.engine.ContinuousEngine`).

Every coroutine that calls `generate` (or `stream`) puts its requests on one asyncio queue; a
single batcher task drains up to `max_batch` of them, pads them into bucketed shapes (so jit
compiles once per bucket, not per call), runs the prefill and then decode chunks of
`chunk_tokens` steps, polling for completion so the event loop keeps serving other coroutines
(HTTP handlers, tools) while the device works. Between chunks, new tokens go to streaming
callers and rows whose caller is gone (cancelled or aborted) stop decoding.

Each request is validated on its own when it is admitted (`admit_error`), so a bad value can
only fail its own caller, never the batch it would have joined. Params are read at the start of
each batch, from the reference or getter given (never copied), so a trainer's in-place update is
seen by the next batch.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from typing import Any, AsyncIterator, Callable, Sequence

import jax
import numpy as np

from orchestrax import models, parallel
from orchestrax.rollout.sampler import (MAX_TOP_LOGPROBS, GenerateRequest, GenerateResult, Sampler,
                                     TopLogprobs)
from orchestrax.rollout.decode import Rows, decode_chunk, prefill
from orchestrax.rollout.engine import ContinuousEngine, bucket
from orchestrax.rollout.fair import FairQueue, StepShare
from orchestrax.rollout.validate import request_ids_error

ENGINES = ("static", "continuous")

log = logging.getLogger(__name__)


class EngineFault(RuntimeError):
    """An engine step failed with no request in it: the fault is the engine's, not a row's."""


@dataclasses.dataclass(frozen=True)
class StreamDelta:
    """Tokens one decode chunk added to a request; `result` is set on the last delta."""
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[TopLogprobs, ...]
    weight_version: str
    result: GenerateResult | None = None


@dataclasses.dataclass(eq=False)
class _Pending:
    request: GenerateRequest
    seed: int
    max_new: int                      # max_new_tokens clipped to the context budget
    future: asyncio.Future
    deltas: asyncio.Queue | None = None   # set for streaming callers
    client: tuple = ()                    # its fair-queue path
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top: list[TopLogprobs] = dataclasses.field(default_factory=list)


class EmbeddedSampler(Sampler):
    """Sampler protocol over `models.forward_with_cache` on whatever mesh the params live on."""

    engine_name = "static"   # its name in ENGINES (`/server_info` reports it)

    def __init__(self, cfg: models.ModelConfig, params_or_getter: Any, *, max_batch: int = 64,
                 max_len: int = 4096, weight_version: str = "0", seed: int = 0,
                 min_bucket: int = 16, gather_s: float = 0.0, poll_s: float = 0.0005,
                 chunk_tokens: int = 64):
        for name, value, lo in (("max_batch", max_batch, 1), ("max_len", max_len, 2),
                                ("min_bucket", min_bucket, 1), ("chunk_tokens", chunk_tokens, 1)):
            if value < lo:
                raise ValueError(f"EmbeddedSampler.{name}={value}; must be >= {lo}")
        self.cfg = cfg
        self.max_batch, self.max_len, self.min_bucket = max_batch, max_len, min_bucket
        self.gather_s, self.poll_s, self.chunk_tokens = gather_s, poll_s, chunk_tokens
        self.weight_version = weight_version
        self._params = None if callable(params_or_getter) else params_or_getter
        self._getter: Callable[[], Any] = (params_or_getter if callable(params_or_getter)
                                           else lambda: self._params)
        self._rng = np.random.default_rng(seed)
        self._queue = FairQueue()   # per client (one per `generate` call unless named)
        self._queued: dict[_Pending, None] = {}   # what the queue holds, in order, for abort
        self._running: list[_Pending] = []
        self._task: asyncio.Task | None = None
        self.stats = {"batches": 0, "requests": 0, "tokens": 0}
        # Cleared by `pause`: no decode chunk or engine step starts until `resume` sets it.
        self.unpaused = asyncio.Event()
        self.unpaused.set()

    # --- public API ----------------------------------------------------------------------------
    @property
    def params(self) -> Any:
        return self._getter()

    def set_params(self, params: Any, weight_version: str) -> None:
        """Serve `params` from the next batch on (a batch in flight finishes on the old ones)."""
        self._params = params
        self._getter = lambda: self._params
        self.weight_version = weight_version

    def drop_params(self) -> None:
        """Free this sampler's weights until the next `set_params` (a trainer's step needs the
        memory; nothing may be generated in between)."""
        self._params = None
        self._getter = lambda: self._params

    async def publish(self, params: Any, version: str) -> None:
        self.set_params(sampler_copy(self.cfg, params), weight_version=version)

    def admit_error(self, r: GenerateRequest) -> str | None:
        """Why this sampler cannot run `r` (naming the field), or None. `generate` raises it as a
        ValueError before anything is queued."""
        error = request_ids_error(r, vocab_size=self.cfg.vocab_size, max_len=self.max_len)
        if error:
            return error
        if r.top_logprobs > MAX_TOP_LOGPROBS:
            return f"top_logprobs={r.top_logprobs}; must be in [0, {MAX_TOP_LOGPROBS}]"
        return None

    async def generate(self, requests: Sequence[GenerateRequest], client: Any = None
                       ) -> list[GenerateResult]:
        """`client` keys the fair queue (requests of one client share its turn); None: this
        call is a client of its own."""
        pendings = [self._admit(r) for r in requests]  # validate all before queueing any
        self._enqueue(pendings, client)
        try:
            return list(await asyncio.gather(*(p.future for p in pendings)))
        finally:  # cancelled (the caller left): rows still queued or running are dropped
            for p in pendings:
                p.future.cancel()

    async def stream(self, request: GenerateRequest, client: Any = None
                     ) -> AsyncIterator[StreamDelta]:
        """Deltas of one request as its decode chunks finish; the last carries the result.
        Closing the iterator early drops the request from its batch."""
        p = self._admit(request, stream=True)
        self._enqueue([p], client)
        try:
            while True:
                delta = await p.deltas.get()
                if delta is None:  # the batch failed
                    raise p.future.exception()
                yield delta
                if delta.result is not None:
                    return
        finally:
            p.future.cancel()

    def pause(self) -> None:
        """Hold every request where it is (queued, or between decode chunks / engine steps)."""
        self.unpaused.clear()

    def resume(self) -> None:
        self.unpaused.set()

    def release_cache(self) -> None:
        """Free the KV cache kept between requests while idle (this batcher keeps none)."""

    def abort(self, rid: str | None = None) -> int:
        """Finish queued and running requests with `rid` (all when None) as 'abort' now; running
        rows stop decoding at the end of the current chunk. Returns the count."""
        n = 0
        for p in self._pending():
            if (rid is None or p.request.rid == rid) and not p.future.done():
                self._finish(p, "abort")
                n += 1
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
        return sum(not p.future.done() for p in self._pending())

    # --- internals -----------------------------------------------------------------------------
    def _pending(self) -> list[_Pending]:
        return [*self._queued, *self._running]

    def _admit(self, r: GenerateRequest, stream: bool = False) -> _Pending:
        why = self.admit_error(r)
        if why is not None:
            raise ValueError(why)
        seed = r.sampling.sampling_seed
        if seed is None:
            seed = int(self._rng.integers(0, 2**31 - 1))
        return _Pending(request=r, seed=seed % (2**32),
                        max_new=min(r.sampling.max_new_tokens, self.max_len - len(r.input_ids)),
                        future=asyncio.get_running_loop().create_future(),
                        deltas=asyncio.Queue() if stream else None)

    def _enqueue(self, pendings: list[_Pending], client: Any = None) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._batch_loop())
        client = object() if client is None else client
        for p in pendings:
            p.client = client if isinstance(client, tuple) else (client,)
            self._queue.put_nowait(p, client, len(p.request.input_ids) + p.max_new)
            self._queued[p] = None

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
            for p in batch:
                del self._queued[p]
            batch = [p for p in batch if not p.future.done() and self._prepared(p)]
            if not batch:
                continue
            self._running = batch
            try:
                await self._run(batch)
            except Exception as e:  # a device failure fails this batch's callers, not the loop
                await self._isolate(batch, e)
            finally:
                self._running = []

    def _prepared(self, p: _Pending) -> bool:
        """Whether `p`'s row values fit the device arrays; if not, `p` fails alone."""
        try:
            self._rows([p], 1)
        except Exception as e:
            self._finish(p, error=e)
            return False
        return True

    async def _isolate(self, batch: list[_Pending], error: Exception) -> None:
        """A failed batch cannot say which row failed it: rerun each request alone, so only one
        that fails by itself fails its caller. A stream that already got tokens fails (its
        rerun would send them twice)."""
        for p in batch:
            if p.future.done():
                continue
            if len(batch) == 1 or (p.ids and p.deltas is not None):
                self._finish(p, error=error)
                continue
            p.ids, p.logprobs, p.top = [], [], []
            self._running = [p]
            try:
                await self._run([p])
            except Exception as e:
                self._finish(p, error=e)

    def _rows(self, batch: list[_Pending], rows: int) -> Rows:
        n_stop = bucket(max(len(p.request.sampling.stop_token_ids) for p in batch), lo=4,
                        hi=1 << 30)
        temp = np.zeros((rows,), np.float32)
        top_p = np.ones((rows,), np.float32)
        top_k = np.full((rows,), -1, np.int32)
        seeds = np.zeros((rows,), np.uint32)
        max_new = np.zeros((rows,), np.int32)
        stop = np.full((rows, n_stop), -1, np.int32)
        presence = np.zeros((rows,), np.float32)
        frequency = np.zeros((rows,), np.float32)
        for i, p in enumerate(batch):
            sp = p.request.sampling
            temp[i], top_p[i], top_k[i] = sp.temperature, sp.top_p, sp.top_k
            seeds[i], max_new[i] = p.seed, p.max_new
            stop[i, :len(sp.stop_token_ids)] = sp.stop_token_ids
            presence[i], frequency[i] = sp.presence_penalty, sp.frequency_penalty
        return Rows(temperature_B=temp, top_k_B=top_k, top_p_B=top_p, seeds_B=seeds,
                    max_new_B=max_new, stop_ids_BS=stop, presence_B=presence,
                    frequency_B=frequency)

    async def _ready(self, tree: Any) -> Any:
        # Dispatch is asynchronous: poll instead of blocking so the event loop stays live.
        while not all(x.is_ready() for x in jax.tree.leaves(tree)):
            await asyncio.sleep(self.poll_s)
        return jax.device_get(tree)

    async def _run(self, batch: list[_Pending]) -> None:
        # At least 8 rows: decode is memory-bound, so padding rows is nearly free and saves
        # compiles.
        n_rows = bucket(len(batch), lo=min(8, self.max_batch), hi=self.max_batch)
        t = bucket(max(len(p.request.input_ids) for p in batch), lo=self.min_bucket,
                   hi=self.max_len)
        n_new = bucket(max(p.max_new for p in batch), lo=self.min_bucket, hi=self.max_len)
        want_top = max(p.request.top_logprobs for p in batch)
        n_top = bucket(want_top, lo=4, hi=MAX_TOP_LOGPROBS) if want_top else 0
        penalize = any(p.request.sampling.presence_penalty or p.request.sampling.frequency_penalty
                       for p in batch)
        prompt = np.zeros((n_rows, t), np.int32)
        mask = np.zeros((n_rows, t), np.int32)
        mask[:, -1] = 1  # padding rows see one token so their attention is never empty
        for i, p in enumerate(batch):
            ids = p.request.input_ids
            prompt[i, t - len(ids):] = ids
            mask[i, t - len(ids):] = 1
        rows = self._rows(batch, n_rows)
        version, params = self.weight_version, self._getter()
        static = dict(n_top=n_top, penalize=penalize)
        state = prefill(self.cfg, params, prompt, mask, rows, total_len=t + n_new, **static)
        keep = np.zeros((n_rows,), bool)
        while True:
            await self.unpaused.wait()
            keep[:len(batch)] = [not p.future.done() for p in batch]
            state, chunk = decode_chunk(self.cfg, params, state, rows, keep,
                                        chunk=self.chunk_tokens, **static)
            before = [len(p.ids) for p in batch]
            chunk, length, done, stopped = await self._ready(
                (chunk, state.length_B, state.done_B, state.stopped_B))
            for i, p in enumerate(batch):
                k = int(length[i]) - before[i]
                if k <= 0 or p.future.done():
                    continue
                delta = StreamDelta(
                    output_ids=tuple(int(x) for x in chunk.tokens_BC[i, :k]),
                    logprobs=tuple(float(x) for x in chunk.logprobs_BC[i, :k]),
                    top_logprobs=tuple(
                        tuple(zip(map(int, chunk.top_ids_BCK[i, j, :p.request.top_logprobs]),
                                  map(float, chunk.top_lp_BCK[i, j, :p.request.top_logprobs])))
                        for j in range(k)) if p.request.top_logprobs else (),
                    weight_version=version)
                p.ids += delta.output_ids
                p.logprobs += delta.logprobs
                p.top += delta.top_logprobs
                if bool(done[i]):
                    self._finish(p, "stop" if stopped[i] else "length", version, delta)
                elif p.deltas is not None:
                    p.deltas.put_nowait(delta)
            if all(done[:len(batch)]):
                break
        self.stats["batches"] += 1
        self.stats["requests"] += len(batch)
        self.stats["tokens"] += int(length[:len(batch)].sum())

    def _finish(self, p: _Pending, reason: str = "abort", version: str | None = None,
                delta: StreamDelta | None = None, error: Exception | None = None) -> None:
        if p.future.done():
            return
        if error is not None:
            p.future.set_exception(error)
            p.future.exception()  # a caller that left never retrieves it: mark it seen
            if p.deltas is not None:
                p.deltas.put_nowait(None)
            return
        result = GenerateResult(output_ids=tuple(p.ids), logprobs=tuple(p.logprobs),
                                top_logprobs=tuple(p.top), finish_reason=reason,
                                prompt_tokens=len(p.request.input_ids),
                                weight_version=self.weight_version if version is None else version,
                                rid=p.request.rid)
        p.future.set_result(result)
        if p.deltas is not None:
            d = delta or StreamDelta((), (), (), result.weight_version)
            p.deltas.put_nowait(dataclasses.replace(d, result=result))


class ContinuousSampler(EmbeddedSampler):
    """`EmbeddedSampler`'s interface over a `ContinuousEngine`: a request joins the running
    batch at the next engine step (one prefill chunk plus `decode_steps` decode steps) instead
    of waiting for the whole batch to finish, and leaves it as soon as it is done.

    Params are read before every engine step, so `set_params` (the trainer's push, or the
    server's `update_weights_from_disk`) applies from the next step on, also to rows in flight;
    a result reports the weight version it finished under. A caller that leaves (cancelled,
    aborted, a stop string matched) frees its slot before the next step. A request that fails
    in the engine fails alone: the engine drops its row (`ContinuousEngine.failures`), and a
    step that fails as a whole is rerun in halves until the failing request runs by itself
    (`_split_failed_step`). The last `reserve_slots` free slots are kept for clients that
    hold none (`_join_fairly`), so another client's request starts at the next step however
    long the first one's rows run; a client alone leaves that many slots idle. A peer that
    opens a new call per request takes the reserve like any new client (the fair queue's order
    among peers still holds). Clients whose rows need different cache spans take turns
    (`fair.StepShare`): a step runs the rows of the client that got the least work so far and
    of those that fit in its span, so a small request beside a giant call's long rows runs at
    its own span instead of theirs. The slot cache stays
    allocated while idle, so an episode's next turn finds its prefix there (the engine's
    prefix cache); `drop_params` frees it with the weights (the trainer's step needs both).
    """

    engine_name = "continuous"

    def __init__(self, cfg: models.ModelConfig, params_or_getter: Any, *, max_batch: int = 64,
                 max_len: int = 4096, weight_version: str = "0", seed: int = 0,
                 prefill_chunk: int = 512, decode_steps: int = 8, min_chunk: int = 16,
                 top_logprobs: int = MAX_TOP_LOGPROBS, prefix_cache: bool = True,
                 reserve_slots: int = 1, dispatch_reads: int | None = None):
        if reserve_slots < 0:
            raise ValueError(f"ContinuousSampler.reserve_slots={reserve_slots}; must be >= 0")
        super().__init__(cfg, params_or_getter, max_batch=max_batch, max_len=max_len,
                         weight_version=weight_version, seed=seed, min_bucket=min_chunk,
                         chunk_tokens=decode_steps)
        # params=None: the loop hands the engine the current params before every step.
        self.engine = ContinuousEngine(
            cfg, None, max_batch=max_batch, max_len=max_len,
            prefill_chunk=min(prefill_chunk, max_len), decode_steps=decode_steps,
            top_logprobs=top_logprobs, min_chunk=min_chunk, prefix_cache=prefix_cache,
            dispatch_reads=dispatch_reads)
        self._live: dict[str, _Pending] = {}    # engine rid -> caller, for rows in the engine
        # Free slots only a client that holds none may take (`_join_fairly`).
        self.reserve_slots = min(reserve_slots, max_batch - 1)
        self._next_key = 0
        # (engine rid, ids, logprobs, top, result) recorded by the engine's hook during a step
        self._events: list[tuple] = []
        self._reported: dict[str, int] = {}
        # Groups of a failed step's requests still to run on their own (`_split_failed_step`),
        # and whether the group in the engine now is one of them.
        self._rerun: list[list[_Pending]] = []
        self._rerunning = False
        self._share = StepShare()
        # held_steps: steps that left some client's rows waiting (`_hold`)
        # faults: failed steps that failed with no request in the engine too
        self.stats = {"steps": 0, "requests": 0, "tokens": 0, "reruns": 0, "held_steps": 0,
                      "faults": 0}

    def admit_error(self, r: GenerateRequest) -> str | None:
        return self.engine.admit_error(r)

    def drop_params(self) -> None:
        super().drop_params()
        if not self.engine.busy:   # nothing is generated until the next set_params
            self.engine.release()

    def release_cache(self) -> None:
        if not self.engine.busy:
            self.engine.release()

    def take_counters(self) -> dict[str, int]:
        """Prompt tokens prefilled and reused from the prefix cache since the previous call."""
        out = {k: self.engine.stats[k] - self._reported.get(k, 0)
               for k in ("prefill_tokens", "cached_tokens")}
        self._reported = {k: self.engine.stats[k] for k in out}
        return out

    def _pending(self) -> list[_Pending]:
        return [*self._queued, *self._live.values(), *(p for g in self._rerun for p in g)]

    def _join(self, p: _Pending) -> None:
        del self._queued[p]
        self._submit(p)

    def _submit(self, p: _Pending) -> None:
        if p.future.done():
            return
        # Engine rids are ours: copies of one request (n > 1) may share the caller's rid.
        key = str(self._next_key)
        self._next_key += 1
        try:
            sp = dataclasses.replace(p.request.sampling, sampling_seed=p.seed)
            self.engine.submit(dataclasses.replace(p.request, rid=key, sampling=sp),
                               on_tokens=lambda *event: self._events.append(event))
        except Exception as e:  # this request alone: the loop goes on with the others
            self._finish(p, error=e)
            return
        self._live[key] = p

    async def _batch_loop(self) -> None:
        while True:
            if not self._live:
                self._rerunning = bool(self._rerun)
                if self._rerun:   # a group of a failed step's requests runs on its own
                    self.stats["reruns"] += 1
                    for p in self._rerun.pop():
                        self._submit(p)
                else:
                    self._join(await self._queue.get())
            for key in [k for k, p in self._live.items() if p.future.done()]:
                self.engine.abort(key)   # the caller left: free its slot before this step
                del self._live[key]
            if not self._rerunning:   # none join a rerun group (they would share its fate)
                self._join_fairly()
            self._events.clear()
            if self._live:
                await self.unpaused.wait()
                await self._step()

    def _join_fairly(self) -> None:
        """Only as many join as can start: the rest wait in the fair queue, where a later
        client's small request can still pass a giant call's backlog. The last
        `reserve_slots` free slots go only to a client (a whole fair-queue path) that holds
        none, so a new client's request starts at the next step instead of waiting for a
        giant call's rows to finish."""
        held = collections.Counter(p.client for p in self._live.values())
        while self.engine.room > 0:
            room = self.engine.room
            p = self._queue.take(lambda path: room > self.reserve_slots or not held[path])
            if p is None:
                return
            self._join(p)
            held[p.client] += 1

    def _hold(self) -> set[str]:
        """Engine rids whose rows wait this step: those of clients `StepShare` does not run
        (clients are whole fair-queue paths, as in `_join_fairly`)."""
        spans: dict[tuple, int] = {}
        for key, span in self.engine.spans().items():
            if key in self._live:
                client = self._live[key].client
                spans[client] = max(spans.get(client, 0), span)
        run = self._share.choose(spans, self.engine.steps_at) if spans else set()
        return {key for key, p in self._live.items() if p.client not in run}

    async def _step(self) -> None:
        eng = self.engine
        try:
            eng.params, eng.weight_version = self._getter(), self.weight_version
            hold = self._hold()
            self.stats["held_steps"] += bool(hold)
            # The step blocks on the device; a worker thread keeps the event loop serving.
            # Only this loop touches the engine, and only between awaits of this call.
            await asyncio.to_thread(eng.step, hold)
        except Exception as e:  # the shared dispatch failed: nobody knows whose row did it
            await self._split_failed_step(e)
            return
        self.stats["steps"] += 1
        for key, e in eng.failures:   # requests the engine dropped; the others went on
            p = self._live.pop(key, None)
            if p is not None:
                self._finish(p, error=e)
        for key, ids, lps, top, result in self._events:
            p = self._live.get(key)
            if p is None or p.future.done():
                continue
            p.ids += ids
            p.logprobs += lps
            p.top += top
            self.stats["tokens"] += len(ids)
            delta = StreamDelta(ids, lps, top, eng.weight_version)
            if result is None:
                if p.deltas is not None:
                    p.deltas.put_nowait(delta)
                continue
            del self._live[key]
            self.stats["requests"] += 1
            self._finish(p, result.finish_reason, result.weight_version, delta)


    async def _split_failed_step(self, error: Exception) -> None:
        """A failed engine step cannot say which row failed it. Its requests leave the engine
        (its cache, perhaps donated and lost, is freed) and run again in two halves, each on
        its own, halving again on failure: only a request whose step fails with it alone fails
        its caller, after about 2 log2(rows) reruns. Seeds are fixed per request, so a rerun
        samples the same tokens. A stream that already got tokens fails (its rerun would send
        them twice).

        First the step (the hold choice and the engine's step) is tried once with no request in
        the engine: when that fails too, the
        fault is nobody's row (a broken engine or a wrapper of it): every request of the step
        fails at once with `EngineFault` naming the error, logged once, no rerun, and the
        loop goes on serving (each later step meets the same test, so a fault that lasts
        fails each later request within two steps; one that clears serves them again)."""
        eng, live = self.engine, list(self._live.values())
        for key in self._live:
            eng.abort(key)
        self._live.clear()
        if not eng.busy:
            eng.release()
        try:
            self._hold()
            await asyncio.to_thread(eng.step, ())
        except Exception as probe:
            fault = EngineFault(f"the engine's step fails with no request in it: "
                                f"{type(probe).__name__}: {probe}")
            log.error("%s (failing the %d requests of the step)", fault, len(live))
            self.stats["faults"] += 1
            for p in live:
                self._finish(p, error=fault)
            return
        again = []
        for p in live:
            if p.future.done():
                continue
            if len(live) == 1 or (p.ids and p.deltas is not None):
                self._finish(p, error=error)
            else:
                p.ids, p.logprobs, p.top = [], [], []
                again.append(p)
        half = (len(again) + 1) // 2
        self._rerun += [g for g in (again[half:], again[:half]) if g]


def sampler_copy(cfg: models.ModelConfig, params: Any) -> Any:
    """The sampler's own copy of a trainer's `params`, in the forward's dtypes
    (`models.compute_copy`: the same tokens and logprobs as the fp32 masters, half their memory
    under bf16 compute). Multi-process: training params span every process's devices and a
    sampler runs on its own process alone, so they are gathered (a collective: every process
    calls this at the same point) onto this process's devices."""
    params = models.compute_copy(cfg, params)
    if jax.process_count() == 1:
        return params
    from jax.experimental import multihost_utils
    host = multihost_utils.process_allgather(params, tiled=True)
    local = parallel.make_mesh(parallel.MeshConfig(), jax.local_devices())
    return jax.device_put(host, models.param_shardings(cfg, local))


def make_embedded_sampler(engine: str, cfg: models.ModelConfig, params_or_getter: Any, *,
                          max_batch: int, max_len: int, seed: int = 0,
                          weight_version: str = "0",
                          dispatch_reads: int | None = None) -> EmbeddedSampler:
    """The embedded sampler `engine` names ("static" or "continuous"), with defaults for the
    rest (`dispatch_reads`: the continuous engine's, ignored by the static batcher)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}; allowed: {ENGINES}")
    kind, own = ((ContinuousSampler, {"dispatch_reads": dispatch_reads})
                 if engine == "continuous" else (EmbeddedSampler, {}))
    return kind(cfg, params_or_getter, max_batch=max_batch, max_len=max_len, seed=seed,
                weight_version=weight_version, **own)
