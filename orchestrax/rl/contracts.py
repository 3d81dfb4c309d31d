"""Shape, rank and dtype contracts of the rl functions, checked with chex.

Inside a jitted function they run once per trace, on static shapes, so they cost nothing per
call. A broken contract is bad input, not a bug of ours, so it raises ValueError (chex's default
is AssertionError); the message is chex's account of the shapes or dtype, then
`[owner: argument must be ...]`, naming the caller's argument.
"""

from __future__ import annotations

from typing import Sequence

import chex
import numpy as np


def _one(x: chex.Array) -> chex.Array:
    # chex reads a list as several inputs; a nested list passed as one argument is one array.
    return x if hasattr(x, "shape") else np.asarray(x)


def check_rank(owner: str, name: str, x: chex.Array, rank: int, layout: str) -> None:
    """`x` has `rank` axes; `layout` (e.g. "[B,T]") says what they are."""
    chex.assert_rank(_one(x), rank, custom_message=f"{owner}: {name} must be {layout}",
                     exception_type=ValueError)


def check_shape(owner: str, name: str, x: chex.Array, shape: Sequence[int],
                layout: str) -> None:
    """`x` has exactly `shape`; `layout` says where the sizes come from."""
    chex.assert_shape(_one(x), tuple(shape), custom_message=f"{owner}: {name} must be {layout}",
                      exception_type=ValueError)


def check_floating(owner: str, name: str, x: chex.Array) -> None:
    """`x` holds floats of any width (bf16 included): integer log-probabilities are token ids."""
    chex.assert_type(_one(x), float, custom_message=f"{owner}: {name} must hold floats",
                     exception_type=ValueError)


def check_integer(owner: str, name: str, x: chex.Array) -> None:
    """`x` holds integers (token ids, positions, segment ids)."""
    chex.assert_type(_one(x), int, custom_message=f"{owner}: {name} must hold integers",
                     exception_type=ValueError)
