"""Where the supervised warm start gets its batches: the environment's demonstrations, or
JSONL files of trajectories (`TrainConfig.sft_data`) through the grain pipeline of
`orchestrax.data.sft`.

JSONL rows are packed: several sequences one after another, each with its `segment_ids` and
`positions` (restarting at 0), which the SFT step passes to the model, so a sequence attends only
to itself and sees the positions it would alone: its logprobs, token-mean loss and gradient
equal those of the same sequences unpacked (tests/test_data_sft.py). Demonstration batches hold
one sequence a row and carry neither.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Sequence

import numpy as np

from orchestrax.agent.chat import render_messages
from orchestrax.data.sft import sft_batches

# The header ends where a rollout's prompt ends: after an empty think block when thinking is off
# (the generation prompt supplies it), so that block is prompt, not trained.
_ASSISTANT = re.compile(r"(<\|im_start\|>assistant\n(?:<think>\n\n</think>\n\n)?)(.*?<\|im_end\|>)",
                        re.S)
_STEP_KEYS = ("tokens", "attention_mask", "loss_mask")
_PACKED_STEP_KEYS = _STEP_KEYS + ("segment_ids", "positions")


class ConversationRenderer:
    """(messages, tools) -> (ids, loss mask): 1 on each assistant turn's body (a non-empty think
    block included) and its `<|im_end|>`, 0 elsewhere. Pieces are tokenised apart at the
    assistant header, exactly where a rollout's prompt ends and the sampler's ids begin.
    Picklable (grain workers)."""

    def __init__(self, codec: Any):
        self.codec = codec

    def __call__(self, messages: Sequence[dict], tools: Sequence[Any] = ()
                 ) -> tuple[list[int], list[int]]:
        text = render_messages(messages, tools=tools, keep_thinking=True)
        ids: list[int] = []
        mask: list[int] = []
        cursor = 0
        for m in _ASSISTANT.finditer(text):
            for piece, loss in ((text[cursor:m.end(1)], 0), (m.group(2), 1)):
                piece_ids = self.codec.encode(piece)
                ids += piece_ids
                mask += [loss] * len(piece_ids)
            cursor = m.end()
        tail = self.codec.encode(text[cursor:]) if cursor < len(text) else []
        return ids + tail, mask + [0] * len(tail)


def jsonl_batches(paths: Sequence[str], codec: Any, *, seq_len: int, batch_size: int,
                  seed: int, workers: int, start: int, process_index: int = 0,
                  process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """This process's rows of the train step's packed SFT batches ([B / process_count, seq_len]
    tokens / attention_mask / loss_mask / segment_ids / positions) from its own share of the
    JSONL records, skipping the `start` batches a resumed run has already trained on."""
    if batch_size % process_count:
        raise ValueError(f"sft_batch={batch_size} does not split evenly over {process_count} "
                         f"processes; use a multiple of {process_count}")
    if workers:
        import absl.flags  # grain's worker processes read absl flags
        if not absl.flags.FLAGS.is_parsed():
            absl.flags.FLAGS(["orchestrax"])
    it = iter(sft_batches(paths, ConversationRenderer(codec), seq_len=seq_len,
                          batch_size=batch_size // process_count, seed=seed, workers=workers,
                          process_index=process_index, process_count=process_count))
    for _ in range(start):
        next(it)
    for batch in it:
        yield {k: batch[k] for k in _PACKED_STEP_KEYS}


def demo_batches(demos: Sequence[Any], *, pad_id: int, seq_len: int, batch_size: int, seed: int,
                 start: int) -> Iterator[dict[str, np.ndarray]]:
    """Batches of the environment's demonstration trajectories, drawn with replacement; batch
    k depends only on (seed, k), so a resumed run continues the same sequence from `start`."""
    from orchestrax.rl import pack

    step = start
    while True:
        rng = np.random.default_rng([seed, 1, step])
        chosen = [demos[i] for i in rng.choice(len(demos), batch_size)]
        batch = pack(chosen, pad_id=pad_id, max_len=seq_len)
        yield {k: batch[k] for k in _STEP_KEYS}
        step += 1
