"""Logical axis names of every parameter and cache tensor (the mesh mapping is in parallel/rules)."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from orchestrax import parallel
from orchestrax.models.configs import ModelConfig


def param_logical_axes(cfg: ModelConfig) -> dict[str, Any]:
    """Same tree structure as `init_params(cfg)`, with a tuple of logical names per leaf."""
    layers = {
        "attn_norm": ("layers", "norm"),
        "q": ("layers", "embed", "heads", "head_dim"),
        "k": ("layers", "embed", "kv_heads", "head_dim"),
        "v": ("layers", "embed", "kv_heads", "head_dim"),
        "o": ("layers", "heads", "head_dim", "embed"),
        "mlp_norm": ("layers", "norm"),
        "gate": ("layers", "embed", "mlp"),
        "up": ("layers", "embed", "mlp"),
        "down": ("layers", "mlp", "embed"),
    }
    if cfg.qk_norm:
        layers |= {"q_norm": ("layers", "head_dim"), "k_norm": ("layers", "head_dim")}
    tree = {"embed": ("vocab", "embed"), "layers": layers, "final_norm": ("norm",)}
    if not cfg.tie_embeddings:
        tree["lm_head"] = ("embed", "vocab")
    return tree


def cache_logical_axes() -> dict[str, Any]:
    kv = ("layers", "batch", "seq", "kv_heads", "head_dim")
    return {"k": kv, "v": kv, "mask": ("batch", "seq"), "index": ()}


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules: parallel.Rules = parallel.DEFAULT_RULES):
    """NamedSharding per parameter; raises (naming the parameter and axes) when a mesh axis does
    not divide the dimension it would shard."""
    from orchestrax.models.model import init_params  # local: model imports this module
    shapes = jax.eval_shape(lambda: init_params(cfg, seed=0))
    return parallel.tree_shardings(shapes, param_logical_axes(cfg), mesh, rules)


def shard_params(cfg: ModelConfig, params: Any, mesh: Mesh,
                 rules: parallel.Rules = parallel.DEFAULT_RULES) -> Any:
    return jax.device_put(params, param_shardings(cfg, mesh, rules))
