"""Export a training run's checkpoint as a Hugging Face directory that transformers loads.

    python scripts/export_hf.py RUN_DIR OUT_DIR [--step N] [--dtype bfloat16]

RUN_DIR is a TrainConfig.out_dir: the trainer keeps `model/` (config.json + tokenizer files) and
`checkpoints/` (Orbax) there. Only the parameters are read; the optimizer state is skipped.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import orbax.checkpoint as ocp

from orchestrax import models


def export(run_dir: str, out_dir: str, *, step: int | None = None, dtype: str | None = None):
    run = pathlib.Path(run_dir)
    model_dir = run / "model"
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir}/config.json not found: is {run} a training run dir?")
    cfg = models.config_from_hf(json.loads((model_dir / "config.json").read_text()))
    mngr = ocp.CheckpointManager(run.resolve() / "checkpoints")
    step = mngr.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{run}/checkpoints holds no checkpoint")
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    params = restored["state"]["params"]
    out = models.save_hf(cfg, params, out_dir, tokenizer_dir=model_dir, dtype=dtype)
    print(f"exported step {step} of {run} to {out}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--step", type=int)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    args = ap.parse_args()
    export(args.run_dir, args.out_dir, step=args.step, dtype=args.dtype)


if __name__ == "__main__":
    main()
