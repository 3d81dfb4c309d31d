"""Flow-GRPO: training the orchestrator of sub-agent mode one turn at a time.

A sub-agent-mode rollout is a sequence of orchestrator turns, each with its own prompt rebuilt
from memory, so there is no single token stream to train on. Each turn becomes its own sample
(its exact prompt ids, loss on the ids it sampled). The rollout's final ToolOrchestra reward (the
same reward as in Direct mode; the orchestrator's "tools" are its sub-agents, so P weighs
dispatches per sub-agent) is turned into a GRPO advantage within the task's group of G rollouts,
and every turn of the rollout carries that advantage. Turns longer than the training budget are
dropped only after advantages are computed, so dropping one never moves another's advantage.
The loss weighs turns as Flow-GRPO does (AgentFlow, arXiv 2510.05592): each rollout 1/G, each of
its T_i turns 1/T_i of that, each token 1/|a| of its turn (`agent.flow_agg`; "token-mean" over
all turn rows is the alternative, which lets long rollouts with many turns dominate).
Sub-agents are frozen: their tokens never enter the batch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import numpy as np

from orchestrax import registry, rl
from orchestrax.agent.fanout import fan_out
from orchestrax.agent.subagent import (ROLES, SubagentRollout, build_subagents, holdable,
                                       query_tools, run_query)
from orchestrax.data.records import Task
from orchestrax.rollout.base import SamplerConfig
from orchestrax.train import batching
from orchestrax.train.rollouts import grouped
from orchestrax.train.agent_config import AgentConfig

if TYPE_CHECKING:
    from orchestrax.train.config import TrainConfig


# --- reward and batch (pure, numpy) ---------------------------------------------------------
class _Dispatch(NamedTuple):
    name: str                    # the sub-agent dispatched


class _AsScored(NamedTuple):
    """A rollout as `rl.score_groups` reads a trajectory: its "tool calls" are the
    orchestrator's dispatches, named by sub-agent (the sub-agents' own tool calls are not the
    orchestrator's actions and are not counted)."""

    tool_calls: list[_Dispatch]
    cost: float
    clock: float                 # `SubagentRollout.clock_s`, timed with both models' speeds
    format_errors: int
    final_answer: str | None

    def clock_s(self, seconds_per_token: float) -> float:
        return self.clock        # already timed: orchestrator and sub-agents differ in speed


def _as_scored(r: SubagentRollout, seconds_per_token: float,
               subagent_seconds_per_token: float) -> _AsScored:
    calls = [_Dispatch(name) for name, k in r.account.dispatches.items() for _ in range(k)]
    return _AsScored(calls, r.cost, r.clock_s(seconds_per_token, subagent_seconds_per_token),
                     r.format_errors, r.final_answer)


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


def turn_batch(groups: Sequence[Sequence[SubagentRollout]], advantages_QG: np.ndarray,
               keep_QG: np.ndarray, *, pad_id: int, max_turn_tokens: int, row_multiple: int
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One row per orchestrator turn, carrying its rollout's advantage and sample mask; turns
    longer than `max_turn_tokens` are left out. Rows are padded (sample_mask 0) to a multiple of
    `row_multiple` so the jitted step sees few distinct shapes.

    Returns (batch for `train_step`, info): info["rollout"] [B] is q·G + g of each row's rollout
    (-1 on padding rows), info["dropped"] [Q,G] the number of over-budget turns per rollout."""
    q, g = advantages_QG.shape
    rows, rollout_of = [], []
    dropped = np.zeros((q, g), np.int32)
    for i, group in enumerate(groups):
        for j, r in enumerate(group):
            for s in r.samples:
                if len(s.prompt_ids) + len(s.output_ids) > max_turn_tokens:
                    dropped[i, j] += 1
                    continue
                rows.append(s.as_trajectory(r.task_id))
                rollout_of.append(i * g + j)
    n = len(rows)
    b = max(row_multiple, -(-n // row_multiple) * row_multiple)
    packed = batching.pack(rows, pad_id=pad_id, max_len=max_turn_tokens) if rows else {}
    t = packed["tokens"].shape[1] if rows else batching.bucket_len(1)
    out = {"tokens": np.full((b, t), pad_id, np.int32),
           "attention_mask": np.zeros((b, t), np.int32),
           "loss_mask": np.zeros((b, t), np.float32),
           "sampler_logprobs": np.zeros((b, t), np.float32)}
    for key, value in packed.items():
        out[key][:n] = value
    index = np.full((b,), -1, np.int64)
    index[:n] = rollout_of
    flat_A, flat_keep = advantages_QG.reshape(-1), keep_QG.reshape(-1)
    out["advantages"] = np.where(index >= 0, flat_A[index], 0.0).astype(np.float32)
    out["sample_mask"] = np.where(index >= 0, flat_keep[index], 0.0).astype(np.float32)
    out["rollout_ids"] = index.astype(np.int32)   # agg="rollout-turn-token-mean" weighs by it
    return out, {"rollout": index, "dropped": dropped}


def flow_batch(tasks: Sequence[Task], groups: Sequence[Sequence[SubagentRollout]],
               outcome_QG: np.ndarray, agent_names: Sequence[str], grpo: rl.GRPOConfig, *,
               pad_id: int, max_turn_tokens: int, row_multiple: int,
               tool_names: Sequence[Sequence[str]] | None = None,
               seconds_per_token: float = 0.0, subagent_seconds_per_token: float = 0.0
               ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The ToolOrchestra reward, filters and group advantages over [Q,G] rollouts (the direct
    loop's `rl.score_groups`, with dispatches per sub-agent as the tool calls), then the
    per-turn batch. `tool_names`: each task's own tools, the order its P uses (see
    `preferences`); the two speeds time the orchestrator's and the sub-agents' tokens in the
    latency feature. Returns (batch, stats)."""
    scored = [[_as_scored(r, seconds_per_token, subagent_seconds_per_token) for r in gr]
              for gr in groups]
    scores = rl.score_groups(scored, outcome_QG,
                             [list(agent_names)] * len(groups),
                             list(preferences(tasks, agent_names, tool_names)), grpo)
    batch, info = turn_batch(groups, scores.advantages_QG, scores.keep_QG, pad_id=pad_id,
                             max_turn_tokens=max_turn_tokens, row_multiple=row_multiple)
    f = scores.features
    flat = [r for gr in groups for r in gr]
    acc = [r.account for r in flat]
    stats = {"reward_mean": float(scores.reward_QG.mean()),
             "accuracy": float(np.mean(outcome_QG)),
             "cost_mean": float(f.cost_QG.mean()), "latency_mean": float(f.latency_QG.mean()),
             "latency_wall_mean": float(np.mean([r.latency for r in flat])),
             "format_error_rate": float((scores.format_errors_QG > 0).mean()),
             "turns_mean": float(np.mean([a.turns for a in acc])),
             "flow/turn_samples": float((info["rollout"] >= 0).sum()),
             "flow/dropped_over_budget": float(info["dropped"].sum()),
             "tokens/prompt_mean": float(np.mean([a.prompt_tokens for a in acc])),
             "tokens/completion_mean": float(np.mean([a.completion_tokens for a in acc])),
             "tool_calls_mean": float(np.mean([len(a.tool_calls) for a in acc]))}
    stats |= {f"dispatches/{n}": float(f.counts_QGN[..., k].mean())
              for k, n in enumerate(f.tool_names)}
    return batch, stats | scores.counters


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

    async def rollout(self, tasks: Sequence[Task], group: int, episode,
                      seeds: np.ndarray) -> tuple[list[list[SubagentRollout]], np.ndarray]:
        """G rollouts per task with the orchestrator sampling as `episode.sampling` says; its
        turns draw from the sampler's own stream (`seeds` are for Direct-mode episodes)."""
        async def one(task):
            return await self.play(task, episode.sampling)

        played = await fan_out(one, [t for t in tasks for _ in range(group)],
                               max_in_flight=self.cfg.rollout.max_in_flight)
        return grouped(played, len(tasks), group)

    def make_batch(self, tasks, groups, outcome, pad_id: int
                   ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        q, g = outcome.shape
        names = [[t.spec.name for t in self.env.tools(task)] for task in tasks]
        spt, sub = self.speeds()
        return flow_batch(tasks, groups, outcome, self.agent_names, self.cfg.grpo, pad_id=pad_id,
                          max_turn_tokens=self.max_turn_tokens, row_multiple=q * g,
                          tool_names=names, seconds_per_token=spt,
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
        SamplerConfig(backend="embedded", engine=r.engine, max_batch=r.sampler_max_batch,
                      max_len=r.context_tokens, seed=cfg.seed + 1),
        model_cfg, jax.tree.map(jnp.copy, params))
