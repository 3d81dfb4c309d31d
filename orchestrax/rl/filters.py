"""Sample filters as static-shape masks (jit-friendly), plus counters for metrics.

Paper §3.2 stabilisation: drop a task's group when its reward std < 0.1 (homogeneity), drop
rollouts with malformed tool calls (format) and rollouts without a usable final answer (invalid).
A dropped rollout keeps its slot in the batch with sample_mask 0, so it costs no gradient.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from orchestrax.rl import contracts
from orchestrax.rl.advantages import group_mean_std


def has_final_answer(answer: str | None) -> bool:
    """An answer counts when it has a non-blank character; an empty or whitespace-only final
    answer is no answer (the paper filters both)."""
    return answer is not None and answer.strip() != ""


@jax.jit
def homogeneity_mask(R: chex.Array, min_std: float = 0.1, mask: chex.Array | None = None
                     ) -> jax.Array:
    """bool [Q]: True where the group's population reward std (over `mask`ed members) ≥ min_std."""
    _, std = group_mean_std(R, mask, ddof=0)
    return std[:, 0] >= min_std


def validity_mask(format_errors: chex.Array | None = None, has_answer: chex.Array | None = None,
                  shape: tuple[int, int] | None = None) -> jax.Array:
    """bool [Q,G]: no format errors and a final answer present (either input may be omitted)."""
    if format_errors is None and has_answer is None:
        if shape is None:
            raise ValueError("validity_mask needs format_errors, has_answer or shape")
        return jnp.ones(shape, bool)
    ok = True
    if format_errors is not None:
        ok = jnp.asarray(format_errors) == 0
    if has_answer is not None:
        ok = ok & jnp.asarray(has_answer, bool)
    return jnp.asarray(ok, bool)


def sample_mask(R: chex.Array, *, format_errors: chex.Array | None = None,
                has_answer: chex.Array | None = None, min_std: float = 0.1
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(keep [Q,G] bool, counters). R must already be 0 / excluded for invalid rollouts.

    Homogeneity is judged on the valid members of each group only.
    """
    contracts.check_rank("sample_mask", "R", R, 2, "[Q,G]")
    R = jnp.asarray(R, jnp.float32)
    Q, G = R.shape
    for name, x in (("format_errors", format_errors), ("has_answer", has_answer)):
        if x is not None:
            contracts.check_shape("sample_mask", name, x, (Q, G), f"[Q,G] = {R.shape} like R")
    valid = validity_mask(format_errors, has_answer, shape=(Q, G))
    group_ok = homogeneity_mask(R, min_std, valid)
    keep = valid & group_ok[:, None]
    i32 = jnp.int32
    counters = {
        "filter/format_dropped": (jnp.sum(jnp.asarray(format_errors) > 0).astype(i32)
                                  if format_errors is not None else jnp.zeros((), i32)),
        "filter/invalid_dropped": (jnp.sum(~jnp.asarray(has_answer, bool)).astype(i32)
                                   if has_answer is not None else jnp.zeros((), i32)),
        "filter/homogeneous_groups": jnp.sum(~group_ok).astype(i32),
        "filter/homogeneous_dropped": jnp.sum(valid & ~group_ok[:, None]).astype(i32),
        "filter/kept": jnp.sum(keep).astype(i32),
        "filter/kept_fraction": jnp.mean(keep.astype(jnp.float32)),
    }
    return keep, counters
