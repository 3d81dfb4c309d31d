"""JAX's persistent compilation cache, turned on the same way by every command that compiles
(`train`, `demo`, `serve`, `eval`), from its config's `compile_cache_dir`."""

from __future__ import annotations

import logging
import os

import jax

from orchestrax.checks import require

log = logging.getLogger(__name__)

# On by default: a second start of the same config loads its programs instead of compiling them
# (minutes for Qwen3-8B on a GPU). An entry is keyed by the program, the devices, the XLA flags
# and the jax version, so it cannot serve a program it was not compiled for.
DEFAULT_DIR = "~/.cache/orchestrax/xla"
# Eager ops compile in milliseconds: not worth an entry each. Model programs take longer.
MIN_COMPILE_SECS = 0.1
# Least recently used entries go beyond this. A size limit also makes jax take a file lock
# around every read and write, so processes started side by side (a server and a trainer, the
# processes of one run) share the directory safely; of a multi-process run only process 0
# writes.
MAX_BYTES = 8 << 30
FLAG_HELP = ("JAX's persistent compilation cache: a second start loads its programs instead of "
             f"compiling them ({DEFAULT_DIR}; --set compile_cache_dir=None: off)")


def use_compile_cache(directory: str | None) -> str | None:
    """Turn on the persistent compilation cache at `directory` (`~` expanded; None: leave it
    off) for this process; call before the first compile. Returns the directory in use. A
    directory JAX's own settings already name ($JAX_COMPILATION_CACHE_DIR, or an earlier
    `jax.config.update`, as the test suite does) is kept with its settings."""
    current = jax.config.jax_compilation_cache_dir
    if current is not None or directory is None:
        return current
    path = os.path.expanduser(directory)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    log.info("compilation cache: %s", path)
    return path


def check_dir(cfg) -> None:
    """`cfg.compile_cache_dir` is a directory or None; a wrong value names the field."""
    value = cfg.compile_cache_dir
    require(value is None or (isinstance(value, str) and bool(value.strip())), cfg,
            "compile_cache_dir", value, "a directory, or None (no persistent compilation cache)")
