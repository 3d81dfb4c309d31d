"""Export a training run's checkpoint as a Hugging Face directory that transformers loads.

    python tools/export_hf.py RUN_DIR OUT_DIR [--step N] [--dtype bfloat16] [--overwrite]
    python -m orchestrax.train.export RUN_DIR OUT_DIR ...      (the same)

RUN_DIR is a TrainConfig.out_dir: the trainer keeps `model/` (config.json + tokenizer files) and
`checkpoints/` (Orbax) there. Only the parameters are read; the optimizer state is skipped.
The export is written next to OUT_DIR and renamed into place, so a server that loaded an older
export keeps the files it opened; a non-empty OUT_DIR is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile

from orchestrax import models
from orchestrax.train import checkpoint, run_info


class ExportError(Exception):
    """A user error: the message says which path and what to do."""


def export(run_dir: str, out_dir: str, *, step: int | None = None, dtype: str | None = None,
           overwrite: bool = False):
    run, dest = pathlib.Path(run_dir), pathlib.Path(out_dir)
    model_dir = run / "model"
    if not (model_dir / "config.json").exists():
        raise ExportError(f"{model_dir}/config.json not found: is {run} a training run dir "
                          "(TrainConfig.out_dir)?")
    kept = [p.resolve() for p in (run, model_dir, run / "checkpoints")]
    if dest.resolve() == kept[0] or any(k == dest.resolve() or k in dest.resolve().parents
                                        for k in kept[1:]):
        raise ExportError(f"OUT_DIR {dest} would replace files of the run {run}; export to "
                          "another directory")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) and not overwrite:
        raise ExportError(f"OUT_DIR {dest} exists and is not empty; pass --overwrite to "
                          "replace it, or give a new directory")
    cfg = models.config_from_hf(json.loads((model_dir / "config.json").read_text()))
    try:
        params, step, _ = checkpoint.read_params(run.resolve() / "checkpoints", step=step)
    except FileNotFoundError as e:
        raise ExportError(f"{e}; train first or pick another run dir") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    try:
        models.save_hf(cfg, params, tmp, tokenizer_dir=model_dir, dtype=dtype)
        settings = run_info.find(run)
        if settings is not None:  # eval of the export uses the run's template and budgets
            shutil.copyfile(settings, tmp / run_info.RUN_CONFIG)
            (tmp / run_info.RUN_CONFIG).chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; save_pretrained's dirs are not
        _swap_in(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"exported step {step} of {run} to {dest}")
    return dest


def _swap_in(new: pathlib.Path, dest: pathlib.Path) -> None:
    """Put `new` at `dest` by renames only: files a running server opened are never rewritten."""
    if not dest.exists():
        new.rename(dest)
        return
    old = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
    old.rmdir()
    dest.rename(old)
    new.rename(dest)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--step", type=int)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a non-empty OUT_DIR (by rename: a live server keeps its files)")
    ap.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    args = ap.parse_args()
    try:
        export(args.run_dir, args.out_dir, step=args.step, dtype=args.dtype,
               overwrite=args.overwrite)
    except ExportError as e:
        if args.debug:
            raise
        sys.exit(f"export_hf: {e}")


if __name__ == "__main__":
    main()
