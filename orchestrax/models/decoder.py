"""The decoder's parameters as a Flax NNX module: what exists, its init, its logical sharding.

Split-once pattern (the flax gemma example's): build or `nnx.eval_shape` the module, take
`nnx.split(module)` once outside jit, and pass the pure state through every jitted function.
`nnx.to_pure_dict` of that state is the params tree the functional model (model.py), HF I/O and
Orbax checkpoints use: `{"embed", "layers": {"q", ...}, "final_norm"[, "lm_head"]}`.

Each `nnx.Param` carries logical axis names (`sharding=`); parallel/rules.py maps them to mesh
axes (models/sharding.py reads them back). Layers are stacked on a leading "layers" axis at
construction, one random key per weight for all layers, so init values equal the functional
init's of earlier versions and the layer scan in model.py runs over the pure state unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from orchestrax.models import model
from orchestrax.models.configs import ModelConfig

Params = model.Params


class Layers(nnx.Module):
    """All decoder blocks' weights, each [L, ...]."""

    def __init__(self, cfg: ModelConfig, normal, ones):
        d, f, h, n, k, nl = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim,
                             cfg.num_heads, cfg.num_kv_heads, cfg.num_layers)
        self.attn_norm = ones(("layers", "norm"), nl, d)
        self.q = normal(("layers", "embed", "heads", "head_dim"), nl, d, n, h)
        self.k = normal(("layers", "embed", "kv_heads", "head_dim"), nl, d, k, h)
        self.v = normal(("layers", "embed", "kv_heads", "head_dim"), nl, d, k, h)
        self.o = normal(("layers", "heads", "head_dim", "embed"), nl, n, h, d)
        self.mlp_norm = ones(("layers", "norm"), nl, d)
        self.gate = normal(("layers", "embed", "mlp"), nl, d, f)
        self.up = normal(("layers", "embed", "mlp"), nl, d, f)
        self.down = normal(("layers", "mlp", "embed"), nl, f, d)
        if cfg.qk_norm:
            self.q_norm = ones(("layers", "head_dim"), nl, h)
            self.k_norm = ones(("layers", "head_dim"), nl, h)


class Decoder(nnx.Module):
    """Qwen3 / Llama decoder (ModelConfig.arch). Random init: normal(0, 0.02), norms at 1.

    Params are created unsharded (eager sharding off), so this runs outside a mesh; place them
    with `jax.jit(..., out_shardings=models.param_shardings(...))` or `models.shard_params`."""

    def __init__(self, cfg: ModelConfig, *, seed: int = 0):
        self.cfg = cfg
        dt = jnp.dtype(cfg.param_dtype)
        keys = iter(jax.random.split(jax.random.key(seed), 16))

        def normal(names, *shape):
            w = (0.02 * jax.random.normal(next(keys), shape, jnp.float32)).astype(dt)
            return nnx.Param(w, sharding=names)

        def ones(names, *shape):
            return nnx.Param(jnp.ones(shape, dt), sharding=names)

        with nnx.use_eager_sharding(False):
            self.layers = Layers(cfg, normal, ones)
            self.embed = normal(("vocab", "embed"), cfg.vocab_size, cfg.hidden_size)
            self.final_norm = ones(("norm",), cfg.hidden_size)
            if not cfg.tie_embeddings:
                self.lm_head = normal(("embed", "vocab"), cfg.hidden_size, cfg.vocab_size)

    def params(self) -> Params:
        """The pure params tree (model.py's layout)."""
        return nnx.to_pure_dict(nnx.state(self, nnx.Param))

    def __call__(self, input_ids_BT: jax.Array,
                 attention_mask_BT: jax.Array | None = None) -> jax.Array:
        """float32 logits [B, T, V]; model.forward on this module's params."""
        return model.forward(self.cfg, self.params(), input_ids_BT, attention_mask_BT)


def init_params(cfg: ModelConfig, seed: int = 0) -> Params:
    """Random params as a pure tree. Works under `jax.eval_shape` and `jax.jit` for any size."""
    return Decoder(cfg, seed=seed).params()


def abstract_decoder(cfg: ModelConfig) -> Decoder:
    """The module with ShapeDtypeStructs for values: shapes and sharding names, no memory."""
    return nnx.eval_shape(lambda: Decoder(cfg))
