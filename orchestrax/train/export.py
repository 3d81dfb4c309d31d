"""Export a training run's checkpoint as a Hugging Face directory that transformers loads.

    orchestrax export RUN_DIR OUT_DIR [--step N] [--dtype bfloat16] [--overwrite]
    python tools/export_hf.py RUN_DIR OUT_DIR ...              (the same)
    python -m orchestrax.train.export RUN_DIR OUT_DIR ...      (the same)

Configured as every command is: an `ExportCommand` (`--config` function, `--set field=value`),
the positional directories and flags being shorthands of its fields.

RUN_DIR is a TrainConfig.out_dir: the trainer keeps `model/` (config.json + tokenizer files) and
`checkpoints/` (Orbax) there. Only the parameters are read; the optimizer state is skipped.
The export is written next to OUT_DIR and renamed into place, so a server that loaded an older
export keeps the files it opened; a non-empty OUT_DIR is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import sys
import tempfile

from orchestrax import models
from orchestrax.checks import check_fields, one_of, require
from orchestrax.train import checkpoint, overrides, run_info

DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """A user error: the message says which path and what to do."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportCommand:
    """Everything `orchestrax export` is told: a `--config` function returns one, `--set` and
    the shorthands (RUN_DIR, OUT_DIR, --step, --dtype, --overwrite) change it."""

    run_dir: str = ""                 # a TrainConfig.out_dir
    out_dir: str = ""                 # the HF directory to write
    step: int | None = None           # None: the newest whole checkpoint
    dtype: str | None = None          # None: the checkpoint's own
    overwrite: bool = False           # replace a non-empty out_dir (by rename)

    def __post_init__(self):
        check_fields(self)
        if self.dtype is not None:
            one_of(self, "dtype", self.dtype, DTYPES)


def config() -> ExportCommand:
    """What `orchestrax export` starts from without --config (RUN_DIR and OUT_DIR say the
    rest)."""
    return ExportCommand()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Shorthands of `ExportCommand` fields (dest = the field); `p` has argument_default
    SUPPRESS, so one not given is absent."""
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a TrainConfig.out_dir")
    p.add_argument("out_dir", nargs="?", metavar="OUT_DIR", help="the HF directory to write")
    p.add_argument("--step", type=int, help="checkpoint step (default: the newest whole one)")
    p.add_argument("--dtype", choices=DTYPES, help="weights' dtype (default: the checkpoint's)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty OUT_DIR (by rename: a live server keeps its files)")


def run(cmd: ExportCommand) -> int:
    """Export as `cmd` says; 0 when written."""
    for name, flag in (("run_dir", "RUN_DIR"), ("out_dir", "OUT_DIR")):
        require(bool(getattr(cmd, name)), cmd, name, getattr(cmd, name), f"given ({flag})")
    export(cmd.run_dir, cmd.out_dir, step=cmd.step, dtype=cmd.dtype, overwrite=cmd.overwrite)
    return 0


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 argument_default=argparse.SUPPRESS)
    overrides.add_arguments(ap)
    add_arguments(ap)
    ap.add_argument("--debug", action="store_true", default=False,
                    help="show tracebacks of user errors")
    args = ap.parse_args(argv)
    try:
        run(overrides.from_args(args, ExportCommand, config))
    except ValueError as e:
        if args.debug:
            raise
        sys.exit(f"export_hf: {e}")


if __name__ == "__main__":
    main()
