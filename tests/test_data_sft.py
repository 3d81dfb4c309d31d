"""SFT warm-start data from JSONL (grain): packed batches hold exactly the unpacked sequences
and loss masks, and train like them (same loss, same gradient, one compile per shape);
conversations get loss on assistant turns only; files stream."""

import collections
import json
import sys

import absl.flags
import chex
import jax
import numpy as np
import pytest

from orchestrax import models, rl
from orchestrax.agent.codec import Codec
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.data.sft import JsonlSource, Tokenise, sft_batches, unpack
from orchestrax.train.warmstart import ConversationRenderer, jsonl_batches

MCFG = models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=4, num_kv_heads=2, head_dim=8)


def _records(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(3, 40))
        ids = rng.integers(1, 500, length).tolist()
        mask = (rng.random(length) < 0.5).astype(int).tolist()
        out.append({"token_ids": ids, "loss_mask": mask, "id": i})
    return out


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_batches_hold_the_unpacked_sequences_and_masks(tmp_path, workers):
    if workers:
        absl.flags.FLAGS(sys.argv[:1])  # grain's worker processes read absl flags
    records = _records(50)
    a = _write(tmp_path / "a.jsonl", records[:30])
    b = _write(tmp_path / "b.jsonl", records[30:])
    ds = sft_batches([a, b], None, seq_len=64, batch_size=4, seed=1, workers=workers)
    it = iter(ds)
    seen = []
    for _ in range(12):
        batch = next(it)
        assert {k: v.shape for k, v in batch.items()} == {
            k: (4, 64) for k in ("tokens", "loss_mask", "segment_ids", "positions",
                                 "attention_mask")}
        np.testing.assert_array_equal(batch["attention_mask"], batch["segment_ids"] > 0)
        assert not batch["loss_mask"][batch["segment_ids"] == 0].any()  # padding has no loss
        for b_, row in enumerate(batch["segment_ids"]):  # positions restart per sequence
            for s in np.unique(row[row > 0]):
                np.testing.assert_array_equal(batch["positions"][b_][row == s],
                                              np.arange((row == s).sum()))
        seen += list(unpack(batch))
    by_tokens = {tuple(r["token_ids"]): r for r in records}
    assert len(seen) > 50  # more than one epoch went by
    for seq in seen:
        original = by_tokens[tuple(seq["tokens"].tolist())]
        np.testing.assert_array_equal(seq["loss_mask"], original["loss_mask"])
    assert {tuple(s["tokens"].tolist()) for s in seen} == set(by_tokens)  # all records come
    if not workers:  # whole packed batches are a prefix of the record stream: epoch by epoch,
        counts = collections.Counter(tuple(s["tokens"].tolist()) for s in seen)  # no record
        assert max(counts.values()) - min(counts.values()) <= 1  # twice before all came once


def test_source_streams_by_offsets_and_names_bad_records(tmp_path):
    path = tmp_path / "t.jsonl"
    text = '{"token_ids": [1, 2], "loss_mask": [0, 1]}\n\n{"token_ids": [3]}\nnot json\n'
    path.write_text(text)
    src = JsonlSource([path])
    assert len(src) == 3  # blank lines are not records
    assert src[0]["record"] == {"token_ids": [1, 2], "loss_mask": [0, 1]}
    byte = text.index("not json")
    with pytest.raises(ValueError, match=rf"t.jsonl: record 2 \(byte {byte}\) is not JSON"):
        src[2]
    tok = Tokenise(None, seq_len=8)
    with pytest.raises(ValueError, match="record 1: loss_mask has None entries for 1 token_ids"):
        tok(src[1])
    with pytest.raises(ValueError, match="needs 'token_ids' \\+ 'loss_mask' or 'messages'"):
        tok({"record": {"messages": []}, "where": "x record 0"})
    with pytest.raises(FileNotFoundError, match="SFT data file '/nope.jsonl'"):
        JsonlSource(["/nope.jsonl"])
    long = tok({"record": {"token_ids": list(range(20)), "loss_mask": [1] * 20}, "where": ""})
    assert long["tokens"].tolist() == list(range(8))  # cut to seq_len


def test_conversations_get_loss_on_assistant_turns_only(tmp_path):
    codec = Codec(tiny_qwen3_tokenizer(512))
    render = ConversationRenderer(codec)
    call = '<tool_call>\n{"name": "lookup_cheap", "arguments": {}}\n</tool_call>'
    messages = [{"role": "system", "content": "You route jobs."},
                {"role": "user", "content": "Run job 7."},
                {"role": "assistant", "content": call},
                {"role": "tool", "content": "Done: 7"},
                {"role": "assistant", "content": "<answer>done</answer>"}]
    ids, mask = render(messages)
    assert len(ids) == len(mask)
    trained = codec.decode([i for i, m in zip(ids, mask) if m])
    assert trained == call + "<|im_end|>" + "<answer>done</answer><|im_end|>"
    # The ids are those of the whole rendered conversation, split only at assistant headers.
    from orchestrax.agent.chat import render_messages
    assert codec.decode(ids) == render_messages(messages, keep_thinking=True)

    path = _write(tmp_path / "c.jsonl", [{"messages": messages}] * 3)
    batch = next(jsonl_batches([str(path)], codec, seq_len=256, batch_size=2, seed=0, workers=0,
                               start=0))
    assert sorted(batch) == ["attention_mask", "loss_mask", "positions", "segment_ids", "tokens"]
    total = int(batch["loss_mask"].sum())  # whole conversations packed, several to a row
    assert total > 0 and total % sum(mask) == 0


def unpacked(batch, seq_len):
    """The sequences of a packed batch, one per row, right-padded: the batch packing replaces."""
    seqs = list(unpack(batch))
    out = {"tokens": np.zeros((len(seqs), seq_len), np.int32),
           "attention_mask": np.zeros((len(seqs), seq_len), np.int32),
           "loss_mask": np.zeros((len(seqs), seq_len), np.int32)}
    for i, seq in enumerate(seqs):
        n = len(seq["tokens"])
        out["tokens"][i, :n], out["attention_mask"][i, :n] = seq["tokens"], 1
        out["loss_mask"][i, :n] = seq["loss_mask"]
    return out


def sft_loss(params, batch):
    """Token-mean cross-entropy over loss_mask, packed rows or not."""
    logp = models.token_logprobs(MCFG, params, batch["tokens"], batch["attention_mask"],
                                 segment_ids_BT=batch.get("segment_ids"),
                                 positions_BT=batch.get("positions"))
    return rl.sft_loss(logp, batch["loss_mask"] * batch["attention_mask"])[0]


def packed_batch(tmp_path, seq_len=48, batch_size=3):
    path = _write(tmp_path / "r.jsonl", _records(30, seed=3))
    return next(jsonl_batches([str(path)], None, seq_len=seq_len, batch_size=batch_size, seed=0,
                              workers=0, start=0))


def test_packed_sft_loss_and_gradient_equal_the_unpacked(tmp_path):
    batch = packed_batch(tmp_path)
    rows = unpacked(batch, 48)
    n_seg = [len(np.unique(r[r > 0])) for r in batch["segment_ids"]]
    assert max(n_seg) >= 2 and (batch["segment_ids"] == 0).any()  # packing and padding happen
    params = models.init_params(MCFG, seed=4)
    grad = jax.jit(jax.value_and_grad(sft_loss))
    loss, g = grad(params, batch)
    want_loss, want_g = grad(params, rows)
    assert float(loss) == pytest.approx(float(want_loss), abs=1e-6)
    chex.assert_trees_all_close(g, want_g, atol=1e-6, rtol=1e-5)
    # The comparison can tell: the same rows with no segment mask give another gradient.
    _, g_whole_row = grad(params, {k: batch[k] for k in ("tokens", "attention_mask",
                                                          "loss_mask", "positions")})
    with pytest.raises(AssertionError):
        chex.assert_trees_all_close(g_whole_row, want_g, atol=1e-6, rtol=1e-5)


def test_the_sft_step_trains_packed_rows_like_unpacked_ones(tmp_path):
    """One step of the jitted SFT update: same loss metric and gradient norm, same new params
    (Adam with eps = 1 makes its first step ~ lr·g, so params compare gradients)."""
    batch = packed_batch(tmp_path)
    ocfg = rl.OptimizerConfig(lr=0.1, eps=1.0, weight_decay=0.0, max_grad_norm=None)
    step = rl.make_train_step(MCFG, rl.GRPOConfig(objective="sft", compute_entropy=False),
                              ocfg).step
    fresh = lambda: rl.init_state(models.init_params(MCFG, seed=4), ocfg)  # noqa: E731
    s_packed, m_packed = step(fresh(), batch)
    s_rows, m_rows = step(fresh(), unpacked(batch, 48))
    assert float(m_packed["loss"]) == pytest.approx(float(m_rows["loss"]), abs=1e-6)
    assert float(m_packed["grad_norm"]) == pytest.approx(float(m_rows["grad_norm"]), rel=1e-5)
    assert float(m_packed["policy_tokens"]) == float(m_rows["policy_tokens"])
    chex.assert_trees_all_close(s_packed.params, s_rows.params, atol=1e-6, rtol=0)


def test_packed_sft_steps_compile_once_per_shape(tmp_path, monkeypatch):
    from orchestrax.rl import train_step
    chex.clear_trace_counter()
    monkeypatch.setattr(train_step, "_train_step",
                        chex.assert_max_traces(train_step._train_step, n=1))
    ocfg = rl.OptimizerConfig(lr=1e-3)
    step = rl.make_train_step(MCFG, rl.GRPOConfig(objective="sft", compute_entropy=False),
                              ocfg).step
    state = rl.init_state(models.init_params(MCFG, seed=4), ocfg)
    path = _write(tmp_path / "r.jsonl", _records(30, seed=3))
    batches = jsonl_batches([str(path)], None, seq_len=48, batch_size=2, seed=0, workers=0,
                            start=0)
    for _ in range(4):                   # new packings, same keys and shapes: no retrace
        state, _ = step(state, next(batches))
    assert int(state.counters["train_steps"]) == 4
    longer = next(jsonl_batches([str(path)], None, seq_len=64, batch_size=2, seed=0, workers=0,
                                start=0))
    with pytest.raises(AssertionError, match="traced > 1 times"):
        step(state, longer)               # a new shape is a new trace


def test_packed_rows_are_for_the_sft_step_only(tmp_path):
    batch = packed_batch(tmp_path, batch_size=2)
    grpo = rl.make_train_step(MCFG, rl.GRPOConfig(compute_entropy=False),
                              rl.OptimizerConfig()).step
    state = rl.init_state(models.init_params(MCFG, seed=4), rl.OptimizerConfig())
    with pytest.raises(ValueError, match=r"packed rows; they are for objective='sft' only "
                                         r"\(got objective='grpo'"):
        grpo(state, {**batch, "advantages": np.zeros(2, np.float32)})
    sft = rl.make_train_step(MCFG, rl.GRPOConfig(objective="sft"), rl.OptimizerConfig()).step
    with pytest.raises(ValueError, match=r"batch has \['segment_ids'\] without the rest"):
        sft(state, {k: v for k, v in batch.items() if k != "positions"})
    seq_mean = rl.make_train_step(MCFG, rl.GRPOConfig(objective="sft", agg="seq-mean-token-mean"),
                                  rl.OptimizerConfig()).step
    with pytest.raises(ValueError, match="packed rows need GRPOConfig.agg='token-mean'; "
                                         "agg='seq-mean-token-mean'"):
        seq_mean(state, batch)


@pytest.mark.slow
def test_packed_sft_step_on_a_2x4_mesh_matches_one_device(tmp_path):
    """segment_ids / positions are split over the batch axes with the rest of the batch."""
    from orchestrax import parallel
    batch = packed_batch(tmp_path, batch_size=8)
    ocfg = rl.OptimizerConfig(lr=0.1, eps=1.0, weight_decay=0.0, max_grad_norm=None)
    gcfg = rl.GRPOConfig(objective="sft", compute_entropy=False)
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("data", 2), ("fsdp", 4),
                                                        ("tensor", 1))))
    out = []
    for m in (None, mesh):
        train = rl.make_train_step(MCFG, gcfg, ocfg, m)
        params = models.init_params(MCFG, seed=4)
        if m is not None:
            params = jax.device_put(params, train.shardings.params)
        out.append(train.step(train.init(params), batch))
    (s1, m1), (s8, m8) = out
    assert float(m1["loss"]) == pytest.approx(float(m8["loss"]), abs=1e-5)
    chex.assert_trees_all_close(s1.params, s8.params, atol=1e-5, rtol=0)


def test_processes_read_a_partition_of_the_records(tmp_path):
    """Each of 3 processes packs only its own records; over one epoch each reads its share
    once, and the shares are disjoint and cover the files."""
    n, seq_len = 20, 16
    # One record fills one row (seq_len tokens), so rows come out in the shard's epoch order;
    # the first token names the record.
    records = [{"token_ids": [i + 1] * seq_len, "loss_mask": [1] * seq_len} for i in range(n)]
    a = _write(tmp_path / "a.jsonl", records[:7])
    b = _write(tmp_path / "b.jsonl", records[7:])
    shares = []
    for p in range(3):
        it = iter(sft_batches([a, b], None, seq_len=seq_len, batch_size=1, seed=0,
                              process_index=p, process_count=3))
        size = len(range(p, n, 3))
        epoch = [int(next(it)["tokens"][0, 0]) - 1 for _ in range(size)]
        assert sorted(epoch) == list(range(p, n, 3)), p  # its own records, each once
        shares.append(set(epoch))
    assert set.union(*shares) == set(range(n)) and sum(map(len, shares)) == n
    with pytest.raises(ValueError, match="process_index=3"):
        sft_batches([a], None, seq_len=8, batch_size=1, seed=0, process_index=3, process_count=3)
    with pytest.raises(ValueError, match="sft_batch=3 does not split evenly over 2"):
        next(jsonl_batches([str(a)], None, seq_len=8, batch_size=3, seed=0, workers=0, start=0,
                           process_count=2))
