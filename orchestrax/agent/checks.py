"""Range checks shared by the agent layer's frozen configs (episode, orchestrator, sub-agents,
memory limits), so each `__post_init__` names its fields once and every error reads the same."""

from __future__ import annotations

from typing import Any


def at_least(cfg: Any, bound: float, *names: str) -> None:
    """Raise ValueError("<Class>.<field>=<value>; must be >= <bound>") for the first of `names`
    whose value on `cfg` is below `bound`, or is not a number at all (a bool is not)."""
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{type(cfg).__name__}.{name}={value!r}; must be a number >= {bound}")
        if not value >= bound:  # also refuses NaN
            raise ValueError(f"{type(cfg).__name__}.{name}={value!r}; must be >= {bound}")


def at_least_or_none(cfg: Any, bound: float, *names: str) -> None:
    """`at_least` for optional fields: None (decided elsewhere) passes."""
    at_least(cfg, bound, *(n for n in names if getattr(cfg, n) is not None))
