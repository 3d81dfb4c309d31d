"""Orbax checkpoints of the train state plus a JSON sidecar (data position, RNG, metrics).

A crash resumes from the newest complete checkpoint; Orbax writes to a temporary directory and
renames on commit, so a half-written step is never picked up.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs carrying each leaf's sharding: restore targets for Orbax."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree)


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, *, every: int, keep: int = 3):
        self.every = every
        self._mngr = ocp.CheckpointManager(
            os.path.abspath(directory),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=1,
                                                 create=True))

    @property
    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def maybe_save(self, step: int, state: Any, meta: dict[str, Any], *, force: bool = False) -> bool:
        if step == self.latest_step or (not force and (self.every <= 0 or step % self.every)):
            return False
        self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      meta=ocp.args.JsonSave(meta)), force=True)
        self._mngr.wait_until_finished()
        log.info("checkpoint saved at step %d", step)
        return True

    def restore(self, like_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore onto the shardings of `like_state` (which may differ from the saved ones)."""
        step = self.latest_step if step is None else step
        if step is None:
            raise FileNotFoundError("no checkpoint to restore")
        out = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_like(like_state)),
            meta=ocp.args.JsonRestore()))
        log.info("restored checkpoint of step %d", step)
        return out["state"], out["meta"]

    def close(self) -> None:
        self._mngr.close()
