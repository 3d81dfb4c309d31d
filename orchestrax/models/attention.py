"""Causal grouped-query attention whose memory is linear in the sequence length.

Letters as in model.py: B batch, T queries, S keys, N query heads, K kv heads, G = N / K, H head
dim; `bq`/`bk` are block lengths, `nq`/`nk` block counts.

Query `t` of row `b` sits at slot `q_offset[b] + t` and sees key `s` when
`s <= q_offset[b] + t` and `kv_valid[b, s]`: the training forward has `q_offset = 0, S = T`; a
KV-cache step has `q_offset` = the cache index (one for the batch, or one per row [B] for a slot
cache). A packed row (several sequences one after another) adds
`segment_ids[b, t] == segment_ids[b, s]`, so each sequence sees only itself. That mask is never
built as a [B, T, S] array.

Scores are made one (query block, key block) pair at a time with an online softmax (the
flash-attention recurrence) and a custom VJP that recomputes them in the backward pass from the
output and its log-sum-exp, so neither pass keeps anything of size T x S. Each pass is one loop
over a static list of pairs; with a static query offset (training) the pairs that causality
masks entirely are not in it. Rows with no visible key (left padding) give 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

BLOCK_Q = 512
BLOCK_K = 512
_NEG = -1e30  # masked scores: finite, so a row with no visible key yet never makes inf - inf


def attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, kv_valid_BS: jax.Array,
              q_offset: jax.Array | int = 0, *, segment_ids_BT: jax.Array | None = None,
              block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
              fused: str | None = "auto", right_padded: bool = False) -> jax.Array:
    """Softmax(q·kᵀ/√H)·v under the causal, key-validity mask above; returns [B, T, N, H] in
    q's dtype. Scores and softmax are float32.

    `segment_ids_BT` (integer, one id per packed sequence) is for packed training rows: it needs
    S = T and no cache offset, and always takes the chunked path (`jax.nn.dot_product_attention`
    has no segment argument).

    `fused` names a `jax.nn.dot_product_attention` implementation to use when the mask allows
    it (no cache offset, no segments, and every row right-padded); "auto" is cuDNN's flash
    attention on GPU for 16-bit dtypes and nothing elsewhere; None always takes the chunked
    path. The layout is checked at run time (a `lax.cond`: on XLA:GPU a host read of its
    predicate) unless `right_padded` says that every row of `kv_valid_BS` is right-padded (its
    valid keys first); a false claim lets real queries see left padding, so make it only for
    rows checked on the host (`rl.check_right_padded`)."""
    if segment_ids_BT is not None:
        _check_segments(segment_ids_BT, q_BTNH, k_BSKH, q_offset)
        return _chunked(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, q_offset, block_q, block_k,
                        segment_ids_BT)
    if fused == "auto":
        fused = "cudnn" if _cudnn_applies(q_BTNH) else None
    if fused is not None and isinstance(q_offset, int) and q_offset == 0 and (
            k_BSKH.shape[1] == q_BTNH.shape[1]):
        if right_padded:
            return _fused(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, fused)
        return _fused_if_right_padded(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, fused,
                                      functools.partial(attention, block_q=block_q,
                                                        block_k=block_k, fused=None))
    return _chunked(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, q_offset, block_q, block_k)


def _check_segments(segment_ids_BT, q_BTNH, k_BSKH, q_offset) -> None:
    b, t = q_BTNH.shape[:2]
    if tuple(segment_ids_BT.shape) != (b, t) or k_BSKH.shape[1] != t:
        raise ValueError(f"attention: segment_ids_BT has shape {tuple(segment_ids_BT.shape)}; it "
                         f"needs [B, T] = {(b, t)} with as many keys as queries (got "
                         f"S = {k_BSKH.shape[1]})")
    if not jnp.issubdtype(segment_ids_BT.dtype, jnp.integer):
        raise ValueError(f"attention: segment_ids_BT has dtype {segment_ids_BT.dtype}; an integer "
                         "dtype is needed")
    if not (isinstance(q_offset, int) and q_offset == 0):
        raise ValueError(f"attention: segment_ids_BT needs q_offset = 0 (a packed training row); "
                         f"got {q_offset!r}")


def _cudnn_applies(q_BTNH: jax.Array) -> bool:
    h = q_BTNH.shape[-1]
    return (jax.default_backend() == "gpu" and q_BTNH.dtype in (jnp.bfloat16, jnp.float16)
            and h % 8 == 0 and h <= 128)


def _fused(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, implementation) -> jax.Array:
    """The fused kernel on right-padded rows: causality alone hides the padding from every real
    query, and the kernel takes the mask as lengths."""
    lengths_B = jnp.sum(kv_valid_BS.astype(jnp.bool_), axis=1, dtype=jnp.int32)
    # An all-padding row gets one visible key, so its (unused) outputs stay finite.
    out = jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, is_causal=True,
                                       key_value_seq_lengths=jnp.maximum(lengths_B, 1),
                                       implementation=implementation)
    return out.astype(q_BTNH.dtype)


def _fused_if_right_padded(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, implementation, chunked):
    """`_fused` where every row is right-padded (training batches), checked at run time; any
    other layout goes chunked."""
    s = k_BSKH.shape[1]
    valid = kv_valid_BS.astype(jnp.bool_)
    lengths_B = jnp.sum(valid, axis=1, dtype=jnp.int32)
    right_padded = jnp.all(valid == (jnp.arange(s)[None] < lengths_B[:, None]))
    fused = functools.partial(_fused, implementation=implementation)
    return jax.lax.cond(right_padded, fused, chunked, q_BTNH, k_BSKH, v_BSKH, valid)


def _chunked(q_BTNH, k_BSKH, v_BSKH, kv_valid_BS, q_offset, block_q, block_k,
             segment_ids_BT=None) -> jax.Array:
    b, t, n, h = q_BTNH.shape
    s, kh = k_BSKH.shape[1], k_BSKH.shape[2]
    bq = min(t, block_q)
    # Keep a block's score tile at block_q x block_k: a decode step (t = 1) takes S in one go.
    bk = min(s, max(block_k, block_q * block_k // bq))
    nq, nk = -(-t // bq), -(-s // bk)
    q = jnp.pad(q_BTNH, ((0, 0), (0, nq * bq - t), (0, 0), (0, 0)))
    q_nBTKGH = jnp.moveaxis(q.reshape(b, nq, bq, kh, n // kh, h), 1, 0)
    pad_s = ((0, 0), (0, nk * bk - s), (0, 0), (0, 0))
    k_nBSKH = jnp.moveaxis(jnp.pad(k_BSKH, pad_s).reshape(b, nk, bk, kh, h), 1, 0)
    v_nBSKH = jnp.moveaxis(jnp.pad(v_BSKH, pad_s).reshape(b, nk, bk, kh, h), 1, 0)
    valid = jnp.pad(kv_valid_BS.astype(jnp.bool_), ((0, 0), (0, nk * bk - s)))
    valid_nBS = jnp.moveaxis(valid.reshape(b, nk, bk), 1, 0)
    segments = None if segment_ids_BT is None else _segment_blocks(segment_ids_BT, nq, bq, nk, bk)
    # Tie the mask's inputs to q: under a layer scan they are loop-invariant, and JAX would
    # hoist every mask tile out of the loop as one [nq, nk, ..., bq, bk] residual (T x S again).
    q_offset_B = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (b,))
    q_nBTKGH, valid_nBS, segments, q_offset_B = jax.lax.optimization_barrier(
        (q_nBTKGH, valid_nBS, segments, q_offset_B))
    causal_offset = q_offset if isinstance(q_offset, int) else None
    out_nBTKGH = _flash(q_nBTKGH, k_nBSKH, v_nBSKH, valid_nBS, segments, q_offset_B,
                        causal_offset)
    out = jnp.moveaxis(out_nBTKGH, 0, 1).reshape(b, nq * bq, n, h)
    return out[:, :t]


def _segment_blocks(segment_ids_BT, nq, bq, nk, bk):
    """(queries' ids [nq, B, bq], keys' ids [nk, B, bk]), each padded with -1: padded queries
    are cut from the output and padded keys are invalid anyway."""
    b, t = segment_ids_BT.shape
    seg = segment_ids_BT.astype(jnp.int32)
    blocks = lambda n, size: jnp.moveaxis(  # noqa: E731
        jnp.pad(seg, ((0, 0), (0, n * size - t)), constant_values=-1).reshape(b, n, size), 1, 0)
    return blocks(nq, bq), blocks(nk, bk)


def _visible(i, j, bq, bk, valid_BS, q_offset_B, segments=None) -> jax.Array:
    """[B, 1, 1, bq, bk] mask of query block i against key block j; `segments` is that pair's
    (query ids [B, bq], key ids [B, bk]) or None. Row b's queries sit at q_offset_B[b] + t."""
    q_slots_BT = q_offset_B[:, None] + i * bq + jnp.arange(bq)[None]
    causal_BTS = (j * bk + jnp.arange(bk))[None, None, :] <= q_slots_BT[:, :, None]
    mask_BTS = valid_BS[:, None, :] & causal_BTS
    if segments is not None:
        q_seg_BT, k_seg_BS = segments
        mask_BTS = mask_BTS & (q_seg_BT[:, :, None] == k_seg_BS[:, None, :])
    return mask_BTS[:, None, None]


def _scores(q_BTKGH, k_BSKH) -> jax.Array:
    scale = q_BTKGH.shape[-1] ** -0.5
    return jnp.einsum("BTKGH,BSKH->BKGTS", q_BTKGH, k_BSKH,
                      preferred_element_type=jnp.float32) * scale


def _pair(q_seg, k_seg):
    """One (query block, key block) pair's segment ids, or None without segments."""
    return None if q_seg is None else (q_seg, k_seg)


def _schedule(nq: int, nk: int, bq: int, bk: int, causal_offset: int | None, key_major: bool):
    """The (query block, key block) pairs a pass visits, as static int32/bool arrays (i, j,
    first of its group, last of its group); groups are query blocks (forward) or key blocks
    (backward, `key_major`). With a static query offset the pairs causality hides entirely
    are left out; with a traced one every pair is visited (masked), so no pass ever asks the
    host which pairs to run (a conditional per pair would be a device-to-host sync on GPU)."""
    pairs = [(i, j) for i in range(nq) for j in range(nk)
             if causal_offset is None or j * bk <= causal_offset + (i + 1) * bq - 1]
    if key_major:
        pairs.sort(key=lambda p: (p[1], p[0]))
    group = [p[1] if key_major else p[0] for p in pairs]
    first = [n == 0 or group[n - 1] != group[n] for n in range(len(pairs))]
    last = [n == len(pairs) - 1 or group[n + 1] != group[n] for n in range(len(pairs))]
    i, j = zip(*pairs)
    return (np.asarray(i, np.int32), np.asarray(j, np.int32), np.asarray(first),
            np.asarray(last))


def _at(x, n):
    return None if x is None else jax.lax.dynamic_index_in_dim(x, n, 0, keepdims=False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q_nBTKGH, k_nBSKH, v_nBSKH, valid_nBS, segments, q_offset_B, causal_offset):
    return _flash_fwd(q_nBTKGH, k_nBSKH, v_nBSKH, valid_nBS, segments, q_offset_B,
                      causal_offset)[0]


def _flash_fwd(q_nBTKGH, k_nBSKH, v_nBSKH, valid_nBS, segments, q_offset_B, causal_offset):
    nq, b, bq, kh, g, h = q_nBTKGH.shape
    nk, bk = k_nBSKH.shape[0], k_nBSKH.shape[2]
    q_seg_nBT, k_seg_nBS = (None, None) if segments is None else segments
    residuals = (q_nBTKGH, k_nBSKH, v_nBSKH, valid_nBS, segments, q_offset_B)
    if nq == 1 and nk == 1:
        # One tile (T <= block_q and S within a tile: short rows, every decode step): a plain
        # masked softmax; the loop machinery of the recurrence below costs ~8% at T = 512 on CPU.
        pair = None if segments is None else (q_seg_nBT[0], k_seg_nBS[0])
        mask = _visible(0, 0, bq, bk, valid_nBS[0], q_offset_B, pair)
        carry = _online_softmax(_empty(b, kh, g, bq, h), q_nBTKGH[0], k_nBSKH[0], v_nBSKH[0],
                                mask)
        out, lse = _normalise(*carry, q_nBTKGH.dtype)
        return out[None], residuals + (out[None], lse[None])

    # One loop over the visited pairs, query-block major: the online softmax restarts at a
    # group's first pair, and its last pair writes the block's output and log-sum-exp.
    def step(c, xs):
        i, j, first, last = xs
        carry, out, lse = c
        carry = jax.tree.map(lambda e, x: jnp.where(first, e, x), _empty(b, kh, g, bq, h),
                             carry)
        pair = None if segments is None else (_at(q_seg_nBT, i), _at(k_seg_nBS, j))
        mask = _visible(i, j, bq, bk, _at(valid_nBS, j), q_offset_B, pair)
        carry = _online_softmax(carry, _at(q_nBTKGH, i), _at(k_nBSKH, j), _at(v_nBSKH, j), mask)
        o, l_ = _normalise(*carry, q_nBTKGH.dtype)
        out = jax.lax.dynamic_update_index_in_dim(out, jnp.where(last, o, _at(out, i)), i, 0)
        lse = jax.lax.dynamic_update_index_in_dim(lse, jnp.where(last, l_, _at(lse, i)), i, 0)
        return (carry, out, lse), None

    init = (_empty(b, kh, g, bq, h), jnp.zeros(q_nBTKGH.shape, q_nBTKGH.dtype),
            jnp.zeros((nq, b, kh, g, bq), jnp.float32))
    (_, out, lse), _ = jax.lax.scan(step, init, _schedule(nq, nk, bq, bk, causal_offset,
                                                          key_major=False))
    return out, residuals + (out, lse)


def _empty(b, kh, g, bq, h):
    """The online softmax's (running max, denominator, weighted sum) before any key."""
    return (jnp.full((b, kh, g, bq), _NEG, jnp.float32), jnp.zeros((b, kh, g, bq), jnp.float32),
            jnp.zeros((b, kh, g, bq, h), jnp.float32))


def _online_softmax(carry, q_BTKGH, k_BSKH, v_BSKH, mask):
    """Fold one key block into (running max, denominator, weighted sum): the flash recurrence."""
    m_BKGT, l_BKGT, acc_BKGTH = carry
    s = jnp.where(mask, _scores(q_BTKGH, k_BSKH), _NEG)
    m_new = jnp.maximum(m_BKGT, jnp.max(s, axis=-1))
    p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m_BKGT - m_new)
    pv = jnp.einsum("BKGTS,BSKH->BKGTH", p.astype(v_BSKH.dtype), v_BSKH,
                    preferred_element_type=jnp.float32)
    return m_new, l_BKGT * corr + jnp.sum(p, axis=-1), acc_BKGTH * corr[..., None] + pv


def _normalise(m_BKGT, l_BKGT, acc_BKGTH, dtype):
    """(output [B, T, K, G, H] in `dtype`, log-sum-exp [B, K, G, T]) from the softmax's running
    max, denominator and weighted sum; a row that saw no key gives 0 for both."""
    seen = l_BKGT > 0
    l_safe = jnp.where(seen, l_BKGT, 1.0)
    out_BKGTH = jnp.where(seen[..., None], acc_BKGTH / l_safe[..., None], 0.0)
    lse_BKGT = jnp.where(seen, m_BKGT + jnp.log(l_safe), 0.0)
    return jnp.einsum("BKGTH->BTKGH", out_BKGTH).astype(dtype), lse_BKGT


def _flash_bwd(causal_offset, res, dout_nBTKGH):
    q_nBTKGH, k_nBSKH, v_nBSKH, valid_nBS, segments, q_offset_B, out_nBTKGH, lse_nBKGT = res
    q_seg_nBT, k_seg_nBS = (None, None) if segments is None else segments
    nq, b, bq, kh, g, h = q_nBTKGH.shape
    nk, bk = k_nBSKH.shape[0], k_nBSKH.shape[2]
    scale = h ** -0.5
    dt = q_nBTKGH.dtype
    # D_i = rowsum(dO * O): the softmax Jacobian's diagonal term, once per query.
    d_nBKGT = jnp.einsum("nBTKGH,nBTKGH->nBKGT", dout_nBTKGH.astype(jnp.float32),
                         out_nBTKGH.astype(jnp.float32))

    # One loop over the visited pairs, key-block major: dk and dv of a key block accumulate
    # over its group and are written at its last pair; dq accumulates across groups.
    def step(c, xs):
        i, j, first, last = xs
        (dk_BSKH, dv_BSKH), dq, dk_all, dv_all = c
        zeros = jnp.zeros((b, bk, kh, h), jnp.float32)
        dk_BSKH, dv_BSKH = jnp.where(first, zeros, dk_BSKH), jnp.where(first, zeros, dv_BSKH)
        q_BTKGH, do_BTKGH, k_BSKH, v_BSKH = (_at(q_nBTKGH, i), _at(dout_nBTKGH, i),
                                             _at(k_nBSKH, j), _at(v_nBSKH, j))
        pair = None if segments is None else (_at(q_seg_nBT, i), _at(k_seg_nBS, j))
        mask = _visible(i, j, bq, bk, _at(valid_nBS, j), q_offset_B, pair)
        p = jnp.where(mask, jnp.exp(_scores(q_BTKGH, k_BSKH) - _at(lse_nBKGT, i)[..., None]),
                      0.0)
        dv_BSKH += jnp.einsum("BKGTS,BTKGH->BSKH", p.astype(dt), do_BTKGH,
                              preferred_element_type=jnp.float32)
        dp = jnp.einsum("BTKGH,BSKH->BKGTS", do_BTKGH, v_BSKH,
                        preferred_element_type=jnp.float32)
        ds = (p * (dp - _at(d_nBKGT, i)[..., None])).astype(dt)
        dq_i = jnp.einsum("BKGTS,BSKH->BTKGH", ds, k_BSKH,
                          preferred_element_type=jnp.float32) * scale
        dk_BSKH += jnp.einsum("BKGTS,BTKGH->BSKH", ds, q_BTKGH,
                              preferred_element_type=jnp.float32) * scale
        dq = jax.lax.dynamic_update_index_in_dim(dq, _at(dq, i) + dq_i, i, 0)
        put = lambda all_, x: jax.lax.dynamic_update_index_in_dim(  # noqa: E731
            all_, jnp.where(last, x, _at(all_, j)), j, 0)
        return ((dk_BSKH, dv_BSKH), dq, put(dk_all, dk_BSKH), put(dv_all, dv_BSKH)), None

    zeros = jnp.zeros((b, bk, kh, h), jnp.float32)
    kv0 = jnp.zeros(k_nBSKH.shape, jnp.float32)
    init = ((zeros, zeros), jnp.zeros(q_nBTKGH.shape, jnp.float32), kv0, kv0)
    (_, dq, dk, dv), _ = jax.lax.scan(step, init, _schedule(nq, nk, bq, bk, causal_offset,
                                                            key_major=True))
    return (dq.astype(dt), dk.astype(k_nBSKH.dtype), dv.astype(v_nBSKH.dtype), None, None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)
