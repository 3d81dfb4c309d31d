"""A loaded tau2 domain: base DB, tasks, policy and the domain's functions as tools.

    dom = load_domain("../shared/data/tau2/retail")
    final_db = dom.replay([{"name": "cancel_pending_order", "arguments": {...}}, ...])
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Iterable

from orchestrax.envs.tau2 import airline, retail
from orchestrax.envs.tau2.db import DomainDB, Rejected
from orchestrax.envs.tau2.functions import DomainFunction, tool_result, tool_spec
from orchestrax.envs.tau2.telecom import TelecomDomain, load_telecom
from orchestrax.tools.tool import ToolResult
from orchestrax.tools.schema import ArgumentError, check_arguments

_DOMAINS = {"retail": retail, "airline": airline}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActionOutcome:
    name: str
    ok: bool
    observation: str


def _to_text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result)


class Tau2Domain:
    """Immutable after loading; every episode and every replay works on its own `DomainDB`."""

    def __init__(self, name: str, base_db: dict, tasks: list[dict], policy: str,
                 splits: dict[str, list[str]]):
        if name not in _DOMAINS:
            raise ValueError(f"tau2 domain name={name!r}; allowed: {sorted(_DOMAINS)}")
        self.name = name
        self.base_db = base_db
        self.tasks = tasks
        self.policy = policy
        self.splits = splits
        self.functions: dict[str, DomainFunction] = {f.name: f for f in _DOMAINS[name].FUNCTIONS}

    def fresh_db(self) -> DomainDB:
        return DomainDB(self.base_db)

    def apply(self, db: DomainDB, name: str, arguments: Any) -> ActionOutcome:
        """Run one action on `db`. Unknown tools, bad arguments and domain rejections give
        `ok=False` with an "Error: ..." observation and leave `db` unchanged."""
        fn = self.functions.get(name)
        touched = set(db.touched)
        try:
            if fn is None:
                raise Rejected(f"Tool {name!r} not found; allowed: {sorted(self.functions)}")
            args = check_arguments(fn.parameters, arguments)
            return ActionOutcome(name=name, ok=True, observation=_to_text(fn.fn(db, args)))
        except (Rejected, ArgumentError) as e:
            db.touched = touched  # a rejected action operated on nothing
            return ActionOutcome(name=name, ok=False, observation=f"Error: {e}")

    def run(self, actions: Iterable[dict]) -> tuple[DomainDB, list[ActionOutcome]]:
        """Replay `[{"name", "arguments"}, ...]` on a fresh DB; rejected actions are skipped."""
        db = self.fresh_db()
        outcomes = [self.apply(db, a.get("name"), a.get("arguments", {})) for a in actions]
        return db, outcomes

    def replay(self, actions: Iterable[dict]) -> dict[str, Any]:
        """The final DB (an independent JSON-able dict) after replaying `actions`."""
        return self.run(actions)[0].snapshot()

    def tools(self, db: DomainDB | None = None) -> list["DomainTool"]:
        """One tool per domain function, all sharing `db` (a fresh one by default)."""
        db = self.fresh_db() if db is None else db
        return [DomainTool(self, fn, db) for fn in self.functions.values()]

    def task(self, task_id: str) -> dict:
        for t in self.tasks:
            if t["id"] == task_id:
                return t
        raise KeyError(f"task_id={task_id!r} not in tau2 domain {self.name}")


class DomainTool:
    """A domain function bound to an episode's DB; implements `orchestrax.tools.tool.Tool`.
    Rejections raise `ToolError` (non-transient) so the executor reports them as observations."""

    def __init__(self, domain: Tau2Domain, fn: DomainFunction, db: DomainDB):
        self.spec = tool_spec(fn)
        self._domain, self.db = domain, db

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        out = self._domain.apply(self.db, self.spec.name, arguments)
        return tool_result(out.ok, out.observation)


# The tables each domain's functions read; a db.json without one of them is the wrong file.
_TABLES = {"retail": ("orders", "users", "products"),
           "airline": ("flights", "reservations", "users")}


def _read_json(path: pathlib.Path, kind: type) -> Any:
    """Parse `path`, naming the file and where the JSON breaks (a truncated copy, say)."""
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                         "the file may be truncated") from None
    if not isinstance(value, kind):
        raise ValueError(f"{path}: top level is a {type(value).__name__}; expected a "
                         f"{kind.__name__}")
    return value


def _read_db(path: pathlib.Path, name: str) -> dict:
    db = _read_json(path, dict)
    for table in _TABLES.get(name, ()):
        if not isinstance(db.get(table), dict):
            raise ValueError(f"{path}: a tau2 {name} DB needs the {table!r} table (an object keyed "
                             f"by id); found keys {sorted(db)[:10]}")
    try:
        return _DOMAINS[name].normalise(db)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: a record does not have the tau2 {name} shape "
                         f"({type(e).__name__}: {e})") from None


def load_domain(path: str | pathlib.Path) -> Tau2Domain | TelecomDomain:
    """Load `<path>/{db.json,tasks.json,policy.md[,split_tasks.json]}`; the domain's name is
    the folder name (retail or airline). A folder named telecom loads the dual-control domain
    (`telecom.load_telecom`: TOML DBs for the agent and the user's phone)."""
    root = pathlib.Path(path)
    name = root.resolve().name
    if name == "telecom":
        return load_telecom(root)
    if name not in _DOMAINS:
        raise ValueError(f"tau2 domain folder {root} is named {name!r}; allowed: "
                         f"{sorted([*_DOMAINS, 'telecom'])}")
    for required in ("db.json", "tasks.json", "policy.md"):
        if not (root / required).is_file():
            raise FileNotFoundError(f"tau2 domain {root} lacks {required}")
    base_db = _read_db(root / "db.json", name)
    tasks = _read_json(root / "tasks.json", list)
    split_file = root / "split_tasks.json"
    splits = _read_json(split_file, dict) if split_file.is_file() else {}
    return Tau2Domain(name, base_db, tasks, (root / "policy.md").read_text(), splits)
