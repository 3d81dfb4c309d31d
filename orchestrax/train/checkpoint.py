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
import pathlib
from typing import Any, Callable, NamedTuple

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


def _quiet_read_only(record: logging.LogRecord) -> bool:
    """Drop Orbax's warning that a read-only manager is read-only: every eval and serve of a run
    would print it before its own output."""
    return not str(record.msg).startswith("Given directory is read only")


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
            logging.getLogger("absl").addFilter(_quiet_read_only)
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

    def commit(self) -> None:
        """Wait for the save in flight (if any) to commit and write its manifest, so a crash in
        what follows (a long eval) cannot take the step with it."""
        self._finish_pending()

    def close(self) -> None:
        """Wait for the last save to commit, then release Orbax's threads."""
        self._finish_pending()
        self._mngr.close()


class SavedParams(NamedTuple):
    params: Any
    step: int               # the checkpoint step read
    meta: dict[str, Any]    # its JSON sidecar (phase, step, metrics rows)


def read_params(checkpoints: str | os.PathLike, *, like: Any = None, step: int | None = None,
                dtype: str | None = None) -> SavedParams:
    """The `params` of a run's saved train state, the one way eval, export, serve and `init_from`
    read a run. Read-only: a corrupt newest step is named in one log line and the previous one
    read, but nothing in the directory moves (the run may still be training). Only the params
    subtree is read; the AdamW moments (twice the params' bytes) stay on disk.

    `like`: params whose shapes, dtypes and shardings to restore onto (a trainer's mesh). Without
    it, the saved shapes on this process's first device, cast to `dtype` as they are read
    (default: as saved); not the saved sharding, so a run trained over 8 devices reads on one."""
    ckpt = Checkpointer(checkpoints, every=0, read_only=True)
    try:
        target = abstract_like(like) if like is not None else _saved_params_like(
            ckpt.directory, step, dtype)
        restored, meta = ckpt.restore({"params": target}, step, partial=True)
        return SavedParams(restored["params"], ckpt.restored_step, meta)
    finally:
        ckpt.close()


def _saved_params_like(checkpoints: epath.Path, step: int | None, dtype: str | None) -> Any:
    """ShapeDtypeStructs of the train state's `params` from Orbax's metadata of `step`, or of the
    newest step whose metadata reads (every step of a run saves the same tree; the restore then
    checks the chosen step's files)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    steps = [step] if step is not None else sorted(
        (int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()), reverse=True)
    if not steps:
        raise FileNotFoundError(f"{checkpoints} holds no checkpoint")
    errors = []
    for s in steps:
        handler = ocp.StandardCheckpointHandler()
        try:
            tree = handler.metadata(checkpoints / str(s) / "state")["params"]
            return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, dtype or m.dtype,
                                                               sharding=device), tree)
        except Exception as e:  # noqa: BLE001 -- an unreadable step; the restore names it
            errors.append(f"step {s}: {type(e).__name__}: {_first_line(e)}")
        finally:
            handler.close()
    raise FileNotFoundError(f"{checkpoints}: no step's train-state metadata reads: "
                            + "; ".join(errors))


def write_tree(path: epath.Path, tree: Any) -> None:
    """Save a pytree that never changes once written (the KL reference) and wait for it."""
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, tree)
    ckptr.wait_until_finished()
    ckptr.close()


def read_tree(path: epath.Path, like: Any) -> Any:
    """A pytree `write_tree` saved, onto `like`'s shapes, dtypes and shardings."""
    ckptr = ocp.StandardCheckpointer()
    try:
        return ckptr.restore(path, abstract_like(like))
    finally:
        ckptr.close()


class Model(NamedTuple):
    cfg: Any                  # models.ModelConfig
    params: Any
    tokenizer_dir: pathlib.Path
    version: str              # the checkpoint step of a run, "hf" for an HF directory


def is_run_dir(path: str | os.PathLike) -> bool:
    """A TrainConfig.out_dir: the model card in `model/` and Orbax steps in `checkpoints/`."""
    path = pathlib.Path(path)
    return (path / "checkpoints").is_dir() and (path / "model" / "config.json").is_file()


def load_model(path: str | os.PathLike, *, dtype: str = "float32",
               param_dtype: str = "float32", field: str = "model") -> Model:
    """A model to sample from: an HF directory, or a training run directory's newest whole
    checkpoint, computing in `dtype` with params held in `param_dtype`. `field` names the flag
    or setting `path` came from in the error for a directory that is neither."""
    from orchestrax import models
    path = pathlib.Path(path)
    if is_run_dir(path):
        saved = read_params(path.resolve() / "checkpoints", dtype=param_dtype)
        cfg = models.config_from_hf(json.loads((path / "model" / "config.json").read_text()),
                                    dtype=dtype, param_dtype=param_dtype)
        return Model(cfg, saved.params, path / "model", str(saved.step))
    if (path / "config.json").is_file():
        cfg, params = models.load_hf(path, dtype=dtype, param_dtype=param_dtype)
        return Model(cfg, params, path, "hf")
    raise FileNotFoundError(f"{field} {str(path)!r}: neither an HF directory (config.json) nor a "
                            "training run directory (model/config.json + checkpoints/)")


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
