"""`orchestrax train --config configs/x.py[:fn] [--set a.b=value ...]`: build the config, train."""

from __future__ import annotations

import ast
import dataclasses
import runpy
from typing import Any, Sequence

from orchestrax import parallel
from orchestrax.train import setup
from orchestrax.train.config import TrainConfig


def load_config(spec: str) -> TrainConfig:
    """`path.py` (calls `config()`) or `path.py:function`."""
    path, _, fn = spec.partition(":")
    namespace = runpy.run_path(path)
    name = fn or "config"
    if name not in namespace:
        raise ValueError(f"{path} has no function {name!r}")
    cfg = namespace[name]()
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"{spec} returned {type(cfg).__name__}, not TrainConfig")
    return cfg


def _parse(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string


def apply_overrides(cfg: Any, overrides: Sequence[str]) -> Any:
    """`rollout.group_size=4`, `optim.lr=1e-6`, `rollout.server_urls=("http://h:30000",)`."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected key=value")
        cfg = _replace_path(cfg, key.split("."), _parse(value), key)
    return cfg


def _replace_path(obj: Any, parts: list[str], value: Any, full: str) -> Any:
    fields = {f.name for f in dataclasses.fields(obj)}
    if parts[0] not in fields:
        raise ValueError(f"--set {full}: {type(obj).__name__} has no field {parts[0]!r}; "
                         f"fields: {sorted(fields)}")
    if len(parts) > 1:
        value = _replace_path(getattr(obj, parts[0]), parts[1:], value, full)
    elif isinstance(value, list):
        value = tuple(value)
    return dataclasses.replace(obj, **{parts[0]: value})


def run(config: str, overrides: Sequence[str]) -> int:
    setup.configure_logging()
    parallel.initialize()
    cfg = apply_overrides(load_config(config), overrides)
    from orchestrax.train.loop import train
    train(cfg)
    return 0
