"""The embedded JAX sampler: concurrent `generate` calls share the forward passes of one
continuously batching engine (`rollout.engine.ContinuousEngine`).

Every coroutine that calls `generate` (or `stream`) puts its requests on one fair queue; a
single loop task moves them into the engine's free slots and runs engine steps (one prefill
chunk plus `decode_steps` decode steps) in a worker thread, so the event loop keeps serving
other coroutines (HTTP handlers, tools) while the device works. After each step, new tokens go
to streaming callers, and rows whose caller is gone (cancelled or aborted) leave the engine.

Each request is validated on its own when it is admitted (`admit_error`), so a bad value can
only fail its own caller, never the step it would have joined. Params are read before each
step, from the reference or getter given (never copied), so a trainer's in-place update is
seen by the next step.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
from typing import Any, AsyncIterator, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orchestrax import models, parallel
from orchestrax.rollout.sampler import (MAX_TOP_LOGPROBS, GenerateRequest, GenerateResult, Sampler,
                                     SamplingParams, TopLogprobs)
from orchestrax.rollout.engine import (ContinuousEngine, cache_split_shortfall, check_state_fits,
                                       device_memory_limit, needs_filtering, params_mesh)
from orchestrax.rollout.fair import FairQueue, StepShare

log = logging.getLogger(__name__)


class EngineFault(RuntimeError):
    """An engine step failed with no request in it: the fault is the engine's, not a row's."""


@dataclasses.dataclass(frozen=True)
class StreamDelta:
    """Tokens one engine step added to a request; `result` is set on the last delta."""
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


class ContinuousSampler(Sampler):
    """The `Sampler` interface (`generate`, `stream`, `abort`, `set_params`) over a
    `ContinuousEngine`: a request joins the running batch at the next engine step (one prefill
    chunk plus `decode_steps` decode steps) and leaves it as soon as it is done.

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

    def __init__(self, cfg: models.ModelConfig, params_or_getter: Any, *, max_batch: int = 64,
                 max_len: int = 4096, weight_version: str = "0", seed: int = 0,
                 prefill_chunk: int = 512, decode_steps: int = 8, min_chunk: int = 16,
                 top_logprobs: int = MAX_TOP_LOGPROBS, prefix_cache: bool = True,
                 reserve_slots: int = 1, dispatch_reads: int | None = None,
                 prefill_rows: int = 8):
        for name, value, lo in (("max_batch", max_batch, 1), ("max_len", max_len, 2),
                                ("reserve_slots", reserve_slots, 0)):
            if value < lo:
                raise ValueError(f"ContinuousSampler.{name}={value}; must be >= {lo}")
        self.cfg = cfg
        self.max_batch, self.max_len = max_batch, max_len
        self.weight_version = weight_version
        self._params = None if callable(params_or_getter) else params_or_getter
        self._getter: Callable[[], Any] = (params_or_getter if callable(params_or_getter)
                                           else lambda: self._params)
        self._rng = np.random.default_rng(seed)
        self._queue = FairQueue()   # per client (one per `generate` call unless named)
        self._queued: dict[_Pending, None] = {}   # what the queue holds, in order, for abort
        self._task: asyncio.Task | None = None
        # Cleared by `pause`: no engine step starts until `resume` sets it.
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        # A cache the device cannot hold is refused now, naming its sizes (here, where the
        # params and so the mesh are known: the engine gets them before every step).
        # Several processes: the weights it is built with span them all; those it will sample
        # with are gathered onto this process's devices, not counted here.
        mesh = sampler_mesh(self._params)
        check_state_fits(cfg, max_batch, max_len, mesh,
                         self._params if jax.process_count() == 1 else None,
                         device_memory_limit(mesh))
        shortfall = cache_split_shortfall(cfg, max_batch, max_len, mesh)
        if shortfall:
            log.warning(shortfall)
        self.engine = ContinuousEngine(
            cfg, None, max_batch=max_batch, max_len=max_len,
            prefill_chunk=min(prefill_chunk, max_len), decode_steps=decode_steps,
            top_logprobs=top_logprobs, min_chunk=min_chunk, prefix_cache=prefix_cache,
            dispatch_reads=dispatch_reads, prefill_rows=prefill_rows)
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

    # --- public API ----------------------------------------------------------------------------
    @property
    def params(self) -> Any:
        return self._getter()

    def set_params(self, params: Any, weight_version: str) -> None:
        """Serve `params` from the next engine step on, rows in flight included."""
        self._params = params
        self._getter = lambda: self._params
        self.weight_version = weight_version

    async def publish(self, params: Any, version: str) -> None:
        self.set_params(sampler_copy(self.cfg, params), weight_version=version)

    def admit_error(self, r: GenerateRequest) -> str | None:
        return self.engine.admit_error(r)

    def drop_params(self) -> None:
        """Free this sampler's weights, and its slot cache when idle, until the next
        `set_params` (a trainer's step needs the memory; nothing may be generated in between)."""
        self._params = None
        self._getter = lambda: self._params
        if not self.engine.busy:
            self.engine.drop_params()
            self.engine.release()

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
        """Deltas of one request as its engine steps finish; the last carries the result.
        Closing the iterator early drops the request from the engine."""
        p = self._admit(request, stream=True)
        self._enqueue([p], client)
        try:
            while True:
                delta = await p.deltas.get()
                if delta is None:  # the request failed
                    raise p.future.exception()
                yield delta
                if delta.result is not None:
                    return
        finally:
            p.future.cancel()

    def pause(self) -> None:
        """Hold every request where it is (queued, or between engine steps)."""
        self.unpaused.clear()

    def resume(self) -> None:
        self.unpaused.set()

    def release_cache(self) -> None:
        """Free the slot cache kept between requests (the prefix cache), if idle."""
        if not self.engine.busy:
            self.engine.release()

    def abort(self, rid: str | None = None) -> int:
        """Finish queued and running requests with `rid` (all when None) as 'abort' now; running
        rows leave the engine before its next step. Returns the count."""
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

    def warm(self, sampling: Sequence[SamplingParams] | None = None) -> int:
        """Compile every program the engine can dispatch for requests sampled with `sampling`
        (None: any settings, so with and without the top-k/top-p filter) on the current
        params, before the first request; logs how many and how long."""
        eng = self.engine
        if sampling is None:
            filtering = (False, True)
        else:
            filtering = sorted({needs_filtering([p], self.cfg.vocab_size) for p in sampling})
        eng.params, eng.weight_version = self._getter(), self.weight_version
        start = time.perf_counter()
        n = eng.warm(filtering)
        log.info("warmed %d engine programs (max_batch=%d, max_len=%d) in %.1f s", n,
                 self.max_batch, self.max_len, time.perf_counter() - start)
        return n

    def take_counters(self) -> dict[str, int]:
        """Prompt tokens prefilled and reused from the prefix cache since the previous call."""
        out = {k: self.engine.stats[k] - self._reported.get(k, 0)
               for k in ("prefill_tokens", "cached_tokens")}
        self._reported = {k: self.engine.stats[k] for k in out}
        return out

    # --- internals -----------------------------------------------------------------------------
    def _pending(self) -> list[_Pending]:
        return [*self._queued, *self._live.values(), *(p for g in self._rerun for p in g)]

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


def sampler_copy(cfg: models.ModelConfig, params: Any) -> Any:
    """The sampler's own copy of a trainer's `params`, in the forward's dtypes
    (`models.compute_copy`: the same tokens and logprobs as the fp32 masters, half their memory
    under bf16 compute), its layers unstacked (`models.unstack_layers`: a decode step then
    copies no layer's weights out of a stacked array). Multi-process: training params span
    every process's devices and a sampler runs on its own process alone, so they are gathered
    (a collective: every process calls this at the same point) onto this process's devices."""
    if jax.process_count() == 1:
        return _unstacked_copy(cfg, params)
    from jax.experimental import multihost_utils
    host = multihost_utils.process_allgather(models.compute_copy(cfg, params), tiled=True)
    shardings = models.param_shardings(cfg, sampler_mesh(params))
    layer = jax.tree.map(lambda s: NamedSharding(s.mesh, PartitionSpec(*s.spec[1:])),
                         shardings["layers"])
    # Unstacked on the host (numpy views), so the devices never hold both layouts.
    return jax.device_put(models.unstack_layers(host),
                          {**shardings, "layers": (layer,) * cfg.num_layers})


@functools.partial(jax.jit, static_argnums=0)
def _unstacked_copy(cfg: models.ModelConfig, params: Any) -> Any:
    return models.unstack_layers(models.compute_copy(cfg, params))


# A loaded model's params (serve, eval) in the layout the sampler reads them fastest, dtypes
# kept: layers unstacked (`models.unstack_layers`), so a decode step reads each layer's weights
# where they lie instead of copying them out of stacked arrays. Both layouts are alive for a
# moment while it runs.
sampler_layout = jax.jit(models.unstack_layers)


def sampler_mesh(params: Any) -> Mesh | None:
    """The mesh this process's sampler runs on: the params' own, or, with several processes,
    this process's devices alone (where `sampler_copy` gathers the trainer's params)."""
    if jax.process_count() == 1:
        return params_mesh(params)
    return parallel.make_mesh(parallel.MeshConfig(), jax.local_devices())


def make_embedded_sampler(cfg: models.ModelConfig, params_or_getter: Any, *, max_batch: int,
                          max_len: int, seed: int = 0, weight_version: str = "0",
                          dispatch_reads: int | None = None) -> ContinuousSampler:
    """The embedded sampler, with the engine's defaults for the rest."""
    return ContinuousSampler(cfg, params_or_getter, max_batch=max_batch, max_len=max_len,
                             seed=seed, weight_version=weight_version,
                             dispatch_reads=dispatch_reads)
