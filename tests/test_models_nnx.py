"""The Flax NNX definition of the decoder: split once, pure state through jit; its logits, params
tree and shardings are those of the functional model and the old sharding table."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from orchestrax import models, parallel

# models/sharding.py's table before the NNX model (main at 0d33131): the reference.
OLD_TABLE = {
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


def old_logical_axes(cfg):
    layers = dict(OLD_TABLE)
    if cfg.qk_norm:
        layers |= {"q_norm": ("layers", "head_dim"), "k_norm": ("layers", "head_dim")}
    tree = {"embed": ("vocab", "embed"), "layers": layers, "final_norm": ("norm",)}
    if not cfg.tie_embeddings:
        tree["lm_head"] = ("embed", "vocab")
    return tree


CONFIGS = [models.tiny_config(),
           models.tiny_config(arch="llama", num_heads=8, num_kv_heads=4, head_dim=16,
                              tie_embeddings=False)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["qwen3-tied", "llama-untied"])
def test_split_once_logits_equal_the_functional_model_bit_for_bit(cfg):
    graphdef, state = nnx.split(models.Decoder(cfg, seed=5))  # once, outside jit
    params = nnx.to_pure_dict(state)
    assert jax.tree.structure(params) == jax.tree.structure(models.init_params(cfg, seed=5))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 10)), jnp.int32)
    mask = jnp.ones_like(ids).at[1, :4].set(0).at[2, 7:].set(0)
    nnx_logits = jax.jit(lambda s, i, m: nnx.merge(graphdef, s)(i, m))(state, ids, mask)
    fn_logits = jax.jit(models.forward, static_argnums=0)(cfg, params, ids, mask)
    assert nnx_logits.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(nnx_logits), np.asarray(fn_logits))


@pytest.mark.parametrize("cfg", CONFIGS, ids=["qwen3-tied", "llama-untied"])
def test_logical_names_and_shardings_equal_the_old_table(cfg):
    assert models.param_logical_axes(cfg) == old_logical_axes(cfg)
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 4), ("tensor", 2))))
    shapes = jax.eval_shape(lambda: models.init_params(cfg))
    want = parallel.tree_shardings(shapes, old_logical_axes(cfg), mesh)
    got = models.param_shardings(cfg, mesh)
    assert got == want  # same tree structure and equal shardings leaf by leaf
    assert got["layers"]["q"].spec == P(None, "fsdp", "tensor", None)


def test_a_decoder_created_outside_a_mesh_is_placed_by_its_annotations():
    # flax 0.12 would device_put a sharded Param at creation and raise without a mesh.
    cfg = models.tiny_config(num_heads=8, num_kv_heads=4, head_dim=16)
    module = models.Decoder(cfg)
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 2), ("tensor", 4))))
    sharded = jax.device_put(module.params(), models.module_shardings(module, mesh))
    assert sharded["embed"].sharding.spec == P("tensor", "fsdp")
    assert sharded["layers"]["gate"].addressable_shards[0].data.shape == (2, 32, 32)


class TinyMLPDecoder(nnx.Module):
    """A user's own decoder: params annotated with the rules' logical names, pure-state call."""

    def __init__(self, vocab: int, dim: int, seed: int = 0):
        k1, k2 = jax.random.split(jax.random.key(seed))
        with nnx.use_eager_sharding(False):
            self.embed = nnx.Param(0.02 * jax.random.normal(k1, (vocab, dim)),
                                   sharding=("vocab", "embed"))
            self.w = nnx.Param(0.02 * jax.random.normal(k2, (dim, dim)),
                               sharding=("embed", "mlp"))

    def __call__(self, ids_BT):
        h_BTD = jnp.tanh(self.embed[...][ids_BT] @ self.w[...])
        return h_BTD @ self.embed[...].T


def test_own_nnx_decoder_follows_the_same_contract():
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 2), ("tensor", 4))))
    abstract = nnx.eval_shape(lambda: TinyMLPDecoder(64, 16))
    shardings = models.module_shardings(abstract, mesh)
    assert shardings["w"].spec == P("fsdp", "tensor")
    graphdef, state = nnx.split(TinyMLPDecoder(64, 16))
    params = jax.device_put(nnx.to_pure_dict(state), shardings)

    @jax.jit
    def logits(params, ids):  # pure dict in, module rebuilt inside
        return nnx.merge(graphdef, params)(ids)

    ids = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    out = logits(params, ids)
    ref = TinyMLPDecoder(64, 16)(ids)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-6, rtol=0)
