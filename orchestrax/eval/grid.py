"""The paper's grid in one call: agent mode × thinking placement × component ablation.

    orchestrax eval --policy runs/x --tasks musique aime --agent direct,subagent \
        --thinking none,orchestrator,subagents,all --ablate none,no_coder,no_memory

Each grid point is an ordinary `run_eval` with its runner and options (main turn limit only, no
turn sweep); rows are labelled with the point and written as one table, JSON, CSV and plots
(accuracy and tokens per point and task set; calls per tool). Direct mode has no sub-agents:
its thinking is the orchestrator's switch alone ("subagents" = "none", "all" = "orchestrator"),
and ablations do not apply to it.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Sequence

from orchestrax.agent.subagent import ABLATIONS, THINKING, thinking_flags
from orchestrax.eval import report
from orchestrax.eval.policy import Policy
from orchestrax.eval.subagent_runner import SubagentOptions
from orchestrax.eval.suite import EvalRun, run_eval
from orchestrax.tools.tool import Pricing

AGENTS = ("direct", "subagent")


@dataclasses.dataclass(frozen=True)
class GridPoint:
    agent: str
    thinking: str
    ablation: str = "none"

    @property
    def label(self) -> str:
        return "/".join([self.agent, self.thinking] + ([self.ablation] if self.ablation != "none"
                                                       else []))


def _split(value: str, allowed: Sequence[str], flag: str) -> list[str]:
    items = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if not items or bad:
        raise ValueError(f"{flag}={value!r}; allowed: comma-separated {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def grid_points(agents: str, thinking: str, ablations: str = "none") -> list[GridPoint]:
    """Every combination, Direct points deduplicated by what they can actually vary."""
    out: list[GridPoint] = []
    for agent in _split(agents, AGENTS, "--agent"):
        for place in _split(thinking, THINKING, "--thinking"):
            if agent == "direct":
                place = "orchestrator" if thinking_flags(place)[0] else "none"
                point = GridPoint("direct", place)
                if point not in out:
                    out.append(point)
                continue
            out += [GridPoint(agent, place, a)
                    for a in _split(ablations, tuple(ABLATIONS), "--ablate")]
    return out


async def run_grid(policy: Policy, run: EvalRun, points: Sequence[GridPoint], *,
                   subagent_policy: Any = None, subagent_pricing: Pricing | None = None
                   ) -> dict[str, Any]:
    """`run`: the `EvalRun` every point starts from; `subagent_policy` and
    `subagent_pricing`: the sub-agents' model and its price (None: the orchestrator's, free).
    Returns a payload shaped like `run_eval`'s, with rows (and records) labelled by point."""
    rows, records, created = [], {}, None
    for point in points:
        episode = dataclasses.replace(run.cfg.episode,
                                      enable_thinking=thinking_flags(point.thinking)[0])
        options = (SubagentOptions(thinking=point.thinking, subagent_policy=subagent_policy,
                                   subagent_pricing=subagent_pricing).with_ablation(point.ablation)
                   if point.agent == "subagent" else None)
        cfg = dataclasses.replace(run.cfg, episode=episode, agent_options=options)
        payload = await run_eval(policy, dataclasses.replace(run, cfg=cfg, runner=point.agent,
                                                             turn_limits=()))
        created = created or payload["created"]
        for row in payload["rows"]:
            rows.append({"agent": point.agent, "thinking": point.thinking,
                         "ablation": point.ablation, "point": point.label, **row,
                         "total_tokens": row["prompt_tokens"] + row["completion_tokens"]})
        for name, recs in payload["records"].items():
            records[f"{point.label}:{name}"] = recs
    return {"policy": policy.name, "created": created, "main_turn_limit": run.cfg.episode.max_turns,
            "grid": [p.label for p in points], "rows": rows, "records": records}


COLUMNS = (("accuracy", "acc", "{:.3f}"), ("prompt_tokens", "prompt tok", "{:.0f}"),
           ("completion_tokens", "compl tok", "{:.0f}"), ("minutes_per_task", "min/task", "{:.3f}"),
           ("cents_per_task", "cents/task", "{:.3f}"), ("turns", "turns", "{:.2f}"),
           ("errors", "errors", "{:.0f}"))


def grid_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per grid point and task set, then calls per task by tool (dispatches too)."""
    width = max([len(r["point"]) for r in rows] + [10]) + 2
    head = f"{'config':<{width}}{'task set':<14}" + "".join(f"{h:>12}" for _, h, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['point']:<{width}}{r['task_set']:<14}" + "".join(
            f"{fmt.format(r[k]):>12}" for k, _, fmt in COLUMNS))
    tools = sorted({t for r in rows for t in r["calls_per_task"]})
    if tools:
        lines += ["", "calls per task, by tool",
                  f"{'config':<{width}}{'task set':<14}" + "".join(f"{t[-18:]:>20}" for t in tools)]
        lines += [f"{r['point']:<{width}}{r['task_set']:<14}" + "".join(
            f"{r['calls_per_task'].get(t, 0.0):>20.2f}" for t in tools) for r in rows]
    return "\n".join(lines)


def write_grid(payload: dict[str, Any], out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    """grid.json, grid.csv, grid_accuracy.png, grid_tokens.png, grid_calls.png."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = payload["rows"]
    report.write_json(out / "grid.json", payload)
    report.write_csv(out / "grid.csv", rows, ("agent", "thinking", "ablation", "task_set",
                                               "tasks", *[k for k, _, _ in COLUMNS],
                                               "total_tokens"))
    tools = sorted({t for r in rows for t in r["calls_per_task"]})
    return [out / "grid.json", out / "grid.csv", *_plots(out, rows, tools)]


def _plots(out: pathlib.Path, rows: Sequence[dict[str, Any]], tools: Sequence[str]
           ) -> list[pathlib.Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    points = list(dict.fromkeys(r["point"] for r in rows))
    sets = list(dict.fromkeys(r["task_set"] for r in rows))
    by = {(r["point"], r["task_set"]): r for r in rows}
    x = np.arange(len(points))
    written = []
    for key, ylabel, name in (("accuracy", "accuracy", "grid_accuracy.png"),
                              ("total_tokens", "tokens per query (prompt + completion)",
                               "grid_tokens.png")):
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(points)), 4))
        w = 0.8 / len(sets)
        for i, s in enumerate(sets):
            ax.bar(x + i * w, [by[(p, s)][key] if (p, s) in by else 0 for p in points], w,
                   label=s)
        ax.set_xticks(x + 0.4 - w / 2, points, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
    if tools:
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(points)), 4))
        bottom = np.zeros(len(points))
        for t in tools:
            vals = np.array([sum(by[(p, s)]["calls_per_task"].get(t, 0.0) for s in sets
                                 if (p, s) in by) / len(sets) for p in points])
            ax.bar(x, vals, bottom=bottom, label=t)
            bottom += vals
        ax.set_xticks(x, points, rotation=30, ha="right")
        ax.set_ylabel("calls per task (mean over task sets)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "grid_calls.png", dpi=120)
        plt.close(fig)
        written.append(out / "grid_calls.png")
    return written
