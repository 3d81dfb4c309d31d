"""Weight sync to SGLang servers by disk: write an HF safetensors directory per version, then
POST `/update_weights_from_disk` to every server (the one path that works from JAX).

The directory must be readable by the servers (shared filesystem for remote ones).
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
from typing import Any

import jax

from orchestrax import models, parallel


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightSync:
    """Where an HTTP sampler's `publish` writes each version, and the model it describes."""

    model: models.ModelConfig
    root: str                          # a directory the servers can read
    tokenizer_dir: str | None = None   # copied into every version (SGLang loads it from there)
    keep: int = 2                      # newest versions kept on disk


def write_version(cfg: models.ModelConfig, params: Any, root: str | pathlib.Path, version: str, *,
                  tokenizer_dir: str | None = None, keep: int = 2) -> pathlib.Path:
    """Write `root/v{version}` atomically (temp dir, then rename) and delete all but the newest
    `keep` versions. Returns the directory. Multi-process: every process calls this (the params
    are gathered from all), process 0 alone writes, and all return once the directory is whole,
    so each may then point its own servers at it."""
    if keep < 1:
        raise ValueError(f"write_version keep={keep}; must be >= 1")
    if not version or "/" in version:
        raise ValueError(f"write_version version={version!r}; must be a non-empty name without '/'")
    root = pathlib.Path(root)
    final, tmp = root / f"v{version}", root / f".tmp-v{version}"
    writer = jax.process_index() == 0
    if writer:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    models.save_hf(cfg, params, tmp, tokenizer_dir=tokenizer_dir)
    if writer:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        versions = sorted((p for p in root.glob("v*") if p.is_dir()),
                          key=lambda p: p.stat().st_mtime)
        for old in versions[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    parallel.barrier(f"weights v{version}")
    return final
