"""The RL task stream: which task indices each step trains on, as a grain pipeline.

Each process takes a disjoint shard of the task indices (`index % process_count ==
process_index`), reshuffles it every epoch, and cuts each epoch into steps of `per_step` tasks.
An epoch's remainder (fewer than `per_step` tasks) is skipped rather than topped up from the next
epoch, so no step ever holds a task twice; the reshuffle makes a different remainder each epoch.
The stream is a random-access grain `MapDataset`, so its iterator's position is one integer,
saved in the Orbax checkpoint and restored exactly.
"""

from __future__ import annotations

import sys
from typing import Sequence

import grain
import numpy as np

from orchestrax.data.shuffle import EpochPermutations


class EpochSteps(grain.MapDataset):
    """Step i -> int64 [per_step] elements of `shard`: epoch i // steps_per_epoch of a
    per-epoch permutation of `shard`, its (i % steps_per_epoch)-th slice of `per_step`."""

    def __init__(self, shard: grain.MapDataset, per_step: int, seed: int):
        super().__init__(shard)
        self._shard = np.asarray([shard[i] for i in range(len(shard))], np.int64)
        self._per_step = per_step
        self._steps_per_epoch = len(self._shard) // per_step
        self._orders = EpochPermutations(self._shard, seed)  # thread-safe: grain reads ahead

    def __len__(self) -> int:
        return sys.maxsize

    def __str__(self) -> str:
        return f"EpochSteps(per_step={self._per_step}, shard={len(self._shard)})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        epoch, k = divmod(index, self._steps_per_epoch)
        order = self._orders(epoch)  # one permutation per epoch, a pure function of (seed, epoch)
        return order[k * self._per_step:(k + 1) * self._per_step].copy()


def task_stream(num_tasks: int, tasks_per_step: int, *, seed: int, process_index: int = 0,
                process_count: int = 1) -> grain.MapDataset:
    """Per-step task indices for this process: `tasks_per_step / process_count` of them."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index}, process_count={process_count}; need "
                         "0 <= process_index < process_count")
    if tasks_per_step % process_count:
        raise ValueError(f"rollout.tasks_per_step={tasks_per_step} does not split evenly over "
                         f"{process_count} processes; use a multiple of {process_count}")
    per_step = tasks_per_step // process_count
    shard = grain.MapDataset.range(num_tasks)[process_index::process_count]
    if not 1 <= per_step <= len(shard):
        raise ValueError(f"rollout.tasks_per_step={tasks_per_step}: {per_step} per process, but "
                         f"process {process_index}'s shard has {len(shard)} of the {num_tasks} "
                         "tasks; a step takes each task at most once")
    return EpochSteps(shard, per_step, seed)


class EpochCycle(grain.MapDataset):
    """Element k -> `values` reshuffled every epoch: element k % n of epoch k // n's
    permutation (an endless, random-access stream of one task source)."""

    def __init__(self, values: np.ndarray, seed: int):
        super().__init__()
        self._n = len(values)
        self._orders = EpochPermutations(np.asarray(values, np.int64), seed)

    def __len__(self) -> int:
        return sys.maxsize

    def __str__(self) -> str:
        return f"EpochCycle(n={self._n})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        epoch, k = divmod(index, self._n)
        return int(self._orders(epoch)[k])


def mixture_stream(sizes: Sequence[int], weights: Sequence[float], tasks_per_step: int, *,
                   seed: int, process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
    """Per-step task indices for this process from several task sources laid end to end (source
    s holds indices offset_s .. offset_s + sizes[s] - 1): grain's weighted mix of one endless
    reshuffled stream per source, so over any run of steps source s fills a `weights[s]` /
    sum(weights) share of the slots. Each process draws from its own shard of every source. A
    source smaller than its share of a step repeats tasks within that step."""
    if len(sizes) != len(weights) or not sizes:
        raise ValueError(f"mixture: {len(sizes)} sources but {len(weights)} weights")
    if any(w <= 0 for w in weights):
        raise ValueError(f"mixture weights {tuple(weights)}; each must be > 0")
    if tasks_per_step % process_count:
        raise ValueError(f"rollout.tasks_per_step={tasks_per_step} does not split evenly over "
                         f"{process_count} processes; use a multiple of {process_count}")
    offsets = np.cumsum([0, *sizes])
    parents = []
    for s, n in enumerate(sizes):
        shard = np.arange(offsets[s], offsets[s] + n)[process_index::process_count]
        if not len(shard):
            raise ValueError(f"mixture source {s} has {n} tasks: none for process "
                             f"{process_index} of {process_count}")
        parents.append(EpochCycle(shard, seed * 1009 + s))
    mixed = grain.MapDataset.mix(parents, list(map(float, weights)))
    return mixed.batch(tasks_per_step // process_count)
