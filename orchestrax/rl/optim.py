"""AdamW with warmup + cosine/constant schedule and global-norm clipping (optax), optionally with
16-bit moments.

A bf16 moment cannot be stored by rounding to nearest: with b2 = 0.999 an update changes the
second moment by ~0.1%, below half a bf16 ulp (0.2-0.4%), so `nu` would never decay or grow
and Adam's step size would freeze at its first values. Stochastic rounding (round up with
probability equal to the dropped fraction) keeps every stored moment an unbiased estimate of the
fp32 one; the random bits come from the update count, so a run is reproducible. The moments are
updated in fp32 and this step's update uses the fp32 values; only what is kept is 16-bit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from orchestrax.rl.grpo_config import OptimizerConfig


def lr_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """Linear warmup 0 -> lr over warmup_steps, then constant or cosine down to lr·min_lr_ratio
    at total_steps."""
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
            decay_steps=cfg.total_steps, end_value=cfg.lr * cfg.min_lr_ratio)
    if cfg.warmup_steps == 0:
        return optax.constant_schedule(cfg.lr)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)],
        [cfg.warmup_steps])


def round_stochastic(x: jax.Array, dtype, key: jax.Array) -> jax.Array:
    """float32 `x` in bfloat16, rounded up or down with probabilities that make the result's
    expectation x (float32 and other dtypes: a plain cast)."""
    dtype = jnp.dtype(dtype)
    if dtype != jnp.bfloat16:
        return x.astype(dtype)
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    noise = jax.random.bits(key, x.shape, jnp.uint32) >> 16       # uniform in [0, 2^16)
    # bf16 is fp32's top 16 bits: adding noise below them then truncating rounds up with
    # probability (dropped bits) / 2^16.
    up = (bits + noise) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(up, jnp.float32).astype(jnp.bfloat16)


class LeanAdamState(NamedTuple):
    count: jax.Array           # int32 updates so far
    mu: optax.Updates
    nu: optax.Updates


def scale_by_lean_adam(b1: float, b2: float, eps: float, mu_dtype, nu_dtype,
                       seed: int = 0) -> optax.GradientTransformation:
    """`optax.scale_by_adam` with each moment kept in its own dtype (bf16 by stochastic
    rounding); the arithmetic is float32."""
    mu_dtype, nu_dtype = jnp.dtype(mu_dtype), jnp.dtype(nu_dtype)

    def init(params):
        return LeanAdamState(count=jnp.zeros((), jnp.int32),
                             mu=jax.tree.map(lambda p: jnp.zeros(p.shape, mu_dtype), params),
                             nu=jax.tree.map(lambda p: jnp.zeros(p.shape, nu_dtype), params))

    def update(updates, state, params=None):
        del params
        count = state.count + 1
        c = count.astype(jnp.float32)
        leaves, treedef = jax.tree.flatten(updates)
        key = jax.random.fold_in(jax.random.key(seed), count)
        out, mus, nus = [], [], []
        for i, (g, m, v) in enumerate(zip(leaves, treedef.flatten_up_to(state.mu),
                                          treedef.flatten_up_to(state.nu))):
            g32 = g.astype(jnp.float32)
            m32 = b1 * m.astype(jnp.float32) + (1 - b1) * g32
            v32 = b2 * v.astype(jnp.float32) + (1 - b2) * g32 * g32
            m_hat, v_hat = m32 / (1 - b1 ** c), v32 / (1 - b2 ** c)
            out.append((m_hat / (jnp.sqrt(v_hat) + eps)).astype(g.dtype))
            k_mu, k_nu = jax.random.split(jax.random.fold_in(key, i))
            mus.append(round_stochastic(m32, mu_dtype, k_mu))
            nus.append(round_stochastic(v32, nu_dtype, k_nu))
        unflat = lambda xs: jax.tree.unflatten(treedef, xs)  # noqa: E731
        return unflat(out), LeanAdamState(count=count, mu=unflat(mus), nu=unflat(nus))

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Clip by global norm (if set), then AdamW with the schedule; decay applies to every leaf.
    Train fp32 params: an lr-1e-6 step is below half a bf16 ulp of a ~0.02 weight, so bf16
    params round it away (tests/test_rl_precision.py). A bf16 nu_dtype takes the lean Adam
    above (both moments in their own dtypes); otherwise optax's adamw."""
    if cfg.nu_dtype == "bfloat16":
        adamw = optax.chain(
            scale_by_lean_adam(cfg.b1, cfg.b2, cfg.eps, cfg.mu_dtype or jnp.float32,
                               cfg.nu_dtype),
            optax.add_decayed_weights(cfg.weight_decay),
            optax.scale_by_learning_rate(lr_schedule(cfg)))
    else:
        adamw = optax.adamw(lr_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                            weight_decay=cfg.weight_decay,
                            mu_dtype=None if cfg.mu_dtype is None else jnp.dtype(cfg.mu_dtype))
    if cfg.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
