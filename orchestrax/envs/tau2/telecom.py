"""tau2 telecom, the dual-control domain: the agent works the CRM, the user works the phone.

    dom = load_telecom("../shared/data/tau2/telecom")
    r = dom.replay_task(task)      # fresh state -> task's initial state -> gold actions in order
    r.agent_db, r.user_db, r.assertions, r.errors
    dom.reward(task, calls)        # calls: [{"requestor", "name", "arguments"}, ...] in order

After every successful call on either side the two databases are synced (`sync`), as in a
tau2-bench simulation: the phone learns whether its line is active, roaming allowed and the
data quota exceeded; a paid payment request marks its bill paid; a bill awaiting payment
becomes a payment request on the phone. A failed call leaves the state unsynced, as there.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Iterable, Literal

from orchestrax.envs.tau2 import telecom_agent, telecom_user
from orchestrax.envs.tau2.db import Rejected
from orchestrax.envs.tau2.functions import DomainFunction
from orchestrax.envs.tau2.telecom_db import (TelecomState, normalise_agent_db, normalise_user_db,
                                             read_toml)
from orchestrax.tools.schema import ArgumentError, check_arguments

Side = Literal["assistant", "user"]
SIDES: tuple[Side, ...] = ("assistant", "user")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CallOutcome:
    requestor: Side
    name: str
    ok: bool
    observation: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskReplay:
    """`*_initial`: after the task's initial state, before any gold action; `agent_db`,
    `user_db`: after the gold actions; `assertions`: one bool per env assertion, in task order;
    `errors`: the indices of the gold actions that were refused."""

    agent_db_initial: dict[str, Any]
    user_db_initial: dict[str, Any]
    agent_db: dict[str, Any]
    user_db: dict[str, Any]
    assertions: list[bool]
    errors: list[int]


def sync(st: TelecomState) -> None:
    """Carry the agent DB's facts about the user's line over to the phone and back."""
    sur = st.surroundings
    if sur["phone_number"] is None:
        return
    line = telecom_agent.line_by_phone(st, sur["phone_number"])
    sur["line_active"] = line["status"] == "Active"
    sur["roaming_allowed"] = line["roaming_enabled"]
    quota = telecom_agent.plan(st, line["plan_id"])["data_limit_gb"] + line["data_refueling_gb"]
    sur["mobile_data_usage_exceeded"] = line["data_used_gb"] >= quota
    request = sur["payment_request"]
    if request is not None and request["paid"]:
        telecom_agent.bill(st, request["bill_id"])["status"] = "Paid"
        sur["payment_request"] = None
    if sur["payment_request"] is None:
        waiting = telecom_agent.bills_awaiting_payment(
            st, telecom_agent.customer_by_phone(st, sur["phone_number"]))
        if waiting:
            sur["payment_request"] = {"bill_id": waiting[0]["bill_id"],
                                      "amount_due": waiting[0]["total_due"], "paid": False}


def _copy(db: dict) -> dict:
    """A deep copy of a JSON-shaped DB; a JSON round trip is ~3x faster than copy.deepcopy."""
    return json.loads(json.dumps(db))


def _text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result)


def compare_action(gold: dict, call: dict) -> bool:
    """tau2-bench's match of a gold action with a call: same name, and equal values for the
    gold's `compare_args` (None: every argument the call gives; []: names alone match)."""
    if gold["name"] != call.get("name"):
        return False
    args = call.get("arguments") or {}
    keys = list(args) if gold.get("compare_args") is None else gold["compare_args"]
    if not keys:
        return True
    return ({k: v for k, v in args.items() if k in keys}
            == {k: v for k, v in gold["arguments"].items() if k in keys})


class TelecomDomain:
    """Immutable after loading; every replay and episode works on its own `TelecomState`."""

    name = "telecom"

    def __init__(self, agent_db: dict, user_db: dict, tasks: list[dict], policy: str,
                 splits: dict[str, list[str]]):
        self.base_agent_db, self.base_user_db = agent_db, user_db
        self.tasks, self.policy, self.splits = tasks, policy, splits
        self.functions: dict[Side, dict[str, DomainFunction]] = {
            "assistant": {f.name: f for f in telecom_agent.FUNCTIONS},
            "user": {f.name: f for f in telecom_user.FUNCTIONS}}

    def tool_functions(self, side: Side) -> list[DomainFunction]:
        """The functions a model on `side` may call (13 for the agent, 30 for the user)."""
        return [f for f in self.functions[side].values() if f.is_tool]

    def fresh_state(self) -> TelecomState:
        st = TelecomState(_copy(self.base_agent_db), _copy(self.base_user_db))
        sync(st)
        return st

    def _function(self, side: Any, name: Any, kinds: tuple[str, ...]) -> DomainFunction:
        if side not in SIDES:
            raise Rejected(f"requestor={side!r}; allowed: {list(SIDES)}")
        fn = self.functions[side].get(name)
        if fn is None or fn.kind not in kinds:
            allowed = sorted(n for n, f in self.functions[side].items() if f.kind in kinds)
            raise Rejected(f"Tool {name!r} not found for {side}; allowed: {allowed}")
        return fn

    def call(self, st: TelecomState, side: Side, name: str, arguments: Any) -> CallOutcome:
        """A model's tool call: unknown tools, bad arguments and refusals give `ok=False` with an
        "Error: ..." observation; a success is followed by `sync`."""
        try:
            fn = self._function(side, name, ("read", "write", "generic"))
            result = fn.fn(st, check_arguments(fn.parameters, arguments, tool=name))
            sync(st)
            return CallOutcome(requestor=side, name=name, ok=True, observation=_text(result))
        except (Rejected, ArgumentError) as e:
            return CallOutcome(requestor=side, name=name, ok=False, observation=f"Error: {e}")

    def run_env_function(self, st: TelecomState, side: Side, name: str, arguments: dict) -> Any:
        """A task-setup function or assertion (or a tool); raises on anything wrong: a task
        whose setup fails is a broken task, not an agent's mistake."""
        fn = self._function(side, name, ("read", "write", "generic", "env", "assert"))
        try:
            result = fn.fn(st, check_arguments(fn.parameters, arguments, tool=name))
        except (Rejected, ArgumentError) as e:
            raise ValueError(f"{side} function {name}({arguments}) failed: {e}") from None
        sync(st)
        return result

    def initial_state(self, task: dict) -> TelecomState:
        """A fresh state with the task's `initialization_actions` applied in order."""
        init = task.get("initial_state") or {}
        if init.get("initialization_data") or init.get("message_history"):
            raise ValueError(f"task {task.get('id')!r}: initialization_data and message_history "
                             "are not supported (no telecom task uses them)")
        st = self.fresh_state()
        for action in init.get("initialization_actions") or []:
            self.run_env_function(st, action["env_type"], action["func_name"], action["arguments"])
        return st

    def assertions(self, st: TelecomState, task: dict) -> list[bool]:
        """Each env assertion's result compared with its `assert_value`, in task order."""
        out = []
        for spec in (task.get("evaluation_criteria") or {}).get("env_assertions") or []:
            result = self.run_env_function(st, spec["env_type"], spec["func_name"], spec["arguments"])
            if not isinstance(result, bool):
                raise ValueError(f"assertion {spec['func_name']} returned {result!r}, not a bool")
            out.append(result == spec.get("assert_value", True))
        return out

    def run_calls(self, task: dict, calls: Iterable[dict]) -> tuple[TelecomState, list[CallOutcome]]:
        st = self.initial_state(task)
        outcomes = [self.call(st, c.get("requestor", "assistant"), c.get("name"),
                              c.get("arguments", {})) for c in calls]
        return st, outcomes

    def replay_task(self, task: dict) -> TaskReplay:
        st = self.initial_state(task)
        agent0, user0 = _copy(st.agent), _copy(st.user)
        gold = gold_actions(task)
        errors = [k for k, a in enumerate(gold)
                  if not self.call(st, a["requestor"], a["name"], a["arguments"]).ok]
        agent1, user1 = _copy(st.agent), _copy(st.user)
        return TaskReplay(agent_db_initial=agent0, user_db_initial=user0, agent_db=agent1,
                          user_db=user1, assertions=self.assertions(st, task), errors=errors)

    def reward(self, task: dict, calls: list[dict]) -> float:
        """tau2-bench's reward for the telecom domain: the product of the env assertions on the
        state after `calls`, times (when `reward_basis` has ACTION) every gold action matched
        by some call. `calls`: both sides' tool calls in order, `{"requestor", "name",
        "arguments"}`."""
        criteria = task.get("evaluation_criteria") or {}
        basis = set(criteria.get("reward_basis") or [])
        unknown = basis - {"ENV_ASSERTION", "ACTION"}
        if unknown:  # every telecom task uses these two; DB, NL and COMMUNICATE need more
            raise ValueError(f"task {task.get('id')!r}: reward_basis {sorted(unknown)} not "
                             "supported for telecom; allowed: ENV_ASSERTION, ACTION")
        st, _ = self.run_calls(task, calls)
        reward = 1.0
        if "ENV_ASSERTION" in basis:
            reward *= float(all(self.assertions(st, task)))
        if "ACTION" in basis:
            reward *= float(all(any(compare_action(g, c) for c in calls) for g in gold_actions(task)))
        return reward

    def task(self, task_id: str) -> dict:
        for t in self.tasks:
            if t["id"] == task_id:
                return t
        raise KeyError(f"task_id={task_id!r} not in tau2 domain telecom")


def gold_actions(task: dict) -> list[dict]:
    return list((task.get("evaluation_criteria") or {}).get("actions") or [])


def load_telecom(path: str | pathlib.Path) -> TelecomDomain:
    """`<path>/{db.toml,user_db.toml,tasks.json,main_policy.md,tech_support_manual.md}` and
    `split_tasks.json` if present. The policy is the main policy and the tech-support manual
    in the tags the benchmark wraps them in."""
    root = pathlib.Path(path)
    for required in ("db.toml", "user_db.toml", "tasks.json", "main_policy.md",
                     "tech_support_manual.md"):
        if not (root / required).is_file():
            raise FileNotFoundError(f"tau2 telecom domain {root} lacks {required}")
    agent_db = normalise_agent_db(read_toml(root / "db.toml"), str(root / "db.toml"))
    user_db = normalise_user_db(read_toml(root / "user_db.toml"), str(root / "user_db.toml"))
    tasks = json.loads((root / "tasks.json").read_text())
    if not isinstance(tasks, list):
        raise ValueError(f"{root / 'tasks.json'}: top level is a {type(tasks).__name__}; "
                         "expected a list of tasks")
    split_file = root / "split_tasks.json"
    splits = json.loads(split_file.read_text()) if split_file.is_file() else {}
    policy = ("<main_policy>\n" + (root / "main_policy.md").read_text()
              + "\n</main_policy>\n<tech_support_policy>\n"
              + (root / "tech_support_manual.md").read_text() + "\n</tech_support_policy>")
    return TelecomDomain(agent_db, user_db, tasks, policy, splits)
