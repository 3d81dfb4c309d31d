"""Batched generation in two jitted pieces: a left-padded prefill, then KV-cache decode chunks.

Letters: B batch rows, T prompt length (left padded), S stop ids per row, C decode steps per
chunk, K top logprobs per step, V vocabulary. The host calls `decode_chunk` until every row is
done, so between chunks it can hand tokens to streaming clients and drop rows whose client went
away (`keep_B`); a chunk's loop also ends early once every row is done. Rows that finished keep
feeding a token but record nothing.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from orchestrax import models
from orchestrax.rollout.sampling import sample_step


class Rows(NamedTuple):
    """Per-row settings, fixed for a batch's lifetime."""
    temperature_B: jax.Array   # float32; 0 means greedy
    top_k_B: jax.Array         # int32; <= 0 means no top-k
    top_p_B: jax.Array         # float32
    seeds_B: jax.Array         # uint32
    max_new_B: jax.Array       # int32 token budget of each row
    stop_ids_BS: jax.Array     # int32, padded with -1
    presence_B: jax.Array      # float32 presence penalty (used when `penalize`)
    frequency_B: jax.Array     # float32 frequency penalty (used when `penalize`)


class DecodeState(NamedTuple):
    step: jax.Array            # int32: index of the next token to record (same for live rows)
    cache: Any
    token_B: jax.Array         # sampled, not yet recorded
    logprob_B: jax.Array
    top_ids_BK: jax.Array      # int32 [B, K] top-K ids of the step that sampled token_B
    top_lp_BK: jax.Array       # float32 [B, K] their logprobs
    length_B: jax.Array        # int32 tokens recorded (a stop token included)
    done_B: jax.Array          # bool
    stopped_B: jax.Array       # bool: ended on a stop id (else on max_new, or dropped)
    counts_BV: jax.Array       # int32 [B, V] generated-token counts, or [B, 0] without penalties


class Chunk(NamedTuple):
    """What one chunk recorded: row b's new tokens are the first
    (length_B after - length_B before) entries of its row."""
    tokens_BC: jax.Array
    logprobs_BC: jax.Array
    top_ids_BCK: jax.Array
    top_lp_BCK: jax.Array


def _sample(logits_BV: jax.Array, rows: Rows, counts_BV: jax.Array, step: jax.Array, *,
            n_top: int, penalize: bool):
    extra = dict(counts_BV=counts_BV, presence_B=rows.presence_B,
                 frequency_B=rows.frequency_B) if penalize else {}
    return sample_step(logits_BV, temperature_B=rows.temperature_B, top_k_B=rows.top_k_B,
                       top_p_B=rows.top_p_B, seeds_B=rows.seeds_B, step=step, n_top=n_top,
                       **extra)


@functools.partial(jax.jit, static_argnames=("cfg", "total_len", "n_top", "penalize"))
def prefill(cfg: models.ModelConfig, params: Any, prompt_BT: jax.Array, mask_BT: jax.Array,
            rows: Rows, *, total_len: int, n_top: int, penalize: bool) -> DecodeState:
    """Run the prompts and sample each row's first token. `total_len` (>= T + the largest
    max_new_B) sizes the KV cache."""
    b, t = prompt_BT.shape
    cache = models.init_cache(cfg, b, total_len)
    logits_B1V, cache = models.forward_with_cache(cfg, params, prompt_BT, mask_BT, cache,
                                                  last_only=True)
    counts_BV = jnp.zeros((b, cfg.vocab_size if penalize else 0), jnp.int32)
    token_B, logprob_B, top_ids_BK, top_lp_BK = _sample(
        logits_B1V[:, -1], rows, counts_BV, jnp.int32(0), n_top=n_top, penalize=penalize)
    return DecodeState(step=jnp.int32(0), cache=cache, token_B=token_B, logprob_B=logprob_B,
                       top_ids_BK=top_ids_BK, top_lp_BK=top_lp_BK,
                       length_B=jnp.zeros((b,), jnp.int32), done_B=rows.max_new_B <= 0,
                       stopped_B=jnp.zeros((b,), jnp.bool_), counts_BV=counts_BV)


@functools.partial(jax.jit, static_argnames=("cfg", "chunk", "n_top", "penalize"),
                   donate_argnames=("state",))
def decode_chunk(cfg: models.ModelConfig, params: Any, state: DecodeState, rows: Rows,
                 keep_B: jax.Array, *, chunk: int, n_top: int, penalize: bool
                 ) -> tuple[DecodeState, Chunk]:
    """Record up to `chunk` tokens per live row. Rows with keep_B False are finished first
    (their client left) and record nothing. Greedy rows report log_softmax(logits) at T = 1."""
    b = state.token_B.shape[0]
    state = state._replace(done_B=state.done_B | ~keep_B)
    buf = Chunk(tokens_BC=jnp.zeros((b, chunk), jnp.int32),
                logprobs_BC=jnp.zeros((b, chunk), jnp.float32),
                top_ids_BCK=jnp.zeros((b, chunk, n_top), jnp.int32),
                top_lp_BCK=jnp.zeros((b, chunk, n_top), jnp.float32))

    def cond(carry):
        i, s, _ = carry
        return (i < chunk) & ~jnp.all(s.done_B)

    def body(carry):
        i, s, out = carry
        live_B = ~s.done_B
        out = Chunk(tokens_BC=out.tokens_BC.at[:, i].set(jnp.where(live_B, s.token_B, 0)),
                    logprobs_BC=out.logprobs_BC.at[:, i].set(
                        jnp.where(live_B, s.logprob_B, 0.0)),
                    top_ids_BCK=out.top_ids_BCK.at[:, i].set(s.top_ids_BK),
                    top_lp_BCK=out.top_lp_BCK.at[:, i].set(s.top_lp_BK))
        length_B = s.length_B + live_B
        hit_B = live_B & jnp.any(s.token_B[:, None] == rows.stop_ids_BS, axis=-1)
        done_B = s.done_B | hit_B | (length_B >= rows.max_new_B)
        counts_BV = s.counts_BV
        if penalize:
            counts_BV = counts_BV.at[jnp.arange(b), s.token_B].add(live_B.astype(jnp.int32))
        # The forward for the next token is wasted on a row's last step; a cond around it
        # would cost more than it saves on the common path.
        logits_B1V, cache = models.forward_with_cache(
            cfg, params, s.token_B[:, None], jnp.ones((b, 1), jnp.int32), s.cache)
        token_B, logprob_B, top_ids_BK, top_lp_BK = _sample(
            logits_B1V[:, 0], rows, counts_BV, s.step + 1, n_top=n_top, penalize=penalize)
        s = DecodeState(step=s.step + 1, cache=cache, token_B=token_B, logprob_B=logprob_B,
                        top_ids_BK=top_ids_BK, top_lp_BK=top_lp_BK, length_B=length_B,
                        done_B=done_B, stopped_B=s.stopped_B | hit_B, counts_BV=counts_BV)
        return i + 1, s, out

    _, state, out = jax.lax.while_loop(cond, body, (jnp.int32(0), state, buf))
    return state, out
