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
from typing import Mapping

from orchestrax import registry
from orchestrax.data.instances import InstanceConfig, prepare_instance
from orchestrax.data.tasks import spread
from orchestrax.envs.environment import EnvConfig
from orchestrax.envs.qa import QAConfig
from orchestrax.envs.routing import RoutingConfig
from orchestrax.envs.tau2.env import Tau2Config
from orchestrax.envs.toolscale import ToolScaleConfig
from orchestrax.eval.core import TaskSet
from orchestrax.tools.tool import Tool
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.randomize import instance_seed

QA_FILES = {"frames": "frames_824.jsonl", "musique": "musique_500.jsonl",
            "bamboogle": "bamboogle_125.jsonl", "aime": "aime_2024_2025.jsonl"}
TAU2_DOMAINS = ("retail", "airline", "telecom")


def data_dir() -> pathlib.Path:
    """$ORCHESTRAX_DATA, else ../shared/data from the working directory (commands run from the
    repository root); the package never looks for data relative to its own files."""
    return pathlib.Path(os.environ.get("ORCHESTRAX_DATA") or "../shared/data")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSetOptions:
    split: str | None = None                  # None: the task set's default (see module doc)
    limit: int | None = None                  # first N tasks
    judge: ChatEndpoint | None = None         # LLM-as-judge for QA sets graded by a judge
    grader: str | None = None                 # QA: exact | math | judge (None: by file name)
    tau2_user: ChatEndpoint | None = None     # the simulated tau2 user
    tools: Mapping[str, Tool] | None = None   # the orchestrator's catalog (kinds that take one)
    routing: RoutingConfig = RoutingConfig()  # the `routing` task set's environment
    # Tasks without a preference get one from the evaluation pool (Pairs_eval), seeded by
    # (seed, task id) so every policy measured with the same seed gets the same P per task.
    preferences: bool = True
    seed: int = 0
    # The rest of the instance (an eval pricing sheet), as a training run's eval prepares it.
    instances: InstanceConfig = InstanceConfig()
    # The `routing` set only: at most this many of its tasks, evenly spaced (a training run's
    # eval_tasks, so the set is the one its eval rows measured).
    routing_tasks: int | None = None

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"TaskSetOptions.limit={self.limit}; must be >= 1 or None")


def env_config(name: str, opts: TaskSetOptions = TaskSetOptions()
               ) -> tuple[EnvConfig, str, str]:
    """(environment config, default split, label) of the task set `name`."""
    if name == "routing":
        return opts.routing, "eval", "routing"
    if name.startswith("tau2:"):
        domain = name.split(":", 1)[1]
        if domain not in TAU2_DOMAINS:
            raise ValueError(f"task set {name!r}: tau2 domains are {list(TAU2_DOMAINS)}")
        # benchmark scoring (completeness=False): the numbers tau2-bench reports
        return (Tau2Config(domain=str(data_dir() / "tau2" / domain), user=opts.tau2_user,
                           completeness=False), "test", name)
    if name.startswith("toolscale:"):
        return _toolscale(name, opts), "test", name.split(":")[1]
    if name in QA_FILES or name.endswith(".jsonl"):
        path = data_dir() / "qa" / QA_FILES[name] if name in QA_FILES else pathlib.Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"task set {name!r}: {path} not found (set $ORCHESTRAX_DATA "
                                    "to the folder holding qa/ and tau2/)")
        return (QAConfig(path=str(path), grader=opts.grader, judge=opts.judge), "all",
                name if name in QA_FILES else path.stem)
    raise ValueError(f"unknown task set {name!r}; allowed: routing, "
                     f"{', '.join('tau2:' + d for d in TAU2_DOMAINS)}, "
                     "toolscale:<domain or folder>:<tasks.json>, "
                     f"{', '.join(QA_FILES)}, or a path to a .jsonl file")


def load_task_set(name: str | EnvConfig, opts: TaskSetOptions = TaskSetOptions()) -> TaskSet:
    """The task set a name above stands for, or the eval split of any registered env config."""
    if isinstance(name, EnvConfig):
        config, split, label = name, "eval", type(name).__name__
    else:
        config, split, label = env_config(name, opts)
    env = registry.build_env(config, tools=opts.tools if config.takes_catalog else None)
    tasks = env.tasks(opts.split or split)
    if name == "routing":
        tasks = spread(tasks, opts.routing_tasks)
    if opts.limit is not None:
        tasks = tasks[:opts.limit]
    if not tasks:
        raise ValueError(f"task set {name!r} split {opts.split or split!r} has no tasks")
    instances = dataclasses.replace(opts.instances, preferences=opts.preferences)
    tasks = [prepare_instance(t, env, split="eval", seed=instance_seed(opts.seed, t.task_id),
                              config=instances) for t in tasks]
    return TaskSet(name=label, env=env, tasks=list(tasks))


def _toolscale(name: str, opts: TaskSetOptions) -> ToolScaleConfig:
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
    return ToolScaleConfig(domain=str(folder), tasks=parts[2], user=opts.tau2_user)
