"""Synthetic tool routing for the CPU demo: the preference vector decides which tool is right.

Each task is a job ("Fetch the report.") that any of three tools can run; the episode succeeds
when a tool call ran the job and the agent then closed with a final answer. The tools differ only
in simulated price and latency (reported through `ToolResult`, never slept):

    lookup_cheap    $0.001 / call   4.0 s     right when P weighs compute (cost)
    lookup_fast     $0.020 / call   0.2 s     right when P weighs latency
    lookup_premium  $0.050 / call  10.0 s     dominated; right only when P names it

P = (one weight per tool, in `tools()` order, outcome, compute, latency), values in [0, 1].
The premium tool's 10 s makes the task symmetric: in a group that tries all three tools, cheap
scores 1 under cost and (10 - 4) / (10 - 0.2) = 0.61 under latency, fast the mirror image
((0.05 - 0.02) / (0.05 - 0.001) = 0.61 under cost). No tool wins on average, so a policy can only
gain by reading the preference (with premium at 2 s, "always fast" was the best blind policy and
the demo policy collapsed to it).

Why jobs and not questions whose answer the tool returns: copying a tool's output into the answer
needs an induction-style attention pattern that a 2-layer model only starts to form after ~100
warm-start steps (measured: 6% copy accuracy at step 100, 0% before), far beyond a CPU demo.
Routing is what the demo is about, so the outcome depends on making a valid call, and the
preference sentence sits in the user turn, a few tokens before the decision it governs.
Everything is a function of (seed, split): two environments with the same config agree.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any, ClassVar, Sequence

import numpy as np

from orchestrax.data import preferences as pairs
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import EnvConfig, Environment
from orchestrax.tools.tool import Pricing, ToolError, ToolResult, ToolSpec
from orchestrax.tools.randomize import instance_seed

POOL_KINDS = ("pool:cost", "pool:latency")
SYSTEM_PROMPT = "Call a tool, then answer <answer>done</answer>."
JOBS = ("Fetch the report.", "Send the invoice.", "Check the order.", "Book the room.",
        "Find the file.", "Update the list.", "Get the weather.", "Call the user.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LookupTool:
    name: str
    usd_per_call: float
    latency_s: float


DEFAULT_TOOLS = (LookupTool(name="lookup_cheap", usd_per_call=0.001, latency_s=4.0),
                 LookupTool(name="lookup_fast", usd_per_call=0.02, latency_s=0.2),
                 LookupTool(name="lookup_premium", usd_per_call=0.05, latency_s=10.0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingConfig(EnvConfig):
    takes_catalog: ClassVar[bool] = False   # its lookup tools are the whole tool set
    seed: int = 0
    num_train: int = 256
    num_eval: int = 32
    tools: tuple[LookupTool, ...] = DEFAULT_TOOLS
    # "cost", "latency", or a tool name (the user asks for that tool); tasks cycle through them.
    # "pool": each task draws P and its instruction from Pairs_train (train split) or Pairs_eval
    # (eval split), which share no instruction. "pool:cost" / "pool:latency": the same draw
    # among the pairs whose P weighs compute only / latency only (P as "cost" / "latency", the
    # instruction one of that profile's phrasings).
    preferences: tuple[str, ...] = ("cost", "latency")
    # The eval split always mixes these, so a run trained under one preference is measured on both.
    eval_preferences: tuple[str, ...] = ("cost", "latency")
    # The pairs the eval split's pool kinds draw from: "eval" (phrasings no training task has)
    # or "train" (held-out tasks, the training phrasings).
    eval_pool: str = "eval"
    # Demonstrations open the tool-call turn with which objective the task's instruction weighs
    # ("Priority: low cost." / "Priority: low latency."), still calling a uniformly random
    # tool: the warm start teaches reading the instruction, never which tool serves it.
    restate_preference: bool = False
    # Train tasks in blocks of one task per `preferences` entry, in order, sharing one job (task
    # i's job is task i - i % len(preferences)'s): a block differs only in P. Each step then
    # draws whole blocks, kept together, so `grpo.group_tasks = len(preferences)` makes a block
    # one GRPO group.
    kind_blocks: bool = False

    def __post_init__(self):
        if self.num_train < 1 or self.num_eval < 1:
            raise ValueError(f"RoutingConfig.num_train={self.num_train}, num_eval={self.num_eval}; "
                             "both must be >= 1")
        names = [t.name for t in self.tools]
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"RoutingConfig.tools must be >= 2 tools with distinct names; got {names}")
        if any(t.usd_per_call < 0 or t.latency_s < 0 for t in self.tools):
            raise ValueError("RoutingConfig.tools: usd_per_call and latency_s must be >= 0")
        allowed = ["cost", "latency", "pool", *POOL_KINDS, *names]
        for field in ("preferences", "eval_preferences"):
            value = getattr(self, field)
            if not value or any(k not in allowed for k in value):
                raise ValueError(f"RoutingConfig.{field}={value!r}; allowed: {allowed}")
        if self.eval_pool not in ("train", "eval"):
            raise ValueError(f"RoutingConfig.eval_pool={self.eval_pool!r}; allowed: 'train', 'eval'")
        kinds = {k.removeprefix("pool:") for k in self.preferences + self.eval_preferences}
        for kind in ("cost", "latency"):
            if kind in kinds or "pool" in kinds:
                key = (lambda t: t.usd_per_call) if kind == "cost" else (lambda t: t.latency_s)
                best = sorted(key(t) for t in self.tools)
                if best[0] == best[1]:
                    raise ValueError(f"RoutingConfig.tools: preference {kind!r} needs one tool "
                                     "strictly best on it")


def preferred_tool(config: RoutingConfig, kind: str) -> str:
    if kind == "cost":
        return min(config.tools, key=lambda t: t.usd_per_call).name
    if kind == "latency":
        return min(config.tools, key=lambda t: t.latency_s).name
    return kind


def preference_vector(config: RoutingConfig, kind: str) -> tuple[float, ...]:
    tools = [1.0 if t.name == kind else 0.0 for t in config.tools]
    return (*tools, 1.0, float(kind == "cost"), float(kind == "latency"))


def preferred_from_vector(config: RoutingConfig, P: Sequence[float]) -> str | None:
    """The tool P favours: the one it names, else the cheapest (compute > latency) or the
    fastest (latency > compute); None when P does not single one out."""
    names = [t.name for t in config.tools]
    named = [n for n, w in zip(names, P[:len(names)]) if w > 0]
    if named:
        return named[0]
    compute, latency = P[-2], P[-1]
    if compute == latency:
        return None
    return preferred_tool(config, "cost" if compute > latency else "latency")


def _pool_pairs(split: str, kind: str) -> list:
    """The split's pairs whose P weighs only compute ("cost") or only latency, no tool."""
    want = (1.0, 0.0) if kind == "cost" else (0.0, 1.0)
    return [p for p in pairs.pairs(split) if not p.names_tool and p.outcome == 1.0
            and (p.compute, p.latency) == want]


def preference_text(kind: str) -> str:
    return {"cost": "Preference: low cost.", "latency": "Preference: low latency."}.get(
        kind, f"Preference: use {kind}.")


def _block_tasks(blocks: np.ndarray, *, size: int) -> np.ndarray:
    """Block ids -> their tasks' indices, each block's `size` tasks in order."""
    return (blocks[:, None] * size + np.arange(size)).reshape(-1)


class _Lookup:
    """One tool bound to one task's job."""

    def __init__(self, tool: LookupTool, job: str):
        self.spec = ToolSpec(
            # kept minimal: every schema token is prompt the tiny demo model must read, and the
            # demo's rows must stay within one 512-token attention block
            name=tool.name, description=f"${tool.usd_per_call:g}, {tool.latency_s:g}s",
            parameters={},
            category="basic", pricing=Pricing(kind="per_call", usd_per_call=tool.usd_per_call),
            latency_s=tool.latency_s)
        self._job = job

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        if arguments:
            raise ToolError(f"{self.spec.name} takes no arguments; got {sorted(arguments)}")
        # simulated: charge the price and report the nominal latency instead of sleeping
        return ToolResult(observation=f"Done: {self._job}", cost=self.spec.pricing.cost(),
                          latency=self.spec.latency_s)


class RoutingEnv(Environment):
    def __init__(self, config: RoutingConfig = RoutingConfig()):
        self.config = config
        self._splits = {"train": self._make("train", config.num_train, config.preferences),
                        "eval": self._make("eval", config.num_eval, config.eval_preferences)}

    def _make(self, split: str, n: int, kinds: tuple[str, ...]) -> list[Task]:
        rng = random.Random(f"routing/{self.config.seed}/{split}")
        pool = "train" if split == "train" else self.config.eval_pool
        tasks = []
        blocks = self.config.kind_blocks and split == "train"
        for i in range(n):
            job = rng.choice(JOBS) if not (blocks and i % len(kinds)) else job
            kind = kinds[i % len(kinds)]
            task_id = f"routing/{split}/{i}"
            if kind == "pool":
                P, text = pairs.draw(pool, [t.name for t in self.config.tools],
                                     instance_seed(self.config.seed, task_id))
                want, text = preferred_from_vector(self.config, P), f"Preference: {text}"
            elif kind in POOL_KINDS:
                kind = kind.removeprefix("pool:")
                pair = random.Random(instance_seed(self.config.seed, task_id)).choice(
                    _pool_pairs(pool, kind))
                P = (*[0.0] * len(self.config.tools), pair.outcome, pair.compute, pair.latency)
                want, text = preferred_from_vector(self.config, P), f"Preference: {pair.instruction}"
            else:
                P, text = preference_vector(self.config, kind), preference_text(kind)
                want = preferred_tool(self.config, kind)
            tasks.append(Task(
                task_id=task_id,
                messages=({"role": "system", "content": SYSTEM_PROMPT},
                          {"role": "user", "content": f"{job} {text}"}),
                preference=P, answer="done",
                metadata={"job": job, "preference_kind": kind, "preferred_tool": want}))
        return tasks

    def tasks(self, split: str = "train") -> list[Task]:
        """`split`: train, or eval (alias test)."""
        split = "eval" if split == "test" else split
        if split not in self._splits:
            raise ValueError(f"routing split={split!r}; allowed: train, eval, test")
        return list(self._splits[split])

    def task_stream(self, num_tasks: int, tasks_per_step: int, *, seed: int,
                    process_index: int = 0, process_count: int = 1):
        """Every step holds the training kinds in equal shares (`preferences` entries, as
        close as `tasks_per_step` allows). Why: the preferred tools of two kinds pull one
        shared policy in opposite directions, and a step that happens to draw mostly one kind
        moves every task's choice towards that kind's tool (measured: uniform draws of 8 tasks
        swung the one policy between the cheap and the fast tool from step to step)."""
        from orchestrax.data.tasks import MixtureSteps, task_stream
        if tasks_per_step % process_count:
            raise ValueError(f"rollout.tasks_per_step={tasks_per_step} does not split evenly "
                             f"over {process_count} processes; use a multiple of {process_count}")
        prefs = self.config.preferences
        if self.config.kind_blocks:   # whole blocks, in order: one task per kind each
            k = len(prefs)
            if tasks_per_step % (k * process_count):
                raise ValueError(f"rollout.tasks_per_step={tasks_per_step} with kind_blocks: "
                                 f"must be a multiple of {k * process_count} (blocks of {k} "
                                 f"tasks over {process_count} processes)")
            return task_stream(num_tasks // k, tasks_per_step // k, seed=seed,
                               process_index=process_index, process_count=process_count
                               ).map(functools.partial(_block_tasks, size=k))
        kinds = list(dict.fromkeys(prefs))
        shards = [np.array([i for i in range(num_tasks) if prefs[i % len(prefs)] == k],
                           np.int64)[process_index::process_count] for k in kinds]
        return MixtureSteps(shards, [1.0] * len(kinds), tasks_per_step // process_count, seed)

    def tools(self, task: Task) -> list[_Lookup]:
        return [_Lookup(t, task.metadata["job"]) for t in self.config.tools]

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        """1 when some call ran the job and the agent then gave a final answer."""
        ran = any(c.ok and c.observation == f"Done: {task.metadata['job']}"
                  for c in trajectory.tool_calls)
        return float(ran and bool((trajectory.final_answer or "").strip()))

    def demonstration(self, task: Task, rng) -> list[str]:
        """Assistant turns of a correct episode with a uniformly random tool (format, no
        preference): a call (after the restated objective with `restate_preference`), then the
        answer. `rng`: a numpy Generator."""
        tool = self.config.tools[int(rng.integers(len(self.config.tools)))].name
        return [self.call_turn(task, tool), "<answer>done</answer>"]

    def call_turn(self, task: Task, tool: str) -> str:
        """The demonstrations' call turn for `tool` (after the restated objective with
        `restate_preference`)."""
        call = '<tool_call>\n{"name": "%s", "arguments": {}}\n</tool_call>' % tool
        kind = task.metadata["preference_kind"]
        if self.config.restate_preference and kind in ("cost", "latency"):
            call = f"Priority: low {kind}.\n{call}"
        return call

    def stats(self, tasks: Sequence[Task], groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        """preferred_tool_rate_<kind>: share of episodes whose calls all went to the preferred
        tool (at least one call); preferred_share_<kind>: share of the calls on that kind's
        tasks that went to the preferred tool; tool_share_<name>: share of all calls that went
        to each tool; tool_calls_mean: calls per episode."""
        hits: dict[str, list[float]] = {}
        kind_calls: dict[str, list[int]] = {}  # kind -> [calls to the preferred tool, calls]
        calls = []
        used = {t.name: 0 for t in self.config.tools}
        for task, group in zip(tasks, groups):
            want = task.metadata["preferred_tool"]
            kind = task.metadata["preference_kind"]
            for traj in group:
                names = [c.name for c in traj.tool_calls]
                calls.append(len(names))
                for n in names:
                    if n in used:
                        used[n] += 1
                if want is not None:  # a pool preference may single out no tool
                    hits.setdefault(kind, []).append(
                        float(bool(names) and all(n == want for n in names)))
                    tally = kind_calls.setdefault(kind, [0, 0])
                    tally[0] += names.count(want)
                    tally[1] += len(names)
        out = {f"preferred_tool_rate_{k}": sum(v) / len(v) for k, v in hits.items()}
        out |= {f"preferred_share_{k}": hit / total for k, (hit, total) in kind_calls.items()
                if total}
        out["preferred_tool_rate"] = (sum(sum(v) for v in hits.values())
                                      / max(1, sum(len(v) for v in hits.values())))
        out |= {f"tool_share_{n}": c / max(1, sum(used.values())) for n, c in used.items()}
        if calls:
            out["tool_calls_mean"] = sum(calls) / len(calls)
        return out
