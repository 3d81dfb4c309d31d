"""What a run prints per logged row: one short line (step N/total, a few numbers, rate, ETA) that
reads the same on a terminal and in a log file, the progress bar's postfix, warnings for steps
that trained on nothing, and the run's eval settings that differ from its training rollouts.
The full row stays in metrics.jsonl and TensorBoard."""

from __future__ import annotations

import datetime
import math
import time
from typing import Any, Sequence

# (row key, label, format) shown per phase, in this order, when present.
SHOWN = {
    "sft": (("train/loss", "loss", "{:.4g}"),),
    "rl": (("rollout/reward_mean", "reward", "{:.3g}"), ("rollout/accuracy", "acc", "{:.3g}"),
           ("rollout/cost_mean", "cost", "{:.3g}"), ("filter/kept_fraction", "kept", "{:.2f}"),
           ("train/loss", "loss", "{:.3g}"), ("train/kl", "kl", "{:.3g}"),
           ("train/grad_norm", "grad", "{:.3g}")),
    "eval": (("rollout/accuracy", "acc", "{:.3g}"), ("rollout/cost_mean", "cost", "{:.3g}"),
             ("rollout/latency_mean", "latency", "{:.3g}")),
}


class Clock:
    """Seconds per step and time left, per phase, from the wall time between logged rows."""

    def __init__(self, now=time.monotonic):
        self._now = now
        self._first: dict[str, tuple[int, float]] = {}

    def rate(self, phase: str, step: int) -> float | None:
        """Mean seconds per step of `phase` since its first logged row (None until two rows)."""
        t = self._now()
        first = self._first.setdefault(phase, (step, t))
        done = step - first[0]
        return (t - first[1]) / done if done > 0 else None


def _eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(round(seconds))))


def line(row: dict[str, Any], total: int | None, clock: Clock) -> str:
    phase, step = row["phase"], row["step"]
    head = f"{phase} step {step}/{total}" if total else f"{phase} at step {step}"
    cells = [f"{label} {fmt.format(row[key])}" for key, label, fmt in SHOWN.get(phase, ())
             if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
    text = head + "  " + "  ".join(cells)
    if total and phase != "eval":
        per_step = clock.rate(phase, step)
        if per_step is not None:
            text += f"  | {per_step:.3g} s/step, ETA {_eta(per_step * max(0, total - step))}"
    return text


PREFERRED_SHARE = "env/preferred_share_"   # an env's share of calls to each P kind's preferred tool


def bar_postfix(row: dict[str, Any]) -> str:
    """The progress bar's postfix for a row: an SFT row's loss; an RL row's preferred tool's
    share of calls per P kind (what a routing env learns, when its stats report it), else its
    reward; then its accuracy."""
    def num(key: str) -> float | None:
        v = row.get(key)
        return v if isinstance(v, (int, float)) and math.isfinite(v) else None

    if row["phase"] == "sft":
        return "" if num("train/loss") is None else f"loss {num('train/loss'):.4g}"
    shares = [f"{k.removeprefix(PREFERRED_SHARE)} {row[k]:.2f}" for k in sorted(row)
              if k.startswith(PREFERRED_SHARE) and num(k) is not None]
    cells = ([f"preferred tool {', '.join(shares)}"] if shares
             else [f"reward {num('rollout/reward_mean'):.3g}"]
             if num("rollout/reward_mean") is not None else [])
    if num("rollout/accuracy") is not None:
        cells.append(f"acc {num('rollout/accuracy'):.2f}")
    return "; ".join(cells)


def degenerate(row: dict[str, Any]) -> Sequence[str]:
    """Why an RL step's update learned nothing, if it did not."""
    if row["phase"] != "rl":
        return []
    out = []
    if row.get("rollout/format_error_rate") == 1.0:
        out.append("every rollout had a format error: check the chat template, "
                   "rollout.enable_thinking and max_new_tokens")
    if row.get("filter/kept") == 0:
        out.append("no rollout kept by the filters (every group homogeneous or malformed): "
                   "this update trained on nothing")
    elif row.get("train/grad_norm") == 0.0:
        out.append("gradient norm is 0: this update changed nothing")
    return out


def eval_differences(cfg: Any) -> Sequence[str]:
    """How a TrainConfig's eval rows sample differently from its training rollouts (said once
    at start, so an eval accuracy is not read as the training one's)."""
    r, out = cfg.rollout, []
    if cfg.eval_every and cfg.eval_temperature != r.temperature:
        how = "greedy" if cfg.eval_temperature == 0 else f"at T={cfg.eval_temperature:g}"
        out.append(f"eval rows decode {how} (eval_temperature), training rollouts sample at "
                   f"T={r.temperature:g} (rollout.temperature)")
    if cfg.eval_every and cfg.eval_samples != r.group_size and cfg.eval_temperature > 0:
        out.append(f"eval rows average {cfg.eval_samples} sample(s) a task (eval_samples), "
                   f"training rollouts {r.group_size} (rollout.group_size)")
    return out
