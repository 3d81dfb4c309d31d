"""`make demo`: warm-start a tiny routing policy on CPU, then train ONE policy by GRPO that routes
by each task's preference vector.

    orchestrax demo [--config configs/demo.py] [--out runs/demo] [--fresh] [--set grpo.steps=4]

Configured as every command is: a `DemoCommand` built from the config file's `config_warmstart()`
and `config()` (and its `OUT`), changed by `--set warmstart.x=..`, `--set grpo.x=..` and the
shorthands --out and --fresh. The file is read relative to the working directory (commands run
from the repository root). It runs a supervised warm start (tools chosen uniformly, never told
which tool a preference favours), then one GRPO run on tasks whose P is drawn per task from the
cost-weighted and latency-weighted training pairs. The table shows, on held-out tasks of each
kind, the preferred tool's share of calls before and after GRPO, as the trainer's evaluation and
`orchestrax eval` measure it, and the GRPO policy's preference adherence against the warm start.
`<out>/preference_shares.png` plots the preferred tool's share per P kind per GRPO step and the
eval numbers. Rerunning resumes every run where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrax.checks import check_fields
from orchestrax.envs.routing import RoutingConfig, preferred_from_vector
from orchestrax.train import plots, setup
from orchestrax.train.train_config import TrainConfig
from orchestrax.train.loop import train

CONFIG = "configs/demo.py"
KINDS = ("cost", "latency")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoCommand:
    """Everything `orchestrax demo` is told: the two runs and where they go."""

    warmstart: TrainConfig   # supervised warm start; its step-0 eval is the "before RL" row
    grpo: TrainConfig        # GRPO from the warm start (its init_from names the warm start's run)
    # Base directory: each run's out_dir (and the GRPO run's init_from) become out/<its last
    # path component>.
    out: str = "runs/demo"
    fresh: bool = False      # delete `out` first; otherwise a rerun resumes both runs

    def __post_init__(self):
        check_fields(self)


def config(path: str = CONFIG) -> DemoCommand:
    """The `DemoCommand` of a config file that defines `config_warmstart()` and `config()` (both
    returning a TrainConfig) and optionally `OUT` (the default --out)."""
    if not Path(path).is_file():
        raise ValueError(f"--config {path!r} not found; run from the repository root or give the "
                         f"path of {CONFIG}")
    namespace = runpy.run_path(path)
    missing = [f for f in ("config_warmstart", "config") if f not in namespace]
    if missing:
        raise ValueError(f"--config {path}: no function {missing[0]!r}; a demo config defines "
                         "config_warmstart() and config()")
    return DemoCommand(warmstart=namespace["config_warmstart"](), grpo=namespace["config"](),
                       out=str(namespace.get("OUT", DemoCommand.out)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Shorthands of `DemoCommand` fields (dest = the field); `p` has argument_default SUPPRESS,
    so one not given is absent."""
    p.add_argument("--out", help="base output directory (default: the config file's OUT)")
    p.add_argument("--fresh", action="store_true", help="delete the output directory first")


def runs(cmd: DemoCommand) -> tuple[TrainConfig, TrainConfig]:
    """The warm-start and GRPO TrainConfigs as they run: out_dir and init_from under `cmd.out`."""
    base = Path(cmd.out)
    return tuple(dataclasses.replace(
        c, out_dir=str(base / Path(c.out_dir).name),
        init_from=None if c.init_from is None else str(base / Path(c.init_from).name))
        for c in (cmd.warmstart, cmd.grpo))


def run(cmd: DemoCommand) -> int:
    """Train both runs, evaluate both with `orchestrax eval`, print the table; 0 when done."""
    setup.configure_logging()
    warm, grpo = runs(cmd)
    base = Path(cmd.out)
    if cmd.fresh:
        shutil.rmtree(base, ignore_errors=True)
    start = time.perf_counter()
    train(warm)
    train(grpo)
    trained = time.perf_counter()
    evals = {"warm start": orchestrax_eval(warm, base / "eval_warmstart", None)}
    evals["GRPO"] = orchestrax_eval(grpo, base / "eval_grpo",
                                    base / "eval_warmstart" / "eval.json")
    minutes = ((trained - start) / 60, (time.perf_counter() - trained) / 60)
    rows = [("before RL (warm start)", eval_rows(warm)[-1], evals["warm start"]),
            ("GRPO, one policy", eval_rows(grpo)[-1], evals["GRPO"])]
    print(table(rows, warm))
    png = plots.plot_preference_shares(Path(grpo.out_dir) / "metrics.jsonl", KINDS, evals,
                                       base / "preference_shares.png")
    print(f"\ntraining took {minutes[0]:.1f} min, `orchestrax eval` {minutes[1]:.1f} min; "
          f"metrics: {base}/*/metrics.jsonl (TensorBoard: {base}/*/tensorboard); "
          f"preferred-tool share per step: {png}")
    return 0


def table(rows: list[tuple[str, dict[str, Any], dict[str, Any]]], cfg: TrainConfig) -> str:
    """The demo's table: per policy, the preferred tool's share of calls per P kind and the
    accuracy (trainer eval), then `orchestrax eval`'s shares, accuracy and adherence."""
    lines = [f"\npreferred tool's share of calls on held-out tasks per P kind (trainer eval and "
             f"`orchestrax eval` of its checkpoint: {cfg.eval_samples} samples a task at "
             f"T={cfg.eval_temperature:g}, the same seeds)",
             f"{'':24s}{'cost->cheap':>12s}{'latency->fast':>14s}{'accuracy':>9s}"
             f"{' | eval: cost':>13s}{'latency':>8s}{'accuracy':>9s}{'adherence':>10s}"]
    for label, row, ev in rows:
        adh = ev["adherence"]
        lines.append(
            f"{label:24s}{_cell(row.get('env/preferred_share_cost'), 12)}"
            f"{_cell(row.get('env/preferred_share_latency'), 14)}"
            f"{_cell(row['rollout/accuracy'], 9)}{_cell(ev['share']['cost'], 13)}"
            f"{_cell(ev['share']['latency'], 8)}{_cell(ev['accuracy'], 9)}"
            f"{_cell(adh, 10, '.3f')}")
    if any(math.isnan(ev["share"][k]) for _, _, ev in rows for k in KINDS):
        lines.append("(-: no tool call on that kind's tasks, so no share)")
    return "\n".join(lines)


def _cell(x: float | None, width: int, fmt: str = ".2f") -> str:
    """`x` right-aligned in `width`, or '-' where it is missing or NaN (a share of no calls)."""
    return f"{'-' if x is None or math.isnan(x) else format(x, fmt):>{width}s}"


def orchestrax_eval(cfg: TrainConfig, out: Path, baseline: Path | None) -> dict[str, Any]:
    """`orchestrax eval` of a run dir on the routing task set (episode settings and the routing
    env from the run's own config): {"adherence" (against `baseline`'s eval.json, None without),
    "accuracy", "share": {kind: the preferred tool's share of calls on that kind's tasks}}."""
    # The command itself, in its own process: the trainer's layer does not import eval's.
    argv = [sys.executable, "-m", "orchestrax.cli", "eval", "--policy", cfg.out_dir,
            "--tasks", "routing", "--turn-sweep", "", "--out", str(out), "--no-progress"]
    code = subprocess.run(argv + (["--baseline", str(baseline)] if baseline else [])).returncode
    if code:
        raise SystemExit(f"orchestrax eval of {cfg.out_dir} failed (exit {code})")
    payload = json.loads((out / "eval.json").read_text())
    (row,) = payload["rows"]
    return {"adherence": row["adherence"], "accuracy": row["accuracy"],
            "share": preferred_shares(payload["records"]["routing"], cfg.env)}


def preferred_shares(records: list[dict[str, Any]], env: RoutingConfig) -> dict[str, float]:
    """Kind -> calls to the tool P favours / all calls, over eval.json records whose P weighs
    only compute ("cost") or only latency."""
    hits = {k: [0, 0] for k in KINDS}
    for rec in records:
        P = rec["preference"]
        kind = {(1.0, 0.0): "cost", (0.0, 1.0): "latency"}.get(tuple(P[-2:]))
        if kind is None:
            continue
        hits[kind][0] += rec["calls"].get(preferred_from_vector(env, P), 0)
        hits[kind][1] += sum(rec["calls"].values())
    return {k: h / n if n else float("nan") for k, (h, n) in hits.items()}


def eval_rows(cfg: TrainConfig) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in
            (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "eval"]

