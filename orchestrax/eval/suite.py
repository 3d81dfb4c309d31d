"""One policy over named task sets: the turn-limit sweep, preference adherence against a baseline,
and the rows, JSON, CSV and plots `orchestrax eval` writes.

The turn-limit sweep (default 10/20/50/100) runs each task once at the largest limit and cuts the
episodes at the smaller ones (`core.at_turn_limit`), which is exact at temperature 0, the paper's
evaluation protocol; at temperature > 0 every limit is a separate run.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
from typing import Any, Sequence

from orchestrax.eval import report
from orchestrax.eval.core import TaskSet, at_turn_limit, evaluate
from orchestrax.eval.scores import preference_adherence, summarize
from orchestrax.eval.policy import Policy
from orchestrax.eval.episode_records import EpisodeRecord
from orchestrax.eval.runners import RUNNERS, EvalConfig
from orchestrax.eval.tasksets import TaskSetOptions, load_task_set

DEFAULT_SWEEP = (10, 20, 50, 100)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalRun:
    task_sets: tuple[str, ...]
    cfg: EvalConfig = EvalConfig()
    turn_limits: tuple[int, ...] = DEFAULT_SWEEP   # the sweep; () for the main limit only
    runner: str = "direct"
    max_in_flight: int = 64
    baseline: str | None = None                    # an earlier run's eval.json
    options: TaskSetOptions = TaskSetOptions()
    progress: bool = True

    def __post_init__(self):
        if not self.task_sets:
            raise ValueError("EvalRun.task_sets is empty; name at least one task set")
        if any(n < 1 for n in self.turn_limits):
            raise ValueError(f"EvalRun.turn_limits={self.turn_limits}; each must be >= 1")
        if self.runner not in RUNNERS:
            raise ValueError(f"EvalRun.runner={self.runner!r}; registered: {sorted(RUNNERS)}")


def load_baseline(path: str) -> dict[str, list[EpisodeRecord]]:
    """Task set -> episode records (at that run's main turn limit) of an earlier eval.json."""
    data = json.loads(pathlib.Path(path).read_text())
    if "records" not in data:
        raise ValueError(f"--baseline {path}: not an `orchestrax eval` JSON (no 'records')")
    return {name: [EpisodeRecord.from_json(r) for r in rows]
            for name, rows in data["records"].items()}


async def _run_set(ts: TaskSet, policy: Policy, run: EvalRun) -> dict[int, list[EpisodeRecord]]:
    """Records per turn limit (the main limit and every sweep limit)."""
    main = run.cfg.episode.max_turns
    limits = sorted({main, *run.turn_limits})

    async def at(limit: int) -> list[EpisodeRecord]:
        cfg = dataclasses.replace(run.cfg, episode=dataclasses.replace(run.cfg.episode,
                                                                        max_turns=limit))
        return await evaluate(ts, policy, cfg, runner=run.runner,
                              max_in_flight=run.max_in_flight, progress=run.progress)

    if run.cfg.episode.sampling.temperature > 0:
        return {limit: await at(limit) for limit in limits}
    longest = await at(limits[-1])
    out = {limits[-1]: longest}
    for limit in limits[:-1]:
        out[limit] = await at_turn_limit(longest, ts, limit, run.cfg)
    return out


async def run_eval(policy: Policy, run: EvalRun) -> dict[str, Any]:
    """The whole evaluation: {"policy", "created", "main_turn_limit", "rows", "records"}.
    `rows`: one summary per task set and turn limit; `records`: every episode at the main limit."""
    baseline = load_baseline(run.baseline) if run.baseline else {}
    main = run.cfg.episode.max_turns
    rows, records = [], {}
    for name in run.task_sets:
        ts = load_task_set(name, run.options)
        by_limit = await _run_set(ts, policy, run)
        records[ts.name] = [r.to_json() for r in by_limit[main]]
        for limit, recs in sorted(by_limit.items()):
            row = {"policy": policy.name, "task_set": ts.name, "turn_limit": limit,
                   "samples": run.cfg.samples, **summarize(recs),
                   "env": env_stats(ts, recs, run.cfg.samples)}
            adh = preference_adherence(recs, baseline.get(ts.name, ()))
            row |= {"adherence": adh["adherence"], "adherence_tasks": adh["tasks"]}
            rows.append(row)
    return {"policy": policy.name,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "main_turn_limit": main, "rows": rows, "records": records}


def env_stats(ts: TaskSet, records: Sequence[EpisodeRecord], samples: int) -> dict[str, float]:
    """The environment's own statistics of the episodes (`Environment.stats`, which the
    trainer's eval rows log as `env/<name>`: the routing env's preferred-tool shares), over
    groups of each task's `samples` records."""
    groups = [[r.trajectory for r in records[i * samples:(i + 1) * samples]]
              for i in range(len(ts.tasks))]
    if any(t is None for g in groups for t in g):
        return {}
    return ts.env.stats(ts.tasks, groups)


def write_outputs(payload: dict[str, Any], out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    """eval.json, eval.csv and the plots of `report.plot`."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "eval.json", payload)
    report.write_csv(out / "eval.csv", payload["rows"])
    return [out / "eval.json", out / "eval.csv",
            *report.plot(out, payload["rows"], payload["main_turn_limit"])]
