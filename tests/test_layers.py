"""The layers of DESIGN.md, checked on the source: no import cycle between modules, no import from
a lower package to a higher one, no module that nothing reaches, no two modules of one name, and no
environment or sampler backend constructed anywhere but in the registry.

Imports are read from the AST of every file, function bodies and `if TYPE_CHECKING:` blocks
included (a lazy or type-only import still ties two layers together), relative imports resolved."""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[1] / "orchestrax"
ROOT = PKG.parent

# package -> the packages it may import (besides itself). Lower layers first; read off the
# "must not know about" column of DESIGN.md's layer table. `eval` is not in that table: it measures
# a trained policy, so it sits beside `train` and may use it; only the CLI sits above both.
ALLOWED = {
    "parallel": set(),                          # not the models' internals
    "models": {"parallel"},                     # not RL, not tools
    "rl": {"models", "parallel"},               # not HTTP, not tools
    "tools": set(),                             # not the policy
    "data": {"tools"},                          # not models (tool-config randomisation: tools)
    "rollout": {"models", "parallel"},          # not reward math
    "agent": {"data", "rollout", "tools"},      # not how a sampler is implemented: see NARROW
    "envs": {"agent", "data", "tools"},         # not the trainer
    # builds envs, samplers, tokenizers and tool catalogs for everything above it
    "registry": {"agent", "data", "envs", "models", "parallel", "rollout", "tools"},
    "train": {"agent", "data", "envs", "models", "parallel", "registry", "rl", "rollout", "tools"},
    "eval": {"agent", "data", "envs", "models", "parallel", "registry", "rl", "rollout", "tools",
             "train"},
    "synth": {"envs", "tools"},                  # not the trainer
    # runs the trainer's processes, then `orchestrax eval` of the export
    "rehearsal": {"agent", "data", "eval", "models", "registry", "tools", "train"},
    "cli": {"eval", "registry", "rehearsal", "rollout", "synth", "tools", "train"},
}
# The one validation module: every package may import it, and it imports none of them.
FOUNDATION = "checks"
ALLOWED = {FOUNDATION: set()} | {p: deps | {FOUNDATION} for p, deps in ALLOWED.items()}
# (package, package it imports) -> the only modules it may import there: the agent layer knows
# the sampler interface, never a sampler implementation (DESIGN.md: agent must not know "how a
# sampler is implemented").
NARROW = {("agent", "rollout"): {"orchestrax.rollout.sampler"}}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _absolute(node: ast.ImportFrom, path: pathlib.Path) -> str:
    """The module `from ... import` names; `from .x import y` is resolved against `path`."""
    if node.level == 0:
        return node.module or ""
    package = list(path.relative_to(ROOT).with_suffix("").parts)[:-1]  # the file's own package
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: pathlib.Path) -> set[str]:
    """orchestrax modules named by any import statement in the file (function bodies included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            for alias in node.names:  # `from a.b import c` names module a.b.c, or a name in a.b
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    resolved = set()
    for name in found:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != "orchestrax":
            resolved.add(name)
    return resolved


GRAPH = {m: _imports(p) - {m} for m, p in MODULES.items()}
# What users run: the console script, `python -m` modules, operator scripts, benchmarks and the
# config files `--config` loads. Tests are not users: a module only tests import belongs in tests/.
ENTRY_POINTS = {"orchestrax.cli"}.union(
    *(_imports(p) for d in ("tools", "bench", "configs") for p in (ROOT / d).glob("*.py")))


def _package(module: str) -> str:
    return module.split(".")[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in graph:
        if m not in index:
            visit(m)
    return cycles


def test_every_package_has_a_layer_and_the_layers_are_ordered():
    packages = {_package(m) for m in MODULES if m != "orchestrax"}
    assert packages == set(ALLOWED), (packages ^ set(ALLOWED), "add the package to ALLOWED")
    assert _cycles({p: set(deps) for p, deps in ALLOWED.items()}) == []


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve_to_the_module_they_name():
    path = PKG / "eval" / "grid.py"
    nodes = ast.parse("from . import report\nfrom ..agent.subagent import x\n").body
    assert [_absolute(n, path) for n in nodes] == ["orchestrax.eval", "orchestrax.agent.subagent"]


def test_no_import_from_a_lower_layer_to_a_higher_one():
    bad = sorted((a, b) for a, deps in GRAPH.items() for b in deps
                 if a != "orchestrax" and _package(a) != _package(b)
                 and _package(b) not in ALLOWED[_package(a)])
    assert not bad, bad


def test_narrow_interfaces_between_layers():
    bad = sorted((a, b) for a, deps in GRAPH.items() for b in deps if a != "orchestrax"
                 and (_package(a), _package(b)) in NARROW
                 and b not in NARROW[_package(a), _package(b)])
    assert not bad, bad


def test_no_import_cycles():
    cycles = _cycles(GRAPH)
    assert not cycles, cycles


def test_every_module_is_reached():
    reached, todo = set(), list(ENTRY_POINTS)
    while todo:
        m = todo.pop()
        if m in reached:
            continue
        reached.add(m)
        todo.extend(GRAPH[m])
        parts = m.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__
        todo.extend(p for p in (".".join(parts[:k]) for k in range(2, len(parts))) if p in MODULES)
    assert sorted(set(MODULES) - reached - {"orchestrax"}) == []


def _shared_names(modules: list[str]) -> dict[str, list[str]]:
    """Last name -> the modules (packages included: `a.b` is a module too) that share it."""
    by_name: dict[str, list[str]] = {}
    for m in modules:
        if m != "orchestrax":
            by_name.setdefault(m.rsplit(".", 1)[-1], []).append(m)
    return {n: sorted(ms) for n, ms in by_name.items() if len(ms) > 1}


def test_no_two_modules_share_a_name():
    # `from x import metrics` or a traceback's `config.py` must say which one it means.
    assert _shared_names(list(MODULES)) == {}


def test_the_name_check_finds_a_shared_name():
    modules = ["orchestrax", "orchestrax.a", "orchestrax.a.sub", "orchestrax.b.sub", "orchestrax.c",
               "orchestrax.d.a"]
    assert _shared_names(modules) == {"a": ["orchestrax.a", "orchestrax.d.a"],
                                      "sub": ["orchestrax.a.sub", "orchestrax.b.sub"]}


# Parts only the registry builds: environments (subclasses of envs.environment.Environment) and
# sampler backends (subclasses of rollout.sampler.Sampler defined in rollout/; the scripted
# sampler of agent/ is a fixture that replays given text), and the functions that return one.
REGISTRY = "orchestrax.registry"
PART_ROOTS = {"Environment": "orchestrax.envs", "Sampler": "orchestrax.rollout"}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        return node.value.rsplit(".", 1)[-1]
    return None


def _parts(trees: dict[str, ast.Module]) -> dict[str, str]:
    """name -> defining module of every part class and of every function annotated to return
    one."""
    bases = {}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = (module, {_name(b) for b in node.bases})
    parts = {}
    for root, package in PART_ROOTS.items():
        grown = {root}
        while True:
            more = {c for c, (_, bs) in bases.items() if bs & grown} - grown
            if not more:
                break
            grown |= more
        parts |= {c: bases[c][0] for c in grown - {root} if bases[c][0].startswith(package)}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns \
                    and _name(node.returns) in parts:
                parts[node.name] = module
    return parts


def _constructions(trees: dict[str, ast.Module]) -> list[tuple[str, str]]:
    """(module, part) for every call of a part outside the registry and the part's own module."""
    parts = _parts(trees)
    return sorted({(module, _name(node.func)) for module, tree in trees.items()
                   for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and _name(node.func) in parts
                   and module not in (REGISTRY, parts[_name(node.func)])})


def test_only_the_registry_constructs_envs_and_samplers():
    trees = {m: ast.parse(p.read_text()) for m, p in MODULES.items()}
    assert {"RoutingEnv", "QAEnv", "Tau2Env", "ContinuousSampler",
            "SGLangClient", "make_embedded_sampler"} <= set(_parts(trees))
    assert _constructions(trees) == []


def test_the_construction_check_finds_a_construction():
    trees = {"orchestrax.envs.toy": ast.parse("class Toy(Environment): ..."),
             "orchestrax.rollout.toy": ast.parse(
                 "class Fast(Sampler): ...\ndef make() -> 'Fast': return Fast()"),
             "orchestrax.train.x": ast.parse("env = Toy()\nsampler = make()"),
             REGISTRY: ast.parse("env = Toy()")}
    assert _constructions(trees) == [("orchestrax.train.x", "Toy"), ("orchestrax.train.x", "make")]


def test_architecture_md_lists_every_package_with_what_it_may_import():
    rows = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0] != "`package`":
            rows[cells[0].strip("`")] = set() if cells[2] == "-" else set(cells[2].split(", "))
    assert rows == {p: deps - {FOUNDATION} for p, deps in ALLOWED.items()}
