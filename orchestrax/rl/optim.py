"""AdamW with warmup + cosine/constant schedule and global-norm clipping (optax)."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from orchestrax.rl.config import OptimizerConfig


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


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Clip by global norm (if set), then AdamW with the schedule; decay applies to every leaf.
    Train fp32 params: an lr-1e-6 step is below half a bf16 ulp of a ~0.02 weight, so bf16
    params round it away (tests/test_rl_precision.py)."""
    adamw = optax.adamw(lr_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay,
                        mu_dtype=None if cfg.mu_dtype is None else jnp.dtype(cfg.mu_dtype))
    if cfg.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
