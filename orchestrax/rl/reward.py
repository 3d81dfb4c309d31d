"""The ToolOrchestra reward (paper Eq. 2) and a plain outcome reward.

Letters: Q tasks, G rollouts per task, N tools, F = N + 3 features.
Features M = [calls per tool…, outcome, −cost, −latency]. The minus signs are applied *before*
min–max normalisation, so after normalising a cheaper (faster) trajectory has the larger
feature and a positive p_compute (p_latency) rewards it. Min–max is scale invariant, so cost and
latency units (dollars/cents, seconds/minutes) do not matter — except for the resolution floors
(`Resolution`, in dollars and seconds): a feature whose spread over the scope is below its floor
counts as constant, so differences no policy decision made (rounding, a machine's timing noise)
are never stretched to the full 0..1 range and turned into reward.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from orchestrax.rl import contracts
from orchestrax.checks import one_of
from orchestrax.rl.grpo_config import REWARD_SCOPES


class Resolution(NamedTuple):
    """The smallest spread of each feature over a scope that counts as a difference."""
    calls: float = 1.0         # one tool call
    outcome: float = 1.0       # right vs wrong
    cost_usd: float = 1e-4     # a hundredth of a cent: per-second prices of measured tool time
    latency_s: float = 1.0     # the latency quantum: real tools' measured time jitters below it

    def floors(self, n_tools: int) -> np.ndarray:
        """[N+3] float32 floors in feature order (calls per tool…, outcome, cost, latency)."""
        for name, v in self._asdict().items():
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"Resolution.{name}={v!r}; must be a number >= 0")
        return np.array([self.calls] * n_tools + [self.outcome, self.cost_usd, self.latency_s],
                        np.float32)


RESOLUTION = Resolution()


def _concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def feature_matrix(tool_counts_QGN: jax.Array, outcome_QG: jax.Array, cost_QG: jax.Array,
                   latency_QG: jax.Array) -> jax.Array:
    """[Q,G,N+3] raw features [counts…, outcome, −cost, −latency] (signs so larger is better)."""
    f32 = jnp.float32
    return jnp.concatenate([
        jnp.asarray(tool_counts_QGN, f32),
        jnp.asarray(outcome_QG, f32)[..., None],
        -jnp.asarray(cost_QG, f32)[..., None],
        -jnp.asarray(latency_QG, f32)[..., None],
    ], axis=-1)


def minmax_normalize(M_QGF: jax.Array, valid_QG: jax.Array, scope: str,
                     floor_F: jax.Array | None = None) -> jax.Array:
    """Min–max each feature to [0,1] over valid members of the scope; a constant feature, or one
    whose spread is below its floor (`floor_F` [F], default 0), -> 0.

    scope "group": over the G rollouts of each task; "batch": over all Q·G rollouts.
    Invalid members neither set the range nor get a non-zero value.
    """
    one_of("toolorchestra_reward", "scope", scope, REWARD_SCOPES)
    axes = (1,) if scope == "group" else (0, 1)
    v = valid_QG[..., None]
    lo = jnp.min(jnp.where(v, M_QGF, jnp.inf), axis=axes, keepdims=True)
    hi = jnp.max(jnp.where(v, M_QGF, -jnp.inf), axis=axes, keepdims=True)
    rng = hi - lo
    ok = jnp.isfinite(rng) & (rng > 0)                 # empty scope gives inf - inf = nan
    if floor_F is not None:
        ok = ok & (rng >= jnp.asarray(floor_F, jnp.float32))
    safe = jnp.where(ok, rng, 1.0)
    norm = jnp.where(ok, (M_QGF - jnp.where(ok, lo, 0.0)) / safe, 0.0)
    return jnp.where(v, norm, 0.0)


def toolorchestra_reward(tool_counts: chex.Array, outcome: chex.Array, cost: chex.Array,
                         latency: chex.Array, preference: chex.Array, scope: str = "group",
                         valid: chex.Array | None = None,
                         resolution: Resolution = RESOLUTION) -> jax.Array:
    """R[Q,G] = M_norm · P for correct rollouts, 0 otherwise; features spread less than their
    `resolution` over the scope count as constant.

    tool_counts [Q,G,N] calls per tool; outcome [Q,G] in {0,1}; cost [Q,G] dollars (≥ 0);
    latency [Q,G] seconds (≥ 0); preference [Q,N+3] in [0,1], ordered (tools…, outcome, compute,
    latency), or [Q,G,N+3] when the rollouts of one group answer tasks with different P. valid [Q,G] bool (default all): rollouts removed by the format/answer filters, which
    take no part in the normalisation and get R = 0.
    """
    owner = "toolorchestra_reward"
    tool_counts, outcome, cost, latency = map(jnp.asarray, (tool_counts, outcome, cost, latency))
    preference = jnp.asarray(preference, jnp.float32)
    contracts.check_rank(owner, "tool_counts", tool_counts, 3, "[Q,G,N]")
    Q, G, N = tool_counts.shape
    for name, x in (("outcome", outcome), ("cost", cost), ("latency", latency)):
        contracts.check_shape(owner, name, x, (Q, G), f"[Q,G] = ({Q}, {G}) like tool_counts")
    if preference.ndim == 3:   # one P per rollout (a group of several tasks)
        contracts.check_shape(owner, "preference", preference, (Q, G, N + 3),
                              f"[Q,G,N+3] = ({Q}, {G}, {N + 3}) or [Q,N+3]")
    else:
        contracts.check_shape(owner, "preference", preference, (Q, N + 3),
                              f"[Q,N+3] = ({Q}, {N + 3}) ordered (tools…, outcome, compute, "
                              "latency), or [Q,G,N+3] one per rollout")
        preference = jnp.broadcast_to(preference[:, None, :], (Q, G, N + 3))
    if _concrete(preference):
        p = np.asarray(preference)
        if not np.all((p >= 0) & (p <= 1)):
            raise ValueError("preference values must lie in [0, 1]")
    if _concrete(outcome):
        o = np.asarray(outcome)
        if not np.all((o == 0) | (o == 1)):
            raise ValueError("outcome values must be 0 or 1")
    one_of("toolorchestra_reward", "scope", scope, REWARD_SCOPES)
    if valid is not None:
        contracts.check_shape(owner, "valid", valid, (Q, G),
                              f"[Q,G] = ({Q}, {G}) like tool_counts")
    valid_QG = jnp.ones((Q, G), bool) if valid is None else jnp.asarray(valid, bool)
    return _reward(tool_counts, outcome, cost, latency, preference, valid_QG,
                   resolution.floors(N), scope)


@functools.partial(jax.jit, static_argnames="scope")
def _reward(tool_counts, outcome, cost, latency, preference, valid_QG, floor_F, scope):
    M = feature_matrix(tool_counts, outcome, cost, latency)
    R = jnp.einsum("qgf,qgf->qg", minmax_normalize(M, valid_QG, scope, floor_F), preference)
    return jnp.where((outcome == 1) & valid_QG, R, 0.0)


def outcome_reward(outcome: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """Plain 0/1 reward for non-tool tasks: R = outcome (0 where not valid)."""
    R = jnp.asarray(outcome, jnp.float32)
    return R if valid is None else jnp.where(jnp.asarray(valid, bool), R, 0.0)


def features_from_trajectories(trajectories: Sequence[Any], tool_names: Sequence[str],
                               seconds_per_token: float = 0.0
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counts [n,N] int32, cost [n] dollars, latency [n] seconds) from agent Trajectories.

    Column i counts calls to `tool_names[i]`; calls to other names are not counted (the agent
    records them as format errors). Latency is the paper's Clock(τ), made deterministic:
    `Trajectory.clock_s(seconds_per_token)`, the tools' latency plus the policy's generated
    tokens at `seconds_per_token` (never the measured sampler wall time, which is queueing).
    """
    index = {name: i for i, name in enumerate(tool_names)}
    if len(index) != len(tool_names):
        raise ValueError(f"tool_names has duplicates: {list(tool_names)}")
    counts = np.zeros((len(trajectories), len(tool_names)), np.int32)
    for row, traj in enumerate(trajectories):
        for call in traj.tool_calls:
            if call.name in index:
                counts[row, index[call.name]] += 1
    cost = np.array([t.cost for t in trajectories], np.float32)
    latency = np.array([t.clock_s(seconds_per_token) for t in trajectories], np.float32)
    return counts, cost, latency


class GroupFeatures(NamedTuple):
    """Reward inputs of Q groups of G trajectories, tool columns aligned by name."""
    tool_names: tuple[str, ...]     # the N count columns: every task's tools, first seen first
    counts_QGN: np.ndarray          # int32 calls per tool
    cost_QG: np.ndarray             # float32 dollars
    latency_QG: np.ndarray          # float32 seconds
    preference_QF: np.ndarray       # float32 [Q, N+3]: (tools…, outcome, compute, latency)


def group_features(groups: Sequence[Sequence[Any]], tool_names: Sequence[Sequence[str]],
                   preferences: Sequence[Sequence[float]], seconds_per_token: float = 0.0
                   ) -> GroupFeatures:
    """Features of each task's group over the union of the tasks' tools, one column per tool
    name. With per-instance tool subsets, column j must mean the same tool in every row, or
    `reward_scope="batch"` min–maxes one tool's calls against another's.

    tool_names[q] lists task q's tools; preferences[q] is ordered (those tools…, outcome,
    compute, latency). A tool task q lacks gets count 0 and preference 0 in q's rows.
    `seconds_per_token`: the policy's generation speed in the latency feature.
    """
    Q = len(groups)
    if not (len(tool_names) == len(preferences) == Q):
        raise ValueError(f"groups, tool_names and preferences must have one entry per task; got "
                         f"{Q}, {len(tool_names)}, {len(preferences)}")
    G = len(groups[0]) if Q else 0
    if any(len(g) != G for g in groups):
        raise ValueError(f"every group must hold G={G} trajectories; got sizes "
                         f"{[len(g) for g in groups]}")
    columns = tuple(dict.fromkeys(name for names in tool_names for name in names))
    col = {name: j for j, name in enumerate(columns)}
    N = len(columns)
    counts = np.zeros((Q, G, N), np.int32)
    cost = np.zeros((Q, G), np.float32)
    latency = np.zeros((Q, G), np.float32)
    pref = np.zeros((Q, N + 3), np.float32)
    for q, (group, names, p) in enumerate(zip(groups, tool_names, preferences)):
        idx = [col[name] for name in names]
        c, cost[q], latency[q] = features_from_trajectories(group, names, seconds_per_token)
        counts[q][:, idx] = c
        if p is None:
            raise ValueError(f"preferences[{q}] is None; every task needs its preference vector "
                             f"(for outcome only: zeros for its {len(names)} tools, then 1, 0, 0)")
        if len(p) != len(names) + 3:
            raise ValueError(f"preferences[{q}] has {len(p)} entries; task {q} has {len(names)} "
                             f"tools, so it needs {len(names) + 3} (tools…, outcome, compute, "
                             f"latency)")
        pref[q, idx] = p[:len(names)]
        pref[q, N:] = p[len(names):]
    return GroupFeatures(columns, counts, cost, latency, pref)
