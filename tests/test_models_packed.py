"""Packed rows (several sequences one after another, with segment ids and restarting positions):
every sequence's logprobs and entropies equal those of the same sequence alone in its row."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestrax import models
from orchestrax.models import model as model_lib
from orchestrax.models.attention import attention

CFG = models.tiny_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4,
                         num_kv_heads=2, head_dim=8)
T = 24
LENGTHS = [[7, 5, 9], [11, 6], [3, 20]]  # 2-3 sequences a row, then right padding


def packed_and_alone(seed=0):
    """(packed batch [3, T] with segment_ids / positions, each sequence alone in a row [7, T],
    where[i] = (packed row, first slot, length) of sequence i)."""
    rng = np.random.default_rng(seed)
    tokens, segments, positions = (np.zeros((len(LENGTHS), T), np.int32) for _ in range(3))
    alone = np.zeros((sum(map(len, LENGTHS)), T), np.int32)
    alone_mask = np.zeros_like(alone)
    where = []
    for b, row in enumerate(LENGTHS):
        start = 0
        for s, n in enumerate(row, start=1):
            ids = rng.integers(1, CFG.vocab_size, n)
            tokens[b, start:start + n] = ids
            segments[b, start:start + n] = s
            positions[b, start:start + n] = np.arange(n)
            alone[len(where), :n] = ids
            alone_mask[len(where), :n] = 1
            where.append((b, start, n))
            start += n
    packed = {"tokens": tokens, "segment_ids": segments, "positions": positions}
    return packed, (alone, alone_mask), where


def per_sequence(values_BT, where):
    return [np.asarray(values_BT)[b, start:start + n] for b, start, n in where]


@pytest.mark.parametrize("blocks,chunk_size", [(None, None), ((4, 8), 5)])
def test_each_packed_sequence_scores_as_if_alone(monkeypatch, blocks, chunk_size):
    """fp32, <= 1e-5, entropies too; small attention blocks put segment edges inside and across
    blocks, and chunk_size exercises the chunked-logits path."""
    if blocks is not None:
        monkeypatch.setattr(model_lib, "attention",
                            functools.partial(attention, block_q=blocks[0], block_k=blocks[1]))
    params = models.init_params(CFG, seed=1)
    packed, (alone, alone_mask), where = packed_and_alone()
    score = functools.partial(models.token_logprobs, CFG, params, return_entropy=True,
                              chunk_size=chunk_size)
    logp, ent = score(jnp.asarray(packed["tokens"]),
                      segment_ids_BT=jnp.asarray(packed["segment_ids"]),
                      positions_BT=jnp.asarray(packed["positions"]))
    ref_logp, ref_ent = score(jnp.asarray(alone), jnp.asarray(alone_mask))
    for i, (got, want) in enumerate(zip(per_sequence(logp, where), np.asarray(ref_logp))):
        np.testing.assert_allclose(got, want[:len(got)], atol=1e-5, rtol=0, err_msg=f"seq {i}")
        assert got[0] == 0.0  # a segment's first token has no context, like a row's first
    for got, want in zip(per_sequence(ent, where), np.asarray(ref_ent)):
        np.testing.assert_allclose(got, want[:len(got)], atol=1e-5, rtol=0)


def test_without_the_segment_mask_later_sequences_differ():
    """The comparison above can tell: attending over the whole row (what warm start did before)
    changes every sequence after its row's first, and only those.

    Positions alone cannot show it: RoPE scores depend on position differences, so positions
    counted over the row (each segment shifted by a constant) give the same values in fp32."""
    params = models.init_params(CFG, seed=1)
    packed, (alone, alone_mask), where = packed_and_alone()
    tokens, seg = jnp.asarray(packed["tokens"]), jnp.asarray(packed["segment_ids"])
    ref = [r[:n] for r, (_, _, n) in zip(np.asarray(
        models.token_logprobs(CFG, params, jnp.asarray(alone), jnp.asarray(alone_mask))), where)]
    logp = models.token_logprobs(CFG, params, tokens, seg > 0,
                                 positions_BT=jnp.asarray(packed["positions"]))
    for i, (got, want) in enumerate(zip(per_sequence(logp, where), ref)):
        later = where[i][1] > 0  # not its row's first sequence
        # From the sequence's second token: its first is scored from the previous segment.
        assert (np.max(np.abs(got[1:] - want[1:])) > 1e-3) == later, i


def test_forward_takes_packed_rows_and_names_bad_arguments():
    params = models.init_params(CFG, seed=1)
    packed, _, where = packed_and_alone()
    tokens, seg = jnp.asarray(packed["tokens"]), jnp.asarray(packed["segment_ids"])
    pos = jnp.asarray(packed["positions"])
    logits = models.forward(CFG, params, tokens, segment_ids_BT=seg, positions_BT=pos)
    b, start, n = where[1]  # the second sequence of row 0, alone, unpadded
    alone = models.forward(CFG, params, tokens[b:b + 1, start:start + n])
    np.testing.assert_allclose(np.asarray(logits[b, start:start + n]), np.asarray(alone[0]),
                               atol=1e-5, rtol=0)
    # positions_BT reaches the model (all zeros: no position information left).
    flat = models.forward(CFG, params, tokens, segment_ids_BT=seg, positions_BT=pos * 0)
    seq = slice(start + 1, start + n)
    assert float(jnp.max(jnp.abs(flat[b, seq] - logits[b, seq]))) > 1e-3
    with pytest.raises(ValueError, match="segment_ids_BT needs positions_BT"):
        models.forward(CFG, params, tokens, segment_ids_BT=seg)
    with pytest.raises(ValueError, match=r"positions_BT has shape \(3, 23\); it must match "
                                         r"input_ids \(3, 24\)"):
        models.forward(CFG, params, tokens, segment_ids_BT=seg, positions_BT=pos[:, 1:])


def test_segment_starts():
    seg = jnp.asarray([[1, 1, 2, 2, 2, 0, 0], [1, 2, 3, 3, 0, 0, 0]])
    want = [[1, 0, 1, 0, 0, 1, 0], [1, 1, 1, 0, 1, 0, 0]]
    np.testing.assert_array_equal(np.asarray(model_lib.segment_starts(seg)), np.asarray(want, bool))
