"""PNG plots of a run's metrics.jsonl, drawn at the end of the run (matplotlib, no display)."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

# (title, phase -> row key); a panel is drawn only when some row has one of its keys.
PANELS = (("SFT loss", {"sft": "loss"}),
          ("reward", {"rl": "reward_mean"}),
          ("accuracy", {"rl": "accuracy", "eval": "accuracy"}),
          ("cost ($)", {"rl": "cost_mean", "eval": "cost_mean"}),
          ("policy loss", {"rl": "loss"}),
          ("KL to reference", {"rl": "kl"}),
          ("kept fraction", {"rl": "filter/kept_fraction"}))
_STYLE = {"sft": ("warm start", "-"), "rl": ("train", ".-"), "eval": ("eval", "o")}


def _rows(metrics: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def tool_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({k.removeprefix("tool_share_") for r in rows for k in r
                   if k.startswith("tool_share_")})


def panels(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[tuple[str, list, list, str]]]]:
    """(title, [(label, steps, values, style)]) for every panel that has data: the panels of
    PANELS, then each tool's share of calls per RL step."""
    out = []
    for title, keys in PANELS:
        series = []
        for phase, key in keys.items():
            pts = [(r["step"], r[key]) for r in rows if r["phase"] == phase
                   and isinstance(r.get(key), (int, float))]
            if pts:
                label, style = _STYLE[phase]
                series.append((label, [x for x, _ in pts], [y for _, y in pts], style))
        if series:
            out.append((title, series))
    shares = []
    for name in tool_names(rows):
        key = f"tool_share_{name}"
        pts = [(r["step"], r[key]) for r in rows if r["phase"] == "rl" and key in r]
        if pts:
            shares.append((name, [x for x, _ in pts], [y for _, y in pts], ".-"))
    if shares:
        out.append(("share of tool calls", shares))
    return out


def plot_run(metrics: pathlib.Path, out: pathlib.Path) -> pathlib.Path | None:
    """The panels of `panels` into `out` (steps of each phase on the x axis: warm-start steps
    for the SFT loss, RL steps for the rest); None when no row has anything to plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = panels(_rows(metrics))
    if not drawn:
        return None
    cols = min(4, len(drawn))
    nrows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for ax, (title, series) in zip(axes.flat, drawn):
        for label, xs, ys, style in series:
            ax.plot(xs, ys, style, label=label)
        ax.set(title=title, xlabel="SFT step" if title == "SFT loss" else "RL step")
        if title == "share of tool calls":
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(drawn):]:
        ax.remove()
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
