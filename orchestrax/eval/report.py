"""Outputs of `orchestrax eval`: a printed table, JSON (summaries plus every episode record),
CSV (one row per task set and turn limit) and PNG plots (accuracy vs cost over the turn-limit
sweep; calls per tool per task set)."""

from __future__ import annotations

import csv
import json
import pathlib
from typing import Any, Sequence

COLUMNS = (("accuracy", "acc", "{:.3f}"), ("cents_per_task", "cents/task", "{:.3f}"),
           ("minutes_per_task", "min/task", "{:.3f}"), ("prompt_tokens", "prompt tok", "{:.0f}"),
           ("completion_tokens", "compl tok", "{:.0f}"), ("turns", "turns", "{:.2f}"),
           ("adherence", "pref adh", "{:.3f}"), ("errors", "errors", "{:.0f}"))


def table(rows: Sequence[dict[str, Any]]) -> str:
    """`rows`: {"task_set", "turn_limit", summary fields...}; one line each, then calls per tool."""
    w = max([16, *(len(r["task_set"]) + 2 for r in rows)])
    head = f"{'task set':<{w}}{'turns≤':>7}" + "".join(f"{h:>12}" for _, h, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "".join(f"{'-' if r.get(k) is None else fmt.format(r[k]):>12}"
                        for k, _, fmt in COLUMNS)
        lines.append(f"{r['task_set']:<{w}}{r['turn_limit']:>7}{cells}")
    tools = sorted({t for r in rows for t in r["calls_per_task"]})
    if tools:
        lines += ["", "calls per task, by tool (Table 15 view)",
                  f"{'task set':<{w}}{'turns≤':>7}" + "".join(f"{t[:14]:>16}" for t in tools)]
        for r in rows:
            lines.append(f"{r['task_set']:<{w}}{r['turn_limit']:>7}" + "".join(
                f"{r['calls_per_task'].get(t, 0.0):>16.2f}" for t in tools))
    stats = [r for r in rows if r.get("env")]
    if stats:
        lines += ["", "environment statistics (the trainer's eval rows log them as env/<name>)"]
        for r in stats:
            lines.append(f"{r['task_set']:<{w}}{r['turn_limit']:>7}  " + " ".join(
                f"{k}={v:.4g}" for k, v in sorted(r["env"].items())))
    return "\n".join(lines)


def write_json(path: pathlib.Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1))


EVAL_FIELDS = ("policy", "task_set", "turn_limit", "tasks", *[k for k, _, _ in COLUMNS],
               "tool_input_tokens", "tool_output_tokens")


def write_csv(path: pathlib.Path, rows: Sequence[dict[str, Any]],
              leading: Sequence[str] = EVAL_FIELDS) -> None:
    """One line per row: the `leading` fields, then `calls_<tool>` (calls per task) for every
    tool any row called, sorted."""
    tools = sorted({t for r in rows for t in r["calls_per_task"]})
    fields = [*leading, *[f"calls_{t}" for t in tools]]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in fields if not k.startswith("calls_")}
                       | {f"calls_{t}": r["calls_per_task"].get(t, 0.0) for t in tools})


def plot(out: pathlib.Path, rows: Sequence[dict[str, Any]], main_limit: int) -> list[pathlib.Path]:
    """accuracy_vs_cost.png (one line per task set through its turn limits) and
    calls_per_tool.png (grouped bars at the main turn limit)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    sets = sorted({r["task_set"] for r in rows})
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sets:
        pts = sorted((r for r in rows if r["task_set"] == name), key=lambda r: r["turn_limit"])
        ax.plot([r["cents_per_task"] for r in pts], [r["accuracy"] for r in pts], "o-", label=name)
        for r in pts:
            ax.annotate(str(r["turn_limit"]), (r["cents_per_task"], r["accuracy"]), fontsize=7)
    ax.set_xlabel("cost (cents per task)")
    ax.set_ylabel("accuracy")
    ax.set_title("accuracy vs cost (labels: turn limit)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "accuracy_vs_cost.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    main = [r for r in rows if r["turn_limit"] == main_limit]
    tools = sorted({t for r in main for t in r["calls_per_task"]})
    fig, ax = plt.subplots(figsize=(max(6, len(tools) * len(main) * 0.4), 4))
    width = 0.8 / max(1, len(main))
    for i, r in enumerate(main):
        ax.bar([j + i * width for j in range(len(tools))],
               [r["calls_per_task"].get(t, 0.0) for t in tools], width, label=r["task_set"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tools))], tools, rotation=30,
                  ha="right", fontsize=8)
    ax.set_ylabel("calls per task")
    ax.set_title(f"calls per tool (turn limit {main_limit})")
    if main:
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "calls_per_tool.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written
