"""The ToolScale pipeline: domain -> tasks -> verify -> evolve -> verify -> tasks.json.

Each stage writes `<out>/<stage>.jsonl` and is skipped on a rerun once written; inside a stage
the generator's ledger answers every request already paid for, so a killed run redoes only the
calls that had not come back. The verify stage replays each task's gold actions in the domain
worker and keeps a task only if it is well formed, every action executes, it is not a no-op (a
write task changes the DB; a read task looks entries up), every `communicate_info` fact shows
in the tool results, a second replay passes the three checks against the first (a
deterministic task), it does not duplicate a kept task and, when evolved, has more gold steps
than its parent. Output: tau2-format `tasks.json` (with a "domain" field per task) and
`split_tasks.json`, which `ToolScaleEnv`, `orchestrax train` and `orchestrax eval` read.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import pathlib
from typing import Any, Awaitable, Callable

import numpy as np

from orchestrax.envs.toolscale import WorkerDomain
from orchestrax.envs.tau2.verify import gold_actions
from orchestrax.synth import prompts
from orchestrax.synth.exercise import exercise
from orchestrax.synth.generator import Generator
from orchestrax.tools.chat_client import ChatError
from orchestrax.tools.domain_worker import DomainWorker, WorkerConfig, WorkerFailed

CHECKS = ("well_formed", "known_tools", "executes", "not_no_op", "info_grounded",
          "three_checks", "not_duplicate", "harder")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SynthConfig:
    """`domains`: tau2-format folders to write tasks for; `describe`: (name, one-paragraph
    description) of domains to generate first (written under `<out>/domains/<name>`)."""

    out_dir: str
    domains: tuple[str, ...] = ()
    describe: tuple[tuple[str, str], ...] = ()
    tasks_per_domain: int = 8
    evolve: bool = True
    seed: int = 0
    worker: WorkerConfig = WorkerConfig()

    def __post_init__(self):
        if not self.domains and not self.describe:
            raise ValueError("SynthConfig needs domains (folders) or describe (name, text)")
        if self.tasks_per_domain < 1:
            raise ValueError(f"SynthConfig.tasks_per_domain={self.tasks_per_domain}; must be >= 1")
        for name, _ in self.describe:
            if not name.isidentifier():
                raise ValueError(f"SynthConfig.describe name {name!r}: must be a Python "
                                 "identifier (it is a package name)")


async def _stage(path: pathlib.Path, produce: Callable[[], Awaitable[list[dict]]]) -> list[dict]:
    if path.is_file():
        return [json.loads(line) for line in path.read_text().splitlines()]
    rows = await produce()
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)  # a stage file exists only once complete
    return rows


# ------------------------------------------------------------------------------ domain stage

async def make_domain(gen: Generator, name: str, description: str, root: pathlib.Path,
                      worker: WorkerConfig) -> dict[str, Any]:
    """Write one domain (schema -> data model -> DB -> tools -> policy), then validate it: it
    loads in the worker and every tool is called once on arguments sampled from its DB."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    files = {"data_model": "data_model.py", "db": "db.json", "tools": "tools.py",
             "policy": "policy.md"}
    kinds = {"schema": "json", "data_model": "python", "db": "json", "tools": "python",
             "policy": "markdown"}
    so_far: dict[str, str] = {}
    for step in prompts.DOMAIN_STEPS:
        text = await gen.complete(f"domain/{name}/{step}",
                                  prompts.domain_step(step, name, description, so_far))
        so_far[step] = prompts.extract(text, kinds[step])
        if step in files:
            (folder / files[step]).write_text(so_far[step] + "\n")
    for p in (root, folder, *folder.iterdir()):
        p.chmod(0o755 if p.is_dir() else 0o644)  # the sandbox's uid reads them
    row: dict[str, Any] = {"name": name, "folder": str(folder), "ok": False}
    try:
        json.loads((folder / "db.json").read_text())
        probe = DomainWorker(folder, worker)
        try:
            descriptions = await probe.start()
            calls = await exercise(probe, descriptions, attempts=5)
        finally:
            await probe.close()
    except (ValueError, WorkerFailed) as e:
        return {**row, "error": str(e)[:500]}
    return {**row, "ok": bool(descriptions), "tools": len(descriptions),
            "tools_ran": sum(c["ok"] for c in calls.values())}


# ------------------------------------------------------------------------------- tasks stage

def subjects(folder: pathlib.Path, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """`n` DB entries to write tasks about, cycling over the tables (diversity by subject)."""
    db = json.loads((folder / "db.json").read_text())
    tables = [t for t, rows in db.items() if isinstance(rows, dict) and rows]
    picks = []
    for k in range(n):
        table = tables[k % len(tables)]
        keys = list(db[table])
        key = keys[int(rng.integers(len(keys)))]
        picks.append({"table": table, "key": key, "entry": db[table][key]})
    return picks


async def write_tasks(gen: Generator, domain: WorkerDomain, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng([seed, *domain.name.encode()])

    async def one(k: int, subject: dict[str, Any]) -> dict[str, Any]:
        task_id = f"{domain.name}_{k}"
        row = {"id": task_id, "domain": domain.name,
               "subject": {"table": subject["table"], "key": subject["key"]}}
        try:
            text = await gen.complete(f"tasks/{domain.name}", prompts.task_prompt(
                domain.name, domain.policy, domain.descriptions, subject, k))
            return {**row, "task": prompts.tau2_task(task_id, domain.name,
                                                     prompts.parse_json(text))}
        except (ValueError, ChatError) as e:  # a refused request loses this task, not the run
            return {**row, "task": None, "error": str(e)[:500]}

    picked = subjects(domain.folder, n, rng)
    return list(await asyncio.gather(*(one(k, s) for k, s in enumerate(picked))))


async def evolve_tasks(gen: Generator, domain: WorkerDomain, kept: list[dict]) -> list[dict]:
    db = json.loads((domain.folder / "db.json").read_text())

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        subject = {**row["subject"], "entry": db[row["subject"]["table"]][row["subject"]["key"]]}
        task_id = f"{row['id']}_evolved"
        out = {"id": task_id, "domain": domain.name, "subject": row["subject"],
               "parent": row["id"], "parent_steps": len(gold_actions(row["task"]))}
        try:
            text = await gen.complete(f"evolve/{domain.name}", prompts.evolve_prompt(
                domain.name, domain.descriptions, row["task"], subject))
            return {**out, "task": prompts.tau2_task(task_id, domain.name,
                                                     prompts.parse_json(text))}
        except (ValueError, ChatError) as e:
            return {**out, "task": None, "error": str(e)[:500]}

    return list(await asyncio.gather(*(one(r) for r in kept)))


# ------------------------------------------------------------------------------ verify stage

def _norm(text: str) -> str:
    return text.lower().replace(",", "")


async def verify(domain: WorkerDomain, rows: list[dict], seen: set[str]) -> list[dict]:
    """Each row with `checks` (the name of each check with whether it passed, in order, up to
    the first that failed) and `kept`; `seen`: canonical gold action lists kept so far."""
    base = None  # the untouched DB's state, once a task gets that far
    kinds = {d["name"]: d.get("kind") for d in domain.descriptions}
    out = []
    for row in rows:
        checks: dict[str, bool] = {}

        def passes(name: str, ok: bool) -> bool:
            checks[name] = bool(ok)
            return bool(ok)

        task = row.get("task")
        ok = passes("well_formed", task is not None)
        actions = gold_actions(task) if ok else []
        ok = ok and passes("known_tools", all(a["name"] in kinds for a in actions))
        if ok:
            state, outcomes = await domain.replay(actions)
            ok = passes("executes", all(o["ok"] for o in outcomes))
        if ok:
            if base is None:
                base, _ = await domain.replay([])
            writes = any(kinds[a["name"]] == "write" for a in actions)
            ok = passes("not_no_op", state.hash != base.hash if writes else bool(state.touched))
        if ok:
            seen_text = [_norm(o["observation"]) for o in outcomes]
            info = task["evaluation_criteria"]["communicate_info"]
            ok = passes("info_grounded", all(any(_norm(i) in t for t in seen_text) for i in info))
        if ok:  # the gold path as an agent's calls on a fresh DB: all three checks
            again, _ = await domain.replay(actions)
            ok = passes("three_checks", again.same_state(state) and state.touched <= again.touched)
        if ok:
            key = json.dumps([[a["name"], a["arguments"]] for a in actions], sort_keys=True)
            ok = passes("not_duplicate", key not in seen)
            if ok:
                seen.add(key)
        if ok and "parent_steps" in row:
            ok = passes("harder", len(actions) > row["parent_steps"])
        out.append({**row, "checks": checks, "kept": ok})
    return out


# -------------------------------------------------------------------------------- the run

def _split(ids: list[str]) -> dict[str, list[str]]:
    test = ids[::5]
    train = [i for i in ids if i not in set(test)] or list(ids)
    return {"train": train, "test": test, "all": list(ids)}


def report(rows: list[dict]) -> dict[str, Any]:
    """Tasks in, how many passed each check, how many were dropped at each, how many kept, and
    the first malformed reply's error (if any)."""
    passed = collections.Counter(c for r in rows for c, ok in r["checks"].items() if ok)
    dropped = collections.Counter(c for r in rows for c, ok in r["checks"].items() if not ok)
    out = {"tasks_in": len(rows), "passed": {c: passed[c] for c in CHECKS if c in passed},
           "dropped_at": {c: dropped[c] for c in CHECKS if c in dropped},
           "kept": sum(r["kept"] for r in rows)}
    errors = [r["error"] for r in rows if r.get("error")]
    return out | ({"first_error": errors[0]} if errors else {})


def summary(result: dict[str, Any]) -> str:
    """One line per domain and stage (`bank tasks: 4 in, well-formed 0 of 4, kept 0 ...`), then
    the total; says plainly when nothing was kept."""
    lines = []
    for name, stages in result["domains"].items():
        for stage, rep in (("tasks", stages["base"]), ("evolved", stages["evolved"])):
            if not rep["tasks_in"]:
                continue
            n = rep["tasks_in"]
            line = (f"{name} {stage}: {n} in, well-formed {rep['passed'].get('well_formed', 0)} "
                    f"of {n}, kept {rep['kept']} of {n}")
            if rep["dropped_at"]:
                line += " (dropped at " + ", ".join(f"{c} {k}" for c, k in
                                                   rep["dropped_at"].items()) + ")"
            if rep.get("first_error"):
                line += f"; first malformed reply: {rep['first_error'][:160]}"
            lines.append(line)
    kept = result["tasks_kept"]
    lines.append(f"kept {kept} task(s); {result['calls']} generator call(s), "
                 f"{result['reused_calls']} from the ledger, ${result['spent_usd']:.4f}"
                 + ("" if kept else "; NO TASK KEPT: tasks.json is empty (a generator that "
                    "cannot write JSON tasks, e.g. random weights, keeps none)"))
    return "\n".join(lines)


async def run(cfg: SynthConfig, gen: Generator) -> dict[str, Any]:
    out = pathlib.Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    folders = [pathlib.Path(d) for d in cfg.domains]
    if cfg.describe:
        made = await _stage(out / "domain.jsonl", lambda: asyncio.gather(*(
            make_domain(gen, name, text, out / "domains", cfg.worker)
            for name, text in cfg.describe)))
        folders += [pathlib.Path(r["folder"]) for r in made if r["ok"]]
    result: dict[str, Any] = {"domains": {}}
    kept_tasks = []
    for folder in folders:
        domain = WorkerDomain(folder, config=cfg.worker)
        name, seen = domain.name, set()
        try:
            base = await _stage(out / f"tasks_{name}.jsonl",
                                lambda: write_tasks(gen, domain, cfg.tasks_per_domain, cfg.seed))
            base = await _stage(out / f"verify_{name}.jsonl", lambda: verify(domain, base, seen))
            seen = {json.dumps([[a["name"], a["arguments"]] for a in gold_actions(r["task"])],
                               sort_keys=True) for r in base if r["kept"]}
            evolved = []
            if cfg.evolve:
                evolved = await _stage(out / f"evolve_{name}.jsonl", lambda: evolve_tasks(
                    gen, domain, [r for r in base if r["kept"]]))
                evolved = await _stage(out / f"verify_evolve_{name}.jsonl",
                                       lambda: verify(domain, evolved, seen))
        finally:
            await domain.close()
        kept_tasks += [r["task"] for r in [*base, *evolved] if r["kept"]]
        result["domains"][name] = {"base": report(base), "evolved": report(evolved)}
    (out / "tasks.json").write_text(json.dumps(kept_tasks, indent=1))
    (out / "split_tasks.json").write_text(json.dumps(_split([t["id"] for t in kept_tasks])))
    result |= {"tasks_kept": len(kept_tasks), **gen.stats()}
    (out / "report.json").write_text(json.dumps(result, indent=1))
    return result
