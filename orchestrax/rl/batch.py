"""A step's scored rollouts -> the padded [B, T] batch the train step takes, and its statistics.

Pure NumPy over duck-typed records (no JAX, nothing but arrays out). Two shapes of batch:

- **Direct** (`direct_batch`): one row per trajectory (its whole token stream, loss mask 1 only
  on the ids the policy sampled), carrying its group advantage and sample mask.
- **Flow-GRPO** (`flow_batch`): one row per orchestrator turn of a sub-agent-mode rollout (the
  turn's own prompt, loss on the ids it sampled); the rollout's ToolOrchestra reward, with its
  dispatches per sub-agent as the tool calls, becomes a group advantage carried by every turn.
  Turns longer than the budget are dropped only after the advantages are computed, so dropping
  one never moves another's advantage. `rollout_ids` lets the loss weigh each rollout 1/G, each
  of its T_i turns 1/T_i and each token 1/|a| of its turn (AgentFlow, arXiv 2510.05592).

Both score groups with `score_groups` (reward features, filters, advantages, all [Q, G]).
Rows are right-padded to a bucketed length so the jitted step recompiles once per bucket (and
`check_right_padded` can vouch for the layout the fused attention kernel needs).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from orchestrax.rl.grpo_config import GRPOConfig
from orchestrax.rl.scoring import score_groups

ROW_KEYS = ("tokens", "attention_mask", "loss_mask", "sampler_logprobs")


def bucket_len(n: int, multiple: int = 64) -> int:
    """`n` rounded up to a multiple of `multiple` (at least one multiple)."""
    return max(multiple, -(-n // multiple) * multiple)


def empty_rows(rows: int, length: int, pad_id: int) -> dict[str, np.ndarray]:
    """`rows` padding rows of `length`: tokens `pad_id`, every mask and logprob 0."""
    return {"tokens": np.full((rows, length), pad_id, np.int32),
            "attention_mask": np.zeros((rows, length), np.int32),
            "loss_mask": np.zeros((rows, length), np.float32),
            "sampler_logprobs": np.zeros((rows, length), np.float32)}


def pack(sequences: Sequence[Any], *, pad_id: int, max_len: int,
         multiple: int = 64) -> dict[str, np.ndarray]:
    """tokens / attention_mask / loss_mask / sampler_logprobs, all [B, T] and aligned: the entry
    at t concerns tokens[t]. Each sequence has `token_ids`, `loss_mask` and `logprobs` of one
    length. T is the longest sequence bucketed to `multiple`, capped at `max_len`; longer
    sequences are truncated at the end (their tail then costs no gradient)."""
    longest = max(len(s.token_ids) for s in sequences)
    out = empty_rows(len(sequences), min(bucket_len(longest, multiple), max_len), pad_id)
    length = out["tokens"].shape[1]
    for i, s in enumerate(sequences):
        n = min(len(s.token_ids), length)
        out["tokens"][i, :n] = s.token_ids[:n]
        out["attention_mask"][i, :n] = 1
        out["loss_mask"][i, :n] = s.loss_mask[:n]
        out["sampler_logprobs"][i, :n] = s.logprobs[:n]
    return out


def check_right_padded(attention_mask_BT: np.ndarray, what: str) -> None:
    """Raise unless every row of the 0/1 mask holds its real tokens first, then only padding
    (as `pack` makes rows): what a model pass told `right_padded=True` relies on."""
    valid_BT = np.asarray(attention_mask_BT).astype(bool)
    lengths_B = valid_BT.sum(axis=1)
    bad_B = np.any(valid_BT != (np.arange(valid_BT.shape[1])[None] < lengths_B[:, None]), axis=1)
    if bad_B.any():
        raise ValueError(f"{what}: {int(bad_B.sum())} of {len(bad_B)} rows are not right-padded "
                         f"(row {int(np.argmax(bad_B))} has padding before a real token); the "
                         "fused attention would let real tokens see that padding")


def tool_totals(trajectories: Iterable[Any], known: Iterable[str] | None = None
                ) -> dict[str, float]:
    """Calls and dollars per tool over `trajectories` (failed calls counted, at what they
    cost): `tools/<name>/calls`, `tools/<name>/cost_usd`. A call without a usable name (empty,
    over 64 characters, or with a character outside letters, digits and `_.-`) counts under
    `tools/_malformed/`; given the `known` tool names, a usable name outside them counts under
    `tools/_unknown/`, so a model that invents names cannot grow the metrics' columns."""
    known = None if known is None else set(known)
    out: dict[str, float] = {}
    for traj in trajectories:
        for call in traj.tool_calls:
            name = metric_name(call.name)
            if known is not None and name != MALFORMED and name not in known:
                name = UNKNOWN
            calls, cost = f"tools/{name}/calls", f"tools/{name}/cost_usd"
            out[calls] = out.get(calls, 0.0) + 1
            out[cost] = out.get(cost, 0.0) + float(call.cost)
    return out


MALFORMED = "_malformed"
UNKNOWN = "_unknown"
_SEGMENT = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def metric_name(name: object) -> str:
    """`name` as one metrics-key segment, or MALFORMED where it cannot be one."""
    if isinstance(name, str) and _SEGMENT.fullmatch(name):
        return name
    return MALFORMED


def direct_batch(groups: Sequence[Sequence[Any]], outcome_QG: np.ndarray,
                 tool_names: Sequence[Sequence[str]], preferences: Sequence[Sequence[float]],
                 gcfg: GRPOConfig, *, pad_id: int, max_len: int,
                 seconds_per_token: float = 0.0
                 ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Reward, filters and advantages of Q groups of G trajectories (`score_groups`; tool
    names and preferences per task as there), then the packed [Q·G, T] batch with
    `advantages` and `sample_mask` per row, and the step's rollout statistics (means over
    every trajectory, filter counts, per-tool totals)."""
    outcome_QG = np.asarray(outcome_QG, np.float32)
    scores = score_groups(groups, outcome_QG, tool_names, preferences, gcfg,
                          seconds_per_token=seconds_per_token)
    flat = [tr for gr in groups for tr in gr]
    batch = pack(flat, pad_id=pad_id, max_len=max_len)
    batch["advantages"] = scores.advantages_QG.reshape(-1)
    batch["sample_mask"] = scores.keep_QG.reshape(-1).astype(np.float32)
    stats = rollout_stats(scores, outcome_QG, flat) | {
        # measured sampler time, queueing included: a metric, never reward
        "rollout/generation_wall_s_mean": float(np.mean([tr.generation_s for tr in flat])),
        "rollout/tokens_mean": float(np.mean([len(tr.token_ids) for tr in flat]))}
    known = {n for names in tool_names for n in names}
    return batch, stats | scores.counters | tool_totals(flat, known)


def rollout_stats(scores: Any, outcome_QG: np.ndarray, flat: Sequence[Any]) -> dict[str, float]:
    """The step's `rollout/` means over every trajectory of `score_groups`' [Q, G] `scores`
    (`flat`: the trajectories, row-major), shared by every rollout mode's batch."""
    f = scores.features
    return {"rollout/reward_mean": float(np.mean(scores.reward_QG)),
            "rollout/accuracy": float(outcome_QG.mean()),
            "rollout/cost_mean": float(f.cost_QG.mean()),
            "rollout/latency_mean": float(f.latency_QG.mean()),
            "rollout/format_error_rate": float((scores.format_errors_QG > 0).mean()),
            "rollout/turns_mean": float(np.mean([len(tr.turns) for tr in flat])),
            # Every episode comes back, as a trajectory or as a failed one (never lost).
            "rollout/episodes": float(len(flat)),
            "rollout/episodes_failed": float(sum(tr.end_reason == "error" for tr in flat))}


class _Dispatch(NamedTuple):
    name: str                    # the sub-agent dispatched


class _AsScored(NamedTuple):
    """A sub-agent-mode rollout as `score_groups` reads a trajectory: its "tool calls" are the
    orchestrator's dispatches, named by sub-agent (the sub-agents' own tool calls are not the
    orchestrator's actions and are not counted)."""

    tool_calls: list[_Dispatch]
    cost: float
    clock: float                 # timed with both models' speeds
    format_errors: int
    final_answer: str | None

    def clock_s(self, seconds_per_token: float) -> float:
        return self.clock        # already timed: orchestrator and sub-agents differ in speed


class _TurnRow(NamedTuple):
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


def _turn_row(sample: Any) -> _TurnRow:
    n, m = len(sample.prompt_ids), len(sample.output_ids)
    return _TurnRow(list(sample.prompt_ids) + list(sample.output_ids), [0] * n + [1] * m,
                    [0.0] * n + list(sample.logprobs))


def turn_batch(groups: Sequence[Sequence[Any]], advantages_QG: np.ndarray,
               keep_QG: np.ndarray, *, pad_id: int, max_turn_tokens: int, row_multiple: int
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One row per orchestrator turn (`rollout.samples`: `prompt_ids`, `output_ids`,
    `logprobs` of the output), carrying its rollout's advantage and sample mask; turns longer
    than `max_turn_tokens` are left out. Rows are padded (sample_mask 0) to a multiple of
    `row_multiple` so the jitted step sees few distinct shapes.

    Returns (batch, info): batch["rollout_ids"] and info["rollout"] [B] are q·G + g of each
    row's rollout (-1 on padding rows), info["dropped"] [Q, G] the over-budget turns per
    rollout."""
    q, g = advantages_QG.shape
    rows, rollout_of = [], []
    dropped = np.zeros((q, g), np.int32)
    for i, group in enumerate(groups):
        for j, r in enumerate(group):
            for s in r.samples:
                if len(s.prompt_ids) + len(s.output_ids) > max_turn_tokens:
                    dropped[i, j] += 1
                    continue
                rows.append(_turn_row(s))
                rollout_of.append(i * g + j)
    n = len(rows)
    b = bucket_len(n, row_multiple)
    packed = pack(rows, pad_id=pad_id, max_len=max_turn_tokens) if rows else {}
    out = empty_rows(b, packed["tokens"].shape[1] if rows else bucket_len(1), pad_id)
    for key, value in packed.items():
        out[key][:n] = value
    index = np.full((b,), -1, np.int64)
    index[:n] = rollout_of
    flat_A, flat_keep = advantages_QG.reshape(-1), keep_QG.reshape(-1)
    out["advantages"] = np.where(index >= 0, flat_A[index], 0.0).astype(np.float32)
    out["sample_mask"] = np.where(index >= 0, flat_keep[index], 0.0).astype(np.float32)
    out["rollout_ids"] = index.astype(np.int32)   # agg="rollout-turn-token-mean" weighs by it
    return out, {"rollout": index, "dropped": dropped}


def flow_batch(groups: Sequence[Sequence[Any]], outcome_QG: np.ndarray,
               agent_names: Sequence[str], preference_QF: np.ndarray, gcfg: GRPOConfig, *,
               pad_id: int, max_turn_tokens: int, row_multiple: int,
               seconds_per_token: float = 0.0, subagent_seconds_per_token: float = 0.0
               ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The ToolOrchestra reward, filters and group advantages over [Q, G] sub-agent-mode
    rollouts (dispatches per sub-agent as the tool calls; `preference_QF` [Q, N+3] ordered
    (agent_names…, outcome, compute, latency)), then the per-turn batch (`turn_batch`). The two
    speeds time the orchestrator's and the sub-agents' tokens in the latency feature. A rollout
    has `samples`, `account` (`dispatches`, `turns`, `prompt_tokens`, `completion_tokens`,
    `tool_calls`), `cost`, `latency`, `clock_s(orchestrator, subagent)`, `format_errors` and
    `final_answer`. Returns (batch, stats)."""
    scored = [[_AsScored([_Dispatch(name) for name, k in r.account.dispatches.items()
                          for _ in range(k)], r.cost,
                         r.clock_s(seconds_per_token, subagent_seconds_per_token),
                         r.format_errors, r.final_answer) for r in gr] for gr in groups]
    scores = score_groups(scored, outcome_QG, [list(agent_names)] * len(groups),
                          list(np.asarray(preference_QF, np.float32)), gcfg)
    batch, info = turn_batch(groups, scores.advantages_QG, scores.keep_QG, pad_id=pad_id,
                             max_turn_tokens=max_turn_tokens, row_multiple=row_multiple)
    f = scores.features
    flat = [r for gr in groups for r in gr]
    acc = [r.account for r in flat]
    stats = {"rollout/reward_mean": float(scores.reward_QG.mean()),
             "rollout/accuracy": float(np.mean(outcome_QG)),
             "rollout/cost_mean": float(f.cost_QG.mean()),
             "rollout/latency_mean": float(f.latency_QG.mean()),
             "rollout/latency_wall_mean": float(np.mean([r.latency for r in flat])),
             "rollout/format_error_rate": float((scores.format_errors_QG > 0).mean()),
             "rollout/turns_mean": float(np.mean([a.turns for a in acc])),
             "flow/turn_samples": float((info["rollout"] >= 0).sum()),
             "flow/dropped_over_budget": float(info["dropped"].sum()),
             "tokens/prompt_mean": float(np.mean([a.prompt_tokens for a in acc])),
             "tokens/completion_mean": float(np.mean([a.completion_tokens for a in acc])),
             "rollout/tool_calls_mean": float(np.mean([len(a.tool_calls) for a in acc]))}
    stats |= {f"dispatches/{n}": float(f.counts_QGN[..., k].mean())
              for k, n in enumerate(f.tool_names)}
    return batch, stats | scores.counters
