"""Device meshes from a config: named axes, one of which may be -1 ("the rest")."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Axis names and sizes in mesh order, e.g. `(("data", 1), ("fsdp", -1), ("tensor", 1))`.

    The batch is split over data × fsdp, parameters over fsdp (ZeRO-3 style) and tensor.
    """

    axes: tuple[tuple[str, int], ...] = (("data", 1), ("fsdp", -1), ("tensor", 1))

    def __post_init__(self):
        names = [n for n, _ in self.axes]
        if len(set(names)) != len(names):
            raise ValueError(f"MeshConfig.axes has repeated names: {names}")
        sizes = [s for _, s in self.axes]
        if sizes.count(-1) > 1:
            raise ValueError(f"MeshConfig.axes: at most one axis may be -1, got {self.axes}")
        for n, s in self.axes:
            if s != -1 and s < 1:
                raise ValueError(f"MeshConfig.axes: axis {n!r} has size {s}; use >= 1 or -1")

    def resolve(self, num_devices: int) -> dict[str, int]:
        """Concrete axis sizes for `num_devices`; raises naming the axes when they don't fit."""
        fixed = math.prod(s for _, s in self.axes if s != -1)
        if any(s == -1 for _, s in self.axes):
            if num_devices % fixed:
                raise ValueError(f"mesh axes {dict(self.axes)}: the fixed axes multiply to {fixed}, "
                                 f"which does not divide the {num_devices} devices")
            return {n: (num_devices // fixed if s == -1 else s) for n, s in self.axes}
        if fixed != num_devices:
            raise ValueError(f"mesh axes {dict(self.axes)} multiply to {fixed} but there are "
                             f"{num_devices} devices; make one axis -1 or change the sizes")
        return dict(self.axes)


def make_mesh(cfg: MeshConfig = MeshConfig(), devices=None) -> Mesh:
    devices = jax.devices() if devices is None else list(devices)
    sizes = cfg.resolve(len(devices))
    shape = tuple(sizes.values())
    try:
        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # noqa: BLE001 - topology-aware layout is best effort (fake CPU devices)
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, tuple(sizes))
