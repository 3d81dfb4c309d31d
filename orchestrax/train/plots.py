"""PNG plots of a run's metrics.jsonl, drawn at the end of the run (matplotlib, no display)."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

PANELS = (("reward_mean", "reward"), ("accuracy", "accuracy"), ("cost_mean", "cost ($)"))


def _rows(metrics: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def tool_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({k.removeprefix("tool_share_") for r in rows for k in r
                   if k.startswith("tool_share_")})


def plot_run(metrics: pathlib.Path, out: pathlib.Path) -> pathlib.Path | None:
    """Reward, accuracy, cost and each tool's share of calls per RL step (training rollouts as
    lines, evaluations as dots) into `out`; None when the run has no RL or eval rows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows(metrics)
    rl = [r for r in rows if r["phase"] == "rl"]
    ev = [r for r in rows if r["phase"] == "eval"]
    if not rl and not ev:
        return None
    fig, axes = plt.subplots(1, len(PANELS) + 1, figsize=(4.2 * (len(PANELS) + 1), 3.4))
    for ax, (key, label) in zip(axes, PANELS):
        ax.plot([r["step"] for r in rl if key in r], [r[key] for r in rl if key in r],
                label="train", marker=".")
        ax.plot([r["step"] for r in ev if key in r], [r[key] for r in ev if key in r], "o",
                label="eval")
        ax.set(title=label, xlabel="RL step")
    ax = axes[-1]
    for name in tool_names(rows):
        key = f"tool_share_{name}"
        ax.plot([r["step"] for r in rl if key in r], [r[key] for r in rl if key in r],
                marker=".", label=name)
    ax.set(title="share of tool calls", xlabel="RL step", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_tool_shares(runs: dict[str, pathlib.Path], out: pathlib.Path) -> pathlib.Path:
    """One panel per run (label -> metrics.jsonl): each tool's share of calls per RL step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), squeeze=False)
    for ax, (label, metrics) in zip(axes[0], runs.items()):
        rl = [r for r in _rows(metrics) if r["phase"] == "rl"]
        for name in tool_names(rl):
            key = f"tool_share_{name}"
            ax.plot([r["step"] for r in rl], [r.get(key, 0.0) for r in rl], marker="o",
                    label=name)
        ax.set(title=label, xlabel="GRPO step", ylabel="share of tool calls", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
