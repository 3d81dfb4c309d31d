"""One jitted batched generation: left-padded prefill, then a KV-cache decode `lax.while_loop`.

Letters: B batch rows, T prompt length (left padded), N new-token budget, S stop ids per row.
The loop stops as soon as every row has hit a stop id or its own `max_new`; rows that finished
keep feeding a token but record nothing.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from orchestrax import models
from orchestrax.rollout.sampling import sample_next


class DecodeOut(NamedTuple):
    tokens_BN: jax.Array     # int32, valid for n < length_B
    logprobs_BN: jax.Array   # float32, log_softmax(logits / T) of each recorded token
    length_B: jax.Array      # int32 tokens generated (the stop token included)
    stopped_B: jax.Array     # bool: ended on a stop id (else on max_new)


class _Carry(NamedTuple):
    step: jax.Array
    cache: Any
    token_B: jax.Array
    logprob_B: jax.Array
    tokens_BN: jax.Array
    logprobs_BN: jax.Array
    length_B: jax.Array
    done_B: jax.Array
    stopped_B: jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "max_new"))
def generate_batch(cfg: models.ModelConfig, params: Any, prompt_BT: jax.Array, mask_BT: jax.Array,
                   *, temperature_B: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array,
                   seeds_B: jax.Array, max_new_B: jax.Array, stop_ids_BS: jax.Array,
                   max_new: int) -> DecodeOut:
    """Sample up to `max_new` tokens per row (row b stops at `max_new_B[b]` or a stop id).

    stop_ids_BS is padded with -1. Greedy rows (temperature 0) take the argmax and report
    log_softmax(logits) at T = 1.
    """
    b, t = prompt_BT.shape
    sample = functools.partial(sample_next, temperature_B=temperature_B, top_k_B=top_k_B,
                               top_p_B=top_p_B, seeds_B=seeds_B)
    cache = models.init_cache(cfg, b, t + max_new)
    logits_B1V, cache = models.forward_with_cache(cfg, params, prompt_BT, mask_BT, cache,
                                                  last_only=True)
    token_B, logprob_B = sample(logits_B1V[:, -1], step=jnp.int32(0))
    carry = _Carry(step=jnp.int32(0), cache=cache, token_B=token_B, logprob_B=logprob_B,
                   tokens_BN=jnp.zeros((b, max_new), jnp.int32),
                   logprobs_BN=jnp.zeros((b, max_new), jnp.float32),
                   length_B=jnp.zeros((b,), jnp.int32), done_B=max_new_B <= 0,
                   stopped_B=jnp.zeros((b,), jnp.bool_))

    def cond(c: _Carry):
        return (c.step < max_new) & ~jnp.all(c.done_B)

    def body(c: _Carry) -> _Carry:
        live_B = ~c.done_B
        tokens_BN = c.tokens_BN.at[:, c.step].set(jnp.where(live_B, c.token_B, 0))
        logprobs_BN = c.logprobs_BN.at[:, c.step].set(jnp.where(live_B, c.logprob_B, 0.0))
        length_B = c.length_B + live_B
        hit_B = live_B & jnp.any(c.token_B[:, None] == stop_ids_BS, axis=-1)
        done_B = c.done_B | hit_B | (length_B >= max_new_B)
        # The forward for the next token is wasted on the last step; a cond around it would
        # cost more than it saves on the common path.
        logits_B1V, cache = models.forward_with_cache(
            cfg, params, c.token_B[:, None], jnp.ones((b, 1), jnp.int32), c.cache)
        token_B, logprob_B = sample(logits_B1V[:, 0], step=c.step + 1)
        return _Carry(step=c.step + 1, cache=cache, token_B=token_B, logprob_B=logprob_B,
                      tokens_BN=tokens_BN, logprobs_BN=logprobs_BN, length_B=length_B,
                      done_B=done_B, stopped_B=c.stopped_B | hit_B)

    out = jax.lax.while_loop(cond, body, carry)
    return DecodeOut(tokens_BN=out.tokens_BN, logprobs_BN=out.logprobs_BN,
                     length_B=out.length_B, stopped_B=out.stopped_B)
