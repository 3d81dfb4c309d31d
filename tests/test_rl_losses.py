"""Policy loss / SFT loss against hand-worked numbers, a NumPy reference and finite differences."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrax import rl

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
NORM_LEN = 10        # seq-mean-token-sum-norm's fixed divisor (other aggs ignore it); ≠ any T here


def np_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg="token-mean",
                   ref=None, kl_coef=0.0, kl="k3", dual_clip=10.0, sampler=None, tis_cap=None,
                   norm_len=NORM_LEN):
    """Token-by-token float64 reading of the clipped surrogate; independent of the JAX code."""
    f64 = lambda x: None if x is None else np.asarray(x, np.float64)  # noqa: E731
    logp, old, adv, mask, ref, sampler = map(f64, (logp, old, adv, mask, ref, sampler))
    B, T = logp.shape
    per = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            r = math.exp(logp[b, t] - old[b, t])
            a = adv[b]
            loss = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
            if dual_clip is not None and a < 0:
                loss = min(loss, -a * dual_clip)
            if sampler is not None and tis_cap is not None:
                loss *= min(math.exp(old[b, t] - sampler[b, t]), tis_cap)
            if ref is not None:
                x = logp[b, t] - ref[b, t]
                k = {"k1": x, "k3": math.exp(-x) + x - 1, "mse": 0.5 * x * x}[kl]
                loss += kl_coef * k
            per[b, t] = loss
    if agg == "token-mean":
        return (per * mask).sum() / max(mask.sum(), 1)
    if agg == "seq-mean-token-sum-norm":     # Dr.GRPO: a constant divisor, every row counted
        return (per * mask).sum() / (norm_len * B)
    seqs = []
    for b in range(B):
        n = mask[b].sum()
        if n == 0:
            continue
        s = (per[b] * mask[b]).sum()
        seqs.append(s / n)
    return sum(seqs) / max(len(seqs), 1)


def hand_batch():
    logp = np.log(np.array([[1.0, 1.5, 0.5, 1.0], [1.0, 1.1, 0.7, 1.0]], np.float32))
    old = np.zeros((2, 4), np.float32)
    mask = np.array([[0, 1, 1, 0], [0, 1, 1, 1]], np.float32)
    adv = np.array([1.0, -1.0], np.float32)
    return logp, old, adv, mask


@pytest.mark.parametrize("agg,want", [("token-mean", 1.12 / 5),
                                      ("seq-mean-token-mean", (-1.78 / 2 + 2.9 / 3) / 2),
                                      ("seq-mean-token-sum-norm", (-1.78 / 10 + 2.9 / 10) / 2)])
def test_hand_worked(agg, want):
    # A=+1: r=1.5 clipped to 1.28 -> -1.28; r=.5 -> -.5.  A=-1: r=1.1 -> 1.1; r=.7 -> .8 (clip);
    # r=1 -> 1.
    logp, old, adv, mask = hand_batch()
    loss, m = rl.policy_loss(logp, old, adv, mask, agg=agg, norm_len=NORM_LEN)
    assert float(loss) == pytest.approx(want, abs=1e-6)
    assert float(m["clip_frac_high"]) == pytest.approx(1 / 5)
    assert float(m["clip_frac_low"]) == pytest.approx(1 / 5)
    assert float(m["ratio_mean"]) == pytest.approx((1.5 + .5 + 1.1 + .7 + 1) / 5, abs=1e-6)


def test_dual_clip_and_ratio_clamp():
    logp = np.array([[0.0, math.log(20.0)]], np.float32)
    old = np.zeros((1, 2), np.float32)
    mask = np.array([[0.0, 1.0]], np.float32)
    adv = np.array([-1.0], np.float32)
    loss, m = rl.policy_loss(logp, old, adv, mask)
    assert float(loss) == pytest.approx(10.0)           # capped at c·|A|
    assert float(m["dual_clip_frac"]) == 1.0
    loss_nodual, _ = rl.policy_loss(logp, old, adv, mask, dual_clip=None)
    assert float(loss_nodual) == pytest.approx(20.0, rel=1e-6)
    # the dual-clipped token passes no gradient
    g = jax.grad(lambda lp: rl.policy_loss(lp, old, adv, mask)[0])(jnp.asarray(logp))
    assert float(jnp.abs(g).max()) == 0.0
    # a huge log-ratio is clamped before exp, so the loss stays finite
    big = np.array([[0.0, 500.0]], np.float32)
    loss_big, _ = rl.policy_loss(big, old, adv, mask, dual_clip=None)
    assert np.isfinite(float(loss_big))


def test_kl_estimators_hand_worked():
    logp, ref = np.log(np.float32(0.5)), np.log(np.float32(0.25))
    l2 = math.log(2)
    assert float(rl.kl_penalty(logp, ref, "k1")) == pytest.approx(l2, abs=1e-6)
    assert float(rl.kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 + l2 - 1, abs=1e-6)
    assert float(rl.kl_penalty(logp, ref, "mse")) == pytest.approx(0.5 * l2 * l2, abs=1e-6)
    assert float(rl.kl_penalty(ref, ref, "k3")) == 0.0


def test_first_update_ratio_is_one_and_gradient_is_advantage():
    logp, _, adv, mask = hand_batch()
    loss, m = rl.policy_loss(logp, logp, adv, mask)
    assert float(m["log_ratio_absmax_max"]) == 0.0
    assert float(m["clip_frac_high"]) == float(m["clip_frac_low"]) == 0.0
    # at ratio 1, d loss / d logp_bt = -A_b · w_bt
    g = jax.grad(lambda lp: rl.policy_loss(lp, logp, adv, mask)[0])(jnp.asarray(logp))
    np.testing.assert_allclose(np.asarray(g), -adv[:, None] * mask / mask.sum(), atol=1e-7)


@st.composite
def loss_inputs(draw):
    B, T = draw(st.sampled_from([(1, 3), (3, 5), (4, 8)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    old = rng.normal(-1.5, 0.5, (B, T)).astype(np.float32)
    logp = (old + rng.normal(0, 0.3, (B, T))).astype(np.float32)
    ref = (old + rng.normal(0, 0.3, (B, T))).astype(np.float32)
    sampler = (old + rng.normal(0, 0.3, (B, T))).astype(np.float32)
    adv = rng.normal(0, 1.5, B).astype(np.float32)
    mask = (rng.random((B, T)) > 0.3).astype(np.float32)
    return logp, old, ref, sampler, adv, mask


@settings(max_examples=40, deadline=None)
@given(loss_inputs(), st.sampled_from(AGGS), st.sampled_from(["k1", "k3", "mse"]),
       st.sampled_from([0.0, 0.1]), st.sampled_from([None, 1.2]), st.sampled_from([None, 1.2]))
def test_matches_numpy_reference(inputs, agg, kl, kl_coef, dual_clip, tis_cap):
    logp, old, ref, sampler, adv, mask = inputs
    loss, _ = rl.policy_loss(logp, old, adv, mask, agg=agg, ref_logprobs=ref, kl_coef=kl_coef,
                             kl=kl, dual_clip=dual_clip, sampler_logprobs=sampler,
                             tis_cap=tis_cap, norm_len=NORM_LEN)
    want = np_policy_loss(logp.astype(np.float64), old, adv, mask, agg=agg, ref=ref,
                          kl_coef=kl_coef, kl=kl, dual_clip=dual_clip, sampler=sampler,
                          tis_cap=tis_cap)
    assert float(loss) == pytest.approx(want, abs=1e-6, rel=1e-6)


def _near_kink(logp, old, adv, dual_clip, tol=2e-3):
    r = np.exp(logp.astype(np.float64) - old)
    kinks = [0.8, 1.28] + ([dual_clip] if dual_clip else [])
    return any(np.any(np.abs(r - k) < tol) for k in kinks)


@settings(max_examples=25, deadline=None)
@given(loss_inputs(), st.sampled_from(AGGS), st.sampled_from(["k1", "k3", "mse"]),
       st.sampled_from([None, 1.2]))
def test_gradient_matches_finite_differences(inputs, agg, kl, dual_clip):
    logp, old, ref, _, adv, mask = inputs
    assume(not _near_kink(logp, old, adv, dual_clip))
    f = lambda lp: rl.policy_loss(lp, old, adv, mask, agg=agg, ref_logprobs=ref,  # noqa: E731
                                  kl_coef=0.1, kl=kl, dual_clip=dual_clip, norm_len=NORM_LEN)[0]
    g = np.asarray(jax.grad(f)(jnp.asarray(logp)))
    h = 1e-5
    x = logp.astype(np.float64)
    fd = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, dn = x.copy(), x.copy()
        up[idx] += h
        dn[idx] -= h
        kw = dict(agg=agg, ref=ref, kl_coef=0.1, kl=kl, dual_clip=dual_clip)
        fd[idx] = (np_policy_loss(up, old, adv, mask, **kw)
                   - np_policy_loss(dn, old, adv, mask, **kw)) / (2 * h)
    np.testing.assert_allclose(g, fd, atol=2e-5, rtol=1e-4)
    assert np.all(g[mask == 0] == 0.0)      # prompt/tool tokens get no gradient


def test_token_weights_sum_and_split_exactly():
    rng = np.random.default_rng(0)
    mask = (rng.random((8, 6)) > 0.4).astype(np.float32)
    mask[3] = 0.0                                       # a dropped sequence
    for agg in AGGS:
        w = np.asarray(rl.token_weights(mask, agg, NORM_LEN))
        assert np.all(w[mask == 0] == 0)
        if agg != "seq-mean-token-sum-norm":
            assert w.sum() == pytest.approx(1.0, abs=1e-6)
        else:                        # every token 1 / (norm_len · B), dropped rows counted in B
            np.testing.assert_allclose(w[mask > 0], 1 / (NORM_LEN * 8), rtol=1e-6)


def test_metrics_gap_entropy_and_tis():
    logp, old, adv, mask = hand_batch()
    sampler = old - 0.5
    ent = np.full_like(logp, 2.0)
    _, m = rl.policy_loss(logp, old, adv, mask, sampler_logprobs=sampler, tis_cap=1.5,
                          entropy=ent)
    assert float(m["sampler_gap"]) == pytest.approx(0.5, abs=1e-6)   # |old − sampler|
    assert float(m["tis_weight"]) == pytest.approx(1.5)     # e^0.5 = 1.65 truncated to 1.5
    assert float(m["entropy"]) == pytest.approx(2.0)


def test_sft_loss_hand_worked():
    logp = np.log(np.array([[1.0, 0.5, 0.25], [1.0, 0.5, 1.0]], np.float32))
    mask = np.array([[0, 1, 1], [0, 1, 0]], np.float32)
    loss, _ = rl.sft_loss(logp, mask)
    assert float(loss) == pytest.approx((math.log(2) + math.log(4) + math.log(2)) / 3, abs=1e-6)
    loss_s, _ = rl.sft_loss(logp, mask, agg="seq-mean-token-mean")
    assert float(loss_s) == pytest.approx((1.5 * math.log(2) + math.log(2)) / 2, abs=1e-6)


def test_bad_arguments_name_field_and_values():
    logp, old, adv, mask = hand_batch()
    with pytest.raises(ValueError, match="agg='mean'; allowed: token-mean, "
                                         "seq-mean-token-mean, seq-mean-token-sum-norm"):
        rl.policy_loss(logp, old, adv, mask, agg="mean")
    with pytest.raises(ValueError, match="kl='k2'; allowed: k1, k3, mse"):
        rl.policy_loss(logp, old, adv, mask, ref_logprobs=old, kl="k2")
    with pytest.raises(ValueError, match="kl_coef > 0 needs ref_logprobs"):
        rl.policy_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="GRPOConfig.agg='sum'; allowed: "):
        rl.GRPOConfig(agg="sum")
    with pytest.raises(ValueError, match="GRPOConfig.kl='kl'; allowed: "):
        rl.GRPOConfig(kl="kl")
    with pytest.raises(ValueError, match="OptimizerConfig.schedule='linear'; allowed: "):
        rl.OptimizerConfig(schedule="linear")
    with pytest.raises(ValueError, match="GRPOConfig.clip_low=1.5; must be in"):
        rl.GRPOConfig(clip_low=1.5)
    with pytest.raises(ValueError, match="GRPOConfig.logprob_chunk=0; must be None or >= 1"):
        rl.GRPOConfig(logprob_chunk=0)


def test_token_sum_norm_needs_a_fixed_norm_len():
    """Dividing by the padded length T made the loss of the same sequences depend on how long the
    batch's longest trajectory was; the divisor must be a constant the user chose."""
    logp, old, adv, mask = hand_batch()
    with pytest.raises(ValueError, match="GRPOConfig.norm_len=None; must be a fixed int > 0 with "
                                         "agg='seq-mean-token-sum-norm'"):
        rl.GRPOConfig(agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="policy_loss.norm_len=None; agg='seq-mean-token-sum-"
                                         "norm' needs a fixed int >= 1"):
        rl.policy_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="policy_loss.norm_len=None"):
        rl.sft_loss(logp, mask, agg="seq-mean-token-sum-norm")
    # Padding the batch with 3 more masked positions leaves the loss alone.
    pad = lambda x: np.pad(x, ((0, 0), (0, 3)))  # noqa: E731
    a, _ = rl.policy_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm", norm_len=8)
    b, _ = rl.policy_loss(pad(logp), pad(old), adv, pad(mask), agg="seq-mean-token-sum-norm",
                          norm_len=8)
    assert float(a) == float(b) == pytest.approx((-1.78 / 8 + 2.9 / 8) / 2, abs=1e-6)
    assert rl.GRPOConfig(agg="seq-mean-token-sum-norm", norm_len=4096).norm_len == 4096


# chex's account of the shapes, then our argument and its contract (see rl/contracts.py).
CONTRACT_CASES = [
    ("advantages [B,1]", dict(advantages=np.ones((2, 1), np.float32)),
     r"input 0 has shape \(2, 1\) but expected \(2\)\. "
     r"\[policy_loss: advantages must be \[B\] = \(2,\), one per row of logprobs\]"),
    ("advantages [B+1]", dict(advantages=np.ones((3,), np.float32)),
     r"input 0 has shape \(3,\) but expected \(2\)\. \[policy_loss: advantages must be \[B\]"),
    ("loss mask [B,T-1]", dict(mask=np.ones((2, 3), np.float32)),
     r"input 0 has shape \(2, 3\) but expected \(2, 4\)\. "
     r"\[policy_loss: mask must be \[B,T\] = \(2, 4\), the shape of logprobs\]"),
    ("old_logprobs transposed", dict(old_logprobs=np.zeros((4, 2), np.float32)),
     r"input 0 has shape \(4, 2\) but expected \(2, 4\)\. \[policy_loss: old_logprobs must "),
    ("logprobs [B,T,1]", dict(logprobs=np.zeros((2, 4, 1), np.float32)),
     r"input 0 has rank 3 .* but expected 2\. \[policy_loss: logprobs must be \[B,T\]\]"),
    ("token ids as logprobs", dict(logprobs=np.zeros((2, 4), np.int32)),
     r"input 0 has type int32 but expected .*float.*\[policy_loss: logprobs must hold floats\]"),
    ("int old_logprobs", dict(old_logprobs=np.zeros((2, 4), np.int32)),
     r"input 0 has type int32 .*\[policy_loss: old_logprobs must hold floats\]"),
    ("ref_logprobs [B,T+1]", dict(ref_logprobs=np.zeros((2, 5), np.float32)),
     r"\[policy_loss: ref_logprobs must be \[B,T\] = \(2, 4\)"),
]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name, bad, match", CONTRACT_CASES, ids=[c[0] for c in CONTRACT_CASES])
def test_broken_shape_or_dtype_contract_names_the_argument(jit, name, bad, match):
    """A wrong batch fails when the loss is traced, with a ValueError naming our argument and both
    shapes (or the dtype), eagerly and under jit alike."""
    logp, old, adv, mask = hand_batch()
    args = dict(logprobs=logp, old_logprobs=old, advantages=adv, mask=mask) | bad
    fn = jax.jit(rl.policy_loss) if jit else rl.policy_loss
    with pytest.raises(ValueError, match=match):
        fn(**args)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_the_train_steps_loss_checks_its_weights_and_sft_its_mask(jit):
    """policy_loss_weighted (what the jitted train step calls) checks the weight arrays too."""
    from orchestrax.rl.losses import policy_loss_weighted
    logp, old, adv, mask = hand_batch()
    w = rl.token_weights(mask)
    weighted = jax.jit(policy_loss_weighted) if jit else policy_loss_weighted
    with pytest.raises(ValueError, match=r"\(2, 3\) but expected \(2, 4\)\. "
                                         r"\[policy_loss: metric_weights must be \[B,T\]"):
        weighted(logp, old, adv, mask, w, w[:, :3])
    sft = jax.jit(rl.sft_loss) if jit else rl.sft_loss
    with pytest.raises(ValueError, match=r"\(2, 3\) but expected \(2, 4\)\. "
                                         r"\[sft_loss: mask must be \[B,T\]"):
        sft(logp, mask[:, :3])
    kl = jax.jit(rl.kl_penalty) if jit else rl.kl_penalty
    with pytest.raises(ValueError, match=r"\[kl_penalty: ref_logprobs must be \(2, 4\)"):
        kl(logp, old[:1])
    tw = jax.jit(rl.token_weights) if jit else rl.token_weights
    with pytest.raises(ValueError, match=r"\[token_weights: mask must be \[B,T\]\]"):
        tw(mask[0])


def test_contracts_pass_bf16_logprobs_and_cost_no_retrace():
    """The checks read static shapes only: a bf16 batch passes, and a second call with new values
    reuses the trace."""
    import chex
    logp, old, adv, mask = hand_batch()
    chex.clear_trace_counter()
    fn = jax.jit(chex.assert_max_traces(rl.policy_loss, n=1))
    a, _ = fn(jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), adv, mask)
    b, _ = fn(jnp.asarray(logp + 0.1, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), -adv, mask)
    assert np.isfinite(float(a)) and float(a) != float(b)


def test_contracts_add_nothing_to_the_compiled_program():
    """The contracts read shapes while tracing and emit no ops: the lowered program is the same
    with chex's assertions switched off."""
    import chex
    logp, old, adv, mask = hand_batch()

    def lowered():
        return jax.jit(rl.policy_loss).lower(logp, old, adv, mask).as_text()

    checked = lowered()
    chex.disable_asserts()
    try:
        unchecked = lowered()
        rl.policy_loss(logp, old, adv[:1], mask)   # really off: this shape error goes unseen
    finally:
        chex.enable_asserts()
    assert checked == unchecked


def test_dr_grpo_per_token_scale_ignores_the_filter():
    """Dr.GRPO divides by norm_len · B (every row): dropping half the rows (filtered samples
    arrive as all-zero mask rows) leaves each remaining token's weight 1 / (10 · 4) — with a
    divisor counting only non-empty rows it doubled to 1 / (10 · 2)."""
    mask = np.array([[1, 1, 0], [1, 1, 1], [0, 1, 1], [1, 0, 0]], np.float32)
    full = np.asarray(rl.token_weights(mask, "seq-mean-token-sum-norm", NORM_LEN))
    half = mask.copy()
    half[[0, 2]] = 0.0
    filtered = np.asarray(rl.token_weights(half, "seq-mean-token-sum-norm", NORM_LEN))
    np.testing.assert_allclose(full[mask > 0], 1 / 40, rtol=1e-6)
    np.testing.assert_array_equal(filtered[half > 0], full[half > 0])
    assert np.all(filtered[[0, 2]] == 0)


def _turn_rows(turns_tokens):
    """mask [B, T] and rollout ids [B]: one row per turn, `turns_tokens[i]` the token counts of
    rollout i's turns."""
    lens = [(i, n) for i, turns in enumerate(turns_tokens) for n in turns]
    T = max(n for _, n in lens)
    mask = np.zeros((len(lens), T), np.float32)
    for row, (_, n) in enumerate(lens):
        mask[row, :n] = 1.0
    return mask, np.array([i for i, _ in lens], np.int32)


# The rollouts of the review: 1x40, 2x40, 6x40 and 2x200 tokens (turns x tokens per turn).
ROLLOUTS = [[40], [40, 40], [40] * 6, [200, 200]]


def test_flow_grpo_weights_each_rollout_turn_and_token_equally():
    mask, ids = _turn_rows(ROLLOUTS)
    w = np.asarray(rl.token_weights(mask, "rollout-turn-token-mean", rollout_ids=ids))
    share = [float(w[ids == i].sum()) for i in range(4)]
    np.testing.assert_allclose(share, [0.25] * 4, rtol=1e-6)
    # by hand: rollout 2's tokens get 1/4 (rollout) · 1/6 (turn) · 1/40 (token)
    np.testing.assert_allclose(w[ids == 2][mask[ids == 2] > 0], 1 / (4 * 6 * 40), rtol=1e-6)
    np.testing.assert_allclose(w[ids == 3][mask[ids == 3] > 0], 1 / (4 * 2 * 200), rtol=1e-6)
    tm = np.asarray(rl.token_weights(mask, "token-mean"))
    np.testing.assert_allclose([tm[ids == i].sum() for i in range(4)],
                               np.array([40, 80, 240, 400]) / 760, rtol=1e-6)
    # no rollout ids: every row is its own rollout (seq-mean-token-mean)
    np.testing.assert_allclose(np.asarray(rl.token_weights(mask, "rollout-turn-token-mean")),
                               np.asarray(rl.token_weights(mask, "seq-mean-token-mean")),
                               rtol=1e-6)
    # a filtered rollout leaves the others an equal third each
    kept = mask * (ids != 1)[:, None]
    w3 = np.asarray(rl.token_weights(kept, "rollout-turn-token-mean", rollout_ids=ids))
    np.testing.assert_allclose([w3[ids == i].sum() for i in (0, 2, 3)], [1 / 3] * 3, rtol=1e-6)


def test_balanced_group_net_push_is_zero_under_flow_grpo():
    """At ratio 1 the loss gradient on token t of row b is −A_b · w_bt; their sum is the net push
    on the policy. A balanced ±1 group pushes 0 under Flow-GRPO; under a token mean the long
    rollouts win (hand-worked: (40 − 80 + 240 − 400) / 760)."""
    mask, ids = _turn_rows(ROLLOUTS)
    adv = np.array([1.0, -1.0, 1.0, -1.0], np.float32)[ids]
    logp = np.full(mask.shape, -1.0, np.float32)

    def push(agg):
        g = jax.grad(lambda lp: rl.policy_loss(lp, logp, adv, mask, agg=agg,
                                               rollout_ids=ids)[0])(jnp.asarray(logp))
        return -float(jnp.sum(g))

    assert push("rollout-turn-token-mean") == pytest.approx(0.0, abs=1e-7)
    assert push("token-mean") == pytest.approx(-200 / 760, abs=1e-6)
