"""The grain streams' per-epoch shuffles read the same from many threads as from one (grain
reads ahead with a thread pool; a shared "current permutation" field swapped mid-read gave an
SFT record twice in one epoch on CI), and after pickling (grain worker processes); the JSONL
source keeps one descriptor per file when threads open it at once."""

import concurrent.futures
import os
import pickle
import sys
import time

import grain
import numpy as np
import pytest

from orchestrax.data.sft import EpochShuffle, JsonlSource
from orchestrax.data.tasks import task_stream

N = 5  # items per epoch: many epoch boundaries in a short read


def _item(x):  # a record index (sft) or a one-task step (tasks) as an int
    return int(np.asarray(x).reshape(()))


def _shuffle():
    return EpochShuffle(grain.MapDataset.range(N), seed=3)


def _tasks():
    return task_stream(N, 1, seed=3)


@pytest.mark.parametrize("make", [_shuffle, _tasks], ids=["sft", "tasks"])
def test_epoch_permutations_hold_under_threads_and_pickling(make):
    indices = range(N * 400)
    want = [_item(make()[i]) for i in indices]
    for e in range(400):  # every epoch a permutation
        assert sorted(want[e * N:(e + 1) * N]) == list(range(N))
    assert len({tuple(want[e * N:(e + 1) * N]) for e in range(400)}) > 1  # reshuffled
    ds = make()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, as a loaded box does
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            got = [_item(x) for x in pool.map(ds.__getitem__, indices)]
    finally:
        sys.setswitchinterval(interval)
    assert got == want
    copy = pickle.loads(pickle.dumps(ds))
    assert [_item(copy[i]) for i in range(3 * N)] == want[:3 * N]


def test_jsonl_source_opens_each_file_once_under_threads(tmp_path, monkeypatch):
    paths = [tmp_path / f"{name}.jsonl" for name in "ab"]
    for k, path in enumerate(paths):
        path.write_text("".join(f'{{"id": {10 * k + i}}}\n' for i in range(10)))
    src = JsonlSource(paths)
    real_open = os.open

    def slow_open(*args, **kwargs):
        time.sleep(0.01)  # widen the window between the lookup and the store
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "open", slow_open)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ids = [r["record"]["id"] for r in pool.map(src.__getitem__, list(range(20)) * 5)]
    monkeypatch.undo()
    assert ids == list(range(20)) * 5
    assert len(src._fds) == 2  # one kept per file; the extra opens were closed
    names = {str(p) for p in paths}
    leaked = [int(fd) for fd in os.listdir("/proc/self/fd") if _target(fd) in names]
    assert sorted(leaked) == sorted(src._fds.values())


def _target(fd: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the listing's own descriptor is gone by now
        return None
