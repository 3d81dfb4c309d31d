"""`make demo`: warm-start a tiny routing policy on CPU, then let the preference vector steer it.

    python -m orchestrax.train.demo [--out runs/demo] [--fresh]

Runs configs/demo.py: a supervised warm start, then two GRPO runs from it whose tasks differ only
in P (cost-weighted vs latency-weighted). The table shows which tool each policy calls on
held-out tasks, sampled at the rollout temperature; `<out>/tool_shares.png` plots each tool's
share of the training rollouts' calls per GRPO step. Rerunning resumes every run where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import runpy
import shutil
import time
from pathlib import Path

from orchestrax.train import plots, setup
from orchestrax.train.loop import train

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.py"
TOOLS = ("lookup_cheap", "lookup_fast", "lookup_premium")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="base output directory (default: runs/demo)")
    ap.add_argument("--fresh", action="store_true", help="delete the output directory first")
    args = ap.parse_args(argv)
    setup.configure_logging()
    configs = runpy.run_path(str(CONFIG))
    runs = [configs["config_warmstart"](), configs["config"]("cost"), configs["config"]("latency")]
    base = Path(args.out or configs["OUT"])
    runs = [dataclasses.replace(
        c, out_dir=str(base / Path(c.out_dir).name),
        init_from=None if c.init_from is None else str(base / Path(c.init_from).name))
        for c in runs]
    if args.fresh:
        shutil.rmtree(base, ignore_errors=True)
    start = time.perf_counter()
    for cfg in runs:
        train(cfg)
    minutes = (time.perf_counter() - start) / 60
    rows = [("before RL (warm start)", _last_eval(runs[0])),
            ("GRPO, P weighs cost", _last_eval(runs[1])),
            ("GRPO, P weighs latency", _last_eval(runs[2]))]
    print("\nshare of calls per tool on held-out tasks (sampled at T=0.7)")
    print(f"{'':24s}" + "".join(f"{t:>16s}" for t in TOOLS) + f"{'accuracy':>10s}")
    for label, row in rows:
        shares = "".join(f"{row.get(f'tool_share_{t}', float('nan')):16.2f}" for t in TOOLS)
        print(f"{label:24s}{shares}{row['accuracy']:10.2f}")
    shares = {label: Path(cfg.out_dir) / "metrics.jsonl"
              for (label, _), cfg in zip(rows[1:], runs[1:])}
    png = plots.plot_tool_shares(shares, base / "tool_shares.png")
    print(f"\ntraining took {minutes:.1f} min; metrics: {base}/*/metrics.jsonl "
          f"(TensorBoard: {base}/*/tensorboard); tool shares per step: {png}")


def _last_eval(cfg) -> dict:
    rows = [json.loads(line) for line in
            (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "eval"][-1]


if __name__ == "__main__":
    main()
