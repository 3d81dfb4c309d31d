"""Logical axis names -> mesh axes. Every sharding decision of the project lives here.

Parameters (each `nnx.Param`'s `sharding=`, models/decoder.py) and activations (`constrain`
calls) are annotated with logical names; these rules map them to mesh axes. A logical name may map to one mesh axis, a tuple of them, or None (replicated).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

DEFAULT_RULES: Rules = (
    # activations
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    # parameters
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    # the sampler's slot KV cache (rollout/engine.py). Its kv heads split over every axis that
    # splits the params, so attention reads only a device's own heads and the projections
    # exchange activations, never cache. Its slots stay whole: a prefill writes one slot at a
    # dynamic index, and XLA gathers a whole cache whose slot axis is split to do that.
    ("cache_slots", None),
    ("cache_kv_heads", ("tensor", "fsdp")),
)


def logical_to_spec(logical: Sequence[str | None], rules: Rules = DEFAULT_RULES,
                    mesh: Mesh | None = None) -> PartitionSpec:
    """Map logical names to a PartitionSpec; mesh axes of size 1 or absent from `mesh` drop out."""
    table = dict(rules)
    out, used = [], set()
    for name in logical:
        if name is not None and name not in table:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
        target = table.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        if mesh is not None:
            axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1)
        axes = tuple(a for a in axes if a not in used)  # a mesh axis shards one dim at most
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def check_divisible(path: str, shape: Sequence[int], spec: PartitionSpec, mesh: Mesh) -> None:
    """Fail before compiling when a mesh axis does not divide the dimension it shards."""
    for dim, (size, axes) in enumerate(zip(shape, tuple(spec) + (None,) * len(shape))):
        if axes is None:
            continue
        axes = (axes,) if isinstance(axes, str) else axes
        n = 1
        for a in axes:
            n *= mesh.shape[a]
        if size % n:
            raise ValueError(f"{path}: dimension {dim} of size {size} is sharded over mesh axes "
                             f"{axes} of total size {n}, which does not divide it; "
                             f"mesh is {dict(mesh.shape)}")


def fitted_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """`logical_to_spec`, but a dimension its mesh axes do not divide drops its last axes until
    they do (whole when none fit): for buffers that may be split but need not be (8 kv heads
    over 16 devices stay whole; over tensor 2 x fsdp 8, they split over tensor alone)."""
    out = []
    for size, axes in zip(shape, logical_to_spec(logical, rules, mesh)):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        while axes and size % math.prod(mesh.shape[a] for a in axes):
            axes = axes[:-1]
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def tree_shardings(shapes: Any, logical: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings for a pytree of arrays/ShapeDtypeStructs with a matching tree of logical
    axis tuples; checks divisibility of every leaf."""
    def one(path, x, names):
        spec = logical_to_spec(names, rules, mesh)
        check_divisible(jax.tree_util.keystr(path), x.shape, spec, mesh)
        return NamedSharding(mesh, spec)
    return jax.tree_util.tree_map_with_path(
        one, shapes, logical, is_leaf=lambda t: isinstance(t, tuple) and all(
            isinstance(e, (str, type(None))) for e in t))


# --- activation constraints -------------------------------------------------------------------
_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "orchestrax_mesh_rules", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """While active (at trace time), `constrain` pins activations to the rules' shardings."""
    token = _ACTIVE.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    spec = logical_to_spec(logical, rules, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
