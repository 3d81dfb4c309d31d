"""The one validation module of the package: every frozen config's `__post_init__` and every
command's `--set` check their fields here, so each error reads the same way,
`<Owner>.<field>=<value!r>; <what is allowed>`, and names the bad field.

Two kinds of check: ranges and choices (`at_least`, `above`, `one_of`, `require`), which the
configs call on their own fields; and types read off the type hints (`check_fields`,
`check_value`), which run first, so that `lr="fast"` is refused by name rather than by a bare
`TypeError: '>' not supported` inside a range check.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Sequence


def _owner(cfg: Any) -> str:
    return cfg if isinstance(cfg, str) else type(cfg).__name__


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def at_least(cfg: Any, bound: float, *names: str) -> None:
    """Raise ValueError("<Class>.<field>=<value>; must be >= <bound>") for the first of `names`
    whose value on `cfg` is below `bound`, or is not a number at all (a bool is not)."""
    for name in names:
        value = getattr(cfg, name)
        if not _number(value):
            raise ValueError(f"{_owner(cfg)}.{name}={value!r}; must be a number >= {bound}")
        if not value >= bound:  # also refuses NaN
            raise ValueError(f"{_owner(cfg)}.{name}={value!r}; must be >= {bound}")


def at_least_or_none(cfg: Any, bound: float, *names: str) -> None:
    """`at_least` for optional fields: None (decided elsewhere) passes."""
    at_least(cfg, bound, *(n for n in names if getattr(cfg, n) is not None))


def above(cfg: Any, bound: float, *names: str) -> None:
    """Raise ValueError("<Class>.<field>=<value>; must be a finite number > <bound>") for the
    first of `names` that is not one (NaN and infinity are refused)."""
    for name in names:
        value = getattr(cfg, name)
        if not (_number(value) and math.isfinite(value) and value > bound):
            raise ValueError(f"{_owner(cfg)}.{name}={value!r}; must be a finite number > {bound}")


def one_of(owner: Any, name: str, value: Any, allowed: Sequence[Any]) -> None:
    """Raise ValueError("<owner>.<name>=<value!r>; allowed: a, b") when `value` is not one of
    `allowed`; `owner` is a config (its class names it) or a function's name."""
    if value not in allowed:
        raise ValueError(f"{_owner(owner)}.{name}={value!r}; allowed: "
                         f"{', '.join(str(a) for a in allowed)}")


def require(cond: bool, owner: Any, name: str, value: Any, rule: str) -> None:
    """Raise ValueError("<owner>.<name>=<value!r>; must be <rule>") unless `cond`."""
    if not cond:
        raise ValueError(f"{_owner(owner)}.{name}={value!r}; must be {rule}")


def check_fields(cfg: Any, prefix: str = "") -> None:
    """Check every field of dataclass `cfg` (and of the dataclasses inside it) against its hint."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        check_value(f"{prefix}{f.name}", getattr(cfg, f.name), hints[f.name])


def field_hint(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def check_value(path: str, value: Any, hint: Any) -> None:
    """Raise ValueError("<path>=<value!r>; expected <what>") when `value` does not fit `hint`."""
    problem = _mismatch(path, value, hint)
    if problem is not None:
        raise ValueError(problem)


def describe(hint: Any) -> str:
    """`int`, `a float`, `None or an int`, `a tuple of str` — for error messages."""
    if hint is Any:
        return "anything"
    if hint is type(None):
        return "None"
    if hint is bool:
        return "True or False"
    if hint is int:
        return "an int"
    if hint is float:
        return "a finite number"
    if hint is str:
        return "a string"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a tuple of ({describe(args[0])})"
        return f"a tuple of {len(args)} ({', '.join(describe(a) for a in args)})"
    if dataclasses.is_dataclass(hint):
        return f"a {hint.__name__}"
    return getattr(hint, "__name__", repr(hint))


def _mismatch(path: str, value: Any, hint: Any) -> str | None:
    bad = f"{path}={value!r}; expected {describe(hint)}"
    if hint is Any:
        return None
    if hint is type(None):
        return None if value is None else bad
    if hint is bool:
        return None if isinstance(value, bool) else bad
    if hint is int:  # bool is an int subclass, but `steps=True` is a mistake, not a count
        return None if isinstance(value, int) and not isinstance(value, bool) else bad
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return bad
        return None if math.isfinite(value) else bad
    if hint is str:
        return None if isinstance(value, str) else bad
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if any(_mismatch(path, value, a) is None for a in args):
            return None
        # One member is a dataclass and the value is one: report what is wrong inside it.
        inner = [a for a in args if dataclasses.is_dataclass(a) and isinstance(value, a)]
        return _mismatch(path, value, inner[0]) if inner else bad
    if origin is tuple:
        if not isinstance(value, tuple):
            return bad
        if len(args) == 2 and args[1] is Ellipsis:
            members = [(i, args[0]) for i in range(len(value))]
        elif len(args) != len(value):
            return bad
        else:
            members = list(enumerate(args))
        for i, member in members:
            problem = _mismatch(f"{path}[{i}]", value[i], member)
            if problem is not None:
                return problem
        return None
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            return bad
        try:
            check_fields(value, prefix=f"{path}.")
        except ValueError as e:
            return str(e)
        return None
    if origin is typing.Literal:
        return None if value in args else f"{path}={value!r}; allowed: {args}"
    if isinstance(origin, type):  # dict[str, int], list[str]: the container type only
        return None if isinstance(value, origin) else bad
    if isinstance(hint, type):
        return None if isinstance(value, hint) else bad
    return None  # a typing construct this checker does not model (Callable, TypeVar): accept
