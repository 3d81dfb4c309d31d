"""Trajectories -> the padded arrays the train step takes (right padding, bucketed lengths)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from orchestrax.data.records import Trajectory


def bucket_len(n: int, multiple: int = 64) -> int:
    """Round up so the jitted step recompiles only once per bucket, not per batch."""
    return max(multiple, -(-n // multiple) * multiple)


def pack(trajectories: Sequence[Trajectory], *, pad_id: int, max_len: int,
         multiple: int = 64) -> dict[str, np.ndarray]:
    """tokens / attention_mask / loss_mask / sampler_logprobs, all [B, T] and aligned: the entry
    at t concerns tokens[t]. Sequences longer than `max_len` are truncated at the end (their tail
    then costs no gradient)."""
    longest = max(len(t.token_ids) for t in trajectories)
    length = min(bucket_len(longest, multiple), max_len)
    b = len(trajectories)
    out = {"tokens": np.full((b, length), pad_id, np.int32),
           "attention_mask": np.zeros((b, length), np.int32),
           "loss_mask": np.zeros((b, length), np.float32),
           "sampler_logprobs": np.zeros((b, length), np.float32)}
    for i, t in enumerate(trajectories):
        n = min(len(t.token_ids), length)
        out["tokens"][i, :n] = t.token_ids[:n]
        out["attention_mask"][i, :n] = 1
        out["loss_mask"][i, :n] = t.loss_mask[:n]
        out["sampler_logprobs"][i, :n] = t.logprobs[:n]
    return out
