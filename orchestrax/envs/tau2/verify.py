"""tau2 / ToolScale verification of one trajectory.

Three checks, all must pass (ToolOrchestra's "solved" predicate for ToolScale data):
- execution correctness: the DB after replaying the agent's domain calls on a fresh DB hashes
  the same as the DB after replaying the gold actions (tau2-bench's DB check);
- process fidelity: every `communicate_info` string occurs, case-insensitively with commas
  stripped, in some assistant message (tau2-bench's communicate check);
- operation completeness: every DB entry (table, key) that a successful gold action looked up
  or changed was also looked up or changed by a successful agent call. This is what checks
  read-only tasks: skipping the lookup the gold path makes fails it.
Calls to tools outside the domain (search, LLMs, code) are ignored by all three.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Sequence

from orchestrax.data.records import Trajectory
from orchestrax.envs.tau2.db import DomainDB
from orchestrax.envs.tau2.domain import Tau2Domain

_HIDDEN = re.compile(r"<tool_call>.*?</tool_call>|<think>.*?</think>", re.DOTALL)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    db_match: bool
    missing_info: tuple[str, ...]
    missing_entries: tuple[tuple[str, str], ...]

    @property
    def benchmark_passed(self) -> bool:
        """tau2-bench's own reward for these tasks: DB match and communicate_info."""
        return self.db_match and not self.missing_info

    @property
    def passed(self) -> bool:
        """ToolOrchestra's: the benchmark's checks plus operation completeness."""
        return self.benchmark_passed and not self.missing_entries


def gold_actions(task: dict) -> list[dict]:
    return list((task.get("evaluation_criteria") or {}).get("actions") or [])


def visible_text(text: str) -> str:
    """What a user would read: tool-call blocks and thinking removed."""
    return _HIDDEN.sub(" ", text)


def missing_info(task: dict, assistant_texts: Iterable[str]) -> tuple[str, ...]:
    infos = (task.get("evaluation_criteria") or {}).get("communicate_info") or []
    texts = [visible_text(t).lower().replace(",", "") for t in assistant_texts if t]
    return tuple(info for info in infos if not any(info.lower() in t for t in texts))


class GoldCache:
    """The gold replay's DB per task id (it is the same every time)."""

    def __init__(self, domain: Tau2Domain):
        self.domain = domain
        self._cache: dict[str, DomainDB] = {}

    def __call__(self, task: dict) -> DomainDB:
        if task["id"] not in self._cache:
            self._cache[task["id"]] = self.domain.run(gold_actions(task))[0]
        return self._cache[task["id"]]


def check(domain: Tau2Domain, task: dict, calls: Sequence[dict[str, Any]],
          assistant_texts: Iterable[str], gold: GoldCache | None = None) -> Verdict:
    """`calls`: the agent's tool calls in order, `{"name", "arguments"}`."""
    gold_db = (gold or GoldCache(domain))(task)
    domain_calls = [c for c in calls if c.get("name") in domain.functions]
    db, _ = domain.run(domain_calls)
    # same_state == comparing json.dumps(sort_keys=True) hashes of the two DBs, ~1000x faster
    return Verdict(db_match=db.same_state(gold_db),
                   missing_info=missing_info(task, assistant_texts),
                   missing_entries=tuple(sorted(gold_db.touched - db.touched)))


def trajectory_calls(trajectory: Trajectory) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": c.arguments} for c in trajectory.tool_calls]


def trajectory_texts(trajectory: Trajectory) -> list[str]:
    texts = list(trajectory.assistant_texts)
    if trajectory.final_answer:
        texts.append(trajectory.final_answer)
    return texts
