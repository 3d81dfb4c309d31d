"""fp32 master weights: with bf16 compute, AdamW steps at lr 1e-6 move fp32 params and not bf16
params (an lr-sized step is below half a bf16 ulp of a ~0.02 weight); bf16 Adam first moments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestrax import models, rl

OCFG = rl.OptimizerConfig(lr=1e-6)                  # AdamW, weight decay 0.01, clip 1.0


def tiny(param_dtype: str) -> models.ModelConfig:
    return models.tiny_config(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                              num_heads=2, num_kv_heads=1, head_dim=16, dtype="bfloat16",
                              param_dtype=param_dtype)


def batch(B=8, T=10):
    rng = np.random.default_rng(0)
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, 4:] = 1
    return dict(tokens=rng.integers(0, 32, (B, T)).astype(np.int32),
                attention_mask=np.ones((B, T), np.int32), loss_mask=loss_mask,
                advantages=rng.normal(size=B).astype(np.float32))


def changed_fraction(param_dtype: str, ocfg: rl.OptimizerConfig = OCFG, steps: int = 5):
    """(fraction of weight entries that differ after `steps` train steps, final state)."""
    cfg = tiny(param_dtype)
    train = rl.make_train_step(cfg, rl.GRPOConfig(compute_entropy=False), ocfg)
    params = models.init_params(cfg, seed=0)
    before = jax.device_get(params)
    state = train.init(params)
    for _ in range(steps):
        state, metrics = train.step(state, batch())
        assert np.isfinite(float(metrics["loss"]))
    assert int(state.counters["updates"]) == steps
    after = jax.device_get(state.params)
    changed = sum(jax.tree.leaves(jax.tree.map(lambda a, b: int(np.sum(a != b)), after, before)))
    total = sum(np.size(a) for a in jax.tree.leaves(before))
    return changed / total, state


@pytest.fixture(scope="module")
def fp32_run():
    return changed_fraction("float32")


def test_fp32_master_weights_all_move_at_lr_1e6(fp32_run):
    frac, state = fp32_run
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert frac >= 0.99


def test_bf16_master_weights_round_the_same_steps_away(fp32_run):
    frac_bf16, state = changed_fraction("bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state.params))
    # Only entries within ~2.5e-4 of zero can register a 5e-6 move in bf16.
    assert frac_bf16 < 0.1
    assert frac_bf16 < fp32_run[0] / 10


def test_bf16_first_moment_keeps_fp32_params_moving():
    frac, state = changed_fraction("float32", rl.OptimizerConfig(lr=1e-6, mu_dtype="bfloat16"))
    adam = state.opt_state[1][0]                      # chain(clip, adamw): adam's state
    assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.float32)}
    assert frac >= 0.99


def test_mu_dtype_is_checked():
    with pytest.raises(ValueError, match="OptimizerConfig.mu_dtype='float16'; allowed: None, "):
        rl.OptimizerConfig(mu_dtype="float16")
