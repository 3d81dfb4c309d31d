"""What a run leaves next to its metrics for the tools that come after it: the resolved
TrainConfig as JSON (`train_config.json`), and from it the rollout settings a measurement of
the trained policy should reuse (chat template flags, turn and token budgets, its env)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import numpy as np
from etils import epath

RUN_CONFIG = "train_config.json"
# Episode settings eval takes from the run unless a flag overrides them.
EPISODE_KEYS = ("enable_thinking", "max_new_tokens", "max_turns", "context_tokens")


def out_path(out_dir: str | os.PathLike) -> epath.Path:
    """`out_dir` as a path Orbax and etils write through: a URI (gs://bucket/run) stays one,
    where pathlib would make it a local `gs:/bucket/run` folder; a local path made absolute."""
    s = os.fspath(out_dir)
    return epath.Path(s if "://" in s else os.path.abspath(s))


def local_dir(out_dir: str | os.PathLike) -> pathlib.Path:
    """Where a run keeps what needs a local file system (its lock, the metrics.jsonl it appends
    to, TensorBoard events, the model card servers read, the run config, plots): `out_dir`
    itself when local; for a URI a mirror at ~/.cache/orchestrax/runs/<scheme>/<bucket>/<path>
    (metrics.jsonl is copied up to the URI after every row)."""
    s = os.fspath(out_dir)
    if "://" not in s:
        return pathlib.Path(os.path.abspath(s))
    scheme, rest = s.split("://", 1)
    return pathlib.Path.home() / ".cache" / "orchestrax" / "runs" / scheme / rest.strip("/")


def to_json(cfg: Any) -> dict[str, Any]:
    """A frozen config as plain JSON values (tuples as lists; unknown objects as their repr)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=repr))


def write(out_dir: pathlib.Path, cfg: Any) -> pathlib.Path:
    """`cfg` as JSON, with `env_kind`: the class of its env config (the JSON of `env` holds only
    that config's fields)."""
    path = pathlib.Path(out_dir) / RUN_CONFIG
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_json(cfg) | {"env_kind": type(cfg.env).__name__}, indent=2)
                   + "\n")
    tmp.replace(path)
    return path


def find(directory: str | pathlib.Path) -> pathlib.Path | None:
    """The run config of a run dir, of an HF export made from one, or of a run's `model/`."""
    d = pathlib.Path(directory)
    for candidate in (d / RUN_CONFIG, d.parent / RUN_CONFIG if d.name == "model" else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def policy_settings(directory: str | pathlib.Path) -> tuple[dict[str, Any], pathlib.Path] | None:
    """(settings, file) of the run that trained the policy in `directory`, None when it carries
    no run config. settings: the episode budgets of EPISODE_KEYS, the sampling of the run's eval
    rows ("temperature", "top_p", "top_k", "eval_samples" per task, "seed" and "eval_tasks"),
    its sampler's slots ("sampler_max_batch"; a run from before the one engine also recorded
    its batcher, "engine", which is ignored: every embedded sampler is the continuous engine),
    the clock of its latencies
    ("seconds_per_token"),
    its instance settings ("eval_sheet", "preferences"), and "env_kind", "env" (its env
    config's fields as JSON) and "name"."""
    path = find(directory)
    if path is None:
        return None
    try:
        cfg = json.loads(path.read_text())
        rollout = cfg["rollout"]
        out = {k: rollout[k] for k in EPISODE_KEYS}
        out |= {"top_p": float(rollout.get("top_p", 1.0)), "top_k": int(rollout.get("top_k", -1)),
                "seconds_per_token": rollout.get("seconds_per_token"),
                "sampler_max_batch": int(rollout.get("sampler_max_batch", 64))}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a run config written by orchestrax train ({e})") from None
    out["temperature"] = float(cfg.get("eval_temperature", 0.0))  # the run's own eval rows
    out["eval_samples"] = int(cfg.get("eval_samples", 1))
    out["seed"] = int(cfg.get("seed", 0))
    out["eval_tasks"] = cfg.get("eval_tasks")
    instances = cfg.get("instances") or {}
    out |= {"eval_sheet": instances.get("eval_sheet"),
            "preferences": bool(instances.get("preferences", True))}
    out |= {"env_kind": cfg.get("env_kind"), "env": cfg.get("env"), "name": cfg.get("name")}
    return out, path


# The salt of the eval's episode seeds (training rollouts use 0).
EVAL_SALT = 1


def episode_seeds(seed: int, global_step: int, salt: int, n: int, *, group: int = 1,
                  shared: int = 1) -> np.ndarray:
    """The sampling seeds of n episodes (task-major: a task's `group` samples side by side) of
    the rollouts at `global_step` of a run seeded `seed`: training (salt 0) or its eval
    (EVAL_SALT). An episode's turns use seed + turn, so a resumed run, and `orchestrax eval` of
    the checkpoint, sample what the run sampled whatever order requests reach the sampler in.
    `shared` = k: each k consecutive tasks get the same `group` seeds (common random numbers:
    episode g of every task of a block draws the same random numbers); k = 1 draws the same
    seeds as no blocks."""
    draws = np.random.default_rng([seed, 4, global_step, salt]).integers(
        0, 2**31 - 2**16, n // shared)
    return np.broadcast_to(draws.reshape(-1, 1, group),
                           (n // (shared * group), shared, group)).reshape(-1)


LOCK = ".train.lock"


class OutDirLocked(RuntimeError):
    pass


def lock_out_dir(out_dir: pathlib.Path):
    """Hold an exclusive lock on `out_dir` for the life of the returned file object, so a second
    trainer on the same directory refuses (naming the first one's pid) instead of writing every
    metrics row twice. The lock goes with the process, however it ends."""
    import fcntl
    import os
    f = open(pathlib.Path(out_dir) / LOCK, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise OutDirLocked(f"TrainConfig.out_dir={str(out_dir)!r} is in use by another trainer "
                           f"(pid {pid}); wait for it to finish or set another out_dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
