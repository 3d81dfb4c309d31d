"""Per-epoch permutations for the grain streams, safe under grain's reader threads.

grain reads a `MapDataset` with many threads at once, so a stream must not keep "the current
epoch's permutation" in a field: a thread reading the last item of epoch e can find the field
already swapped to epoch e + 1 by its neighbour, and the epoch then holds an item twice. Here
each read looks its epoch's permutation up in a lock-guarded cache of the newest two epochs.
"""

from __future__ import annotations

import threading

import numpy as np


class EpochPermutations:
    """`perms(epoch)` -> `values` permuted by `default_rng([seed, epoch])`: a pure function of
    (seed, epoch), computed once per epoch (grain's own shuffle draws each index through a
    Feistel network, ~85 ms apiece on this box). Pickles without its lock and cache (workers)."""

    def __init__(self, values: np.ndarray, seed: int):
        self.values, self.seed = np.asarray(values), seed
        self._lock = threading.Lock()
        self._cache: dict[int, np.ndarray] = {}

    def __call__(self, epoch: int) -> np.ndarray:
        with self._lock:
            perm = self._cache.get(epoch)
            if perm is None:
                perm = np.random.default_rng([self.seed, epoch]).permutation(self.values)
                # readers straddle at most one epoch boundary: keep the newest two
                self._cache = {e: p for e, p in self._cache.items() if e >= epoch - 1}
                self._cache[epoch] = perm
            return perm

    def __getstate__(self):
        return {"values": self.values, "seed": self.seed}

    def __setstate__(self, state):
        self.__init__(state["values"], state["seed"])
