"""One RL step's groups of trajectories -> rewards, filters and advantages, all [Q, G].

The composition the trainer runs after verification: features aligned by tool name, the
ToolOrchestra reward over the valid members of each scope, the paper's filters (format errors,
no final answer, homogeneous groups) and group advantages.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from orchestrax.rl import contracts
from orchestrax.rl.advantages import compute_advantages
from orchestrax.rl.grpo_config import GRPOConfig
from orchestrax.rl.filters import has_final_answer, sample_mask
from orchestrax.rl.reward import GroupFeatures, Resolution, group_features, toolorchestra_reward


class GroupScores(NamedTuple):
    features: GroupFeatures
    format_errors_QG: np.ndarray    # int32 malformed turns per trajectory
    valid_QG: np.ndarray            # bool: no format error and a non-empty final answer
    reward_QG: np.ndarray           # float32, 0 where wrong or not valid
    keep_QG: np.ndarray             # bool: valid (any, with invalid="zero") and in a group whose
                                    # reward std ≥ min_group_std
    advantages_QG: np.ndarray       # float32, 0 where not valid (invalid="drop")
    counters: dict[str, float]      # filter/* counts for metrics


def score_groups(groups: Sequence[Sequence[Any]], outcome_QG: np.ndarray,
                 tool_names: Sequence[Sequence[str]],
                 preferences: Sequence[Sequence[float]], gcfg: GRPOConfig,
                 seconds_per_token: float = 0.0) -> GroupScores:
    """Rewards, filters and advantages of Q tasks' G trajectories, one group a task (or, with
    `gcfg.group_tasks` = k, one group per k consecutive tasks).

    outcome_QG: 1 where the verifier accepted the trajectory, else 0. tool_names[q] and
    preferences[q] as in `group_features`. Trajectories need `tool_calls`, `cost`, `clock_s`,
    `format_errors` and `final_answer`; `seconds_per_token` times their generated tokens.
    """
    feats = group_features(groups, tool_names, preferences,   # checks that groups are Q × G
                           seconds_per_token)
    outcome_QG = np.asarray(outcome_QG, np.float32)
    contracts.check_shape("score_groups", "outcome_QG", outcome_QG, feats.cost_QG.shape,
                          f"[Q,G] = {feats.cost_QG.shape}, Q groups of G trajectories")
    fmt = np.array([[tr.format_errors for tr in gr] for gr in groups], np.int32)
    answered = np.array([[has_final_answer(tr.final_answer) for tr in gr] for gr in groups])
    valid = (fmt == 0) & answered
    Q, G = outcome_QG.shape
    k = gcfg.group_tasks
    if Q % k:
        raise ValueError(f"grpo.group_tasks={k} does not divide the step's {Q} tasks; "
                         f"rollout.tasks_per_step must be a multiple of {k}")
    # k tasks a group: [Q, G] -> [Q/k, k·G] (rows of one group are its tasks' rollouts in order)
    grouped = lambda x: np.asarray(x).reshape(Q // k, k * G, *np.shape(x)[2:])
    pref = np.broadcast_to(feats.preference_QF[:, None, :], (Q, G, feats.preference_QF.shape[1]))
    outcome_g, fmt_g, answered_g, valid_g = map(grouped, (outcome_QG, fmt, answered, valid))
    R = toolorchestra_reward(grouped(feats.counts_QGN), outcome_g, grouped(feats.cost_QG),
                             grouped(feats.latency_QG), grouped(pref),
                             scope=gcfg.reward_scope, valid=valid_g,
                             resolution=Resolution(cost_usd=gcfg.cost_resolution,
                                                   latency_s=gcfg.latency_resolution))
    if gcfg.invalid == "drop":
        keep, counters = sample_mask(R, format_errors=fmt_g, has_answer=answered_g,
                                     min_std=gcfg.min_group_std)
        scored = valid_g
    else:  # "zero": invalid rollouts stay in their group with R = 0
        keep, counters = sample_mask(R, min_std=gcfg.min_group_std)
        scored = np.ones_like(valid_g)
    A = compute_advantages(R, gcfg.adv_estimator, eps=gcfg.adv_eps, ddof=gcfg.adv_ddof,
                           clip=gcfg.adv_clip, mask=scored)
    back = lambda x, dtype: np.asarray(x, dtype).reshape(Q, G)
    return GroupScores(feats, fmt, valid, back(R, np.float32), back(keep, bool),
                       back(A, np.float32),
                       {name: float(np.asarray(v)) for name, v in counters.items()})
