"""The packed batch (`rl.pack`) as global `jax.Array`s across the processes of a run."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def from_process_rows(batch: dict[str, np.ndarray], shardings: dict[str, Any]
                      ) -> dict[str, Any]:
    """The global batch as `jax.Array`s on `shardings`, built from this process's own rows (each
    process rolled out its own tasks; the global row order is process 0's rows, then process
    1's, ...). Rows are padded to the longest T of any process first. One process: the numpy
    batch as it is (the jitted step places it)."""
    import jax
    if jax.process_count() == 1:
        return batch
    from jax.experimental import multihost_utils
    t = int(np.max(multihost_utils.process_allgather(np.int32(batch["tokens"].shape[1]))))
    out = {}
    for k, v in batch.items():
        if v.ndim >= 2:
            v = np.pad(v, [(0, 0), (0, t - v.shape[1])] + [(0, 0)] * (v.ndim - 2))
        shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
        out[k] = jax.make_array_from_process_local_data(shardings[k], v, shape)
    return out


def from_global_rows(batch: dict[str, np.ndarray], shardings: dict[str, Any]) -> dict[str, Any]:
    """The global batch as `jax.Array`s on `shardings` when every process holds all of it (the
    warm start's batches are a pure function of the seed): each process places only the rows
    its own devices hold. One process: the numpy batch as it is."""
    import jax
    if jax.process_count() == 1:
        return batch
    return {k: jax.make_array_from_callback(v.shape, shardings[k], lambda idx, v=v: v[idx])
            for k, v in batch.items()}
