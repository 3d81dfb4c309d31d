"""What the synth pipeline asks the generator, and how it reads the answers.

Every prompt asks for one fenced block (```json or ```python); `extract` takes the first block of
the wanted kind, or the whole reply when it has none.
"""

from __future__ import annotations

import json
import re
from typing import Any

_BLOCK = re.compile(r"```(\w*)\s*\n(.*?)```", re.DOTALL)
_SYSTEM = "You build data for training tool-using customer-service agents. Follow the format."


def extract(text: str, kind: str) -> str:
    blocks = [body for lang, body in _BLOCK.findall(text) if lang.lower() in (kind, "")]
    return (blocks[0] if blocks else text).strip()


def parse_json(text: str) -> Any:
    """The JSON of a reply's ```json block; ValueError naming what is wrong."""
    body = extract(text, "json")
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at line {e.lineno}): {body[:120]!r}") from None


def _messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def _tools_text(descriptions: list[dict[str, Any]]) -> str:
    return "\n".join(f"- {d['name']} ({d.get('kind', 'read')}): {d['description'].splitlines()[0]}"
                     f" parameters={json.dumps(d['parameters'].get('properties', {}))[:600]}"
                     for d in descriptions)


# ------------------------------------------------------------------------------ domain stage

DOMAIN_STEPS = ("schema", "data_model", "db", "tools", "policy")


def domain_step(step: str, name: str, description: str, so_far: dict[str, str]) -> list[dict]:
    """The messages of one step of writing a domain; `so_far`: the files written before it."""
    context = "\n\n".join(f"{k}:\n{v[:6000]}" for k, v in so_far.items())
    asks = {
        "schema": ("List the tables of this domain's database as a ```json block: "
                   '{"tables": {"<table>": {"key": "<id field>", "fields": {"<field>": '
                   '"<type and meaning>"}}}}. 2-4 tables.'),
        "data_model": (f"Write data_model.py in a ```python block: pydantic models of the schema "
                       "and one class subclassing `DB` (from tau2.environment.db import DB) with "
                       "one `Dict[str, Model]` field per table."),
        "db": ("Write db.json in a ```json block: an object with one key per table, each an "
               "object keyed by id, 5-20 realistic entries per table, valid for data_model.py."),
        "tools": (f"Write tools.py in a ```python block: `from tau2.environment.toolkit import "
                  f"ToolKitBase, ToolType, is_tool`, `from tau2.domains.{name}.data_model "
                  "import ...`, one ToolKitBase subclass taking `db` in __init__, 6-12 methods "
                  "decorated @is_tool(ToolType.READ) or @is_tool(ToolType.WRITE), typed "
                  "parameters, a Google-style docstring with Args:, ValueError on bad input."),
        "policy": "Write policy.md in a ```markdown block: the rules an agent follows here.",
    }
    return _messages(f"Domain {name!r}: {description}\n\n{context}\n\n{asks[step]}")


# ------------------------------------------------------------------------------- tasks stage

_TASK_FORMAT = ('Answer with one ```json block: {"reason_for_call": "<what the user wants, in '
                'the second person>", "known_info": "<what the user knows: names, ids>", '
                '"actions": [{"name": "<tool>", "arguments": {...}}], "communicate_info": '
                '["<short facts from tool results the agent must tell the user>"]}. The actions '
                "are the gold sequence an agent following the policy performs, with exact "
                "argument values taken from the database entry.")


def task_prompt(name: str, policy: str, descriptions: list[dict[str, Any]],
                subject: dict[str, Any], seed: int) -> list[dict]:
    return _messages(
        f"Domain {name!r}. Policy (excerpt):\n{policy[:3000]}\n\nTools:\n"
        f"{_tools_text(descriptions)}\n\nDatabase entry the task is about (table "
        f"{subject['table']!r}, key {subject['key']!r}):\n{json.dumps(subject['entry'])[:3000]}"
        f"\n\nWrite one realistic customer request (variant {seed}) that needs 1-4 tool calls "
        f"on this entry. {_TASK_FORMAT}")


def evolve_prompt(name: str, descriptions: list[dict[str, Any]], task: dict[str, Any],
                  subject: dict[str, Any]) -> list[dict]:
    return _messages(
        f"Domain {name!r}. Tools:\n{_tools_text(descriptions)}\n\nDatabase entry:\n"
        f"{json.dumps(subject['entry'])[:3000]}\n\nAn existing task:\n{json.dumps(task)[:3000]}"
        "\n\nWrite a harder variant: more steps, more constraints, more distinct tools, still "
        f"solvable from this database. {_TASK_FORMAT}")


def tau2_task(task_id: str, domain: str, spec: Any) -> dict[str, Any]:
    """A generated task in tau2's task format; ValueError naming the field that is wrong."""
    if not isinstance(spec, dict):
        raise ValueError("the task is not a JSON object")
    actions = spec.get("actions")
    if not isinstance(actions, list) or not actions:
        raise ValueError("actions must be a non-empty list")
    for a in actions:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str) or not isinstance(
                a.get("arguments", {}), dict):
            raise ValueError(f"action {str(a)[:80]} needs a name and an arguments object")
    info = spec.get("communicate_info") or []
    if not isinstance(info, list) or not all(isinstance(i, str) for i in info):
        raise ValueError("communicate_info must be a list of strings")
    return {
        "id": task_id, "domain": domain,
        "description": {"purpose": "synthesised", "relevant_policies": None, "notes": None},
        "user_scenario": {"persona": None, "instructions": {
            "domain": domain, "reason_for_call": str(spec.get("reason_for_call", "")),
            "known_info": str(spec.get("known_info", "")), "unknown_info": None,
            "task_instructions": ""}},
        "initial_state": None,
        "evaluation_criteria": {
            "actions": [{"action_id": f"{task_id}_{k}", "name": a["name"],
                         "arguments": a.get("arguments", {}), "info": None}
                        for k, a in enumerate(actions)],
            "communicate_info": info, "nl_assertions": None},
    }
