"""Chunked (flash-style) attention against the materialised attention it replaced: values and
gradients to 1e-5 in fp32 with left and right padding, in the model and on a KV cache; its
compiled memory grows linearly in T."""

import functools

import chex
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from orchestrax import models
from orchestrax.models import model as model_lib
from orchestrax.models.attention import attention


def materialised_attention(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, q_offset=0,
                           segment_ids_BT=None, fused=None, right_padded=False):
    """The model's attention before 2026-12-01 (main at 0d33131), with its [B, T, S] mask made
    from the same (kv_valid, q_offset) description, plus same-segment when segments are given
    (`fused` and `right_padded`, the model's arguments, change nothing here)."""
    b, t, n, h = q_BTNH.shape
    s, kh = k_BSKH.shape[1], k_BSKH.shape[2]
    causal_TS = jnp.arange(s)[None, :] <= q_offset + jnp.arange(t)[:, None]
    mask_BTS = kv_valid_BS.astype(bool)[:, None, :] & causal_TS[None]
    if segment_ids_BT is not None:
        mask_BTS = mask_BTS & (segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :])
    q_BTKGH = q_BTNH.reshape(b, t, kh, n // kh, h)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", q_BTKGH, k_BSKH,
                        preferred_element_type=jnp.float32) * (h ** -0.5)
    scores = jnp.where(mask_BTS[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BSKH.dtype)
    return jnp.einsum("BKGTS,BSKH->BTKGH", probs, v_BSKH).reshape(b, t, n, h)


def qkv(b=3, t=13, s=None, n=4, kh=2, h=8, seed=0):
    rng = np.random.default_rng(seed)
    s = s or t
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    return f(b, t, n, h), f(b, s, kh, h), f(b, s, kh, h)


def padded(b, s):
    """Row 0 full, row 1 left-padded, row 2 right-padded."""
    valid = np.ones((b, s), bool)
    valid[1, :4] = False
    valid[2, s - 4:] = False
    return valid


def max_diff_on(real_BT, a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))[real_BT]))


def assert_same_gradients(ours, ref, q, k, v, valid):
    """d/dq, d/dk, d/dv of a random weighting of the outputs agree to 1e-5; the loss reads real
    queries only (padding rows are outputs nobody reads)."""
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
    w = w * valid[:, :, None, None]
    grad = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(f(*a, valid) * w),  # noqa: E731
                                      argnums=(0, 1, 2)))
    chex.assert_trees_all_close(grad(ours)(q, k, v), grad(ref)(q, k, v), atol=1e-5, rtol=0)


@pytest.mark.parametrize("block_q,block_k", [(512, 512), (4, 4), (3, 5), (5, 2)])
def test_values_and_gradients_equal_the_materialised_attention(block_q, block_k):
    q, k, v = qkv()
    valid = padded(3, 13)
    ours = functools.partial(attention, block_q=block_q, block_k=block_k, fused=None)
    got = jax.jit(ours)(q, k, v, valid)
    assert max_diff_on(valid, got, materialised_attention(q, k, v, valid)) <= 1e-5
    assert_same_gradients(ours, materialised_attention, q, k, v, valid)


def test_queries_at_a_cache_offset():
    q, k, v = qkv(t=5, s=19)
    valid = padded(3, 19)
    valid[2, 11:] = False  # slots after the new tokens are empty
    offset = jnp.asarray(6)  # queries at slots 6..10, a traced index as in decode
    want = materialised_attention(q, k, v, valid, offset)
    got = jax.jit(functools.partial(attention, block_q=2, block_k=4))(q, k, v, valid, offset)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


def test_padding_rows_that_see_no_key_are_zero_not_nan():
    q, k, v = qkv()
    valid = padded(3, 13)
    out = attention(q, k, v, valid, block_q=4, block_k=4)
    assert np.all(np.asarray(out)[1, :4] == 0)
    assert np.all(np.isfinite(np.asarray(out)))


def test_fused_kernel_only_for_right_padding():
    """`fused` is cuDNN on GPU; XLA's implementation of the same call checks the dispatch here:
    causal + lengths is wrong for left padding, so equality there proves the chunked fallback."""
    q, k, v = qkv()
    right = np.arange(13)[None] < np.array([[13], [7], [0]])
    for valid in (right, padded(3, 13)):
        got = jax.jit(functools.partial(attention, fused="xla"))(q, k, v, valid)
        assert max_diff_on(valid, got, materialised_attention(q, k, v, valid)) <= 1e-5
        assert np.all(np.isfinite(np.asarray(got)))


def test_right_padded_claim_runs_the_fused_kernel_with_no_conditional():
    """`right_padded=True` is the caller's word that every row is right-padded: the fused kernel
    runs with no run-time layout check (a `cond`, on XLA:GPU a host read of its predicate), with
    the values and gradients of the checked path. A false word lets real queries see left
    padding, which is why callers check their rows on the host."""
    q, k, v = qkv()
    right = np.arange(13)[None] < np.array([[13], [7], [0]])
    checked = functools.partial(attention, fused="xla")
    claimed = functools.partial(attention, fused="xla", right_padded=True)
    np.testing.assert_allclose(np.asarray(jax.jit(claimed)(q, k, v, right)),
                               np.asarray(jax.jit(checked)(q, k, v, right)), atol=1e-6, rtol=0)
    assert_same_gradients(claimed, checked, q, k, v, right)

    def prims(f):
        loss = lambda q, k, v: jnp.sum(f(q, k, v, right))  # noqa: E731
        return _primitives(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr)
    assert "cond" in prims(checked)           # the measure can tell
    assert "cond" not in prims(claimed)
    left = padded(3, 13)
    assert max_diff_on(left, claimed(q, k, v, left), materialised_attention(q, k, v, left)) > 1e-2


def packed_segments():
    """Row 0: three sequences; row 1: two and right padding; row 2: one and right padding."""
    return np.array([[1] * 5 + [2] * 4 + [3] * 4,
                     [1] * 6 + [2] * 4 + [0] * 3,
                     [1] * 9 + [0] * 4], np.int32)


@pytest.mark.parametrize("block_q,block_k,fused", [(512, 512, "xla"), (4, 4, None),
                                                   (3, 5, None)])
def test_segments_values_and_gradients_equal_the_masked_softmax(block_q, block_k, fused):
    """Packed rows: each query sees only its own segment. `fused="xla"` must route to the
    chunked path (XLA's kernel has no segments, so equality proves the routing)."""
    q, k, v = qkv()
    seg = jnp.asarray(packed_segments())
    valid = np.asarray(seg) > 0
    ours = functools.partial(attention, segment_ids_BT=seg, block_q=block_q, block_k=block_k,
                             fused=fused)
    ref = functools.partial(materialised_attention, segment_ids_BT=seg)
    assert max_diff_on(valid, jax.jit(ours)(q, k, v, valid), ref(q, k, v, valid)) <= 1e-5
    assert_same_gradients(ours, ref, q, k, v, valid)
    # The reference can tell: without segments, later sequences read the earlier ones.
    unsegmented = materialised_attention(q, k, v, valid)
    assert max_diff_on(valid, jax.jit(ours)(q, k, v, valid), unsegmented) > 1e-2


def test_segments_refuse_what_they_cannot_mean():
    q, k, v = qkv(t=5, s=19)
    valid = np.ones((3, 19), bool)
    with pytest.raises(ValueError, match=r"segment_ids_BT has shape \(3, 19\); it needs "
                                         r"\[B, T\] = \(3, 5\) with as many keys as queries"):
        attention(q, k, v, valid, segment_ids_BT=jnp.ones((3, 19), jnp.int32))
    q, k, v = qkv()
    valid = np.ones((3, 13), bool)
    with pytest.raises(ValueError, match="segment_ids_BT needs q_offset = 0"):
        attention(q, k, v, valid, 3, segment_ids_BT=jnp.ones((3, 13), jnp.int32))
    with pytest.raises(ValueError, match="segment_ids_BT has dtype float32; an integer"):
        attention(q, k, v, valid, segment_ids_BT=jnp.ones((3, 13), jnp.float32))


def with_attention(monkeypatch, fn):
    monkeypatch.setattr(model_lib, "attention", fn)


@pytest.mark.slow
def test_model_logits_and_decode_equal_the_materialised_model(monkeypatch):
    cfg = models.tiny_config()
    params = models.init_params(cfg, seed=2)
    rng = np.random.default_rng(3)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 14)), jnp.int32)
    valid = padded(3, 14)
    mask = jnp.asarray(valid, jnp.int32)

    # Positions whose prediction reads a real token (the first real token's reads padding).
    scored = jnp.asarray(valid & np.roll(valid, 1, axis=1), jnp.float32)

    def run(params):
        logits = models.forward(cfg, params, ids, mask)
        cache = models.init_cache(cfg, batch=3, max_len=20)
        prefill, cache = models.forward_with_cache(cfg, params, ids[:, :9], mask[:, :9], cache)
        step, _ = models.forward_with_cache(cfg, params, ids[:, 9:10], mask[:, 9:10], cache)
        grads = jax.grad(lambda p: jnp.sum(models.token_logprobs(cfg, p, ids, mask) * scored))(
            params)
        return logits, prefill, step, grads

    with_attention(monkeypatch, functools.partial(attention, block_q=4, block_k=4, fused=None))
    # A new function object per attention: jit caches traces by function.
    fresh = lambda: jax.jit(lambda p: run(p))  # noqa: E731
    ours = fresh()(params)
    with_attention(monkeypatch, materialised_attention)
    ref = fresh()(params)
    assert max_diff_on(valid, ours[0], ref[0]) <= 1e-5
    assert max_diff_on(valid[:, :9], ours[1], ref[1]) <= 1e-5
    np.testing.assert_allclose(np.asarray(ours[2]), np.asarray(ref[2]), atol=1e-5, rtol=0)
    for path, g in jax.tree_util.tree_leaves_with_path(ours[3]):
        want = functools.reduce(lambda t, key: t[key.key], path, ref[3])
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), atol=1e-5, rtol=0,
                                   err_msg=jax.tree_util.keystr(path))


def layer_temp_bytes(t: int) -> int:
    """Compiled temporaries of one Qwen3-0.6B-sized layer's forward + backward on one row."""
    cfg = models.preset("qwen3-0.6b", num_layers=1).replace(vocab_size=1024)
    params = jax.eval_shape(lambda: models.init_params(cfg))
    ids = jax.ShapeDtypeStruct((1, t), jnp.int32)
    loss = lambda p, i: jnp.sum(models.hidden_states(cfg, p, i))  # noqa: E731
    compiled = jax.jit(jax.grad(loss)).lower(params, ids).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_one_layer_memory_is_linear_in_t(monkeypatch):
    ratio = layer_temp_bytes(8192) / layer_temp_bytes(4096)
    assert ratio <= 2.2, ratio
    # The measure can tell: the materialised scores made it ~4x.
    with_attention(monkeypatch, materialised_attention)
    assert layer_temp_bytes(8192) / layer_temp_bytes(4096) > 3.5


def test_profiles_name_blocks_attention_and_lm_head():
    cfg = models.tiny_config()
    params = jax.eval_shape(lambda: models.init_params(cfg))
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    hlo = jax.jit(models.forward, static_argnums=0).lower(cfg, params, ids).as_text(
        debug_info=True)
    for scope in ("block/attention", "block/mlp", "lm_head"):
        assert scope in hlo, scope


def test_queries_at_one_cache_offset_per_row():
    q, k, v = qkv(t=5, s=19)
    valid = padded(3, 19)
    offsets = jnp.asarray([0, 6, 14])   # a slot cache: each row writes at its own index
    got = jax.jit(functools.partial(attention, block_q=2, block_k=4))(q, k, v, valid, offsets)
    for r in range(3):   # every query here sees at least one real key
        want = materialised_attention(q[r:r + 1], k[r:r + 1], v[r:r + 1], valid[r:r + 1],
                                      offsets[r])
        np.testing.assert_allclose(np.asarray(got[r:r + 1]), np.asarray(want), atol=1e-5,
                                   rtol=0)


def _primitives(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


@pytest.mark.parametrize("offset", [0, "traced"])
def test_the_chunked_path_has_no_conditional_to_sync_on(offset):
    """A conditional inside the block loop makes XLA:GPU copy its predicate to the host once
    per (query block, key block) pair and layer; the pair schedule is static instead."""
    q, k, v = qkv(t=13)
    valid = padded(3, 13)
    seg = packed_segments() if offset == 0 else None
    off = 0 if offset == 0 else jnp.asarray(0)

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v, valid, off, segment_ids_BT=seg, block_q=4,
                                 block_k=4, fused=None))

    prims = _primitives(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr)
    assert "scan" in prims and "cond" not in prims, prims
