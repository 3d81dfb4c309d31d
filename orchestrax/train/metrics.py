"""Where a run's metrics go: `metrics.jsonl` (one row per line, the record of truth) and
TensorBoard event files in `tensorboard/` next to it.

A resumed run re-runs the steps after its checkpoint, so rows written after that checkpoint are
cut from the JSONL file (the checkpoint stores how many rows it had) and TensorBoard is told to
hide events from those steps (`purge_step`); every step appears once.
"""

from __future__ import annotations

import json
import logging
import pathlib
from typing import Any

import numpy as np
from etils import epath

log = logging.getLogger(__name__)

# Counts of events a process saw in its own episodes (episodes, sampler requests, filtered and
# kept samples, stale drops, flow turn rows): over processes they add up. Every other number is
# averaged: means, rates, shares and timings of equal shares of episodes, and the train step's
# metrics, which the step computes on the global batch so every process holds the same value.
COUNTERS = frozenset({"episodes", "episodes_failed", "filter/format_dropped",
                      "filter/invalid_dropped", "filter/homogeneous_groups",
                      "filter/homogeneous_dropped", "filter/kept", "flow/turn_samples",
                      "flow/dropped_over_budget"})
COUNTER_PREFIXES = ("rollout/", "tools/")  # sampler counters, stale-weight drops, tool calls
                                         # and dollars per tool
IDENTITY = ("phase", "step")  # which row this is: the same on every process


def is_counter(key: str) -> bool:
    return key in COUNTERS or key.startswith(COUNTER_PREFIXES)


def combine_process_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One metrics row from every process's row of the same step: counters (`is_counter`)
    summed, other numbers averaged over the processes that report them, anything else
    process 0's. One row: that row."""
    if len(rows) == 1:
        return rows[0]
    for key in IDENTITY:
        if len({json.dumps(r.get(key)) for r in rows}) > 1:
            raise ValueError(f"processes logged different rows: {key} = "
                             f"{[r.get(key) for r in rows]}")
    out = dict(rows[0])
    for key in {k for r in rows for k in r} - set(IDENTITY):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))
                  and not isinstance(r.get(key), bool)]
        if values:
            out[key] = float(sum(values)) if is_counter(key) else float(np.mean(values))
    return out


class MetricsLog:
    def __init__(self, out_dir: pathlib.Path, *, keep_rows: int, resume_step: int | None,
                 writer: bool = True, mirror: epath.Path | None = None):
        """Keep the first `keep_rows` rows of an existing metrics.jsonl; `resume_step` is the
        global step of the restored checkpoint (None on a fresh start). `writer=False` (every
        process of a multi-process run but the first) counts rows and writes nothing.
        `mirror`: a directory (gs://...) that gets a whole copy of metrics.jsonl after every
        row, since object stores cannot append; a machine without the local file (a new TPU VM
        resuming) starts from the mirror's copy."""
        from tensorboardX import SummaryWriter

        self.path = out_dir / "metrics.jsonl"
        self.mirror = None if mirror is None else mirror / "metrics.jsonl"
        self.writer = writer
        source = self.path
        if not self.path.exists() and self.mirror is not None and self.mirror.exists():
            source = self.mirror
        lines = source.read_text().splitlines() if source.exists() else []
        if not writer:
            self.rows = min(keep_rows, len(lines))
            self._tb = None
            return
        if len(lines) > keep_rows:
            log.info("dropping %d metrics rows written after the checkpoint (they are re-run)",
                     len(lines) - keep_rows)
        lines = lines[:keep_rows]
        self.path.write_text("".join(line + "\n" for line in lines))
        self._push()
        self.rows = len(lines)
        purge = None if resume_step is None else resume_step + 1
        self._tb = SummaryWriter(logdir=str(out_dir / "tensorboard"), purge_step=purge,
                                 flush_secs=30)

    def write(self, row: dict[str, Any], global_step: int) -> dict[str, Any]:
        """Append `row` (it must carry "phase") and send its numbers to TensorBoard as
        `<phase>/<key>` at `global_step`."""
        if not self.writer:
            self.rows += 1
            return row
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self._push()
        self.rows += 1
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                self._tb.add_scalar(f"{row['phase']}/{key}", value, global_step)
        return row

    def read(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def _push(self) -> None:
        if self.mirror is not None:
            self.mirror.write_text(self.path.read_text())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def progress(total: int, initial: int, desc: str):
    """A tqdm bar over steps (shown on a terminal only; log lines print above it)."""
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit="step", disable=None,
                dynamic_ncols=True, leave=True)


def postfix(row: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    return {k.removesuffix("_mean"): f"{row[k]:.3g}" for k in keys if k in row}
