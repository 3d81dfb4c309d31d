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
import threading
from typing import Sequence, TypeVar

import grain
import numpy as np

from orchestrax.data.shuffle import EpochPermutations

T = TypeVar("T")


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


class MixtureSteps(grain.MapDataset):
    """Step i -> int64 [per_step] task indices drawn from several sources (`shards[s]`, this
    process's indices of source s) in proportion to `weights`.

    Slots: each step's `per_step` slots go one at a time to the source furthest below its
    running target (steps so far x per_step x its share), so every source's count stays within
    one task of its share at every step. Tasks: each source is read epoch by epoch in a
    per-epoch permutation; a step that needs more of a source than its epoch has left starts
    that source's next epoch and skips the remainder (as `EpochSteps` does), so within an
    epoch a source's tasks appear at most once and no step holds a task twice. Steps are a
    pure function of (shards, weights, per_step, seed) and of nothing read earlier: computed in
    order once and kept (a few bytes a step), so a restored iterator jumps straight to its
    position.
    """

    def __init__(self, shards: Sequence[np.ndarray], weights: Sequence[float], per_step: int,
                 seed: int):
        super().__init__()
        self._shards = [np.asarray(x, np.int64) for x in shards]
        total = float(sum(weights))
        self._share = np.asarray(weights, np.float64) / total
        self._per_step = per_step
        for s, (shard, share) in enumerate(zip(self._shards, self._share)):
            most = int(np.floor(per_step * share)) + 1  # the most slots one step gives s
            if len(shard) < min(most, per_step):
                raise ValueError(f"mixture source {s} has {len(shard)} tasks for this process "
                                 f"but a step can take up to {min(most, per_step)} of them; "
                                 "lower its weight or rollout.tasks_per_step, or add tasks")
        self._orders = [EpochPermutations(x, seed * 1009 + s) for s, x in enumerate(self._shards)]
        self._lock = threading.Lock()
        self._steps: list[np.ndarray] = []
        self._taken = np.zeros(len(self._shards))               # slots given to each source
        self._where = [(0, 0) for _ in self._shards]            # (epoch, position) per source

    def __len__(self) -> int:
        return sys.maxsize

    def __str__(self) -> str:
        return f"MixtureSteps(per_step={self._per_step}, shards={[len(x) for x in self._shards]})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        with self._lock:
            while len(self._steps) <= index:
                self._steps.append(self._next_step())
            return self._steps[index].copy()

    def _next_step(self) -> np.ndarray:
        target = (len(self._steps) + 1) * self._per_step * self._share
        counts = np.zeros(len(self._shards), np.int64)
        for _ in range(self._per_step):
            s = int(np.argmax(target - self._taken - counts))  # ties: the first source
            counts[s] += 1
        self._taken += counts
        out = []
        for s, c in enumerate(counts):
            epoch, pos = self._where[s]
            if pos + c > len(self._shards[s]):  # the epoch's remainder is too short: skip it
                epoch, pos = epoch + 1, 0
            out.append(self._orders[s](epoch)[pos:pos + c])
            self._where[s] = (epoch, pos + int(c))
        return np.concatenate(out)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_lock")
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


def mixture_stream(sizes: Sequence[int], weights: Sequence[float], tasks_per_step: int, *,
                   seed: int, process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
    """Per-step task indices for this process from several task sources laid end to end (source
    s holds indices offset_s .. offset_s + sizes[s] - 1), each source's `weights[s]` /
    sum(weights) share of every step's slots (`MixtureSteps`: within one task of the share at
    every step, each task at most once per epoch of its source, never twice in a step). Each
    process draws from its own shard of every source."""
    if len(sizes) != len(weights) or not sizes:
        raise ValueError(f"mixture: {len(sizes)} sources but {len(weights)} weights")
    if any(w <= 0 for w in weights):
        raise ValueError(f"mixture weights {tuple(weights)}; each must be > 0")
    if tasks_per_step % process_count:
        raise ValueError(f"rollout.tasks_per_step={tasks_per_step} does not split evenly over "
                         f"{process_count} processes; use a multiple of {process_count}")
    offsets = np.cumsum([0, *sizes])
    shards = []
    for s, n in enumerate(sizes):
        shard = np.arange(offsets[s], offsets[s] + n)[process_index::process_count]
        if not len(shard):
            raise ValueError(f"mixture source {s} has {n} tasks: none for process "
                             f"{process_index} of {process_count}")
        shards.append(shard)
    return MixtureSteps(shards, list(map(float, weights)), tasks_per_step // process_count, seed)


def spread(items: Sequence[T], n: int | None) -> list[T]:
    """At most `n` of `items`, evenly spaced (first and last kept), so a mixture's sources (laid
    end to end) all stay in; all of them when n is None or not below their count."""
    if n is None or n >= len(items):
        return list(items)
    return [items[i] for i in np.linspace(0, len(items) - 1, n).round().astype(int)]
