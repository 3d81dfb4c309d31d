"""Where a run's metrics go: `metrics.jsonl` (one row per line, the record of truth),
TensorBoard event files in `tensorboard/` next to it, and, when `TrainConfig.wandb.enabled`,
a Weights & Biases run (offline by default: files under `<out_dir>/wandb/`, `wandb sync` uploads
them later; `mode="online"` logs live). Both get every number of every row as `<phase>/<key>`
at the global step.

A resumed run re-runs the steps after its checkpoint, so rows written after that checkpoint are
cut from the JSONL file (the checkpoint stores how many rows it had) and TensorBoard is told to
hide events from those steps (`purge_step`); every step appears once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import pathlib
from typing import Any

import numpy as np
from etils import epath

from orchestrax.checks import one_of

log = logging.getLogger(__name__)

# Counts of events a process saw in its own episodes (episodes, sampler requests, filtered and
# kept samples, stale drops, flow turn rows): over processes they add up. Every other number is
# averaged: means, rates, shares and timings of equal shares of episodes, and the train step's
# metrics, which the step computes on the global batch so every process holds the same value.
COUNTERS = frozenset({"rollout/episodes", "rollout/episodes_failed", "rollout/stale_trajectories",
                      "rollout/stale_turns", "filter/format_dropped", "filter/invalid_dropped",
                      "filter/homogeneous_groups", "filter/homogeneous_dropped", "filter/kept",
                      "flow/turn_samples", "flow/dropped_over_budget"})
COUNTER_PREFIXES = ("sampler/", "tools/")  # sampler counters, tool calls and dollars per tool
IDENTITY = ("phase", "step")  # which row this is: the same on every process

# One key style: every key but the identity is `group/name` (more `/name` parts allowed), the
# group one of these, lower-case with underscores. TensorBoard shows it as `<phase>/<key>`.
GROUPS = ("rollout",    # the episodes of the step (or eval): reward, accuracy, cost, latency, ...
          "filter",     # what the step's filters dropped and kept
          "train",      # the train step's (or SFT step's) own metrics: loss, grad_norm, lr, ...
          "time",       # wall seconds of the step's phases
          "sampler",    # the sampler's counters: requests, retries, failures, cached tokens
          "tools",      # calls and dollars per tool: tools/<name>/calls, tools/<name>/cost_usd
          "env",        # the environment's own statistics (Environment.stats)
          "flow", "tokens", "dispatches")   # sub-agent mode: turn rows, tokens, dispatches
_KEY = re.compile(r"(?:%s)(?:/[A-Za-z0-9_.\-]+)+" % "|".join(GROUPS))


def check_key(key: str) -> None:
    """Raise ValueError unless `key` is in the one key style (`GROUPS`)."""
    if key not in IDENTITY and not _KEY.fullmatch(key):
        raise ValueError(f"metrics key {key!r} is not group/name with group one of "
                         f"{', '.join(GROUPS)}")


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class WandbConfig:
    """Weights & Biases logging (the `wandb` extra). Off unless `enabled`; offline unless `mode`
    says online. The run's id is kept in `<out_dir>/wandb_id`, so a resumed run continues the
    same W&B run."""

    enabled: bool = False
    mode: str = "offline"                 # offline | online
    project: str = "orchestrax"
    entity: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self):
        one_of(self, "mode", self.mode, ("offline", "online"))

    def check_installed(self) -> None:
        if self.enabled:
            _wandb_module()


def _wandb_module():
    try:
        import wandb
    except ImportError:
        raise ModuleNotFoundError(
            "TrainConfig.wandb.enabled=True but the wandb package is not installed; pip "
            "install -e '.[wandb]' (orchestrax[wandb]) or set wandb.enabled=False") from None
    return wandb


def _start_wandb(cfg: WandbConfig, out_dir: pathlib.Path, name: str,
                 config: dict[str, Any] | None):
    import uuid
    wandb = _wandb_module()
    id_file = out_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    return wandb.init(project=cfg.project, entity=cfg.entity, name=name, id=run_id,
                      resume="allow", mode=cfg.mode, dir=str(out_dir), tags=list(cfg.tags),
                      config=config)


class MetricsLog:
    def __init__(self, out_dir: pathlib.Path, *, keep_rows: int, resume_step: int | None,
                 writer: bool = True, mirror: epath.Path | None = None,
                 wandb: WandbConfig = WandbConfig(), run_name: str = "",
                 run_config: dict[str, Any] | None = None):
        """Keep the first `keep_rows` rows of an existing metrics.jsonl; `resume_step` is the
        global step of the restored checkpoint (None on a fresh start). `writer=False` (every
        process of a multi-process run but the first) counts rows and writes nothing.
        `mirror`: a directory (gs://...) that gets a whole copy of metrics.jsonl after every
        row, since object stores cannot append; a machine without the local file (a new TPU VM
        resuming) starts from the mirror's copy. `wandb`: the W&B run, named `run_name`, with
        `run_config` (the resolved config) as its config."""
        from tensorboardX import SummaryWriter

        self.path = out_dir / "metrics.jsonl"
        self.mirror = None if mirror is None else mirror / "metrics.jsonl"
        self.writer = writer
        source = self.path
        if not self.path.exists() and self.mirror is not None and self.mirror.exists():
            source = self.mirror
        lines = source.read_text().splitlines() if source.exists() else []
        self._wandb = None
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
        if wandb.enabled:
            wandb.check_installed()
            self._wandb = _start_wandb(wandb, out_dir, run_name, run_config)

    def write(self, row: dict[str, Any], global_step: int) -> dict[str, Any]:
        """Append `row` (it must carry "phase"; every key in the one style, `check_key`) and
        send its numbers to TensorBoard as `<phase>/<key>` at `global_step`."""
        for key in row:
            check_key(key)
        if not self.writer:
            self.rows += 1
            return row
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self._push()
        self.rows += 1
        scalars = {f"{row['phase']}/{key}": value for key, value in row.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)
                   and key != "step"}
        for key, value in scalars.items():
            self._tb.add_scalar(key, value, global_step)
        if self._wandb is not None:
            # A resumed run re-runs the steps after its checkpoint; W&B warns about and drops
            # steps below the last one it logged.
            self._wandb.log(scalars, step=global_step)
        return row

    def read(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def _push(self) -> None:
        if self.mirror is not None:
            self.mirror.write_text(self.path.read_text())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            # wandb keeps its settings (the run directory among them) per process: without this
            # a second run in the process (the demo's runs) would write into the first's out_dir
            _wandb_module().teardown()
            self._wandb = None


def progress(total: int | None, initial: int, desc: str, unit: str = "step",
             leave: bool = True):
    """A tqdm bar over steps or `unit`s (shown on a terminal only, and not for a phase of none:
    a warm start's RL phase; log lines print above it). `total` None: not known yet (a count
    until it is set); `leave=False`: erased when closed."""
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit=unit,
                disable=True if total == 0 else None, dynamic_ncols=True, leave=leave)
