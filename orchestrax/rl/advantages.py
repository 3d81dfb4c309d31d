"""Per-rollout advantages from group rewards. R and masks are [Q,G] (Q tasks, G rollouts each).

`mask` marks rollouts that count (filtered ones are excluded from the group statistics and get
advantage 0). Every estimator is pure and jit-friendly.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from orchestrax.rl import contracts
from orchestrax.checks import one_of
from orchestrax.rl.grpo_config import ADV_ESTIMATORS


def _prep(R: chex.Array, mask: chex.Array | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    contracts.check_rank("advantages", "R", R, 2, "[Q,G] rewards")
    R = jnp.asarray(R, jnp.float32)
    if mask is not None:
        contracts.check_shape("advantages", "mask", mask, R.shape,
                              f"[Q,G] = {R.shape}, the shape of R")
    m = jnp.ones(R.shape, bool) if mask is None else jnp.asarray(mask, bool)
    n = jnp.sum(m, axis=1, keepdims=True).astype(jnp.float32)
    return R, m, n


@functools.partial(jax.jit, static_argnames="ddof")
def group_mean_std(R: chex.Array, mask: chex.Array | None = None, ddof: int = 0
                   ) -> tuple[jax.Array, jax.Array]:
    """Masked per-group mean and std ([Q,1] each); std is 0 for groups with ≤ ddof members."""
    R, m, n = _prep(R, mask)
    mean = jnp.sum(jnp.where(m, R, 0.0), axis=1, keepdims=True) / jnp.maximum(n, 1.0)
    ss = jnp.sum(jnp.where(m, (R - mean) ** 2, 0.0), axis=1, keepdims=True)
    std = jnp.sqrt(ss / jnp.maximum(n - ddof, 1.0))
    return mean, jnp.where(n > ddof, std, 0.0)


def _finish(A: jax.Array, m: jax.Array, clip: float | None) -> jax.Array:
    if clip is not None:
        A = jnp.clip(A, -clip, clip)
    return jnp.where(m, A, 0.0)


@functools.partial(jax.jit, static_argnames=("ddof", "clip"))
def group_advantages(R: chex.Array, eps: float = 1e-6, ddof: int = 0, clip: float | None = None,
                     mask: chex.Array | None = None) -> jax.Array:
    """GRPO: (R − mean_g) / (std_g + eps), std with `ddof` (0: population), optional ±clip."""
    R, m, _ = _prep(R, mask)
    mean, std = group_mean_std(R, m, ddof)
    return _finish((R - mean) / (std + eps), m, clip)


@functools.partial(jax.jit, static_argnames="clip")
def dr_grpo_advantages(R: chex.Array, clip: float | None = None,
                       mask: chex.Array | None = None) -> jax.Array:
    """Dr.GRPO: R − mean_g (no std division, so easy/hard groups are not up-weighted)."""
    R, m, _ = _prep(R, mask)
    mean, _ = group_mean_std(R, m)
    return _finish(R - mean, m, clip)


@functools.partial(jax.jit, static_argnames="clip")
def rloo_advantages(R: chex.Array, clip: float | None = None,
                    mask: chex.Array | None = None) -> jax.Array:
    """RLOO: R_i − mean of the other members of the group (0 for a group of one)."""
    R, m, n = _prep(R, mask)
    total = jnp.sum(jnp.where(m, R, 0.0), axis=1, keepdims=True)
    loo = (total - R) / jnp.maximum(n - 1.0, 1.0)
    return _finish(jnp.where(n > 1, R - loo, 0.0), m, clip)


def compute_advantages(R: chex.Array, estimator: str = "grpo", *, eps: float = 1e-6,
                       ddof: int = 0, clip: float | None = None,
                       mask: chex.Array | None = None) -> jax.Array:
    """Dispatch by name: "grpo", "dr_grpo" or "rloo". [Q,G] -> [Q,G]."""
    one_of("compute_advantages", "estimator", estimator, ADV_ESTIMATORS)
    if estimator == "grpo":
        return group_advantages(R, eps=eps, ddof=ddof, clip=clip, mask=mask)
    if estimator == "dr_grpo":
        return dr_grpo_advantages(R, clip=clip, mask=mask)
    return rloo_advantages(R, clip=clip, mask=mask)
