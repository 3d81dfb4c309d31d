"""PNG plots of a run's metrics.jsonl, drawn at the end of the run (matplotlib, no display)."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

import numpy as np

from orchestrax.train import console

# (title, phase -> row key); a panel is drawn only when some row has one of its keys.
PANELS = (("SFT loss", {"sft": "train/loss"}),
          ("reward", {"rl": "rollout/reward_mean"}),
          ("accuracy", {"rl": "rollout/accuracy", "eval": "rollout/accuracy"}),
          ("cost ($)", {"rl": "rollout/cost_mean", "eval": "rollout/cost_mean"}),
          ("policy loss", {"rl": "train/loss"}),
          ("KL to reference", {"rl": "train/kl"}),
          ("kept fraction", {"rl": "filter/kept_fraction"}))
_STYLE = {"sft": ("warm start", "-"), "rl": ("train", ".-"), "eval": ("eval", "o")}


def _rows(metrics: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def tool_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({k.removeprefix("env/tool_share_") for r in rows for k in r
                   if k.startswith("env/tool_share_")})


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
        key = f"env/tool_share_{name}"
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


def plot_preference_shares(metrics: pathlib.Path, kinds: Sequence[str],
                           evals: dict[str, dict[str, Any]], out: pathlib.Path) -> pathlib.Path:
    """Left: per RL step, the preferred tool's share of calls on each preference kind's tasks
    (`env/preferred_share_<kind>`; training rollouts as lines, evaluations as dots). Right: per
    policy (label -> {"share": {kind: share}, "adherence": float | None}, e.g. from
    `orchestrax eval`), those shares as bars, the adherence in the label."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = _rows(metrics)
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, kind in enumerate(kinds):
        key = console.PREFERRED_SHARE + kind
        for phase, style in (("rl", ".-"), ("eval", "o")):
            got = [r for r in rows if r["phase"] == phase and key in r]
            ax.plot([r["step"] for r in got], [r[key] for r in got], style, color=f"C{i}",
                    label=f"P weighs {kind}" + (" (eval)" if phase == "eval" else ""))
    ax.set(title="one policy: preferred tool's share of calls", xlabel="GRPO step",
           ylabel="share of calls", ylim=(-0.02, 1.02))
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    width = 0.8 / max(1, len(evals))
    for i, (label, ev) in enumerate(evals.items()):
        adh = ev.get("adherence")
        drawn = bars.bar([k + (i - (len(evals) - 1) / 2) * width for k in range(len(kinds))],
                         [ev["share"][kind] for kind in kinds], width,
                         label=label + ("" if adh is None else f" (adherence {adh:.2f})"))
        bars.bar_label(drawn, fmt="%.2f", fontsize=7)
    bars.set_xticks(range(len(kinds)), [f"P weighs {k}" for k in kinds])
    bars.set(title="orchestrax eval: preferred tool's share", ylabel="share of calls",
             ylim=(0, 1.25), yticks=np.linspace(0, 1, 6))
    ax.legend(fontsize=7, loc="lower right")
    bars.legend(fontsize=7, loc="upper center", ncol=2)
    for a in (ax, bars):
        a.grid(alpha=0.3)
    # The step-0 dots and the warm-start bars score the same policy on the same tasks, sampled
    # with other seeds (an eval is seeded by its run's global step).
    fig.text(0.01, 0.01, "Lines: each GRPO step's training rollouts. Dots: the GRPO run's "
             "evaluations on the held-out tasks; at step 0 that is the warm start,\nsampled with "
             "other seeds than the warm-start bars on the right, so the two differ by the "
             "evaluation's sampling noise.", fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
