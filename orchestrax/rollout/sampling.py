"""Per-row next-token sampling: temperature, top-k, top-p, greedy, presence/frequency penalties
and per-row seeds.

Letters: B batch rows, V vocabulary. Every row carries its own settings so one batch can mix
greedy and sampled requests. The returned logprob is log_softmax(logits / T) of the chosen token
over the full (unfiltered) vocabulary, SGLang's convention; greedy rows use T = 1. Penalties,
when a row sets them, are applied to the logits first, so logprobs are of the distribution that
was sampled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite so a fully masked row cannot produce NaN


def filter_top_k_top_p(scaled_BV: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array) -> jax.Array:
    """Set logits outside each row's top-k and top-p nucleus to NEG_INF.

    top_k <= 0 means no top-k; top-p is measured on the full (temperature-scaled) distribution,
    as SGLang does, and always keeps the most likely token.
    """
    v = scaled_BV.shape[-1]
    sorted_BV = -jnp.sort(-scaled_BV, axis=-1)
    k_B = jnp.where(top_k_B <= 0, v, jnp.minimum(top_k_B, v))
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
    keep_p_B = jnp.sum(mass_before_BV < top_p_B[:, None], axis=-1)
    keep_B = jnp.clip(jnp.minimum(k_B, keep_p_B), 1, v)
    thresh_B1 = jnp.take_along_axis(sorted_BV, (keep_B - 1)[:, None], axis=-1)
    return jnp.where(scaled_BV >= thresh_B1, scaled_BV, NEG_INF)


def row_keys(seeds_B: jax.Array, step: jax.Array) -> jax.Array:
    """One key per row from (its seed, decode step): a request's draws do not depend on which
    other requests share its batch. `step` is one index for all rows, or one per row [B] (the
    continuous engine counts each row's tokens on its own)."""
    step_B = jnp.broadcast_to(jnp.asarray(step, jnp.int32), seeds_B.shape)
    return jax.vmap(lambda s, j: jax.random.fold_in(jax.random.key(s), j))(seeds_B, step_B)


def apply_penalties(logits_BV: jax.Array, counts_BV: jax.Array, presence_B: jax.Array,
                    frequency_B: jax.Array) -> jax.Array:
    """OpenAI's presence/frequency penalties on raw logits: logit[v] -= frequency * count[v] +
    presence * (count[v] > 0), where count[v] is how often token v was generated so far in
    this row (prompt tokens do not count, as in SGLang and vLLM)."""
    counts_BV = counts_BV.astype(jnp.float32)
    return (logits_BV - frequency_B[:, None] * counts_BV
            - presence_B[:, None] * (counts_BV > 0).astype(jnp.float32))


def filters(top_k_B, top_p_B, vocab: int):
    """Which rows ask for top-k or top-p (bool [B]); numpy or jax arrays alike, so the host
    decides from the settings it dispatches what the device computes (`filtering`)."""
    return ((top_k_B > 0) & (top_k_B < vocab)) | (top_p_B < 1.0)


def sample_next(logits_BV: jax.Array, *, temperature_B: jax.Array, top_k_B: jax.Array,
                top_p_B: jax.Array, seeds_B: jax.Array, step: jax.Array, filtering: bool = True
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """float32 [B, V] logits -> (int32 token [B], float32 logprob [B], float32 logp [B, V]).

    temperature 0 = greedy. logp_BV is log_softmax(logits / T), the distribution the logprobs
    (and any top logprobs) are read from. Rows that ask for top-k/top-p (`filters`) sample
    from their filtered logits, the others from all of them. `filtering=False` promises that
    no row whose token is used asks: the O(V log V) sort is left out of the program. It is
    static, known to the caller, so the device never asks the host which way to go.
    """
    logits_BV = logits_BV.astype(jnp.float32)
    greedy_B = temperature_B <= 0
    t_B = jnp.where(greedy_B, 1.0, temperature_B)
    scaled_BV = logits_BV / t_B[:, None]
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    v = logits_BV.shape[-1]
    filtered_BV = scaled_BV
    if filtering:
        filtered_BV = jnp.where(filters(top_k_B, top_p_B, v)[:, None],
                                filter_top_k_top_p(scaled_BV, top_k_B, top_p_B), scaled_BV)
    gumbel_BV = jax.vmap(lambda k: jax.random.gumbel(k, (v,), jnp.float32))(
        row_keys(seeds_B, step))
    sampled_B = jnp.argmax(filtered_BV + gumbel_BV, axis=-1)
    token_B = jnp.where(greedy_B, jnp.argmax(logits_BV, axis=-1), sampled_B).astype(jnp.int32)
    logprob_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
    return token_B, logprob_B, logp_BV


def sample_step(logits_BV: jax.Array, *, temperature_B: jax.Array, top_k_B: jax.Array,
                top_p_B: jax.Array, seeds_B: jax.Array, step: jax.Array, n_top: int,
                counts_BV: jax.Array | None = None, presence_B: jax.Array | None = None,
                frequency_B: jax.Array | None = None, filtering: bool = True
                ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One decode step's draw of the engine (prefill's last position and each decode step):
    penalties when `counts_BV` is given, then `sample_next` (`filtering` as there), then the
    `n_top` most likely ids.

    Returns (int32 token [B], float32 logprob [B], int32 top ids [B, n_top], float32 top
    logprobs [B, n_top]); the top logprobs are read from the same log_softmax(logits / T).
    """
    if counts_BV is not None:
        logits_BV = apply_penalties(logits_BV.astype(jnp.float32), counts_BV, presence_B,
                                    frequency_B)
    token_B, logprob_B, logp_BV = sample_next(
        logits_BV, temperature_B=temperature_B, top_k_B=top_k_B, top_p_B=top_p_B,
        seeds_B=seeds_B, step=step, filtering=filtering)
    if n_top:
        top_lp_BK, top_ids_BK = jax.lax.top_k(logp_BV, n_top)
    else:
        b = logits_BV.shape[0]
        top_lp_BK, top_ids_BK = jnp.zeros((b, 0), jnp.float32), jnp.zeros((b, 0), jnp.int32)
    return token_B, logprob_B, top_ids_BK.astype(jnp.int32), top_lp_BK
