"""Shardings read from the parameters' own logical-axis annotations (`nnx.Param(...,
sharding=names)` in decoder.py), mapped to mesh axes by parallel/rules.py. Works for any NNX
module that annotates its params the same way."""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from orchestrax import parallel
from orchestrax.models.configs import ModelConfig
from orchestrax.models.decoder import abstract_decoder


def logical_axes(module: nnx.Module) -> dict[str, Any]:
    """Pure tree (like the module's params) with each param's tuple of logical axis names."""
    specs = nnx.get_partition_spec(nnx.state(module, nnx.Param))
    return jax.tree.map(tuple, nnx.to_pure_dict(specs),
                        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def module_shardings(module: nnx.Module, mesh: Mesh,
                     rules: parallel.Rules = parallel.DEFAULT_RULES) -> dict[str, Any]:
    """NamedSharding per param (pure tree); raises, naming the param and axes, when a mesh axis
    does not divide the dimension it would shard. `module` may be abstract (nnx.eval_shape)."""
    shapes = nnx.to_pure_dict(nnx.state(module, nnx.Param))
    return parallel.tree_shardings(shapes, logical_axes(module), mesh, rules)


def param_logical_axes(cfg: ModelConfig) -> dict[str, Any]:
    return logical_axes(abstract_decoder(cfg))


def param_shardings(cfg: ModelConfig, mesh: Mesh,
                    rules: parallel.Rules = parallel.DEFAULT_RULES) -> dict[str, Any]:
    return module_shardings(abstract_decoder(cfg), mesh, rules)


def shard_params(cfg: ModelConfig, params: Any, mesh: Mesh,
                 rules: parallel.Rules = parallel.DEFAULT_RULES) -> Any:
    return jax.device_put(params, param_shardings(cfg, mesh, rules))


def cache_logical_axes() -> dict[str, Any]:
    """The KV cache (model.init_cache) is no parameter: its names are stated here."""
    kv = ("layers", "batch", "seq", "kv_heads", "head_dim")
    return {"k": kv, "v": kv, "mask": ("batch", "seq"), "index": ()}
