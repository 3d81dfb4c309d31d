"""The train state (params, optimizer state, counters) and where its leaves and the batch live."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orchestrax import models, parallel
from orchestrax.rl.grpo_config import OptimizerConfig
from orchestrax.rl.optim import make_optimizer

Batch = dict[str, jax.Array]
COUNTERS = ("train_steps", "updates", "skipped_updates", "dropped_samples")


class TrainState(NamedTuple):
    params: Any
    opt_state: Any
    step: jax.Array                     # int32: train_step calls so far
    counters: dict[str, jax.Array]      # int32 scalars, see COUNTERS


def init_state(params: Any, opt_cfg: OptimizerConfig) -> TrainState:
    zero = lambda: jnp.zeros((), jnp.int32)  # noqa: E731 - distinct buffers, the state is donated
    return TrainState(params=params, opt_state=make_optimizer(opt_cfg).init(params), step=zero(),
                      counters={k: zero() for k in COUNTERS})


def state_shardings(model_cfg: models.ModelConfig, opt_cfg: OptimizerConfig, mesh: Mesh,
                    rules: parallel.Rules = parallel.DEFAULT_RULES) -> TrainState:
    """Params and their optimizer moments by `models.param_shardings`; scalars replicated."""
    p_sh = models.param_shardings(model_cfg, mesh, rules)
    rep = NamedSharding(mesh, PartitionSpec())
    opt = make_optimizer(opt_cfg)
    p_shapes = jax.eval_shape(lambda: models.init_params(model_cfg, seed=0))
    o_shapes = jax.eval_shape(opt.init, p_shapes)
    o_sh = optax.tree_map_params(opt, lambda _, s: s, o_shapes, p_sh,
                                 transform_non_params=lambda _: rep)
    return TrainState(params=p_sh, opt_state=o_sh, step=rep, counters={k: rep for k in COUNTERS})


def batch_shardings(batch: Batch, mesh: Mesh, rules: parallel.Rules = parallel.DEFAULT_RULES
                    ) -> dict[str, NamedSharding]:
    """Every batch array split along its leading (batch) dim over the rules' batch axes."""
    def one(x):
        spec = parallel.logical_to_spec(("batch",) + (None,) * (jnp.ndim(x) - 1), rules, mesh)
        return NamedSharding(mesh, spec)
    return {k: one(v) for k, v in batch.items()}


def data_parallel_degree(mesh: Mesh, rules: parallel.Rules) -> tuple[int, tuple[str, ...]]:
    """(devices the batch dim is split over, the mesh axes doing it)."""
    spec = parallel.logical_to_spec(("batch",), rules, mesh)[0]
    axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    n = 1
    for a in axes:
        n *= mesh.shape[a]
    return n, axes
