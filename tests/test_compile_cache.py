"""The persistent compilation cache: one helper sets JAX's config, every command that compiles
calls it with its config's `compile_cache_dir`, and a wrong value names the field."""

from __future__ import annotations

import jax
import pytest

from orchestrax import cli, models
from orchestrax.eval.eval_command import EvalCommand
from orchestrax.train import compile_cache, loop
from orchestrax.train.serve import ServeConfig
from orchestrax.train.train_config import TrainConfig

KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
        "jax_compilation_cache_max_size")


@pytest.fixture
def no_cache_dir():
    """JAX's cache settings as a process without $JAX_COMPILATION_CACHE_DIR starts (the test
    suite sets one), restored after; nothing compiles in between."""
    saved = {k: getattr(jax.config, k) for k in KEYS}
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    for k, v in saved.items():
        jax.config.update(k, v)


def test_helper_sets_jax_config(no_cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compile_cache.use_compile_cache(None) is None
    assert jax.config.jax_compilation_cache_dir is None
    got = compile_cache.use_compile_cache("~/xla")
    assert got == str(tmp_path / "xla") == jax.config.jax_compilation_cache_dir
    assert jax.config.jax_persistent_cache_min_compile_time_secs == compile_cache.MIN_COMPILE_SECS
    assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES
    # A directory JAX already names (the operator's $JAX_COMPILATION_CACHE_DIR) stays.
    assert compile_cache.use_compile_cache(str(tmp_path / "other")) == str(tmp_path / "xla")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")


def test_the_suite_keeps_its_own_cache_dir():
    before = jax.config.jax_compilation_cache_dir
    assert before is not None   # tests/conftest.py's
    assert compile_cache.use_compile_cache(compile_cache.DEFAULT_DIR) == before


@pytest.mark.parametrize("make, owner", [
    (lambda v: TrainConfig(name="t", model=models.tiny_config(), compile_cache_dir=v),
     "TrainConfig"),
    (lambda v: ServeConfig(compile_cache_dir=v), "ServeConfig"),
    (lambda v: EvalCommand(compile_cache_dir=v), "EvalCommand"),
])
def test_compile_cache_dir_is_checked(make, owner):
    assert make(None).compile_cache_dir is None
    assert make("/tmp/x").compile_cache_dir == "/tmp/x"
    for bad in ("", "  ", 3):
        with pytest.raises(ValueError) as e:
            make(bad)
        msg = str(e.value)   # TrainConfig's type check names its top-level fields bare
        assert f"compile_cache_dir={bad!r}" in msg and "\n" not in msg
        assert owner in msg or bad == 3


def test_serve_flags_and_set_are_its_fields():
    parse = lambda *a: cli.command_config(cli.build_parser().parse_args(["serve", "--tiny", *a]))  # noqa: E731
    assert parse().compile_cache_dir == compile_cache.DEFAULT_DIR and parse().warm is False
    cfg = parse("--compile-cache-dir", "/tmp/xla", "--warm")
    assert cfg.compile_cache_dir == "/tmp/xla" and cfg.warm is True
    assert parse("--set", "compile_cache_dir=None").compile_cache_dir is None
    with pytest.raises(ValueError, match="ServeConfig.warm='yes'"):
        ServeConfig(warm="yes")


class Called(Exception):
    pass


@pytest.fixture
def calls(monkeypatch):
    """The directory each command hands the helper; the command stops there."""
    seen = []

    def record(directory):
        seen.append(directory)
        raise Called

    monkeypatch.setattr(compile_cache, "use_compile_cache", record)
    return seen


@pytest.mark.parametrize("argv", [
    ["serve", "--tiny", "--port", "0", "--compile-cache-dir", "/tmp/cc-serve"],
    ["eval", "--policy", "runs/none", "--tasks", "routing", "--compile-cache-dir",
     "/tmp/cc-eval"],
])
def test_commands_call_the_helper_first(calls, argv):
    with pytest.raises(Called):
        cli.main(argv)
    assert calls == [argv[-1]]


def test_training_calls_the_helper_first(calls):
    # `orchestrax train` and `orchestrax demo` both train through loop.train
    with pytest.raises(Called):
        loop.train(TrainConfig(name="t", model=models.tiny_config(),
                               compile_cache_dir="/tmp/cc-train"))
    assert calls == ["/tmp/cc-train"]
