"""Supervised warm-start data from JSONL files of trajectories, as a grain pipeline.

One JSON object per line, either already tokenised — `{"token_ids": [...], "loss_mask": [...]}`,
what a rollout's `Trajectory` holds (exact ids, loss on the sampled ones) — or a conversation —
`{"messages": [...], "tools": [...]}` tokenised by a renderer the caller passes (the trainer's
renders Qwen3's chat format with loss on the assistant turns, the way rollouts mask them).

The files are never loaded whole: one pass records each line's byte offset (8 bytes a line), and
records are read by seeking, so the pipeline is random-access (per-epoch shuffles) and streams.
Records are tokenised, first-fit packed into rows of `seq_len` tokens (`segment_ids` 1, 2, ... per
sequence, 0 on padding; `positions` restart at 0 in each sequence), batched, and prefetched by
grain worker processes.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Any, Callable, Iterator, Sequence

import grain
import numpy as np

from orchestrax.data.shuffle import EpochPermutations


class JsonlSource:
    """Random access to the lines of JSONL files (grain `RandomAccessDataSource`)."""

    def __init__(self, paths: Sequence[str | os.PathLike]):
        self.paths = [str(pathlib.Path(p)) for p in paths]
        if not self.paths:
            raise ValueError("JsonlSource: no files given")
        starts, sizes, files = [], [], []
        for f, path in enumerate(self.paths):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"SFT data file {path!r} does not exist")
            with open(path, "rb") as fh:
                offset = 0
                for line in fh:  # streams: one line in memory at a time
                    if line.strip():
                        starts.append(offset)
                        sizes.append(len(line))
                        files.append(f)
                    offset += len(line)
        if not starts:
            raise ValueError(f"SFT data files {self.paths} hold no records")
        self._offsets = np.asarray(starts, np.int64)
        self._sizes = np.asarray(sizes, np.int64)
        self._files = np.asarray(files, np.int32)
        self._fds: dict[int, int] = {}  # opened lazily, per process (workers unpickle us)

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> dict[str, Any]:
        f = int(self._files[index])
        fd = self._fds.get(f)
        if fd is None:  # two reader threads may both open it: one descriptor is kept
            fd = os.open(self.paths[f], os.O_RDONLY)
            kept = self._fds.setdefault(f, fd)
            if kept != fd:
                os.close(fd)
                fd = kept
        # pread: no shared file position, so grain's reader threads can share the descriptor.
        line = os.pread(fd, int(self._sizes[index]), int(self._offsets[index]))
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.paths[f]}: record {index} (byte {self._offsets[index]}) is "
                             f"not JSON: {e.msg}") from None
        return {"record": record, "where": f"{self.paths[f]} record {index}"}

    def __getstate__(self):
        return {**self.__dict__, "_fds": {}}


class EpochShuffle(grain.MapDataset):
    """parent[perm_e[i % n]] with one permutation of range(n) per epoch e = i // n."""

    def __init__(self, parent: grain.MapDataset, seed: int):
        super().__init__(parent)
        self._n = len(parent)
        self._perms = EpochPermutations(np.arange(self._n), seed)

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        epoch, k = divmod(index, self._n)
        return self._parents[0][int(self._perms(epoch)[k])]


class Tokenise:
    """A record -> {"tokens": int32 [n], "loss_mask": int32 [n]}, cut to `seq_len`.
    `render(messages, tools) -> (ids, mask)` tokenises conversations (it lives above this layer:
    `orchestrax.train.warmstart.ConversationRenderer`); None accepts tokenised records only."""

    def __init__(self, render: Callable[[Sequence[dict], Sequence[Any]], tuple] | None,
                 seq_len: int):
        self.render, self.seq_len = render, seq_len

    def __call__(self, item: dict[str, Any]) -> dict[str, np.ndarray]:
        record, where = item["record"], item["where"]
        if "token_ids" in record:
            ids, mask = record["token_ids"], record.get("loss_mask")
            if mask is None or len(mask) != len(ids):
                raise ValueError(f"{where}: loss_mask has {None if mask is None else len(mask)} "
                                 f"entries for {len(ids)} token_ids; one per token is needed")
        elif "messages" in record and self.render is not None:
            ids, mask = self.render(record["messages"], record.get("tools", ()))
        else:
            raise ValueError(f"{where}: a record needs 'token_ids' + 'loss_mask' or 'messages'; "
                             f"found keys {sorted(record)}")
        return {"tokens": np.asarray(ids[:self.seq_len], np.int32),
                "loss_mask": np.asarray(mask[:self.seq_len], np.int32)}


def sft_batches(paths: Sequence[str | os.PathLike], render: Callable | None, *, seq_len: int,
                batch_size: int, seed: int, workers: int = 0, process_index: int = 0,
                process_count: int = 1) -> grain.IterDataset:
    """Endless packed batches: tokens / loss_mask / segment_ids / positions, each [B, seq_len]
    (int32), plus attention_mask (segment_ids > 0). `workers` > 0 prefetches in that many grain
    processes (call `absl.flags.FLAGS(sys.argv[:1])` first in a script). Several processes:
    each reads and packs only its own records (record i goes to process i % process_count), so
    the processes' epochs partition the data."""
    records = grain.MapDataset.source(JsonlSource(paths))
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index}, process_count={process_count}; need "
                         "0 <= process_index < process_count")
    if len(records) < process_count:
        raise ValueError(f"SFT data files {list(map(str, paths))} hold {len(records)} records "
                         f"for {process_count} processes; each process needs at least one")
    ds = EpochShuffle(records[process_index::process_count], seed).map(
        Tokenise(render, seq_len))
    lengths = {"tokens": seq_len, "loss_mask": seq_len}
    packed = grain.experimental.FirstFitPackIterDataset(
        ds.to_iter_dataset(), length_struct=lengths, num_packing_bins=batch_size, seed=seed)
    batched = packed.map(_flatten).batch(batch_size, drop_remainder=True)
    if workers:
        batched = batched.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return batched


def _flatten(row: dict[str, Any]) -> dict[str, np.ndarray]:
    """grain's packed row (values plus `*_segment_ids` / `*_positions`) -> our batch keys."""
    segments = np.asarray(row["tokens_segment_ids"], np.int32)
    return {"tokens": np.asarray(row["tokens"], np.int32),
            "loss_mask": np.asarray(row["loss_mask"], np.int32),
            "segment_ids": segments,
            "positions": np.asarray(row["tokens_positions"], np.int32),
            "attention_mask": (segments > 0).astype(np.int32)}


def unpack(batch: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """The sequences inside a packed batch, in row order: {"tokens", "loss_mask"} each."""
    for b in range(batch["tokens"].shape[0]):
        seg = batch["segment_ids"][b]
        for s in np.unique(seg[seg > 0]):
            where = seg == s
            yield {"tokens": batch["tokens"][b][where], "loss_mask": batch["loss_mask"][b][where]}
