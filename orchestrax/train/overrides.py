"""The one config dialect of every command: a Python function returning the command's frozen
config (`--config path.py[:function]`), `--set dotted.field=value` overrides, and flags that are
shorthands of config fields (a flag's argparse `dest` is its field's dotted path, and a flag not
given is absent from the parsed arguments)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import runpy
import types
import typing
from typing import Any, Callable, Mapping, Sequence

from orchestrax import checks
from orchestrax.train.train_config import TrainConfig

# Parsed arguments that are not config fields.
NOT_FIELDS = ("command", "config", "set", "debug")


def add_arguments(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """`--config` and `--set` of a command whose other flags are shorthands of its fields."""
    p.add_argument("--config", required=required, default=None,
                   help="configs/x.py or configs/x.py:function returning the command's config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. rollout.group_size=4 (repeatable)")


def from_args(args: argparse.Namespace, kind: type, default: Callable[[], Any],
              load: Callable[[str], Any] | None = None) -> Any:
    """The command's config: `--config`'s function (else `default()`), then `--set` and the
    flags given, all applied together. `load` reads a command's own kind of config file (the
    demo's holds two functions); by default `--config` names one function returning a `kind`."""
    if args.config:
        cfg = load(args.config) if load else load_config(args.config, kind)
    else:
        cfg = default()
    flags = {k: v for k, v in vars(args).items() if k not in NOT_FIELDS}
    return apply_overrides(cfg, args.set, flags)


def load_config(spec: str, kind: type = TrainConfig) -> Any:
    """`path.py` (calls `config()`) or `path.py:function`, which must return a `kind`."""
    path, _, fn = spec.partition(":")
    namespace = runpy.run_path(path)
    name = fn or "config"
    if name not in namespace:
        raise ValueError(f"{path} has no function {name!r}")
    cfg = namespace[name]()
    if not isinstance(cfg, kind):
        raise ValueError(f"{spec} returned {type(cfg).__name__}, not {kind.__name__}")
    return cfg


def _parse(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string


def apply_overrides(cfg: Any, overrides: Sequence[str],
                    flags: Mapping[str, Any] | None = None) -> Any:
    """`rollout.group_size=4`, `optim.lr=1e-6`, `rollout.server_urls=("http://h:30000",)`;
    `flags`: dotted field -> value already parsed by a command's flag (its shorthand).

    All overrides are applied together (each dataclass is rebuilt once), so fields that must
    change as a pair change in one go; `hf_path=/ckpt` alone switches a random-init config to
    that checkpoint. Each value is type-checked against its field before any config's own checks.
    """
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected key=value")
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is also set as a whole")
        if isinstance(node.get(leaf), dict):
            raise ValueError(f"--set {key}: its fields are also set one by one")
        node[leaf] = _Raw(value)
    for key, value in (flags or {}).items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        if leaf in node:
            raise ValueError(f"--set {key}: also given by its flag; give it once")
        node[leaf] = _tuples(value)
    if isinstance(tree.get("hf_path"), _Raw) and "model" not in tree \
            and _parse(tree["hf_path"].text) is not None:
        tree["model"] = _Raw("None")  # exactly one of model / hf_path: the checkpoint wins
    return _rebuild(cfg, tree, "")


class _Raw:
    def __init__(self, text: str):
        self.text = text


def _rebuild(obj: Any, changes: dict[str, Any], prefix: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"--set {prefix.rstrip('.')}.*: {prefix.rstrip('.')} is {obj!r}, not a "
                         "config with fields; set it as a whole")
    fields = {f.name for f in dataclasses.fields(obj)}
    resolved = {}
    for name, change in changes.items():
        path = prefix + name
        if name not in fields:
            raise ValueError(f"--set {path}: {type(obj).__name__} has no field {name!r}; "
                             f"fields: {sorted(fields)}")
        if isinstance(change, dict):
            resolved[name] = _rebuild(getattr(obj, name), change, path + ".")
            continue
        hint = checks.field_hint(type(obj), name)
        value = _coerce(change.text, hint) if isinstance(change, _Raw) else change
        checks.check_value(path, value, hint)
        resolved[name] = value
    try:
        return dataclasses.replace(obj, **resolved)
    except ValueError as e:
        raise ValueError(f"{prefix.rstrip('.')}: {e}" if prefix else str(e)) from None


def _coerce(text: str, hint: Any) -> Any:
    """The value `text` means for a field of type `hint`: a Python literal, except that a string
    field takes the text itself (`name=3` is "3") and `inf`/`nan` are floats (then refused)."""
    value = _parse(text)
    optional_str = isinstance(hint, types.UnionType) and str in typing.get_args(hint)
    if value is not None and (hint is str or optional_str):
        return text
    if isinstance(value, str) and text.strip().lower() in _NONFINITE:
        return float(text)
    return _tuples(value)


_NONFINITE = ("inf", "-inf", "+inf", "infinity", "-infinity", "nan")


def _tuples(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_tuples(v) for v in value)
    return value
