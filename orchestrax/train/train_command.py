"""`orchestrax train --config configs/x.py[:fn] [--set a.b=value ...]`: build the config, train."""

from __future__ import annotations

from typing import Sequence

from orchestrax import parallel
from orchestrax.train import setup
from orchestrax.train.overrides import apply_overrides, load_config


def run(config: str, overrides: Sequence[str]) -> int:
    setup.configure_logging()
    parallel.initialize()
    with parallel.exit_on_error():   # multi-process: a failure ends the job, not a hang
        cfg = apply_overrides(load_config(config), overrides)
        from orchestrax.train.loop import train
        train(cfg)
    return 0
