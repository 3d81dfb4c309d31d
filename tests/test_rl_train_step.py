"""The jitted train step on one device: accumulation, skipping, dropped samples, SFT, eval_shape."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestrax import models, rl
from orchestrax.models import model as model_lib

MCFG = models.tiny_config(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16)
# eps=1 makes Adam's first steps ≈ lr·g, so parameter comparisons measure gradient agreement
# instead of amplifying float noise in near-zero gradient entries through g/|g|.
OCFG = rl.OptimizerConfig(lr=0.1, eps=1.0, weight_decay=0.0, max_grad_norm=None)


def make_batch(B=16, T=10, seed=0, with_old=True):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, MCFG.vocab_size, (B, T)).astype(np.int32)
    attn = np.ones((B, T), np.int32)
    attn[: B // 4, :3] = 0                           # left padding
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, 5:] = 1
    loss_mask[1, 5:] = 0
    loss_mask[1, 7] = 1                               # ragged policy spans
    batch = dict(tokens=tokens, attention_mask=attn, loss_mask=loss_mask,
                 advantages=rng.normal(size=B).astype(np.float32),
                 sample_mask=np.ones(B, np.float32))
    if with_old:
        params = models.init_params(MCFG, seed=0)
        batch["old_logprobs"] = np.asarray(models.token_logprobs(MCFG, params, tokens, attn))
    return batch


def fresh_state(ocfg=OCFG):
    return rl.init_state(models.init_params(MCFG, seed=0), ocfg)


def max_diff(a, b) -> float:
    """Largest |a - b| over two trees of the same structure (tree.map checks that)."""
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)))


@pytest.fixture(scope="module")
def big_step():
    return rl.make_train_step(MCFG, rl.GRPOConfig(agg="seq-mean-token-mean",
                                                  compute_entropy=False), OCFG).step


def test_accumulation_over_4_microbatches_equals_one_batch(big_step):
    batch = make_batch()
    acc = rl.make_train_step(MCFG, rl.GRPOConfig(agg="seq-mean-token-mean", num_microbatches=4,
                                                 compute_entropy=False), OCFG).step
    s1, m1 = big_step(fresh_state(), batch)
    s4, m4 = acc(fresh_state(), batch)
    assert float(m1["loss"]) == pytest.approx(float(m4["loss"]), abs=1e-6)
    assert float(m1["grad_norm"]) == pytest.approx(float(m4["grad_norm"]), rel=1e-5)
    chex.assert_trees_all_close(s1.params, s4.params, atol=1e-5, rtol=0)
    assert max_diff(s1.params, fresh_state().params) > 1e-3        # it did learn something
    # metrics add up across micro-batches to the full-batch token means
    for k in ("clip_frac_high", "ratio_mean", "approx_kl", "policy_tokens"):
        assert float(m1[k]) == pytest.approx(float(m4[k]), abs=1e-6)


def test_chunked_logprobs_give_the_same_update(big_step):
    batch = make_batch()
    chunked = rl.make_train_step(MCFG, rl.GRPOConfig(agg="seq-mean-token-mean",
                                                     compute_entropy=False, logprob_chunk=4),
                                 OCFG).step
    s1, m1 = big_step(fresh_state(), batch)
    s2, m2 = chunked(fresh_state(), batch)
    assert float(m1["loss"]) == pytest.approx(float(m2["loss"]), abs=1e-6)
    chex.assert_trees_all_close(s1.params, s2.params, atol=1e-5, rtol=0)


def test_non_finite_loss_skips_update_and_counts(big_step):
    batch = make_batch()
    batch["advantages"][3] = np.nan
    s0 = fresh_state()
    ref = jax.tree.map(np.array, s0.params)
    s, m = big_step(s0, batch)
    assert int(s.counters["skipped_updates"]) == 1 and int(s.counters["updates"]) == 0
    assert float(m["skipped"]) == 1.0
    chex.assert_trees_all_equal(s.params, ref)
    batch["advantages"][3] = 0.5                  # a good batch afterwards updates again
    s, _ = big_step(s, batch)
    assert int(s.counters["updates"]) == 1 and int(s.counters["train_steps"]) == 2


def test_dropped_samples_cost_no_gradient(big_step):
    batch = make_batch()
    batch["sample_mask"][[0, 5, 9]] = 0
    other = {k: v.copy() for k, v in batch.items()}
    rng = np.random.default_rng(1)
    for r in (0, 5, 9):                           # garbage in the dropped rows changes nothing
        other["tokens"][r] = rng.integers(0, MCFG.vocab_size, 10)
        other["advantages"][r] = np.nan
        other["old_logprobs"][r] = -np.inf
    s1, m1 = big_step(fresh_state(), batch)
    s2, m2 = big_step(fresh_state(), other)
    chex.assert_trees_all_equal(s1.params, s2.params)
    assert float(m1["loss"]) == float(m2["loss"])
    assert int(s2.counters["dropped_samples"]) == 3 and float(m2["dropped_samples"]) == 3.0
    assert int(s2.counters["skipped_updates"]) == 0


def test_a_fully_filtered_batch_leaves_params_and_momentum_alone(big_step):
    """After a real update Adam has momentum; a batch whose samples were all filtered must not
    let that momentum keep moving the params (the demo's format collapsed that way)."""
    s, _ = big_step(fresh_state(), make_batch())
    before = jax.tree.map(np.array, (s.params, s.opt_state))
    empty = make_batch(seed=1)
    empty["sample_mask"][:] = 0
    s, m = big_step(s, empty)
    chex.assert_trees_all_equal((s.params, s.opt_state), before)
    assert float(m["empty"]) == 1.0 and float(m["skipped"]) == 0.0
    assert int(s.counters["updates"]) == 1 and int(s.counters["train_steps"]) == 2


def test_sft_objective_learns_the_masked_tokens():
    batch = make_batch(B=8, with_old=False)
    batch.pop("advantages")
    ocfg = rl.OptimizerConfig(lr=1e-2, weight_decay=0.0)
    step = rl.make_train_step(MCFG, rl.GRPOConfig(objective="sft", compute_entropy=False),
                              ocfg).step
    state = fresh_state(ocfg)
    losses = []
    for _ in range(15):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[0] == pytest.approx(np.log(MCFG.vocab_size), rel=0.15)   # ~uniform at init
    assert losses[-1] < 0.6 * losses[0]


def test_bad_batch_names_the_problem(big_step):
    batch = make_batch()
    with pytest.raises(ValueError, match="missing 'advantages'"):
        big_step(fresh_state(), {k: v for k, v in batch.items() if k != "advantages"})
    with pytest.raises(ValueError, match=r"shape \(15,\) but expected \(16\)\. "
                                         r"\[train_step: batch\['advantages'\] must be \[B\]"):
        big_step(fresh_state(), {**batch, "advantages": batch["advantages"][:15]})
    with pytest.raises(ValueError, match=r"shape \(16, 9\) but expected \(16, 10\)\. "
                                         r"\[train_step: batch\['loss_mask'\] must be \[B,T\]"):
        big_step(fresh_state(), {**batch, "loss_mask": batch["loss_mask"][:, :9]})
    with pytest.raises(ValueError, match=r"type float32 .*"
                                         r"\[train_step: batch\['tokens'\] must hold integers\]"):
        big_step(fresh_state(), {**batch, "tokens": batch["tokens"].astype(np.float32)})
    with pytest.raises(ValueError,
                       match=r"rank 1 .*\[train_step: batch\['tokens'\] must be \[B,T\]"):
        big_step(fresh_state(), {**batch, "tokens": batch["tokens"][:, 0]})
    with pytest.raises(ValueError, match="unknown keys"):
        big_step(fresh_state(), {**batch, "rewards": batch["advantages"]})
    step3 = rl.make_train_step(MCFG, rl.GRPOConfig(num_microbatches=3), OCFG).step
    with pytest.raises(ValueError, match="not divisible by num_minibatches × num_microbatches"):
        step3(fresh_state(), batch)
    kl = rl.make_train_step(MCFG, rl.GRPOConfig(kl_coef=1e-4), OCFG).step
    with pytest.raises(ValueError, match="kl_coef > 0 needs batch\\['ref_logprobs'\\]"):
        kl(fresh_state(), batch)


def test_batch_not_divisible_by_data_parallel_degree_is_named():
    from orchestrax import parallel
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("data", 2), ("fsdp", 4),
                                                        ("tensor", 1))))
    step = rl.make_train_step(MCFG, rl.GRPOConfig(), OCFG, mesh).step
    with pytest.raises(ValueError, match="not divisible by the data-parallel degree 8"):
        step(fresh_state(), make_batch(B=12))


def test_schedule_warmup_then_cosine():
    f = rl.lr_schedule(rl.OptimizerConfig(lr=1.0, warmup_steps=10, schedule="cosine",
                                          total_steps=110, min_lr_ratio=0.1))
    assert float(f(0)) == 0.0 and float(f(5)) == pytest.approx(0.5)
    assert float(f(10)) == pytest.approx(1.0)
    assert float(f(60)) == pytest.approx(0.1 + 0.9 * 0.5, abs=1e-6)
    assert float(f(110)) == pytest.approx(0.1, abs=1e-6)
    g = rl.lr_schedule(rl.OptimizerConfig(lr=2.0, warmup_steps=4))
    assert float(g(2)) == pytest.approx(1.0) and float(g(100)) == pytest.approx(2.0)


def test_full_size_step_traces_with_eval_shape():
    cfg = models.preset("qwen3-0.6b")
    step_cfg = rl.GRPOConfig(num_minibatches=2, num_microbatches=2, ppo_epochs=2)
    from orchestrax.rl.train_step import _train_step
    import functools
    fn = functools.partial(_train_step, mcfg=cfg, gcfg=step_cfg, opt_cfg=OCFG, mesh=None,
                           rules=None, right_padded=False)
    state = jax.eval_shape(lambda: rl.init_state(models.init_params(cfg), OCFG))
    B, T = 8, 64
    batch = {"tokens": jax.ShapeDtypeStruct((B, T), jnp.int32),
             "attention_mask": jax.ShapeDtypeStruct((B, T), jnp.int32),
             "loss_mask": jax.ShapeDtypeStruct((B, T), jnp.float32),
             "advantages": jax.ShapeDtypeStruct((B,), jnp.float32)}
    new_state, metrics = jax.eval_shape(fn, state, batch)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), new_state.params) == \
        jax.tree.map(lambda a: (a.shape, a.dtype), state.params)
    assert metrics["loss"].shape == ()
    assert sum(x.size for x in jax.tree.leaves(state.params)) == models.num_params(cfg)


def test_mfu_helper():
    # tiny_config by hand: per layer q,k,v,o 64*32*(4+2+2+4) = 24,576, q/k norms 64, MLP
    # 3*64*128 = 24,576, two norms 128 -> 49,344; 2 layers + final norm 64 + table 256*64.
    tied = models.tiny_config()
    assert models.num_params(tied) == 2 * 49_344 + 64 + 16_384 == 115_136
    untied = tied.replace(tie_embeddings=False)
    # Untied: the lookup table is no matmul; the LM head is. Both count 115,136.
    assert rl.matmul_params(untied) == rl.matmul_params(tied) == 115_136
    # Attention per token at T = 4: 6 * L 2 * N 4 * H 32 * (T + 1) = 7,680 (query t sees t + 1
    # keys: 10 pairs of 4 * N * H forward FLOPs per layer for 4 tokens, times 3 with backward).
    assert 3 * 2 * 10 * 4 * 4 * 32 / 4 == 7_680
    assert rl.train_flops(tied, 8, 4) == 8 * (6 * 115_136 + 7_680) == 5_587_968
    assert rl.mfu(tied, 8, 4, 2.0, 5_587_968.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="seconds"):
        rl.mfu(tied, 8, 4, 0.0, 1.0)
    with pytest.raises(ValueError, match="known"):
        rl.peak_flops("abacus")


def test_step_compiles_once_per_batch_key_set(monkeypatch):
    from orchestrax.rl import train_step
    chex.clear_trace_counter()
    # make_train_step binds the module's _train_step when called; count its traces.
    monkeypatch.setattr(train_step, "_train_step",
                        chex.assert_max_traces(train_step._train_step, n=2))
    train = rl.make_train_step(MCFG, rl.GRPOConfig(compute_entropy=False), OCFG)
    state = fresh_state()
    with_mask = make_batch(B=4)
    no_mask = {k: v for k, v in make_batch(B=4, seed=1).items() if k != "sample_mask"}
    for b in (with_mask, make_batch(B=4, seed=2), no_mask, with_mask, no_mask):
        state, _ = train.step(state, b)             # new values, same key sets: no retrace
    assert int(state.counters["train_steps"]) == 5
    no_old = {k: v for k, v in with_mask.items() if k != "old_logprobs"}
    with pytest.raises(AssertionError, match="traced > 2 times"):
        train.step(state, no_old)                   # a third key set is a third trace


def test_profile_scopes_name_logprobs_loss_and_optimizer():
    import functools
    import re
    from orchestrax.rl.train_step import _train_step
    fn = functools.partial(_train_step, mcfg=MCFG, gcfg=rl.GRPOConfig(), opt_cfg=OCFG, mesh=None,
                           rules=None, right_padded=False)
    text = jax.jit(fn).lower(fresh_state(), make_batch(B=4, with_old=False)).as_text(
        debug_info=True)
    names = set(re.findall(r'loc\("([^"]*)"', text))
    for scope in ("jvp(token_logprobs)/", "transpose(jvp(token_logprobs))/", "jvp(loss)/",
                  "optimizer/"):
        assert any(n.startswith(scope) for n in names), scope


def test_minibatches_reshuffled_each_epoch_from_the_key():
    import dataclasses
    from orchestrax.rl.train_step import epoch_key, slot_permutation
    batch = make_batch()                                         # B = 16
    gcfg = rl.GRPOConfig(agg="seq-mean-token-mean", num_minibatches=2, num_microbatches=2,
                         compute_entropy=False)
    fixed = rl.make_train_step(MCFG, gcfg, OCFG).step
    shuffled = rl.make_train_step(MCFG, dataclasses.replace(gcfg, shuffle_seed=7), OCFG).step
    s_shuf, _ = shuffled(fresh_state(), batch)
    # Strided split: row i·4 + s sits in slot s (= m·K + k) at position i. The shuffle put old
    # slot perm[s, i] in slot s; the same rows permuted on the host, in the fixed order, must
    # give the same update (loss weights included).
    perm = np.asarray(slot_permutation(epoch_key(7, 0, 0), 4, 4))
    assert all(sorted(perm[:, i]) == [0, 1, 2, 3] for i in range(4))
    rows = [i * 4 + perm[s, i] for i in range(4) for s in range(4)]
    assert rows != list(range(16))
    s_ref, _ = fixed(fresh_state(), {k: v[rows] for k, v in batch.items()})
    chex.assert_trees_all_close(s_shuf.params, s_ref.params, atol=1e-6, rtol=0)
    s_fix, _ = fixed(fresh_state(), batch)
    assert max_diff(s_shuf.params, s_fix.params) > 1e-4
    # A new order every epoch and every train_step call; the same order for the same (seed, step).
    orders = {tuple(np.asarray(slot_permutation(epoch_key(7, step, e), 4, 4)).ravel())
              for step in (0, 1) for e in (0, 1)}
    assert len(orders) == 4
    np.testing.assert_array_equal(slot_permutation(epoch_key(7, 3, 1), 4, 4),
                                  slot_permutation(epoch_key(7, 3, 1), 4, 4))
    with pytest.raises(ValueError, match="GRPOConfig.shuffle_seed=0.5; must be None or an int"):
        rl.GRPOConfig(shuffle_seed=0.5)


def right_padded_batch(B=8, T=10, seed=0):
    """A GRPO batch of right-padded rows (rl.pack's layout), one of them all padding."""
    rng = np.random.default_rng(seed)
    attn = (np.arange(T)[None] < rng.integers(0, T + 1, B)[:, None]).astype(np.int32)
    attn[0], attn[1] = 1, 0
    return dict(tokens=rng.integers(0, MCFG.vocab_size, (B, T)).astype(np.int32),
                attention_mask=attn, loss_mask=attn.astype(np.float32),
                advantages=rng.normal(size=B).astype(np.float32))


@pytest.mark.parametrize("remat", ["full", "none"])
def test_right_padded_step_has_no_conditional_and_the_same_update(monkeypatch, remat):
    """`right_padded=True` takes attention's fused kernel with no run-time layout check in every
    pass of the step (forward, backward, the old logprobs of the second minibatch): XLA:GPU
    reads each `conditional`'s predicate on the host. XLA's kernel stands in for cuDNN's here,
    which the CPU cannot compile."""
    monkeypatch.setitem(model_lib._FUSED, "auto", "xla")
    cfg = MCFG.replace(remat=remat)
    gcfg = rl.GRPOConfig(num_minibatches=2, compute_entropy=False)
    batch = right_padded_batch()
    state = lambda: rl.init_state(models.init_params(cfg, seed=0), OCFG)  # noqa: E731
    out = {}
    for claim in (False, True):
        step = rl.make_train_step(cfg, gcfg, OCFG, right_padded=claim).step
        hlo = jax.jit(step).lower(state(), batch).compile().as_text()
        out[claim] = len(re.findall(r"\bconditional\(", hlo)), step(state(), batch)
    assert out[False][0] > 0, "the runtime-checked step should hold the layout conditional"
    assert out[True][0] == 0
    (s_checked, m_checked), (s_claimed, m_claimed) = out[False][1], out[True][1]
    chex.assert_trees_all_close(s_claimed.params, s_checked.params, atol=1e-6, rtol=0)
    assert float(m_claimed["loss"]) == pytest.approx(float(m_checked["loss"]), abs=1e-6)


def test_right_padded_step_refuses_a_left_padded_batch():
    step = rl.make_train_step(MCFG, rl.GRPOConfig(), OCFG, right_padded=True).step
    batch = make_batch(with_old=False)                # its first 4 rows are left-padded
    for mask in (batch["attention_mask"], jnp.asarray(batch["attention_mask"])):
        with pytest.raises(ValueError, match=r"^train_step batch: 4 of 16 rows are not "
                                             r"right-padded \(row 0 has padding before"):
            step(fresh_state(), {**batch, "attention_mask": mask})
