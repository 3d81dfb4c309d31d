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


def gather_processes(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """On a multi-host run each process rolls out its own shard of the step's tasks; the jitted
    step takes the global batch as numpy on every process, so rows are gathered (padded to the
    longest T of any process first). One process: the batch as it is."""
    import jax
    if jax.process_count() == 1:
        return batch
    from jax.experimental import multihost_utils
    t = int(np.max(multihost_utils.process_allgather(np.int32(batch["tokens"].shape[1]))))
    padded = {k: np.pad(v, [(0, 0), (0, t - v.shape[1])] + [(0, 0)] * (v.ndim - 2))
              if v.ndim >= 2 else v for k, v in batch.items()}
    return {k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
            for k, v in padded.items()}
