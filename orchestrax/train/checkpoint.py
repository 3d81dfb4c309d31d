"""Orbax checkpoints of the train state, a JSON sidecar (phase, step, metrics rows) and the data
stream's position, saved asynchronously and restored from the newest step that is whole.

Crash safety comes in three layers:
- Orbax writes each step into a temporary directory and renames it on commit, so a save killed
  half-way (the step loop does not wait for it) leaves no step behind;
- once a save has committed (checked at the next save and at close) a manifest of every file's
  size and SHA-256 is written into the step; a newest step whose files no longer match it (a
  truncated file, flipped bytes of the same size, an edited metadata or stream position), whose
  JSON metadata does not parse, or whose metadata the caller's `check` refuses (a step number
  that disagrees with the directory's), is named in one log line and moved aside, and the
  previous step is restored instead;
- any other restore error of the newest step counts the same, once an older step restores onto
  the same target (an error every step shares, such as a changed model config, is raised).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from typing import Any, Callable

import jax
from etils import epath
import orbax.checkpoint as ocp

from orchestrax.train import run_info

log = logging.getLogger(__name__)

# In the step directory: {"files": {relative path: {"size": bytes, "sha256": hex}}}; manifests
# written before checksums were kept are {relative path: size in bytes}.
MANIFEST = "orchestrax_manifest.json"
_HASH_CHUNK = 8 << 20


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs carrying each leaf's sharding: restore targets for Orbax."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree)


class CorruptCheckpoint(Exception):
    """A step directory that is not whole; `file` is the first bad file found."""

    def __init__(self, step: int, file: epath.Path, why: str):
        super().__init__(f"checkpoint step {step} is corrupt: {file}: {why}")
        self.step, self.file, self.why = step, file, why


class _Snapshot:
    """A grain iterator's state taken when `save` is called: Orbax may run grain's handler on
    its background thread, after the live iterator has moved on."""

    def __init__(self, iterator: Any):
        self._state = json.dumps(iterator.get_state()).encode()

    def get_state(self) -> bytes:
        return self._state


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, *, every: int, keep: int = 3,
                 read_only: bool = False):
        """`read_only` (a reader such as `orchestrax eval`, maybe beside a live run): never
        writes, and a corrupt step is only logged and skipped, not moved aside."""
        if keep < 2:
            raise ValueError(f"Checkpointer keep={keep}; must be >= 2 so a corrupt newest step "
                             "has a previous one to fall back to")
        self.every, self.keep, self.read_only = every, keep, read_only
        self.restored_step: int | None = None
        self.directory = run_info.out_path(directory)  # gs:// stays gs:// for Orbax
        self._pending: int | None = None
        self._mngr = self._manager()

    def _manager(self) -> ocp.CheckpointManager:
        if self.read_only:  # the options a reader leaves at their defaults (Orbax warns else)
            return ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
                read_only=True, save_interval_steps=0, create=False))
        return ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=self.keep, save_interval_steps=1, create=True,
            enable_async_checkpointing=True))

    @property
    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def maybe_save(self, step: int, state: Any, meta: dict[str, Any], *, data: Any = None,
                   force: bool = False) -> bool:
        """Start saving `state`, `meta` (JSON) and the position of grain iterator `data` at
        `step` every `every` steps (always with `force`); returns without waiting for the write.
        The device arrays are copied to host before this returns, so `state` may be donated."""
        if step in (self.latest_step, self._pending) or (
                not force and (self.every <= 0 or step % self.every)):
            return False
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if data is not None:
            import grain.checkpoint
            items["data"] = grain.checkpoint.CheckpointSave(_Snapshot(data))
        self._finish_pending()
        self._pending = step
        self._mngr.save(step, args=ocp.args.Composite(**items), force=True)
        log.info("checkpoint of step %d started", step)
        return True

    def restore(self, like_state: Any, step: int | None = None, *, data: Any = None,
                partial: bool = False,
                check: Callable[[int, dict[str, Any]], str | None] | None = None
                ) -> tuple[Any, dict[str, Any]]:
        """Restore onto the shardings of `like_state` (which may differ from the saved ones) and,
        when given, set grain iterator `data` to its saved position. Without `step`, the newest
        whole step: corrupt ones are logged, moved aside and skipped.

        `partial`: `like_state` is a nested dict naming a subset of the saved state's leaves
        (e.g. `{"params": ...}`); only those are read from disk, the others are never opened,
        and the result has `like_state`'s structure. The step is still checked whole first.

        `check(step, meta)`, called once the step (and `data`) is restored: why its metadata or
        stream position disagrees with the step, or None; a step it refuses counts as corrupt."""
        steps = [step] if step is not None else sorted(self._mngr.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint to restore in {self.directory}")
        failed: list[tuple[CorruptCheckpoint, Exception]] = []
        for s in steps:
            try:
                self._verify(s)
                out = self._restore(s, like_state, data, partial)
                why = check(s, out["meta"]) if check is not None else None
                if why is not None:
                    raise CorruptCheckpoint(s, self.directory / str(s) / "meta", why)
            except Exception as e:  # noqa: BLE001 -- judged below, once an older step restores
                if step is not None:
                    raise
                failed.append((e if isinstance(e, CorruptCheckpoint) else CorruptCheckpoint(
                    s, self.directory / str(s), f"{type(e).__name__}: {_first_line(e)}"), e))
                continue
            # An older step restored onto the same target, so the newer ones are broken, not
            # mismatched (a changed model config fails on every step and moves nothing).
            for bad, _ in failed:
                self._quarantine(bad)
            log.info("restored checkpoint of step %d", s)
            self.restored_step = s
            return out["state"], out["meta"]
        if all(isinstance(e, CorruptCheckpoint) for _, e in failed):
            raise FileNotFoundError(f"no whole checkpoint in {self.directory}: steps {steps} are "
                                    f"all corrupt (newest: {failed[0][0]})")
        raise failed[0][1]

    def _restore(self, step: int, like_state: Any, data: Any, partial: bool) -> dict[str, Any]:
        target = abstract_like(like_state)
        items = {"meta": ocp.args.JsonRestore()}
        if not partial:
            items["state"] = ocp.args.StandardRestore(target)
        if data is not None and not (self.directory / str(step) / "data").is_dir():
            log.warning("checkpoint step %d has no data-stream position (saved before streams "
                        "were checkpointed); the stream starts from its beginning", step)
        elif data is not None:
            import grain.checkpoint
            items["data"] = grain.checkpoint.CheckpointRestore(data)
        out = self._mngr.restore(step, args=ocp.args.Composite(**items))
        state = self._restore_subtree(step, target) if partial else out["state"]
        return {"state": state, "meta": out["meta"]}

    def _restore_subtree(self, step: int, target: Any) -> Any:
        """The leaves of the saved state that `target` names, the others left unread.
        StandardRestore reads every leaf; a StandardSave is a PyTree save, so PyTreeRestore with
        partial_restore reads the same files. Its handler is a private one: the manager's
        handler of "state" stays the StandardSave/StandardRestore kind training uses."""
        args = ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True)
        handler = ocp.PyTreeCheckpointHandler()
        try:
            out = handler.restore(self.directory / str(step) / "state", args=args)
        finally:
            handler.close()
        # Orbax hands back a target leaf the checkpoint lacks as it was given: name them instead.
        missing = [jax.tree_util.keystr(k) for k, v in jax.tree_util.tree_leaves_with_path(out)
                   if isinstance(v, jax.ShapeDtypeStruct)]
        if missing:
            raise ValueError(f"partial restore target names leaves checkpoint step {step} does "
                             f"not hold: {missing}")
        return out

    def _verify(self, step: int) -> None:
        """Raise CorruptCheckpoint naming the first file that is missing, of the wrong size, or
        (for Orbax's small JSON metadata files) not JSON. Steps saved before manifests existed
        have only their JSON checked."""
        root = self.directory / str(step)
        manifest = root / MANIFEST
        if manifest.is_file():
            try:
                files = json.loads(manifest.read_text())
            except json.JSONDecodeError as e:
                raise CorruptCheckpoint(step, manifest, f"not JSON ({e.msg})") from None
            files = files.get("files", files)
            for rel, saved in files.items():
                path = root / rel
                size, digest = (saved, None) if isinstance(saved, int) else (saved["size"],
                                                                              saved["sha256"])
                if not path.is_file():
                    raise CorruptCheckpoint(step, path, "missing")
                if path.stat().length != size:
                    raise CorruptCheckpoint(step, path, f"{path.stat().length} bytes, "
                                                        f"{size} when saved (truncated?)")
                if digest is not None and _sha256(path) != digest:
                    raise CorruptCheckpoint(step, path, "content differs from when it was saved "
                                                        "(SHA-256 mismatch)")
        for path in _files(root):
            if (path.name in ("_METADATA", "_CHECKPOINT_METADATA")
                    or path.parent.name == "meta" and path.name == "metadata"):
                try:
                    json.loads(path.read_text())
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise CorruptCheckpoint(step, path, f"not JSON ({e})") from None

    def _finish_pending(self) -> None:
        """Wait for the save in flight to commit, then write its manifest (a step killed before
        this has no manifest; it is checked by its JSON and by restoring it)."""
        self._mngr.wait_until_finished()
        step, self._pending = self._pending, None
        root = self.directory / str(step)
        if step is None or not root.is_dir() or jax.process_index() != 0:
            return
        files = {str(p.relative_to(root)): {"size": p.stat().length, "sha256": _sha256(p)}
                 for p in _files(root) if p.name != MANIFEST}
        tmp = root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps({"files": files}, indent=0))
        tmp.rename(root / MANIFEST)  # a manifest is whole or absent
        log.info("checkpoint of step %d committed", step)

    def _attic(self) -> epath.Path:
        return self.directory.with_name(self.directory.name + ".corrupt")

    def _quarantine(self, bad: CorruptCheckpoint) -> None:
        """One log line, then move the step out of Orbax's view (kept for inspection), so the
        run can save that step number again."""
        log.warning("checkpoint step %d is corrupt (%s: %s); falling back to the previous step",
                    bad.step, bad.file, bad.why)
        if self.read_only:
            return
        if jax.process_index() == 0:
            attic = self._attic()
            attic.mkdir(exist_ok=True)
            target = attic / str(bad.step)
            if target.exists():
                target.rmtree()
            (self.directory / str(bad.step)).rename(target)
        self._mngr.reload()

    def close(self) -> None:
        """Wait for the last save to commit, then release Orbax's threads."""
        self._finish_pending()
        self._mngr.close()


def _files(root: epath.Path) -> list[epath.Path]:
    """Every file under `root`, sorted (epath has no rglob: on GCS one listing per folder)."""
    return sorted(d / name for d, _, names in root.walk() for name in names)


def _sha256(path: epath.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def nonfinite_after_restore(metrics: dict[str, float], restored_step: int | None
                            ) -> str | None:
    """Why the first step after restoring `restored_step` must stop the run (its loss or
    gradient norm is not finite: the restored state is broken), or None."""
    bad = {k: v for k in ("loss", "grad_norm") if k in metrics
           and not math.isfinite(v := float(metrics[k]))}
    if restored_step is None or not bad:
        return None
    return (f"the first step after restoring checkpoint step {restored_step} has "
            f"{', '.join(f'{k}={v}' for k, v in bad.items())}: the restored state is broken, so "
            f"nothing was saved and step {restored_step} was left as it is; move it aside "
            "(or restore an older step) to resume from the one before")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""
