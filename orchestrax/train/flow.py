"""Flow-GRPO in the trainer: sub-agent-mode rollouts and their per-turn batches.

A sub-agent-mode rollout is a sequence of orchestrator turns, each with its own prompt rebuilt
from memory, so each turn becomes its own sample; the batch math (the ToolOrchestra reward over
the orchestrator's dispatches, group advantages carried by every turn, over-budget turns dropped
after the advantages) is `rl.flow_batch`. Here: each task's preference vector over the
sub-agents (`preferences`), the sub-agent sampler, and `FlowRunner`, the trainer's rollout driver
in sub-agent mode. The loss weighs turns as Flow-GRPO does (`agent.flow_agg`). Sub-agents are
frozen: their tokens never enter the batch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from orchestrax import registry, rl
from orchestrax.agent.fanout import fan_out
from orchestrax.agent.subagent import (ROLES, SubagentRollout, build_subagents, holdable,
                                       query_tools, run_query)
from orchestrax.data.records import Task
from orchestrax.rollout.sampler import SamplerConfig
from orchestrax.train.rollouts import counted, grouped, task_tool_names, uncounted
from orchestrax.train.agent_config import AgentConfig

if TYPE_CHECKING:
    from orchestrax.train.train_config import TrainConfig


# --- preferences over the sub-agents --------------------------------------------------------
def preferences(tasks: Sequence[Task], agent_names: Sequence[str],
                tool_names: Sequence[Sequence[str]] | None = None) -> np.ndarray:
    """[Q, N+3] ordered (sub-agents…, outcome, compute, latency). A task's P over its own tools
    (`tool_names[i]`, P = (tools…, outcome, compute, latency)) weighs each sub-agent by the
    largest weight among the tools that sub-agent holds; a P already over the sub-agents is
    taken as is; no P scores the outcome alone."""
    n = len(agent_names)
    out = np.zeros((len(tasks), n + 3), np.float32)
    for i, task in enumerate(tasks):
        p = task.preference
        names = list(tool_names[i]) if tool_names is not None else None
        if p is None:
            out[i, -3] = 1.0
            continue
        out[i, -3:] = p[-3:]
        if names is not None and len(p) == len(names) + 3:
            weight = dict(zip(names, p))
            out[i, :n] = [max((weight[t] for t in ROLES[a].tool_names if t in weight), default=0.0)
                          for a in agent_names]
        elif len(p) == n + 3:
            out[i, :n] = p[:n]
    return out


# --- rollouts in the trainer -------------------------------------------------------------------
class FlowRunner:
    """Sub-agent-mode rollouts and Flow-GRPO batches for `train.loop.Trainer`: its
    `train.rollouts.RolloutDriver`."""

    def __init__(self, cfg: "TrainConfig", env, codec, sampler, subagent_sampler, executor):
        a, r = cfg.agent, cfg.rollout
        self.cfg, self.env, self.codec, self.sampler = cfg, env, codec, sampler
        self.subagent_sampler, self.executor = subagent_sampler, executor
        self.orchestrator, self.subagent = a.configs(
            max_turns=a.orchestrator_turns, max_new_tokens=a.orchestrator_new_tokens,
            context_tokens=r.context_tokens)
        first = env.tasks("train")[:1]
        own = [t.spec.name for t in env.tools(first[0])] if first else []
        if own and not holdable(env.tools(first[0])):
            raise ValueError(f"agent.mode='subagent': the environment's tools {own} belong to no "
                             f"sub-agent (they hold {[r.tool_names for r in ROLES.values()]}); "
                             "use a QA environment, or agent.mode='direct'")
        self.tools = shared_tools(a)
        self.agent_names = [n for n in ROLES if n not in a.exclude]
        self.max_turn_tokens = a.train_turn_tokens or r.context_tokens

    async def play(self, task: Task, sampling) -> tuple[SubagentRollout, float]:
        agents = build_subagents(query_tools(task, self.env.tools(task), self.tools),
                                 self.subagent_sampler, self.codec, self.subagent,
                                 executor=self.executor, exclude=self.cfg.agent.exclude)
        config = dataclasses.replace(self.orchestrator, sampling=sampling)
        rollout = await run_query(task, agents, self.sampler, self.codec, config)
        return rollout, await self.env.verify(task, rollout.trajectory)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def rollout(self, tasks: Sequence[Task], group: int, episode, seeds: np.ndarray,
                      on_done: Callable[[int], object] = uncounted
                      ) -> tuple[list[list[SubagentRollout]], np.ndarray]:
        """G rollouts per task with the orchestrator sampling as `episode.sampling` says; its
        turns draw from the sampler's own stream (`seeds` are for Direct-mode episodes)."""
        async def one(task):
            return await self.play(task, episode.sampling)

        played = await fan_out(counted(one, on_done), [t for t in tasks for _ in range(group)],
                               max_in_flight=self.cfg.rollout.max_in_flight)
        return grouped(played, len(tasks), group)

    def make_batch(self, tasks, groups, outcome, pad_id: int
                   ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        q, g = outcome.shape
        names = task_tool_names(self.env, tasks)
        spt, sub = self.speeds()
        return rl.flow_batch(groups, outcome, self.agent_names,
                             preferences(tasks, self.agent_names, names), self.cfg.grpo,
                             pad_id=pad_id, max_turn_tokens=self.max_turn_tokens,
                             row_multiple=q * g, seconds_per_token=spt,
                             subagent_seconds_per_token=sub)

    def speeds(self) -> tuple[float, float]:
        """(orchestrator, sub-agents) seconds per generated token on the reward's clock."""
        spt, sub = self.cfg.rollout.seconds_per_token, self.cfg.agent.subagent_seconds_per_token
        return spt, spt if sub is None else sub

    def clock_s(self, rollout: SubagentRollout) -> float:
        return rollout.clock_s(*self.speeds())

    def take_counters(self) -> dict[str, int]:
        return self.sampler.take_counters()


def shared_tools(agent: AgentConfig) -> list:
    """The sub-agents' tools every task shares: the Coder's sandboxed Python and the Web
    Searcher's BM25 search over `search_corpus` (built here, outside any event loop)."""
    tools = []
    if agent.sandbox is not None:
        from orchestrax.tools.python_tool import PythonTool
        from orchestrax.tools.sandbox import SandboxConfig
        tools.append(PythonTool(SandboxConfig(mode=agent.sandbox)))
    if agent.search_corpus is not None:
        from orchestrax.tools.local_search import LocalSearchTool
        from orchestrax.tools.search_index import SearchIndexConfig, build_index
        tools.append(LocalSearchTool(build_index(SearchIndexConfig(
            corpus_path=agent.search_corpus, backend="bm25"), progress=False)))
    return tools


def make_subagent_sampler(cfg: "TrainConfig", model_cfg, params):
    """The sub-agents' sampler, never updated by training: SGLang servers at
    `agent.subagent_urls`, or an embedded sampler on a copy of the starting weights (the
    trainer's own buffers are donated to every update)."""
    r = cfg.rollout
    if cfg.agent.subagent_urls:
        return registry.build_sampler(SamplerConfig(backend="sglang",
                                                    urls=tuple(cfg.agent.subagent_urls)))
    import jax
    import jax.numpy as jnp
    return registry.build_sampler(
        SamplerConfig(backend="embedded", max_batch=r.sampler_max_batch,
                      max_len=r.context_tokens, seed=cfg.seed + 1),
        model_cfg, jax.tree.map(jnp.copy, params))
