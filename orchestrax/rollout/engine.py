"""A continuously batching sampler engine over a slot KV cache.

Letters: R slots (rows of the running batch), S cache positions per slot, C prefill chunk,
N decode steps per dispatch, K top logprobs, V vocabulary, L layers, H head dim.

The engine owns `max_batch` slots. Each slot is one row of a KV cache (an [R, K, S, H] buffer
per layer, models/slots.py) with its own write index and valid mask, so rows of very different
lengths share one decode step:
- a queued request takes a free slot between decode steps; its prompt is prefilled into that
  slot in chunks of at most `prefill_chunk` tokens, one chunk per engine step, so a long prompt
  does not stall the rows that are decoding; short chunks of several slots (the next turns of
  episodes, short prompts) share a dispatch, up to `prefill_rows` to it, so they read the
  weights once (`BATCHED_PREFILL_TOKENS`);
- a row that stops (stop id, token budget, abort) frees its slot at the end of that step and
  the next queued request takes it; no row waits for the longest row of its batch.

Why slots rather than paged blocks: a slot row is one dynamic-index update per step and needs
no block table or gather kernel, and the per-row valid mask already confines attention to the
row's filled positions. Its cost is memory: every slot reserves `max_len` positions. Paged
blocks would share that memory between short and long rows; left for when memory, not
bandwidth, is what limits the slot count.

The model's blocks run under `models.forward_slots`: each row writes at its own index and
positions continue from its own count of real tokens. Exactly two jitted functions run:
`_prefill` (one compile per chunk-size bucket, and again for several rows at the batched
sizes) and `_decode` (one compile per S bucket:
it reads and writes only the first `span` positions of every slot, the smallest power-of-two
bucket that holds the longest occupied row), asserted by tests with `chex.assert_max_traces`;
each twice at most, with and without the top-k/top-p sort, as the host knows from the rows
it dispatches (`filtering`).

On several devices the state lives on the params' mesh (`state_shardings`): the cache's kv
heads split over the axes that split the params, slots and everything else whole. Each device
then attends over its own heads of every slot, a prefill's slot writes stay on the devices
that hold them, and a step exchanges only activations (no collective moves cache; the tests and
bench/gpu_compile.py read this from the compiled HLO).

Sampling is `rollout.sampling.sample_step` (temperature, top-k, top-p, penalties), given one
step index per row: the draw for a row's j-th output token uses key fold_in(key(seed), j), j
counted per row, so a request's tokens do not depend on when it joined or who shares its steps.
Logprobs are log_softmax(logits / T) over the full vocabulary at the chosen id; greedy rows
report T = 1.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Callable, Collection, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from orchestrax import models, parallel
from orchestrax.rollout.sampler import (MAX_TOP_LOGPROBS, GenerateRequest, GenerateResult,
                                     SamplingParams, TopLogprobs)
from orchestrax.rollout.sampling import filters, sample_step
from orchestrax.rollout.validate import request_ids_error

MAX_STOP_IDS = 64   # stop ids per request (the server's ServeLimits.max_stop)


class SlotState(NamedTuple):
    """Everything on the device, one row per slot; donated to each jitted step."""
    k: tuple[jax.Array, ...]   # L x [R, K, S, H] compute dtype (models.SlotCache)
    v: tuple[jax.Array, ...]
    mask_RS: jax.Array         # bool: position holds a real token of the row
    index_R: jax.Array         # int32: next position to write
    token_R: jax.Array         # int32: last sampled token, recorded, not yet fed to the model
    length_R: jax.Array        # int32: tokens recorded so far (the stop token included)
    live_R: jax.Array          # bool: decoding (prefilled and not finished)
    counts_RV: jax.Array       # int32 generated-token counts, for the penalties
    temperature_R: jax.Array   # float32; 0 = greedy
    top_k_R: jax.Array         # int32; <= 0 = no top-k
    top_p_R: jax.Array         # float32
    seed_R: jax.Array          # uint32
    max_new_R: jax.Array       # int32 token budget
    stop_RX: jax.Array         # int32 stop ids, padded with -1 (X = MAX_STOP_IDS)
    presence_R: jax.Array      # float32
    frequency_R: jax.Array     # float32


class Steps(NamedTuple):
    """What one `_decode` dispatch recorded; entry [r, i] is real where valid_RN[r, i]."""
    tokens_RN: jax.Array
    logprobs_RN: jax.Array
    valid_RN: jax.Array
    stopped_RN: jax.Array      # the token at [r, i] is a stop id
    top_ids_RNK: jax.Array
    top_lp_RNK: jax.Array


def init_state(cfg: models.ModelConfig, slots: int, max_len: int,
               mesh: Mesh | None = None) -> SlotState:
    """A fresh state; on `mesh` (the params' mesh) it is made in place, split as
    `state_shardings` says, so no device ever holds the whole cache."""
    if mesh is not None:
        shardings = state_shardings(cfg, slots, max_len, mesh)
        return jax.jit(init_state, static_argnums=(0, 1, 2), out_shardings=shardings)(
            cfg, slots, max_len)
    cache = models.init_slots(cfg, slots, max_len)
    # Fresh buffers per field: the state is donated, and a buffer may be donated only once.
    zi = lambda: jnp.zeros((slots,), jnp.int32)
    zf = lambda: jnp.zeros((slots,), jnp.float32)
    return SlotState(k=cache.k, v=cache.v, mask_RS=cache.mask_RS, index_R=zi(), token_R=zi(),
                     length_R=zi(), live_R=jnp.zeros((slots,), jnp.bool_),
                     counts_RV=jnp.zeros((slots, cfg.vocab_size), jnp.int32),
                     temperature_R=zf(), top_k_R=zi(), top_p_R=jnp.ones((slots,), jnp.float32),
                     seed_R=jnp.zeros((slots,), jnp.uint32), max_new_R=zi(),
                     stop_RX=jnp.full((slots, MAX_STOP_IDS), -1, jnp.int32), presence_R=zf(),
                     frequency_R=zf())


def state_logical_axes(cfg: models.ModelConfig) -> SlotState:
    """Logical axis names of each SlotState field (parallel/rules.py maps them)."""
    kv = (("cache_slots", "cache_kv_heads", "seq", "head_dim"),) * cfg.num_layers
    row = ("cache_slots",)
    return SlotState(k=kv, v=kv, mask_RS=("cache_slots", "seq"), index_R=row, token_R=row,
                     length_R=row, live_R=row, counts_RV=("cache_slots", None),
                     temperature_R=row, top_k_R=row, top_p_R=row, seed_R=row, max_new_R=row,
                     stop_RX=("cache_slots", None), presence_R=row, frequency_R=row)


def state_shardings(cfg: models.ModelConfig, slots: int, max_len: int,
                    mesh: Mesh) -> SlotState:
    """NamedSharding per SlotState field on the params' `mesh`: the kv heads of the cache split
    over the params' axes where they divide (`parallel.fitted_spec`), the rest whole."""
    shapes = jax.eval_shape(lambda: init_state(cfg, slots, max_len))
    return jax.tree.map(
        lambda x, names: NamedSharding(mesh, parallel.fitted_spec(names, x.shape, mesh)),
        shapes, state_logical_axes(cfg), is_leaf=lambda t: isinstance(t, tuple) and all(
            isinstance(e, (str, type(None))) for e in t))


def state_bytes_per_device(cfg: models.ModelConfig, slots: int, max_len: int,
                           mesh: Mesh | None = None) -> int:
    """Bytes of the slot state one device holds (the whole state without a mesh)."""
    return sum(jax.tree.leaves(_field_bytes(cfg, slots, max_len, mesh)))


def _field_bytes(cfg: models.ModelConfig, slots: int, max_len: int,
                 mesh: Mesh | None) -> SlotState:
    """Bytes of each SlotState leaf on one device (the whole leaf without a mesh)."""
    shapes = jax.eval_shape(lambda: init_state(cfg, slots, max_len))
    if mesh is None:
        return jax.tree.map(lambda x: x.size * x.dtype.itemsize, shapes)
    return jax.tree.map(lambda x, sh: math.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize,
                        shapes, state_shardings(cfg, slots, max_len, mesh))


def check_state_fits(cfg: models.ModelConfig, slots: int, max_len: int, mesh: Mesh | None,
                     params: Any, limit_bytes: int | None) -> None:
    """Raise, naming the sizes that set it, when the slot state plus this device's share of
    `params` exceeds `limit_bytes` (a device's memory; None: unknown, no check). Every slot
    reserves `max_len` positions, so a default left at 64 slots of a 24k context asks ~226 GB
    of KV for an 8B model: better said when the engine is built than as an allocator failure
    at its first request."""
    if limit_bytes is None:
        return
    cache = state_bytes_per_device(cfg, slots, max_len, mesh)
    weights = sum(math.prod(_shard_shape(a)) * a.dtype.itemsize for a in jax.tree.leaves(params))
    if cache + weights > limit_bytes:
        per_slot = cache / slots
        fits = max(0, int((limit_bytes - weights) // per_slot))
        raise ValueError(
            f"ContinuousEngine: max_batch={slots} slots x max_len={max_len} positions need "
            f"{cache / 2**30:.1f} GiB of cache a device beside {weights / 2**30:.1f} GiB of "
            f"weights, over the device's {limit_bytes / 2**30:.1f} GiB; at most {fits} slots "
            f"of {max_len} fit (lower rollout.sampler_max_batch or rollout.context_tokens; "
            "serve: --max-batch or --max-len)")


def cache_split_shortfall(cfg: models.ModelConfig, slots: int, max_len: int,
                          mesh: Mesh | None) -> str | None:
    """One line saying so when the cache's kv heads split over fewer devices than the mesh
    axes that split the params (`fitted_spec` keeps them whole over axes that do not divide
    them: 8 kv heads on a 16-device axis), else None."""
    if mesh is None:
        return None

    def axes(spec):
        return () if spec[0] is None else (spec[0],) if isinstance(spec[0], str) else spec[0]
    wanted = axes(parallel.logical_to_spec(("cache_kv_heads",), mesh=mesh))
    ways = math.prod(mesh.shape[a] for a in wanted)
    # K and V of the whole cache, and of one device's share as `state_shardings` places it.
    kv, mine = (sum(jax.tree.leaves((b.k, b.v))) for b in (
        _field_bytes(cfg, slots, max_len, None), _field_bytes(cfg, slots, max_len, mesh)))
    split = kv // mine
    if split == ways:
        return None
    size = lambda b: f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
    g = math.gcd(cfg.num_kv_heads, ways)
    return (f"slot cache: {cfg.num_kv_heads} kv heads do not divide over mesh axes "
            f"{dict((a, mesh.shape[a]) for a in wanted)}, so its K and V "
            + ("stay whole on every device" if split == 1 else f"split {split} ways, not {ways}")
            + f": {size(mine)} a device instead of {size(kv / ways)} (max_batch={slots} x "
            f"max_len={max_len})" + (f"; tensor={g} x fsdp={ways // g} would split them {g} ways"
                                     if g > split else ""))


def _shard_shape(a: Any) -> tuple[int, ...]:
    sharding = getattr(a, "sharding", None)
    return sharding.shard_shape(a.shape) if sharding is not None else a.shape


def device_memory_limit(mesh: Mesh | None) -> int | None:
    """A device's memory in bytes as its runtime reports it (None on CPU, which does not)."""
    mine = jax.local_devices()
    device = (next((d for d in mesh.devices.flat if d in mine), mine[0]) if mesh is not None
              else mine[0])
    stats = device.memory_stats() or {}   # only this process's devices answer
    return stats.get("bytes_limit")


def needs_filtering(sampling: Sequence[SamplingParams], vocab_size: int) -> bool:
    """Whether a dispatch sampling rows with these settings needs the top-k/top-p sort (a
    static choice: at most two programs per shape, and no host read of a device predicate
    per step)."""
    return bool(filters(np.asarray([p.top_k for p in sampling]),
                        np.asarray([p.top_p for p in sampling]), vocab_size).any())


def params_mesh(params: Any) -> Mesh | None:
    """The mesh the params are placed on (None: on one device, not placed by mesh, or no
    params yet: a server's engine gets its weights later)."""
    leaves = jax.tree.leaves(params)
    sharding = getattr(leaves[0], "sharding", None) if leaves else None
    return sharding.mesh if isinstance(sharding, NamedSharding) else None


# --- device functions -------------------------------------------------------------------------
def _cache(s: SlotState) -> models.SlotCache:
    return models.SlotCache(s.k, s.v, s.mask_RS)


def _sample(logits_RV, s: SlotState, step_R, n_top: int, filtering: bool):
    """Per-row sampling at per-row step indices -> (token, logprob, top ids, top logprobs)."""
    return sample_step(logits_RV, temperature_B=s.temperature_R, top_k_B=s.top_k_R,
                       top_p_B=s.top_p_R, seeds_B=s.seed_R, step=step_R, n_top=n_top,
                       counts_BV=s.counts_RV, presence_B=s.presence_R, frequency_B=s.frequency_R,
                       filtering=filtering)


def _prefill_impl(cfg: models.ModelConfig, params: Any, s: SlotState, slot_P: jax.Array,
                  ids_PC: jax.Array, valid_PC: jax.Array, index_P: jax.Array, keep_P: jax.Array,
                  first_P: jax.Array, last_P: jax.Array, settings: SlotState, *, n_top: int,
                  span: int, filtering: bool):
    """Write one prompt chunk into each of the P distinct slots `slot_P` in one pass: row p's
    chunk at position index_P[p], attending to the slot's first `span` positions; the slot's
    mask is first cut to positions < keep_P[p] (a reused prefix, or all but nothing on a fresh
    row). `first_P` installs row p of `settings` (a P-row SlotState of sampling fields),
    `last_P` samples the row's first token and makes it live. A slot of `slot_P` outside
    [0, R) pads the pass to its row bucket: every write of its row is dropped. The chunks are
    written into the cache in place, layer by layer (`models.forward_slots` with `rows_B`).
    Returns (state, token [P], logprob [P], top ids [P, K], top logprobs [P, K], done [P])."""
    p_rows, c = ids_PC.shape
    row_of = lambda x: x.at[slot_P].get(mode="fill", fill_value=0)  # noqa: E731
    put = lambda x, v: x.at[slot_P].set(v, mode="drop")  # noqa: E731
    pos_S = jnp.arange(s.mask_RS.shape[1])
    s = s._replace(mask_RS=put(s.mask_RS, row_of(s.mask_RS) & (pos_S[None] < keep_P[:, None])))
    logits_PV, cache = models.forward_slots(cfg, params, ids_PC, valid_PC, _cache(s), index_P,
                                            span=span, rows_B=slot_P)
    s = s._replace(k=cache.k, v=cache.v, mask_RS=cache.mask_RS)

    def install(full, new):
        on = first_P.reshape((p_rows,) + (1,) * (full.ndim - 1))
        return put(full, jnp.where(on, new, row_of(full)))
    s = s._replace(**{f: install(getattr(s, f), getattr(settings, f)) for f in (
        "temperature_R", "top_k_R", "top_p_R", "seed_R", "max_new_R", "stop_RX", "presence_R",
        "frequency_R")})
    s = s._replace(counts_RV=install(s.counts_RV, jnp.zeros((p_rows,) + s.counts_RV.shape[1:],
                                                            s.counts_RV.dtype)))
    row = jax.tree.map(row_of, s._replace(k=None, v=None))
    token_P, logprob_P, top_ids, top_lp = _sample(logits_PV, row, jnp.zeros((p_rows,), jnp.int32),
                                                  n_top, filtering)
    done_P = jnp.any(token_P[:, None] == row.stop_RX, axis=-1) | (row.max_new_R <= 1)
    s = s._replace(
        index_R=put(s.index_R, index_P + c),
        token_R=put(s.token_R, jnp.where(last_P, token_P, row.token_R)),
        length_R=put(s.length_R, jnp.where(last_P, 1, 0)),
        live_R=put(s.live_R, last_P & ~done_P),
        counts_RV=s.counts_RV.at[slot_P, token_P].add(last_P.astype(s.counts_RV.dtype),
                                                      mode="drop"))
    return s, token_P, logprob_P, top_ids, top_lp, done_P


def _copy_prefix_impl(s: SlotState, src: jax.Array, dst: jax.Array, n: jax.Array, *,
                      span: int) -> SlotState:
    """Slot `dst` takes slot `src`'s first `n` positions (n <= span): k, v and mask; its next
    write goes to position n. The copy reads and writes `span` positions of one row."""
    copy = lambda xs: tuple(jax.lax.dynamic_update_slice(  # noqa: E731
        x, jax.lax.dynamic_slice_in_dim(x, src, 1, axis=0)[:, :, :span], (dst, 0, 0, 0))
        for x in xs)
    k, v = copy(s.k), copy(s.v)
    mask = s.mask_RS[src] & (jnp.arange(s.mask_RS.shape[1]) < n)
    return s._replace(k=k, v=v, mask_RS=s.mask_RS.at[dst].set(mask),
                      index_R=s.index_R.at[dst].set(n))


def _decode_impl(cfg: models.ModelConfig, params: Any, s: SlotState, keep_R: jax.Array,
                 run_R: jax.Array, *, n_steps: int, n_top: int, span: int, filtering: bool
                 ) -> tuple[SlotState, Steps]:
    """`n_steps` decode steps for every live row with run_R True; rows with keep_R False
    (aborted) stop first, live rows with run_R False (held this step) keep their state. Each
    step feeds a row's last token at the row's own index and samples the next one.

    Only the first `span` cache positions are read (the caller's S bucket: every running row's
    index + n_steps fits in it), so a step's attention costs what the longest running row
    needs, not `max_len`; each step writes one position per row into the donated cache."""
    r = s.token_R.shape[0]
    s = s._replace(live_R=s.live_R & keep_R)
    one_R1 = jnp.ones((r, 1), jnp.bool_)

    def step(s: SlotState, _):
        live_R = s.live_R & run_R
        logits_RV, c = models.forward_slots(cfg, params, s.token_R[:, None], one_R1, _cache(s),
                                            s.index_R, span=span)
        token_R, logprob_R, top_ids, top_lp = _sample(logits_RV, s, s.length_R, n_top,
                                                      filtering)
        stop_R = jnp.any(token_R[:, None] == s.stop_RX, axis=-1)
        length_R = s.length_R + live_R
        done_R = stop_R | (length_R >= s.max_new_R)
        s = s._replace(
            # Rows that are not decoding (free, mid-prefill, held) keep their mask and index:
            # the token written at their index (past the span for a held row) is garbage that
            # their next chunk or step overwrites (or, on a free slot, past what its prefix
            # cache keeps).
            k=c.k, v=c.v, mask_RS=jnp.where(live_R[:, None], c.mask_RS, s.mask_RS),
            index_R=jnp.where(live_R, s.index_R + 1, s.index_R),
            token_R=jnp.where(live_R, token_R, s.token_R), length_R=length_R,
            live_R=s.live_R & ~(live_R & done_R),
            counts_RV=s.counts_RV.at[jnp.arange(r), token_R].add(live_R.astype(jnp.int32)))
        return s, Steps(token_R, logprob_R, live_R, stop_R & live_R, top_ids, top_lp)

    s, out = jax.lax.scan(step, s, None, length=n_steps)
    # scan stacks along a leading N axis: [N, R, ...] -> [R, N, ...]
    return s, Steps(*(jnp.swapaxes(x, 0, 1) for x in out))


def _jit(impl, static):
    """The engine's jit of `impl` (a function, so tests can count traces of a wrapped impl)."""
    return jax.jit(impl, static_argnames=static, donate_argnames=("s",))


_prefill = _jit(_prefill_impl, ("cfg", "n_top", "span", "filtering"))
_decode = _jit(_decode_impl, ("cfg", "n_steps", "n_top", "span", "filtering"))
_copy_prefix = _jit(_copy_prefix_impl, ("span",))


# --- host side --------------------------------------------------------------------------------
# A prefill dispatch of several rows holds at most this many tokens (rows x chunk). A token
# costs one flop per byte of bf16 weights (two per parameter), an H200 does ~200 flops in the
# time it reads a byte (989 TFLOP/s, 4.8 TB/s; an H100 ~300): below ~200-300 tokens a
# dispatch costs about one read of the weights whatever its rows, so rows of short chunks
# share that read, and a dispatch padded out from two real rows costs no more than one row.
BATCHED_PREFILL_TOKENS = 256

def bucket(n: int, *, lo: int, hi: int) -> int:
    """Smallest power of two >= n (at least `lo`), capped at `hi`."""
    b = lo
    while b < n:
        b *= 2
    return min(b, hi)


# on_tokens(rid, new ids, their logprobs, their top logprobs (empty unless asked), result)
StreamHook = Callable[[str, tuple[int, ...], tuple[float, ...], tuple[TopLogprobs, ...],
                       "GenerateResult | None"], None]


@dataclasses.dataclass(eq=False)
class _Job:
    request: GenerateRequest
    rid: str
    seed: int
    on_tokens: StreamHook | None
    max_new: int = 0
    # The prefill plan, made when the job takes a slot: the prompt's first `cached` tokens are
    # already in the slot (positions < start); the rest, left-padded to `len(padded_ids)`, is
    # written from `start` on, one chunk of `chunks` per step: (size, back), `size` tokens
    # whose first `back` re-feed the positions before the chunk's new ones (`_chunking`).
    cached: int = 0
    start: int = 0
    padded_ids: np.ndarray = None
    padded_valid: np.ndarray = None
    chunks: tuple[tuple[int, int], ...] = ()
    next_chunk: int = 0
    slot: int = -1
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top: list[TopLogprobs] = dataclasses.field(default_factory=list)
    result: GenerateResult | None = None

    @property
    def prefilling(self) -> bool:
        return self.next_chunk < len(self.chunks)

    @property
    def prefilled(self) -> int:
        """Positions of `padded_ids` written so far."""
        return sum(size - back for size, back in self.chunks[:self.next_chunk])


class _Chunk(NamedTuple):
    """One job's next prefill chunk, planned on the host: `ids`/`valid` written from position
    `index - back` (its first `back` re-fed, `_chunking`)."""
    ids: np.ndarray
    valid: np.ndarray
    index: int
    back: int
    first: bool
    last: bool
    settings: SlotState


def _stack(rows: Sequence[SlotState]) -> SlotState:
    """One-row SlotStates of sampling fields -> one with a row each."""
    return jax.tree.map(lambda *xs: np.concatenate(xs), *rows)


@dataclasses.dataclass(eq=False)
class _Content:
    """What one slot's cache holds, on the host: real token ids in order and the position of
    each; `epoch` names the weights that computed them (-1: none, or stale)."""
    ids: list[int] = dataclasses.field(default_factory=list)
    pos: list[int] = dataclasses.field(default_factory=list)
    epoch: int = -1
    used: int = 0          # engine step of the last use, for least-recently-used eviction

    def clear(self) -> None:
        self.ids, self.pos, self.epoch = [], [], -1

    def common(self, ids: np.ndarray) -> int:
        n = min(len(self.ids), len(ids))
        if n == 0:
            return 0
        same = np.asarray(self.ids[:n]) == ids[:n]
        return n if same.all() else int(np.argmin(same))


class ContinuousEngine:
    """Continuous batching over `max_batch` slots of `max_len` positions.

    Synchronous and single-threaded: `submit` queues, `step` admits queued requests into free
    slots, runs one prefill chunk per prefilling slot and one decode dispatch (`decode_steps`
    steps; fewer at long spans when `dispatch_reads` is set, see `steps_at`), and returns the
    requests that finished; `run` steps until idle. An async server drives `step` from its own
    loop (`rollout.embedded.ContinuousSampler`). `on_tokens(rid, new_ids, new_logprobs,
    new_top_logprobs, result)` is called with each request's new tokens after every step;
    `result` is set on its last call.

    A request that fails on its own (its slot planning, its settings or prompt chunk, its
    row's host work or hook after a decode) is dropped with its slot and listed in `failures`
    for that step; the other rows go on. `step` raises only when a dispatch shared by all rows
    fails or the donated cache is lost.

    Prefix cache (`prefix_cache`, on by default): a slot keeps its tokens' KV after its request
    ends, and a new request whose prompt starts with tokens some slot holds (the next turn of
    an episode: prompt + reply + tool output; another sample of the same prompt) prefills only
    the rest: in that slot when it is free, else after copying the prefix into a free slot. A
    request whose prompt another slot is prefilling right now waits for it, so the G samples
    of a prompt prefill it once. Free slots are evicted least recently used first; new weights
    (another `params` object or `weight_version`) make every kept prefix stale.
    `stats["prefill_tokens"]` counts prompt tokens computed (not those a chunk re-feeds,
    `_chunking`), `stats["cached_tokens"]` those reused, and each result's `cached_tokens` its
    own; `stats["prefill_chunks"]` counts chunks (a row's, a step) and
    `stats["prefill_dispatches"]` the `_prefill` dispatches that wrote them.

    The slot cache is allocated by the first step after the engine was idle; `release` drops
    it (and the prefix cache) while idle. `params` and `weight_version` may be replaced
    between steps: rows in flight continue on the new weights, and a result reports the
    version it finished under.
    """

    def __init__(self, cfg: models.ModelConfig, params: Any, *, max_batch: int = 64,
                 max_len: int = 4096, prefill_chunk: int = 512, decode_steps: int = 1,
                 top_logprobs: int = 0, min_chunk: int = 16, seed: int = 0,
                 weight_version: str = "0", prefix_cache: bool = True,
                 dispatch_reads: int | None = None, prefill_rows: int = 8):
        for name, value, lo in (("max_batch", max_batch, 1), ("max_len", max_len, 2),
                                ("prefill_chunk", prefill_chunk, 1),
                                ("decode_steps", decode_steps, 1), ("min_chunk", min_chunk, 1),
                                ("prefill_rows", prefill_rows, 1)):
            if value < lo:
                raise ValueError(f"ContinuousEngine.{name}={value}; must be >= {lo}")
        if dispatch_reads is not None and dispatch_reads < 1:
            raise ValueError(f"ContinuousEngine.dispatch_reads={dispatch_reads}; must be >= 1 "
                             "or None")
        if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"ContinuousEngine.top_logprobs={top_logprobs}; must be in "
                             f"[0, {MAX_TOP_LOGPROBS}]")
        self.cfg, self.params, self.weight_version = cfg, params, weight_version
        self.max_batch, self.max_len = max_batch, max_len
        self.prefill_chunk, self.min_chunk = prefill_chunk, min_chunk
        self.decode_steps, self.top_logprobs = decode_steps, top_logprobs
        self.prefix_cache, self.dispatch_reads = prefix_cache, dispatch_reads
        self.prefill_rows = min(prefill_rows, max_batch)
        # chunk size -> rows of a dispatch, for the sizes several slots prefill together
        self.batched_rows = self._batched_rows()
        self._rng = np.random.default_rng(seed)
        self._state: SlotState | None = None
        self._queue: list[_Job] = []
        self._slots: list[_Job | None] = [None] * max_batch
        self._content = [_Content() for _ in range(max_batch)]
        self._epoch, self._epoch_of = 0, (params, weight_version)
        self._steps = 0
        self._next_rid = 0
        # (rid, exception) of the requests the last step dropped; the others went on
        self.failures: list[tuple[str, Exception]] = []
        self.stats = {"decode_dispatches": 0, "prefill_chunks": 0, "prefill_dispatches": 0,
                      "tokens": 0, "prefill_tokens": 0, "cached_tokens": 0,
                      "prefix_copies": 0}

    # --- public API ----------------------------------------------------------------------------
    def admit_error(self, r: GenerateRequest) -> str | None:
        """Why this engine cannot run `r` (naming the field), or None."""
        error = request_ids_error(r, vocab_size=self.cfg.vocab_size, max_len=self.max_len)
        if error:
            return error
        if len(r.sampling.stop_token_ids) > MAX_STOP_IDS:
            return (f"stop_token_ids has {len(r.sampling.stop_token_ids)} ids; at most "
                    f"{MAX_STOP_IDS}")
        if not 0 <= r.top_logprobs <= self.top_logprobs:
            return (f"top_logprobs={r.top_logprobs}; this engine reports at most "
                    f"{self.top_logprobs} (ContinuousEngine.top_logprobs)")
        return None

    def submit(self, r: GenerateRequest, on_tokens: StreamHook | None = None) -> str:
        """Queue `r`; returns its rid (the request's own, or a fresh one). Raises ValueError
        with `admit_error`'s reason."""
        why = self.admit_error(r)
        if why is not None:
            raise ValueError(why)
        rid = r.rid if r.rid is not None else f"engine-{self._next_rid}"
        self._next_rid += 1
        seed = r.sampling.sampling_seed
        if seed is None:
            seed = int(self._rng.integers(0, 2**31 - 1))
        self._queue.append(_Job(request=r, rid=rid, seed=seed % 2**32, on_tokens=on_tokens))
        return rid

    def abort(self, rid: str) -> int:
        """Finish queued and running requests with `rid` as 'abort' now; a running row's slot
        is free for the next step. Returns the count."""
        n = 0
        for job in [j for j in self._queue if j.rid == rid]:
            self._queue.remove(job)
            self._finish_aborted(job)
            n += 1
        for slot, job in enumerate(self._slots):
            if job is not None and job.rid == rid:
                self._slots[slot] = None
                self._finish_aborted(job)
                n += 1
        return n

    def _finish_aborted(self, job: _Job) -> None:
        try:
            self._finish(job, "abort")
        except Exception:   # its hook failed: the row is gone either way, and nobody waits on it
            pass

    @property
    def busy(self) -> bool:
        return bool(self._queue) or any(j is not None for j in self._slots)

    def slot_of(self, rid: str) -> int | None:
        for slot, job in enumerate(self._slots):
            if job is not None and job.rid == rid:
                return slot
        return None

    def drop_params(self) -> None:
        """Forget the weights, so the caller's copy can be freed (the engine kept a reference
        to them, and one through the epoch of its kept prefixes); the next step needs `params`
        set again, and makes every kept prefix stale."""
        self.params = None
        self._epoch_of = (None, self._epoch_of[1])

    def release(self) -> None:
        """Free the slot cache (and the prefixes it keeps) now; only while idle (the next step
        allocates a new one)."""
        if self.busy:
            raise RuntimeError("ContinuousEngine.release: requests are queued or running")
        self._state = None
        for c in self._content:
            c.clear()

    def step(self, hold: Collection[str] = ()) -> list[GenerateResult]:
        """Admit, prefill one chunk per prefilling slot, decode once; the results that
        finished in this step. Rows of the rids in `hold` neither prefill nor decode: they keep
        their state and cost the step nothing (the decode span is the running rows')."""
        finished: list[GenerateResult] = []
        self._steps += 1
        if self._epoch_of[0] is not self.params or self._epoch_of[1] != self.weight_version:
            self._epoch += 1    # kept prefixes were computed by other weights
            self._epoch_of = (self.params, self.weight_version)
        if self._state is None and self.busy:
            self._state = init_state(self.cfg, self.max_batch, self.max_len,
                                     params_mesh(self.params))
        self.failures = []
        self._admit()
        self._prefill_all([j for j in self._slots
                           if j is not None and j.prefilling and j.rid not in hold], finished)
        if any(j is not None and not j.prefilling and j.rid not in hold for j in self._slots):
            self._decode_once(finished, hold)
        return finished

    def _state_lost(self) -> bool:
        return self._state is None or any(x.is_deleted() for x in jax.tree.leaves(self._state))

    @property
    def room(self) -> int:
        """Requests that can be submitted now and start at the next step (free slots no queued
        request is waiting for)."""
        return sum(j is None for j in self._slots) - len(self._queue)

    def programs(self, filtering: Collection[bool] = (False, True)
                 ) -> list[tuple[str, dict[str, int]]]:
        """Every program a step of this engine can dispatch, as (jitted function, its shapes):
        `_prefill` of one row for each chunk size `_chunking` can plan (`prefill_chunk` and
        the power-of-two buckets from `min_chunk` below it) at each S bucket that holds it (a
        later chunk, or one after a reused prefix, reads up to `max_len`), and with one token
        at the smallest S bucket, and of several rows for the sizes of `batched_rows`;
        `_decode` at each S bucket with its `steps_at` steps;
        `_copy_prefix` at each S bucket when the prefix cache is on. Each of the first two once
        per value of `filtering` that requests can need (both, unless every request samples
        alike)."""
        spans = [self._bucket(1)]
        while spans[-1] < self.max_len:
            spans.append(self._bucket(spans[-1] + 1))
        sizes = self._chunk_sizes()
        prefills = [(c, b) for c in sorted(sizes) for b in spans if b >= self._bucket(c)]
        if 1 not in sizes:    # a short prompt on an empty slot with no room to pad it
            prefills.insert(0, (1, spans[0]))
        batched = self.batched_rows
        rows = [(1, c, b) for c, b in prefills] + [
            (batched[c], c, b) for c, b in prefills if c in batched]
        out = []
        for f in filtering:
            out += [("prefill", dict(rows=p, chunk=c, span=b, filtering=int(f)))
                    for p, c, b in rows]
            out += [("decode", dict(span=b, steps=self.steps_at(b), filtering=int(f)))
                    for b in spans if b >= self._bucket(self.decode_steps)]
        if self.prefix_cache:
            out += [("copy", dict(span=b)) for b in spans]
        return out

    def warm(self, filtering: Collection[bool] = (False, True)) -> int:
        """Compile (or load from the persistent compilation cache) every program of `programs`
        before the first request, so no request waits for a compile; returns their count.
        Each runs once on a scratch slot state, through the same jitted functions with the
        same kinds of arguments as a step, then the scratch state is dropped: the first step
        allocates a fresh one, and stats, seeds and results are those of an engine never
        warmed. Only before the slot cache is allocated (or after `release`), so the device
        never holds two."""
        if self.busy or self._state is not None:
            raise RuntimeError("ContinuousEngine.warm: only before the first request or after "
                               "release() (the slot cache is allocated)")
        s = init_state(self.cfg, self.max_batch, self.max_len, params_mesh(self.params))
        dummy = _Job(request=GenerateRequest(input_ids=(0,)), rid="warm", seed=0,
                     on_tokens=None, max_new=1)
        rows = np.zeros((self.max_batch,), np.bool_)
        settings = self._settings(dummy)
        programs = self.programs(filtering)
        for kind, shape in programs:
            if kind == "prefill":
                p, c = shape["rows"], shape["chunk"]
                on, at = np.ones((p,), np.bool_), np.zeros((p,), np.int32)
                s, *_ = _prefill(
                    self.cfg, self.params, s, np.arange(p, dtype=np.int32),
                    np.zeros((p, c), np.int32), np.ones((p, c), np.bool_), at, at, on, on,
                    _stack([settings] * p), n_top=self.top_logprobs, span=shape["span"],
                    filtering=bool(shape["filtering"]))
            elif kind == "decode":
                s, _ = _decode(self.cfg, self.params, s, rows, rows, n_steps=shape["steps"],
                               n_top=self.top_logprobs, span=shape["span"],
                               filtering=bool(shape["filtering"]))
            else:
                s = _copy_prefix(s, np.int32(0), np.int32(0), np.int32(1), span=shape["span"])
        jax.block_until_ready(s)
        return len(programs)

    def run(self) -> list[GenerateResult]:
        """Step until every submitted request finished; results in finishing order."""
        out: list[GenerateResult] = []
        while self.busy:
            out += self.step()
        return out

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """Submit all, run to completion, results in request order."""
        rids = [self.submit(r) for r in requests]
        by_rid, failed = {}, {}
        while self.busy:
            for res in self.step():
                by_rid[res.rid] = res
            failed.update(self.failures)
        for rid in rids:
            if rid in failed:
                raise RuntimeError(f"request {rid} failed: {failed[rid]}") from failed[rid]
        return [by_rid[rid] for rid in rids]

    def span(self, hold: Collection[str] = ()) -> int:
        """The S bucket of the next decode dispatch: a power of two times 2 * min_chunk (capped
        at max_len) that holds the filled positions plus `decode_steps` of every occupied slot
        not in `hold`."""
        return self._bucket(max([self._need(j) for j in self._slots
                                 if j is not None and j.rid not in hold], default=1))

    def spans(self) -> dict[str, int]:
        """rid -> the S bucket its row alone would need in the next step (a queued request:
        its prompt's, as if it had a fresh slot)."""
        out = {j.rid: self._bucket(len(j.request.input_ids) + self.decode_steps)
               for j in self._queue}
        return out | {j.rid: self._bucket(self._need(j)) for j in self._slots if j is not None}

    def steps_at(self, span: int) -> int:
        """Decode steps in one dispatch whose rows read `span` cache positions: `decode_steps`,
        or with `dispatch_reads` set, as many as keep steps x span within it (at least one).
        Several steps a dispatch save host round trips while a step is cheap; at a long span
        they would only make a request that arrives meanwhile wait longer for the engine."""
        if self.dispatch_reads is None:
            return self.decode_steps
        return max(1, min(self.decode_steps, self.dispatch_reads // span))

    def _need(self, job: _Job) -> int:
        if job.prefilling:
            index = job.start + job.prefilled
        else:                  # the last recorded token is fed at this position
            index = job.start + len(job.padded_ids) + len(job.ids) - 1
        return index + self.decode_steps

    # --- internals -----------------------------------------------------------------------------
    def _bucket(self, n: int) -> int:
        return bucket(n, lo=min(2 * self.min_chunk, self.max_len), hi=self.max_len)

    def _chunk_sizes(self) -> set[int]:
        """The chunk sizes `_chunking` plans: `prefill_chunk` and the power-of-two buckets from
        `min_chunk` below it, each below `max_len` (and one token, for a short prompt with no
        room to pad it, which `programs` adds)."""
        top, b = self.prefill_chunk, min(self.min_chunk, self.prefill_chunk)
        sizes = {top}
        while b < top:
            sizes.add(b)
            b *= 2
        return {c for c in sizes if c < self.max_len}

    def _chunking(self, n: int, room: int | None = None, before: int = 0
                  ) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(positions, chunks) of an n-token prompt written after the `before` positions a slot
        holds, in fewer than `room` positions (default max_len). A chunk is (size, back): a
        dispatch of `size` tokens starting `back` positions before the prompt's next one, its
        first `back` tokens what the slot holds there (the same ids at the same positions:
        their K/V recomputed, equal up to rounding; holes stay holes).

        On an empty slot (`before` 0), padded on the left: one power-of-two bucket from
        `min_chunk` up to `prefill_chunk`, else whole `prefill_chunk`s. After a prefix the slot
        holds, or when the padding leaves no room (the output budget runs to the context
        limit), unpadded: whole `prefill_chunk`s, then one bucket for the rest, filled out with
        the positions before it; with too few of those, the largest bucket the rest holds goes
        first. So the turns of an episode leave no holes between them: padding every turn's
        few new tokens to a bucket used up to half the slot's positions, and the episode's
        last turns, past `max_len`, lost the whole prefix. So every chunk size is a bucket or `prefill_chunk`, whatever the
        prompt's length, except that a prompt shorter than `min_chunk` on an empty slot with no
        room goes one token a chunk. Every prompt shorter than `room` fits."""
        room = self.max_len if room is None else room
        top = self.prefill_chunk
        lo = min(self.min_chunk, top)
        padded = bucket(n, lo=lo, hi=top) if n <= top else -(-n // top) * top
        if padded < room and before == 0:
            size = min(padded, top)
            return padded, ((size, 0),) * (padded // size)
        chunks, left = [(top, 0)] * (n // top), n % top
        if left and bucket(left, lo=lo, hi=top) - left > before + n - left:
            if left < lo:          # so nothing is before it (a reused prefix has >= min_chunk)
                return n, ((1, 0),) * n
            first = lo
            while 2 * first <= left:
                first *= 2
            chunks.append((first, 0))     # the rest, < first, then fits back into it
            left -= first
        if left:
            size = bucket(left, lo=lo, hi=top)
            chunks.append((size, size - left))
        return n, tuple(chunks)

    def _admit(self) -> None:
        """Give queued jobs free slots, in order, each with its prefill plan; a job whose
        planning fails is dropped alone."""
        waiting = []
        while self._queue and any(j is None for j in self._slots):
            job = self._queue.pop(0)
            try:
                if not self._place(job):
                    waiting.append(job)
            except Exception as e:
                self._drop(job, e)
        self._queue[:0] = waiting

    def _drop(self, job: _Job, error: Exception) -> None:
        """`job` failed on its own (its settings, its prompt, its hook): free its slot and record
        the failure; the other rows go on. Raises `error` instead when the donated cache is gone
        (every row's caller must hear it)."""
        if self._state_lost():
            raise error
        if job.slot >= 0 and self._slots[job.slot] is job:
            self._slots[job.slot] = None
            self._content[job.slot].clear()   # it may hold part of this job's tokens
        self.failures.append((job.rid, error))

    def _place(self, job: _Job) -> bool:
        """Plan `job` into a free slot, reusing the longest prefix a slot holds; False when a
        slot is prefilling a longer prefix of its prompt right now (it waits for that)."""
        ids = np.asarray(job.request.input_ids)
        n = len(ids)
        best, best_slot = 0, None
        if self.prefix_cache:
            prefilling = [j for j in self._slots if j is not None and j.prefilling]
            for slot, c in enumerate(self._content):
                if c.epoch != self._epoch or any(j.slot == slot for j in prefilling):
                    continue
                p = min(c.common(ids), n - 1)   # the last prompt token is always fed
                if p > best:
                    best, best_slot = p, slot
            if any(min(_common(np.asarray(j.request.input_ids), ids), n - 1)
                   > max(best, self.min_chunk - 1) for j in prefilling):
                return False
        # The output budget is min(max_new_tokens, max_len - n): the
        # prompt's padding (and a reused prefix's holes) may only take positions it leaves.
        want = min(job.request.sampling.max_new_tokens, self.max_len - n)
        start = self._content[best_slot].pos[best - 1] + 1 if best >= self.min_chunk else 0
        padded, chunks = self._chunking(n - best, self.max_len - start - want + 1, start)
        if start == 0 or start + padded + want > self.max_len:
            # No prefix worth a copy or a hole in the slot, or the rest does not fit after it.
            best, best_slot, start = 0, None, 0
            padded, chunks = self._chunking(n, self.max_len - want + 1)
        free = [s for s in range(self.max_batch) if self._slots[s] is None]
        if best_slot is not None and best_slot in free:
            slot = best_slot
        else:
            # Empty slots first, then the least recently used kept prefix.
            slot = min(free, key=lambda s: (self._content[s].epoch == self._epoch,
                                            self._content[s].used))
            if best_slot is not None:
                self._copy(best_slot, slot, best)
        c = self._content[slot]
        if best == 0:
            c.clear()
        del c.ids[best:], c.pos[best:]
        c.epoch, c.used = self._epoch, self._steps
        job.cached, job.start, job.chunks, job.next_chunk = best, start, chunks, 0
        job.max_new = want
        job.padded_ids = np.zeros((padded,), np.int32)
        job.padded_ids[padded - (n - best):] = ids[best:]
        job.padded_valid = np.zeros((padded,), np.bool_)
        job.padded_valid[padded - (n - best):] = True
        job.slot = slot
        self._slots[slot] = job
        return True

    def _copy(self, src: int, dst: int, tokens: int) -> None:
        """Slot `dst` takes the KV of slot `src`'s first `tokens` tokens."""
        sc, dc = self._content[src], self._content[dst]
        n_pos = sc.pos[tokens - 1] + 1
        self._state = _copy_prefix(self._state, np.int32(src), np.int32(dst), np.int32(n_pos),
                                   span=self._bucket(n_pos))
        dc.ids, dc.pos = sc.ids[:tokens], sc.pos[:tokens]
        sc.used = self._steps
        self.stats["prefix_copies"] += 1

    def _held(self, slot: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, valid) of what `slot` holds at positions [lo, hi)."""
        c = self._content[slot]
        a, b = bisect.bisect_left(c.pos, lo), bisect.bisect_left(c.pos, hi)
        ids, valid = np.zeros((hi - lo,), np.int32), np.zeros((hi - lo,), np.bool_)
        at = np.asarray(c.pos[a:b], np.int64) - lo
        ids[at], valid[at] = c.ids[a:b], True
        return ids, valid

    def _settings(self, job: _Job) -> SlotState:
        sp = job.request.sampling
        stop = np.full((1, MAX_STOP_IDS), -1, np.int32)
        stop[0, :len(sp.stop_token_ids)] = sp.stop_token_ids
        one = lambda x, dt: np.asarray([x], dt)
        return SlotState(
            k=None, v=None, mask_RS=None, index_R=None, token_R=None, length_R=None,
            live_R=None, counts_RV=None, temperature_R=one(sp.temperature, np.float32),
            top_k_R=one(sp.top_k, np.int32), top_p_R=one(sp.top_p, np.float32),
            seed_R=one(job.seed, np.uint32), max_new_R=one(job.max_new, np.int32),
            stop_RX=stop, presence_R=one(sp.presence_penalty, np.float32),
            frequency_R=one(sp.frequency_penalty, np.float32))

    def _filtering(self, jobs: list[_Job]) -> bool:
        return needs_filtering([j.request.sampling for j in jobs], self.cfg.vocab_size)

    def _batched_rows(self) -> dict[int, int]:
        """chunk size -> the rows of one dispatch of chunks that size, for the sizes several
        slots prefill together: up to `prefill_rows`, as many as keep the dispatch within
        `BATCHED_PREFILL_TOKENS`, so that even padded out from two real rows it costs about
        one read of the weights, what a one-row dispatch costs. Bigger chunks go a row a
        dispatch (each already costing about its compute)."""
        out = {c: min(self.prefill_rows, BATCHED_PREFILL_TOKENS // c)
               for c in self._chunk_sizes()}
        return {c: p for c, p in out.items() if p > 1}

    def _prefill_all(self, jobs: list[_Job], finished: list[GenerateResult]) -> None:
        """The next chunk of each job: equal-sized chunks of a batched size (`batched_rows`)
        in dispatches of that size's rows (padded to them), the others one a dispatch. A
        job whose chunk cannot be planned is dropped alone; a failed dispatch drops its rows."""
        planned: dict[int, list[tuple[_Job, _Chunk]]] = {}
        for job in jobs:
            try:
                chunk = self._plan_chunk(job)
            except Exception as e:
                self._drop(job, e)
                continue
            planned.setdefault(len(chunk.ids), []).append((job, chunk))
        for size in sorted(planned):
            group = planned[size]
            n = self.batched_rows.get(size, 1)
            for lo in range(0, len(group), n):
                self._prefill_rows(group[lo:lo + n], n, finished)

    def _plan_chunk(self, job: _Job) -> _Chunk:
        i, (size, back), at = job.next_chunk, job.chunks[job.next_chunk], job.prefilled
        index = job.start + at       # the chunk's first new position; it starts `back` before
        ids = job.padded_ids[at:at + size - back]
        valid = job.padded_valid[at:at + size - back]
        if back:
            held_ids, held_valid = self._held(job.slot, index - back, index)
            ids, valid = np.concatenate([held_ids, ids]), np.concatenate([held_valid, valid])
        return _Chunk(ids=ids, valid=valid, index=index, back=back, first=i == 0,
                      last=i + 1 == len(job.chunks), settings=self._settings(job))

    def _prefill_rows(self, rows: list[tuple[_Job, _Chunk]], p: int,
                      finished: list[GenerateResult]) -> None:
        """One `_prefill` dispatch of equal-sized chunks of distinct slots: one row alone, else
        padded to `p` rows (a padding row's slot is `max_batch`: out of range, so its writes
        are dropped)."""
        p = 1 if len(rows) == 1 else p
        pad = p - len(rows)
        chunks = [c for _, c in rows] + [rows[0][1]] * pad
        starts = np.asarray([c.index - c.back for c in chunks], np.int32)
        try:
            self._state, token, logprob, top_ids, top_lp, done = _prefill(
                self.cfg, self.params, self._state,
                np.asarray([job.slot for job, _ in rows] + [self.max_batch] * pad, np.int32),
                np.stack([c.ids for c in chunks]), np.stack([c.valid for c in chunks]),
                starts, starts, np.asarray([c.first for c in chunks]),
                np.asarray([c.last for c in chunks]), _stack([c.settings for c in chunks]),
                n_top=self.top_logprobs,
                span=max(self._bucket(int(i) + len(c.ids)) for i, c in zip(starts, chunks)),
                filtering=self._filtering([job for job, _ in rows]))
        except Exception as e:
            for job, _ in rows:
                self._drop(job, e)
            return
        self.stats["prefill_dispatches"] += 1
        # Only rows on their last chunk sampled a token the host needs.
        sampled = (jax.device_get((token, logprob, top_ids, top_lp, done))
                   if any(c.last for _, c in rows) else None)
        for r, (job, chunk) in enumerate(rows):
            try:
                self._prefilled(job, chunk, sampled and tuple(x[r] for x in sampled), finished)
            except Exception as e:   # this row's host work: the others' chunks still count
                self._drop(job, e)

    def _prefilled(self, job: _Job, chunk: _Chunk, sampled, finished: list[GenerateResult]
                   ) -> None:
        """Record one chunk of `job` written (and its first token, on its last chunk)."""
        job.next_chunk += 1
        content = self._content[job.slot]
        real = np.flatnonzero(chunk.valid[chunk.back:])
        content.ids += chunk.ids[chunk.back:][real].tolist()
        content.pos += (chunk.index + real).tolist()
        self.stats["prefill_chunks"] += 1
        self.stats["prefill_tokens"] += len(real)
        if chunk.first:
            self.stats["cached_tokens"] += job.cached
        if not chunk.last:
            return
        token, logprob, top_ids, top_lp, done = sampled
        stopped = int(token) in job.request.sampling.stop_token_ids
        self._record(job, [int(token)], [float(logprob)], top_ids[None], top_lp[None],
                     "stop" if stopped else "length" if bool(done) else None, finished)

    def _decode_once(self, finished: list[GenerateResult], hold: Collection[str] = ()) -> None:
        keep = np.asarray([j is not None for j in self._slots])
        run = np.asarray([j is not None and j.rid not in hold for j in self._slots])
        span = self.span(hold)
        n_steps = self.steps_at(span)
        decoding = [j for j in self._slots
                    if j is not None and not j.prefilling and j.rid not in hold]
        self._state, steps = _decode(self.cfg, self.params, self._state, keep, run,
                                     n_steps=n_steps, n_top=self.top_logprobs, span=span,
                                     filtering=self._filtering(decoding))
        self.stats["decode_dispatches"] += 1
        steps, live = jax.device_get((steps, self._state.live_R))
        for slot, job in enumerate(self._slots):
            if job is None or job.prefilling:
                continue
            try:
                self._take_steps(job, steps, bool(live[slot]), finished)
            except Exception as e:   # this row's host work: the others' tokens still count
                self._drop(job, e)

    def _take_steps(self, job: _Job, steps: Steps, live: bool,
                    finished: list[GenerateResult]) -> None:
        """Record what one decode dispatch produced for `job`'s row (host arrays)."""
        slot = job.slot
        n = int(steps.valid_RN[slot].sum())
        if n == 0:
            return
        # Each valid step fed the row's last recorded token at the next position.
        content = self._content[slot]
        fed = [job.ids[-1]] + steps.tokens_RN[slot, :n - 1].tolist()
        first = job.start + len(job.padded_ids) + len(job.ids) - 1
        content.ids += fed
        content.pos += range(first, first + n)
        content.used = self._steps
        why = None
        if not live:
            why = "stop" if steps.stopped_RN[slot, n - 1] else "length"
        self._record(job, steps.tokens_RN[slot, :n].tolist(),
                     steps.logprobs_RN[slot, :n].tolist(), steps.top_ids_RNK[slot, :n],
                     steps.top_lp_RNK[slot, :n], why, finished)

    def _record(self, job: _Job, ids: list[int], lps: list[float], top_ids, top_lp,
                why: str | None, finished: list[GenerateResult]) -> None:
        k = job.request.top_logprobs
        top = tuple(tuple(zip(map(int, top_ids[j, :k]), map(float, top_lp[j, :k])))
                    for j in range(len(ids))) if k else ()
        job.ids += ids
        job.logprobs += lps
        job.top += top
        self.stats["tokens"] += len(ids)
        if why is not None:
            self._slots[job.slot] = None
            finished.append(self._finish(job, why, stream=(tuple(ids), tuple(lps), top)))
        elif job.on_tokens is not None:
            job.on_tokens(job.rid, tuple(ids), tuple(lps), top, None)

    def _finish(self, job: _Job, why: str, stream=((), (), ())) -> GenerateResult:
        job.result = GenerateResult(
            output_ids=tuple(job.ids), logprobs=tuple(job.logprobs), top_logprobs=tuple(job.top),
            finish_reason=why, prompt_tokens=len(job.request.input_ids),
            weight_version=self.weight_version, rid=job.rid, cached_tokens=job.cached)
        if job.on_tokens is not None:
            job.on_tokens(job.rid, *stream, job.result)
        return job.result


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two id arrays."""
    n = min(len(a), len(b))
    same = a[:n] == b[:n]
    return n if same.all() else int(np.argmin(same))
