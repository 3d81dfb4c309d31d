"""`make demo`: train the tiny routing policy on CPU and show it learning the preference.

    python -m orchestrax.train.demo [--steps N] [--out runs/demo] [--fresh]
"""

from __future__ import annotations

import argparse
import logging
import runpy
import shutil
from pathlib import Path

from orchestrax.train.loop import train

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.py"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="RL steps (default: the config's)")
    ap.add_argument("--out", help="output directory (default: the config's)")
    ap.add_argument("--fresh", action="store_true", help="delete the output directory first")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S", force=True)
    logging.getLogger("orchestrax").setLevel(logging.INFO)
    cfg = runpy.run_path(str(CONFIG))["config"]()
    cfg = cfg.replace(**{k: v for k, v in (("steps", args.steps), ("out_dir", args.out))
                         if v is not None})
    if args.fresh:
        shutil.rmtree(cfg.out_dir, ignore_errors=True)
    history = train(cfg)
    evals = [h for h in history if h["phase"] == "eval"]
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        print("\nrouting by preference (greedy, held-out tasks)")
        print(f"{'':28s}{'before RL':>12s}{'after RL':>12s}")
        for key, label in (("accuracy", "accuracy"),
                           ("preferred_tool_rate_cost", "cheap tool when P=cost"),
                           ("preferred_tool_rate_latency", "fast tool when P=latency"),
                           ("cost_mean", "mean cost ($)"), ("latency_mean", "mean latency (s)")):
            print(f"{label:28s}{first.get(key, float('nan')):12.3f}{last.get(key, float('nan')):12.3f}")
    print(f"\nmetrics: {cfg.out_dir}/metrics.jsonl")


if __name__ == "__main__":
    main()
