"""Per-task-set numbers in the paper's units: accuracy, cents and minutes per task, tokens, turns,
calls per tool (Table 15), and preference adherence (Appendix L, Eq. 6).

Preference adherence, as computed here: for each task that has a preference vector P, the
policy's trajectory and the baseline's trajectory on the same task form a group of two; each
feature of M = [calls per tool…, outcome, −cost, −latency] is min–max normalised over the pair
(a feature equal in both, or apart by less than its resolution floor — `rl.RESOLUTION`: one
tool call, a hundredth of a cent, one second — counts 0, so 1 ms of timing noise never decides
a task), and the score is M_norm · P when the policy solved the task,
else 0: the paper's training reward (Eq. 2) with the baseline as the only other member of the
group. The mean over tasks is reported: a policy that behaves exactly like the baseline scores
0, one that beats it on everything P weighs scores sum(P) on that task. The paper text at hand
describes Eq. 6 only as normalising trajectory features against a baseline model's behaviour and
weighting them by P; this is our reading of it, and the baseline run is the caller's choice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from orchestrax.eval.episode_records import EpisodeRecord
from orchestrax.rl.reward import toolorchestra_reward


def summarize(records: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """Means per episode (cost in US cents, latency in minutes; with one sample a task, per
    task) and calls per tool per episode. "tasks" counts distinct tasks, "episodes" records."""
    if not records:
        raise ValueError("summarize: no records")
    n = len(records)

    def mean(xs) -> float:
        return float(sum(xs) / n)

    calls: Counter[str] = Counter()
    for r in records:
        calls.update(r.calls)
    total = sum(calls.values())
    return {
        "tasks": len({r.task_id for r in records}),
        "episodes": n,
        "accuracy": mean(r.outcome for r in records),
        "cents_per_task": mean(100.0 * r.cost_usd for r in records),
        "minutes_per_task": mean(r.latency_s / 60.0 for r in records),
        "prompt_tokens": mean(r.prompt_tokens for r in records),
        "completion_tokens": mean(r.completion_tokens for r in records),
        "tool_input_tokens": mean(r.tool_input_tokens for r in records),
        "tool_output_tokens": mean(r.tool_output_tokens for r in records),
        "turns": mean(r.turns for r in records),
        "calls_per_task": {k: calls[k] / n for k in sorted(calls)},
        "call_share": {k: calls[k] / total for k in sorted(calls)} if total else {},
        "errors": sum(r.end_reason == "error" for r in records),
    }


def preference_adherence(records: Sequence[EpisodeRecord],
                         baseline: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """{"adherence": mean score or None, "tasks": how many tasks were scored, "pairs": how many
    (policy episode, baseline episode) pairs, "missing": tasks with a preference that the
    baseline did not run}. Records pair with baseline records by task_id; with several samples
    a task, the k-th sample of the policy (in evaluation order) pairs with the baseline's k-th
    (its k mod n-th when the baseline ran n < k samples), so every policy episode is scored once."""
    base: dict[str, list[EpisodeRecord]] = {}
    for r in baseline:
        base.setdefault(r.task_id, []).append(r)
    seen: dict[str, int] = {}
    pairs = []
    for r in records:
        if r.preference is None or r.task_id not in base:
            continue
        k = seen.get(r.task_id, 0)
        seen[r.task_id] = k + 1
        pairs.append((r, base[r.task_id][k % len(base[r.task_id])]))
    missing = len({r.task_id for r in records
                   if r.preference is not None and r.task_id not in base})
    if not pairs:
        return {"adherence": None, "tasks": 0, "pairs": 0, "missing": missing}
    width = max(len(r.tool_names) for r, _ in pairs)
    counts = np.zeros((len(pairs), 2, width), np.float32)
    pref = np.zeros((len(pairs), width + 3), np.float32)
    outcome = np.zeros((len(pairs), 2), np.float32)
    cost = np.zeros((len(pairs), 2), np.float32)
    latency = np.zeros((len(pairs), 2), np.float32)
    for i, (r, b) in enumerate(pairs):
        if len(r.preference) != len(r.tool_names) + 3:
            raise ValueError(f"record {r.task_id}: preference has {len(r.preference)} entries "
                             f"for {len(r.tool_names)} tools; expected tools + 3")
        for g, rec in enumerate((r, b)):
            # aligned by name: the baseline may have been offered the tools in another order
            counts[i, g, :len(r.tool_names)] = [rec.calls.get(name, 0) for name in r.tool_names]
            outcome[i, g], cost[i, g], latency[i, g] = rec.outcome, rec.cost_usd, rec.latency_s
        pref[i, :len(r.tool_names)] = r.preference[:-3]
        pref[i, width:] = r.preference[-3:]
    R = np.asarray(toolorchestra_reward(counts, outcome, cost, latency, pref, scope="group"))
    return {"adherence": float(R[:, 0].mean()), "tasks": len(seen), "pairs": len(pairs),
            "missing": missing}
