"""QA task environment: JSONL question files with answer checking.

Rows may name their fields like any of the shipped files or the gated sets users add:
question in `problem` | `question` | `Question`, id in `id` | `idx` | `task_id`, answer in
`answer` | `final_answer` | `Final answer` (a string or number, or a list of accepted answers).
Extra fields (reasoning_type, wiki_links, ...) go to `Task.metadata`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
from typing import Any, Literal, Mapping

from orchestrax.data.records import Task, Trajectory
from orchestrax.tools.chat_client import ChatEndpoint, ChatError
from orchestrax.envs.environment import EnvConfig, Environment
from orchestrax.envs.qa_grading import exact_match, judge_match, math_match
from orchestrax.tools.tool import Tool
from orchestrax.tools.randomize import instance_tools

log = logging.getLogger(__name__)

Grader = Literal["exact", "math", "judge"]
_QUESTION_KEYS = ("problem", "question", "Question")
_ID_KEYS = ("id", "idx", "task_id")
_ANSWER_KEYS = ("answer", "final_answer", "Final answer")
SYSTEM_PROMPT = ("Answer the question. Use tools when they help. Give the final answer inside "
                 "<answer></answer>, as short as possible.")


def _pick(row: dict, keys: tuple[str, ...], what: str, where: str) -> tuple[str, Any]:
    for key in keys:
        if key in row and row[key] is not None:
            return key, row[key]
    raise ValueError(f"{where}: no {what} field; expected one of {list(keys)}, got {sorted(row)}")


def load_jsonl(path: str | pathlib.Path) -> list[Task]:
    """One Task per non-empty line; `Task.answer` is a tuple of accepted answer strings."""
    path = pathlib.Path(path)
    tasks, seen = [], set()
    name = path.stem
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: each line must be a JSON object")
            qk, question = _pick(row, _QUESTION_KEYS, "question", where)
            ik, raw_id = _pick(row, _ID_KEYS, "id", where)
            ak, answer = _pick(row, _ANSWER_KEYS, "answer", where)
            answers = tuple(str(a) for a in answer) if isinstance(answer, list) else (str(answer),)
            if not str(question).strip() or not answers or not all(a.strip() for a in answers):
                raise ValueError(f"{where}: empty question or answer")
            task_id = f"{name}/{raw_id}"
            if task_id in seen:
                raise ValueError(f"{where}: duplicate id {raw_id!r}")
            seen.add(task_id)
            extra = {k: v for k, v in row.items() if k not in (qk, ik, ak)}
            tasks.append(Task(task_id=task_id, answer=answers,
                              messages=({"role": "system", "content": SYSTEM_PROMPT},
                                        {"role": "user", "content": str(question)}),
                              metadata={"source": name, "question": str(question), **extra}))
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


def default_grader(path: str | pathlib.Path) -> Grader:
    """`math` for AIME/MATH-style files, `exact` otherwise (pass grader="judge" for HLE/GAIA)."""
    stem = pathlib.Path(path).stem.lower()
    return "math" if any(k in stem for k in ("aime", "math", "gsm")) else "exact"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QAConfig(EnvConfig):
    path: str                             # a JSONL file of questions (module doc: its shapes)
    grader: Grader | None = None          # None: default_grader(path)
    judge: ChatEndpoint | None = None     # required when grader == "judge"
    test_fraction: float = 0.2            # of ids (stable hash) that form the "test" split

    def __post_init__(self):
        if self.grader not in (None, "exact", "math", "judge"):
            raise ValueError(f"QAConfig.grader={self.grader!r}; allowed: exact, math, judge (or None)")
        if self.grader == "judge" and self.judge is None:
            raise ValueError("QAConfig.judge must be a ChatEndpoint when grader='judge'")
        if not 0.0 <= self.test_fraction <= 1.0:
            raise ValueError(f"QAConfig.test_fraction={self.test_fraction}; must be in [0, 1]")


def _in_test(task_id: str, fraction: float) -> bool:
    bucket = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big") / 2 ** 64
    return bucket < fraction


class QAEnv(Environment):
    """QA tasks have no domain tools: the orchestrator's tools are the catalog passed as `tools`
    (`tools.catalog.build_catalog`: code, search, LLMs). A task whose metadata carries a
    `tool_config` (a per-instance subset and pricing sheet, `tools.randomize`) gets that subset,
    repriced. A judge that stays unreachable after retries falls back to exact match for that
    answer (logged, counted in `judge_failures`) rather than ending training."""

    def __init__(self, config: QAConfig | None = None, *, tools: Mapping[str, Tool] | None = None,
                 **fields: Any):
        """`QAEnv(QAConfig(...), tools=catalog)` or `QAEnv(path=..., grader=..., tools=...)`."""
        if (config is None) == (not fields):
            raise ValueError("QAEnv takes a QAConfig or QAConfig's fields (path=..., ...), not both")
        config = config or QAConfig(**fields)
        self.config = config
        self.catalog: dict[str, Tool] = dict(tools or {})
        self.grader: Grader = config.grader or default_grader(config.path)
        self._tasks = load_jsonl(config.path)
        self.judge_failures = 0

    def tasks(self, split: str = "train") -> list[Task]:
        """`split`: train, test (alias eval: a stable `test_fraction` of ids) or all."""
        split = "test" if split == "eval" else split
        if split == "all":
            return list(self._tasks)
        if split not in ("train", "test"):
            raise ValueError(f"QA split={split!r}; allowed: train, test, eval, all")
        want_test = split == "test"
        return [t for t in self._tasks if _in_test(t.task_id, self.config.test_fraction) == want_test]

    def tools(self, task: Task) -> list[Tool]:
        """The catalog in name order, or the task instance's randomised subset of it."""
        return instance_tools(self.catalog, task)

    async def grade(self, task: Task, prediction: str | None) -> float:
        golds = list(task.answer)
        if self.grader == "exact":
            return exact_match(prediction, golds)
        if self.grader == "math":
            return math_match(prediction, golds)
        assert self.config.judge is not None
        try:
            return await judge_match(self.config.judge, task.metadata["question"], prediction, golds)
        except (ChatError, ValueError) as e:
            self.judge_failures += 1
            log.warning("QA judge failed on %s (%s); falling back to exact match", task.task_id, e)
            return exact_match(prediction, golds)

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        return await self.grade(task, trajectory.final_answer)
