"""One task instance = a task plus what the paper randomises per instance: the tool subset and
pricing sheet (from the tool catalog) and the preference (P and its instruction).

The trainer prepares every sampled task this way with a seed made of (run seed, task, step);
eval prepares its tasks with (eval seed, task) from the evaluation pools. Everything travels in
the `Task` (its metadata and preference fields), so episode workers and verifiers that rebuild
tools from the task see the same instance.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

from orchestrax.data import preferences
from orchestrax.data.records import Task
from orchestrax.tools.tool import Tool
from orchestrax.tools.randomize import (RandomizeConfig, ToolConfigSample, sample_config,
                                        with_tool_config)
from orchestrax.tools.sheets import load_sheet


class _Env(Protocol):
    """What an instance needs of an environment (envs sit above data: no import from there)."""

    catalog: Mapping[str, Tool]

    def tools(self, task: Task) -> list[Tool]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class InstanceConfig:
    preferences: bool = True                # draw P and its instruction for tasks without one
    randomize: RandomizeConfig | None = None  # training only; None: every tool, catalog's sheet
    eval_sheet: str | None = None           # eval: every tool, priced with this sheet

    def __post_init__(self):
        if self.eval_sheet is not None:
            load_sheet(self.eval_sheet)     # fails early, naming the bundled sheets


def _tool_sample(catalog_names: Sequence[str], split: preferences.Pool, seed: int,
                 config: InstanceConfig) -> ToolConfigSample | None:
    if not catalog_names:
        return None
    if split == "eval":  # the whole tool set, as the paper evaluates; repriced if asked
        if config.eval_sheet is None:
            return None
        return ToolConfigSample(tools=tuple(sorted(catalog_names)), sheet=config.eval_sheet)
    if config.randomize is None:
        return None
    sample = sample_config(catalog_names, seed, config.randomize)
    if split == "train" and load_sheet(sample.sheet).split != "train":
        raise ValueError(f"RandomizeConfig.sheets includes {sample.sheet!r}, a held-out "
                         "evaluation sheet; training instances may only use training sheets")
    return sample


def prepare_instance(task: Task, env: _Env, *, split: preferences.Pool, seed: int,
                     config: InstanceConfig = InstanceConfig()) -> Task:
    """`task` with its instance's tool config and preference. The randomised tools are the
    env's `catalog` (QA, tau2); a task that already has a preference (the routing demo's own)
    keeps it."""
    catalog_names = sorted(env.catalog)
    sample = _tool_sample(catalog_names, split, seed, config)
    if sample is not None:
        task = with_tool_config(task, sample)
    if config.preferences and task.preference is None:
        tools = env.tools(task)
        P, text = preferences.draw(split, [t.spec.name for t in tools], seed,
                                   nameable=[t.spec.name for t in tools
                                             if t.spec.category != "domain"])
        task = dataclasses.replace(task, preference=P, preference_instruction=text)
    return task
