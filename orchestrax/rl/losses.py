"""Clipped-surrogate policy loss, KL estimators, aggregation modes and the SFT loss.

Letters: B sequences, T tokens. Every [B,T] array is aligned with the tokens: position t holds
the quantity for token t (predicted from tokens < t). `mask` is 1 on policy tokens only.
Losses are minimised; the surrogate is negated accordingly.

Aggregation is written as Σ_bt loss_bt · w_bt with weights w from the *whole* (mini)batch mask,
so splitting a batch into micro-batches and summing their losses reproduces the full-batch loss
exactly (see `token_weights`).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from orchestrax.rl import contracts
from orchestrax.checks import one_of
from orchestrax.rl.grpo_config import AGG_MODES, KL_ESTIMATORS

Metrics = dict[str, jax.Array]
_sg = jax.lax.stop_gradient


def token_weights(mask_BT: chex.Array, agg: str = "token-mean", norm_len: int | None = None,
                  rollout_ids: chex.Array | None = None) -> jax.Array:
    """[B,T] float32 weights w with loss = Σ loss_bt · w_bt.

    token-mean: 1 / (#tokens in batch). seq-mean-token-mean: 1 / (#tokens in seq · #seqs), #seqs
    counting sequences with at least one policy token.
    seq-mean-token-sum-norm (Dr.GRPO): 1 / (norm_len · B), a constant: norm_len is the configured
    maximum length and B every row of the batch, filtered or not (its configured Q·G), so
    filtering samples never changes the per-token scale.
    rollout-turn-token-mean (Flow-GRPO): rows are turns, `rollout_ids` [B] names each row's
    rollout (default: each row its own); each rollout with a policy token weighs 1 / #rollouts,
    each of its turns 1 / #turns of it, each token 1 / #tokens of its turn.
    """
    one_of("policy_loss", "agg", agg, AGG_MODES)
    _check_norm_len("policy_loss", agg, norm_len)
    contracts.check_rank("token_weights", "mask", mask_BT, 2, "[B,T]")
    m = jnp.asarray(mask_BT, jnp.float32)
    n_b = jnp.sum(m, axis=-1, keepdims=True)
    if agg == "token-mean":
        return m / jnp.maximum(jnp.sum(n_b), 1.0)
    if agg == "seq-mean-token-sum-norm":
        return m / (float(norm_len) * m.shape[0])
    per_token = m / jnp.maximum(n_b, 1.0)
    live_B = n_b[:, 0] > 0
    if agg == "seq-mean-token-mean":
        return per_token / jnp.maximum(jnp.sum(live_B), 1).astype(jnp.float32)
    ids_B = (jnp.arange(m.shape[0]) if rollout_ids is None else jnp.asarray(rollout_ids))
    contracts.check_shape("token_weights", "rollout_ids", ids_B, (m.shape[0],),
                          f"[B] = ({m.shape[0]},), one per row of mask")
    # turns_B: live turns of each row's rollout; Σ_b 1/turns_b over live rows = #rollouts.
    same_BB = (ids_B[:, None] == ids_B[None, :]) & live_B[None, :]
    turns_B = jnp.maximum(jnp.sum(same_BB, axis=1), 1).astype(jnp.float32)
    rollouts = jnp.maximum(jnp.sum(jnp.where(live_B, 1.0 / turns_B, 0.0)), 1.0)
    return per_token / (turns_B * rollouts)[:, None]


def _check_norm_len(owner: str, agg: str, norm_len: int | None) -> None:
    """seq-mean-token-sum-norm divides by a constant: the batch's padded length would change the
    per-token gradient scale from step to step with the longest trajectory."""
    if agg == "seq-mean-token-sum-norm" and (norm_len is None or norm_len < 1):
        raise ValueError(f"{owner}.norm_len={norm_len!r}; agg='seq-mean-token-sum-norm' needs a "
                         "fixed int >= 1 (e.g. the maximum response length), not the padded "
                         "length of each batch")


def kl_penalty(logprobs: chex.Array, ref_logprobs: chex.Array, kl: str = "k3") -> jax.Array:
    """Per-token estimate of KL(π‖π_ref) from samples of π: k1 = logπ − logπ_ref,
    k3 = e^d − d − 1 with d = logπ_ref − logπ (unbiased, ≥ 0), mse = ½(logπ − logπ_ref)²."""
    one_of("policy_loss", "kl", kl, KL_ESTIMATORS)
    contracts.check_shape("kl_penalty", "ref_logprobs", ref_logprobs, jnp.shape(logprobs),
                          f"{jnp.shape(logprobs)}, the shape of logprobs")
    diff = logprobs - ref_logprobs
    if kl == "k1":
        return diff
    if kl == "mse":
        return 0.5 * diff ** 2
    d = jnp.clip(-diff, -20.0, 20.0)              # exp overflow guard
    return jnp.exp(d) - d - 1.0


def _check_inputs(owner: str, logprobs: chex.Array, mask: chex.Array,
                  advantages: chex.Array | None = None, **like_logprobs: chex.Array | None
                  ) -> None:
    """logprobs float [B,T]; mask and every given `like_logprobs` array [B,T] too (the ones named
    *logprobs floats); advantages [B]. Runs at trace time under jit."""
    contracts.check_rank(owner, "logprobs", logprobs, 2, "[B,T]")
    contracts.check_floating(owner, "logprobs", logprobs)
    B_T = tuple(jnp.shape(logprobs))
    for name, x in (("mask", mask), *like_logprobs.items()):
        if x is None:
            continue
        contracts.check_shape(owner, name, x, B_T, f"[B,T] = {B_T}, the shape of logprobs")
        if name.endswith("logprobs"):
            contracts.check_floating(owner, name, x)
    if advantages is not None:
        contracts.check_shape(owner, "advantages", advantages, B_T[:1],
                              f"[B] = ({B_T[0]},), one per row of logprobs")


def policy_loss_weighted(logprobs: chex.Array, old_logprobs: chex.Array, advantages: chex.Array,
                         mask: chex.Array, weights: chex.Array, metric_weights: chex.Array, *,
                         clip_low: float = 0.2, clip_high: float = 0.28,
                         dual_clip: float | None = 10.0, log_ratio_clamp: float = 20.0,
                         ref_logprobs: chex.Array | None = None, kl_coef: float = 0.0,
                         kl: str = "k3", sampler_logprobs: chex.Array | None = None,
                         tis_cap: float | None = None, entropy: chex.Array | None = None
                         ) -> tuple[jax.Array, Metrics]:
    """`policy_loss` with explicit loss weights and token-mean metric weights (both [B,T]).

    Metrics are Σ x·metric_weights (additive over micro-batches) except keys ending in "_max".
    """
    _check_inputs("policy_loss", logprobs, mask, advantages, old_logprobs=old_logprobs,
                  weights=weights, metric_weights=metric_weights, ref_logprobs=ref_logprobs,
                  sampler_logprobs=sampler_logprobs, entropy=entropy)
    m = jnp.asarray(mask, jnp.float32)
    on = m > 0
    # Masked slots may hold anything (−inf padding, NaN from dropped rows); zero them first so
    # neither the loss nor its gradient (0·NaN) sees them.
    clean = lambda x: None if x is None else jnp.where(on, x, 0.0)  # noqa: E731
    old_logprobs, ref_logprobs, sampler_logprobs = map(
        clean, (old_logprobs, ref_logprobs, sampler_logprobs))
    A = jnp.where(jnp.any(on, axis=-1), jnp.asarray(advantages, jnp.float32), 0.0)[:, None]
    log_ratio = jnp.clip(logprobs - old_logprobs, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    pg_unclipped = -A * ratio
    pg_clipped = -A * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = jnp.maximum(pg_unclipped, pg_clipped)
    dual_active = jnp.zeros_like(pg, bool)
    if dual_clip is not None:
        # For A < 0 the clip above leaves the loss unbounded in the ratio; cap it at −c·A.
        dual_active = (A < 0) & (pg > -A * dual_clip)
        pg = jnp.where(A < 0, jnp.minimum(pg, -A * dual_clip), pg)
    metrics: Metrics = {}
    if sampler_logprobs is not None:
        # Trainer (behaviour params, = old_logprobs when recomputed) vs sampler on the same
        # tokens: the train/inference mismatch, independent of how far the update has moved.
        gap = jnp.abs(old_logprobs - sampler_logprobs) * m
        metrics["sampler_gap"] = jnp.sum(gap * metric_weights)
        metrics["sampler_gap_max"] = jnp.max(gap)
        if tis_cap is not None:
            # Truncated importance weight π_old / π_sampler corrects the trainer–sampler mismatch.
            tis = _sg(jnp.minimum(jnp.exp(jnp.clip(old_logprobs - sampler_logprobs, -20, 20)),
                                  tis_cap))
            pg = pg * tis
            metrics["tis_weight"] = jnp.sum(tis * metric_weights)
    per_token = pg
    if ref_logprobs is not None:
        kl_BT = kl_penalty(logprobs, ref_logprobs, kl)
        per_token = per_token + kl_coef * kl_BT
        metrics["kl"] = _sg(jnp.sum(kl_BT * metric_weights))
    loss = jnp.sum(jnp.where(on, per_token, 0.0) * weights)
    frac = lambda b: jnp.sum(jnp.where(on & b, 1.0, 0.0) * metric_weights)  # noqa: E731
    sl = _sg(log_ratio)
    metrics.update({
        "loss": _sg(loss),
        "pg_loss": _sg(jnp.sum(jnp.where(on, pg, 0.0) * weights)),
        "clip_frac_high": frac((A > 0) & (_sg(ratio) > 1.0 + clip_high)),
        "clip_frac_low": frac((A < 0) & (_sg(ratio) < 1.0 - clip_low)),
        "dual_clip_frac": frac(_sg(dual_active)),
        "approx_kl": jnp.sum((jnp.exp(sl) - 1.0 - sl) * metric_weights),   # k3 of KL(old‖new)
        "ratio_mean": jnp.sum(jnp.exp(sl) * metric_weights),
        "log_ratio_absmax_max": jnp.max(jnp.abs(sl) * m),
        "policy_tokens": jnp.sum(m),
    })
    if entropy is not None:
        metrics["entropy"] = _sg(jnp.sum(jnp.where(on, entropy, 0.0) * metric_weights))
    return loss, metrics


def policy_loss(logprobs: chex.Array, old_logprobs: chex.Array, advantages: chex.Array,
                mask: chex.Array, clip_low: float = 0.2, clip_high: float = 0.28,
                agg: str = "token-mean", ref_logprobs: chex.Array | None = None,
                kl_coef: float = 0.0, kl: str = "k3", *, dual_clip: float | None = 10.0,
                log_ratio_clamp: float = 20.0, norm_len: int | None = None,
                sampler_logprobs: chex.Array | None = None, tis_cap: float | None = None,
                entropy: chex.Array | None = None, rollout_ids: chex.Array | None = None
                ) -> tuple[jax.Array, Metrics]:
    """Clipped-surrogate GRPO/PPO loss (to minimise) and metrics.

    logprobs, old_logprobs, mask, ref/sampler logprobs, entropy: [B,T]; advantages: [B].
    Per token: r = exp(clamp(logp − old)), loss = max(−A·r, −A·clip(r, 1−clip_low, 1+clip_high)),
    capped at −A·dual_clip when A < 0, times the truncated IS weight min(π_old/π_sampler, tis_cap)
    when both are given, plus kl_coef·KL(π‖π_ref); aggregated by `agg` (`rollout_ids` [B]: the
    rollout of each row, for agg="rollout-turn-token-mean").
    """
    one_of("policy_loss", "agg", agg, AGG_MODES)
    one_of("policy_loss", "kl", kl, KL_ESTIMATORS)
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    w = token_weights(mask, agg, norm_len, rollout_ids)
    mw = token_weights(mask, "token-mean")
    return policy_loss_weighted(
        logprobs, old_logprobs, advantages, mask, w, mw, clip_low=clip_low,
        clip_high=clip_high, dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp,
        ref_logprobs=ref_logprobs, kl_coef=kl_coef, kl=kl, sampler_logprobs=sampler_logprobs,
        tis_cap=tis_cap, entropy=entropy)


def sft_loss(logprobs: chex.Array, mask: chex.Array, agg: str = "token-mean",
             norm_len: int | None = None, weights: chex.Array | None = None
             ) -> tuple[jax.Array, Metrics]:
    """Masked token cross-entropy −Σ logp·w on the GRPO batch format ([B,T] each)."""
    _check_inputs("sft_loss", logprobs, mask, weights=weights)
    w = token_weights(mask, agg, norm_len) if weights is None else weights
    loss = -jnp.sum(logprobs * w)
    return loss, {"loss": _sg(loss), "policy_tokens": jnp.sum(jnp.asarray(mask, jnp.float32))}
