"""An Orbax checkpoint written by the functional model (main at 0d33131, before the Flax NNX
model) restores with today's code and gives the logits it gave then."""

import pathlib
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np

from orchestrax import models, rl
from orchestrax.train.checkpoint import Checkpointer

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "pre_nnx_checkpoint"
# The config tests/fixtures/make_pre_nnx_checkpoint.py saved with.
CFG = models.tiny_config(vocab_size=128, hidden_size=32, intermediate_size=64, num_heads=4,
                         num_kv_heads=2, head_dim=16)


def test_pre_nnx_orbax_checkpoint_restores_with_its_logits(tmp_path):
    # Orbax may write next to a checkpoint it opens: work on a copy of the fixture.
    shutil.copytree(FIXTURE / "checkpoints", tmp_path / "checkpoints")
    like = rl.init_state(models.init_params(CFG, seed=0), rl.OptimizerConfig(lr=1e-3))
    ckpt = Checkpointer(tmp_path / "checkpoints", every=1)
    state, meta = ckpt.restore(like)
    ckpt.close()

    assert meta == {"phase": "rl", "step": 7}
    assert int(state.step) == 7
    assert jax.tree.structure(state) == jax.tree.structure(like)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    saved = np.load(FIXTURE / "logits.npz")
    logits = models.forward(CFG, state.params, jnp.asarray(saved["ids"]),
                            jnp.asarray(saved["mask"]))
    real = saved["mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(logits)[real], saved["logits"][real], atol=1e-5, rtol=0)
    # The restored params are the saved ones, not the restore target's.
    assert not np.allclose(np.asarray(state.params["final_norm"]),
                           np.asarray(like.params["final_norm"]))


def test_init_gives_the_values_the_functional_init_gave(tmp_path):
    """The fixture holds init_params(CFG, seed=11) of the functional model, final_norm x 1.5."""
    shutil.copytree(FIXTURE / "checkpoints", tmp_path / "checkpoints")
    like = rl.init_state(models.init_params(CFG, seed=0), rl.OptimizerConfig(lr=1e-3))
    ckpt = Checkpointer(tmp_path / "checkpoints", every=1)
    saved = ckpt.restore(like)[0].params
    ckpt.close()
    now = models.init_params(CFG, seed=11)
    now["final_norm"] = now["final_norm"] * 1.5
    chex.assert_trees_all_equal(now, saved)
