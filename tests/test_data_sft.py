"""SFT warm-start data from JSONL (grain): packed batches hold exactly the unpacked sequences
and loss masks; conversations get loss on assistant turns only; files stream."""

import json
import sys

import absl.flags
import numpy as np
import pytest

from orchestrax.agent.codec import Codec
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.data.sft import JsonlSource, Tokenise, sft_batches, unpack
from orchestrax.train.warmstart import ConversationRenderer, jsonl_batches


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
    if not workers:  # one reader: no record twice before its epoch ends (bins may reorder)
        assert len({tuple(s["tokens"].tolist()) for s in seen[:40]}) == 40


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
    assert sorted(batch) == ["attention_mask", "loss_mask", "tokens"]
    total = int(batch["loss_mask"].sum())  # whole conversations packed, several to a row
    assert total > 0 and total % sum(mask) == 0
