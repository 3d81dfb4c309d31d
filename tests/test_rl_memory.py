"""The train step's memory levers keep its numbers: gradients accumulated layer by layer into the
accumulator equal value_and_grad's, bf16 Adam moments (stochastic rounding) train like fp32
AdamW, and one update per call needs no separate old-logprob pass."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from orchestrax import models, rl
from orchestrax.rl import optim, train_step as ts


def _batch(cfg, b=4, t=24, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, t), np.int32)
    mask[1, :5] = 0                                        # a left-padded row
    return {"tokens": jnp.asarray(rng.integers(0, cfg.vocab_size, (b, t)), jnp.int32),
            "attention_mask": jnp.asarray(mask),
            "loss_mask": jnp.asarray(rng.random((b, t)) < 0.7, jnp.float32),
            "advantages": jnp.asarray(rng.normal(size=b), jnp.float32)}


def test_value_and_grad_into_adds_value_and_grads_gradient():
    cfg = models.tiny_config(remat="full")                 # tied: the embedding's two uses
    params = models.init_params(cfg)
    x = _batch(cfg)
    w = jnp.asarray(np.random.default_rng(1).normal(size=x["tokens"].shape), jnp.float32)

    def loss_fn(logp, ent):
        return jnp.sum(logp * w) + 0.1 * jnp.sum(ent), {"s": jnp.sum(logp)}

    def ref(p):
        return loss_fn(*models.token_logprobs(cfg, p, x["tokens"], x["attention_mask"],
                                              return_entropy=True, chunk_size=8))

    (loss0, aux0), g0 = jax.value_and_grad(ref, has_aux=True)(params)
    acc = jax.tree.map(lambda p: jnp.full_like(p, 0.25), params)
    acc1, (loss1, aux1) = jax.jit(lambda p, a: models.value_and_grad_into(
        cfg, loss_fn, p, a, x["tokens"], x["attention_mask"], return_entropy=True,
        chunk_size=8))(params, acc)
    np.testing.assert_allclose(loss1, loss0, rtol=1e-6)
    np.testing.assert_allclose(aux1["s"], aux0["s"], rtol=1e-6)
    for got, want in zip(jax.tree.leaves(acc1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(got - 0.25, want, rtol=1e-4, atol=1e-5)


def _run(cfg, gcfg, ocfg, batch, steps=1):
    train = rl.make_train_step(cfg, gcfg, ocfg)
    state = train.init(models.init_params(cfg))
    for _ in range(steps):
        state, met = train.step(state, batch)
    return state, met


def test_in_place_accumulation_steps_like_value_and_grad():
    """remat "full" takes the layer-by-layer path, remat "none" value_and_grad: same step."""
    gcfg = rl.GRPOConfig(num_microbatches=2, compute_entropy=False)
    ocfg = rl.OptimizerConfig(lr=1e-3)
    full = models.tiny_config(remat="full", tie_embeddings=False)
    none = full.replace(remat="none")
    assert ts.in_place_accumulation(full) and not ts.in_place_accumulation(none)
    batch = _batch(full)
    s_full, m_full = _run(full, gcfg, ocfg, batch, steps=2)
    s_none, m_none = _run(none, gcfg, ocfg, batch, steps=2)
    np.testing.assert_allclose(m_full["grad_norm"], m_none["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s_full.params), jax.tree.leaves(s_none.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_one_update_uses_its_own_logprobs_as_the_old_ones():
    """No old_logprobs, one update per call: the same step as with the logprobs of the params
    before the step passed in."""
    cfg = models.tiny_config(remat="full")
    gcfg = rl.GRPOConfig(num_microbatches=2, compute_entropy=False)
    ocfg = rl.OptimizerConfig(lr=1e-3)
    batch = _batch(cfg)
    params = models.init_params(cfg)
    old = models.token_logprobs(cfg, params, batch["tokens"], batch["attention_mask"])
    s_given, m_given = _run(cfg, gcfg, ocfg, {**batch, "old_logprobs": old})
    s_self, m_self = _run(cfg, gcfg, ocfg, batch)
    assert float(m_self["log_ratio_absmax_first"]) == 0.0
    np.testing.assert_allclose(m_self["loss"], m_given["loss"], rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(s_self.params), jax.tree.leaves(s_given.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_one_epoch_scores_old_logprobs_only_for_the_later_minibatches(monkeypatch):
    """One epoch of M minibatches: the first update's rows take their own logprobs as the old
    ones, so the separate pass scores M-1 minibatches; the step equals the one given the old
    logprobs of the params before it. Two epochs, or reshuffled rows, score all M."""
    cfg = models.tiny_config(remat="full")
    # Later minibatches given their own logprobs as the old ones move the params by ~3e-3 here.
    ocfg = rl.OptimizerConfig(lr=1e-3)
    batch = _batch(cfg, b=8)
    scored = []
    real = ts._old_logprobs
    monkeypatch.setattr(ts, "_old_logprobs", lambda mcfg, gcfg, params, mb, right_padded: (
        scored.append(mb["tokens"].shape), real(mcfg, gcfg, params, mb, right_padded))[1])
    gcfg = rl.GRPOConfig(num_minibatches=4, num_microbatches=2, compute_entropy=False)
    s_self, m_self = _run(cfg, gcfg, ocfg, batch)
    assert scored == [(3, 2, 1, 24)]
    old = models.token_logprobs(cfg, models.init_params(cfg), batch["tokens"],
                                batch["attention_mask"])
    s_given, m_given = _run(cfg, gcfg, ocfg, {**batch, "old_logprobs": old})
    assert float(m_self["log_ratio_absmax_first"]) == 0.0
    assert float(m_self["log_ratio_absmax_max"]) > 1e-3     # later updates are off-policy
    np.testing.assert_allclose(m_self["loss"], m_given["loss"], rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(s_self.params), jax.tree.leaves(s_given.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    scored.clear()
    _run(cfg, rl.GRPOConfig(num_minibatches=4, num_microbatches=2, ppo_epochs=2,
                            compute_entropy=False), ocfg, batch)
    _run(cfg, rl.GRPOConfig(num_minibatches=4, num_microbatches=2, shuffle_seed=0,
                            compute_entropy=False), ocfg, batch)
    assert scored == [(4, 2, 1, 24)] * 2


def test_stochastic_rounding_is_unbiased_where_nearest_is_not():
    x = jnp.full((200_000,), 1.0 + 2.0**-10, jnp.float32)   # a quarter ulp above 1 in bf16
    nearest = x.astype(jnp.bfloat16).astype(jnp.float32)
    sr = optim.round_stochastic(x, jnp.bfloat16, jax.random.key(0)).astype(jnp.float32)
    assert float(jnp.mean(nearest)) == 1.0
    assert set(np.unique(np.asarray(sr)).tolist()) == {1.0, 1.0 + 2.0**-7}
    np.testing.assert_allclose(float(jnp.mean(sr)), 1.0 + 2.0**-10, rtol=2e-5)
    assert optim.round_stochastic(x, jnp.float32, jax.random.key(0)).dtype == jnp.float32


def test_lean_adam_in_fp32_is_optax_adamw():
    params = {"w": jnp.linspace(-1, 1, 12).reshape(3, 4), "b": jnp.ones((4,))}
    grads = jax.tree.map(lambda p: jnp.cos(3 * p) + 0.1, params)
    lean = rl.OptimizerConfig(lr=1e-2, max_grad_norm=None)
    ref = optax.adamw(1e-2, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
    mine = optax.chain(optim.scale_by_lean_adam(0.9, 0.999, 1e-8, jnp.float32, jnp.float32),
                       optax.add_decayed_weights(0.01), optax.scale_by_learning_rate(1e-2))
    s_ref, s_mine, p_ref, p_mine = ref.init(params), mine.init(params), params, params
    for _ in range(3):
        u_ref, s_ref = ref.update(grads, s_ref, p_ref)
        u_mine, s_mine = mine.update(grads, s_mine, p_mine)
        p_ref, p_mine = optax.apply_updates(p_ref, u_ref), optax.apply_updates(p_mine, u_mine)
    for a, b in zip(jax.tree.leaves(p_mine), jax.tree.leaves(p_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert lean.nu_dtype is None


def _sft_curve(ocfg: rl.OptimizerConfig, steps: int = 200) -> np.ndarray:
    """Losses of `steps` AdamW updates fitting a tiny model to a fixed batch (fp32 params)."""
    cfg = models.tiny_config()
    params = models.init_params(cfg)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (8, 32)), jnp.int32)
    opt = optim.make_optimizer(ocfg)

    def loss(p):
        return -jnp.mean(models.token_logprobs(cfg, p, tokens)[:, 1:])

    def step(carry, _):
        p, s = carry
        value, g = jax.value_and_grad(loss)(p)
        u, s = opt.update(g, s, p)
        return (optax.apply_updates(p, u), s), value

    _, losses = jax.jit(lambda p: jax.lax.scan(step, (p, opt.init(p)), None, length=steps))(
        params)
    return np.asarray(losses)


def test_bf16_moments_train_like_fp32_adamw_over_200_steps():
    base = dict(lr=3e-3, b2=0.999, max_grad_norm=1.0)
    ref = _sft_curve(rl.OptimizerConfig(**base))
    lean = _sft_curve(rl.OptimizerConfig(**base, mu_dtype="bfloat16", nu_dtype="bfloat16"))
    state = jax.eval_shape(optim.make_optimizer(
        rl.OptimizerConfig(mu_dtype="bfloat16", nu_dtype="bfloat16")).init,
        {"w": jnp.zeros((4, 4))})
    assert {x.dtype for x in jax.tree.leaves(state) if x.ndim} == {jnp.dtype(jnp.bfloat16)}
    assert ref[-1] < 0.5 * ref[0]                               # it does learn
    np.testing.assert_array_less(np.abs(lean - ref) / ref, 0.02)


def test_optimizer_config_names_the_moment_dtypes():
    with pytest.raises(ValueError, match="nu_dtype"):
        rl.OptimizerConfig(nu_dtype="float16")


def test_reference_in_compute_dtype_row_passes_scores_like_fp32_masters():
    """The frozen reference as `compute_copy` (bf16 matrices, norms as stored), scored a few
    rows a pass: bitwise the logprobs of the fp32 masters over the whole batch at once."""
    cfg = models.tiny_config(dtype="bfloat16")
    params = models.init_params(cfg)
    ref = models.compute_copy(cfg, params)
    assert ref["layers"]["q"].dtype == jnp.bfloat16
    assert ref["final_norm"].dtype == ref["layers"]["attn_norm"].dtype == jnp.float32
    x = _batch(cfg, b=4)
    want = models.token_logprobs(cfg, params, x["tokens"], x["attention_mask"], chunk_size=8)
    gcfg = rl.GRPOConfig(logprob_chunk=8)
    got = jax.jit(lambda p, t, m: rl.reference_logprobs(cfg, gcfg, p, t, m, rows=2))(
        ref, x["tokens"], x["attention_mask"])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="rows=3"):
        rl.reference_logprobs(cfg, gcfg, ref, x["tokens"], x["attention_mask"], rows=3)
