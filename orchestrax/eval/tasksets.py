"""Task sets by name: `routing`, `tau2:<domain>`, `frames`, `musique`, `bamboogle`, `aime`, or a
path to a JSONL file in one of the QA shapes (HLE, GPQA, GAIA supplied by the user).

Default splits: the routing environment's eval split, tau2's test split, and every row of a QA
file (the shipped QA files are evaluation sets; pass `split` to change it). Every task gets a
preference and its instruction from the evaluation pool unless it has its own (routing).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Mapping

from orchestrax.data.instances import InstanceConfig, prepare_instance
from orchestrax.eval.core import TaskSet
from orchestrax.tools.base import Tool
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.randomize import instance_seed

QA_FILES = {"frames": "frames_824.jsonl", "musique": "musique_500.jsonl",
            "bamboogle": "bamboogle_125.jsonl", "aime": "aime_2024_2025.jsonl"}
TAU2_DOMAINS = ("retail", "airline", "telecom")


def data_dir() -> pathlib.Path:
    """$ORCHESTRAX_DATA, else ../shared/data next to the repository."""
    env = os.environ.get("ORCHESTRAX_DATA")
    if env:
        return pathlib.Path(env)
    return pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSetOptions:
    split: str | None = None                  # None: the task set's default (see module doc)
    limit: int | None = None                  # first N tasks
    judge: ChatEndpoint | None = None         # LLM-as-judge for QA sets graded by a judge
    grader: str | None = None                 # QA: exact | math | judge (None: by file name)
    tau2_user: ChatEndpoint | None = None     # the simulated tau2 user
    tools: Mapping[str, Tool] | None = None   # the orchestrator's tool catalog (QA tasks)
    routing: tuple[tuple[str, Any], ...] = () # RoutingConfig fields
    # Tasks without a preference get one from the evaluation pool (Pairs_eval), seeded by
    # (seed, task id) so every policy measured with the same seed gets the same P per task.
    preferences: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"TaskSetOptions.limit={self.limit}; must be >= 1 or None")


def load_task_set(name: str, opts: TaskSetOptions = TaskSetOptions()) -> TaskSet:
    if name == "routing":
        from orchestrax.envs.routing import RoutingConfig, RoutingEnv
        env, split, label = RoutingEnv(RoutingConfig(**dict(opts.routing))), "eval", "routing"
    elif name.startswith("tau2:"):
        domain = name.split(":", 1)[1]
        if domain not in TAU2_DOMAINS:
            raise ValueError(f"task set {name!r}: tau2 domains are {list(TAU2_DOMAINS)}")
        from orchestrax.envs import tau2
        # benchmark scoring (completeness=False): the numbers tau2-bench reports
        env = tau2.Tau2Env(data_dir() / "tau2" / domain, user_endpoint=opts.tau2_user,
                           completeness=False)
        split, label = "test", name
    elif name.startswith("toolscale:"):
        env, split, label = _toolscale(name, opts), "test", name.split(":")[1]
    elif name in QA_FILES or name.endswith(".jsonl"):
        from orchestrax.envs.qa import QAEnv
        path = data_dir() / "qa" / QA_FILES[name] if name in QA_FILES else pathlib.Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"task set {name!r}: {path} not found (set $ORCHESTRAX_DATA "
                                    "to the folder holding qa/ and tau2/)")
        env = QAEnv(path=str(path), grader=opts.grader, judge=opts.judge, tools=opts.tools)
        split, label = "all", name if name in QA_FILES else path.stem
    else:
        raise ValueError(f"unknown task set {name!r}; allowed: routing, "
                         f"{', '.join('tau2:' + d for d in TAU2_DOMAINS)}, "
                         "toolscale:<domain or folder>:<tasks.json>, "
                         f"{', '.join(QA_FILES)}, or a path to a .jsonl file")
    tasks = env.tasks(opts.split or split)
    if opts.limit is not None:
        tasks = tasks[:opts.limit]
    if not tasks:
        raise ValueError(f"task set {name!r} split {opts.split or split!r} has no tasks")
    if opts.preferences:
        tasks = [prepare_instance(t, env, split="eval", seed=instance_seed(opts.seed, t.task_id),
                                  config=InstanceConfig()) for t in tasks]
    return TaskSet(name=label, env=env, tasks=list(tasks))


def _toolscale(name: str, opts: TaskSetOptions):
    """`toolscale:<domain>:<tasks file>`: a released ToolScale domain by name (under
    data_dir()/toolscale) or any tau2-format domain folder, with a tau2 tasks file."""
    parts = name.split(":", 2)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise ValueError(f"task set {name!r}: write toolscale:<domain or folder>:<tasks.json>")
    folder = pathlib.Path(parts[1])
    if not folder.is_dir():
        folder = data_dir() / "toolscale" / parts[1]
    if not folder.is_dir():
        raise FileNotFoundError(f"task set {name!r}: no domain folder {parts[1]} (nor {folder})")
    from orchestrax.envs.toolscale import ToolScaleEnv
    return ToolScaleEnv(folder, tasks=parts[2], user_endpoint=opts.tau2_user, tools=opts.tools)
