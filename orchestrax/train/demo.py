"""`make demo`: warm-start a tiny routing policy on CPU, then train ONE policy by GRPO that routes
by each task's preference vector.

    orchestrax demo [--config configs/demo.py] [--out runs/demo] [--fresh] [--set grpo.steps=4]

Configured as every command is: a `DemoCommand` built from the config file's `config_warmstart()`
and `config()` (and its `OUT`), changed by `--set warmstart.x=..`, `--set grpo.x=..` and the
shorthands --out and --fresh. The file is read relative to the working directory (commands run
from the repository root). It runs a supervised warm start (tools chosen uniformly, never told
which tool a preference favours), then one GRPO run on tasks whose P is drawn per task from the
cost-weighted and latency-weighted training pairs. The table shows, on held-out tasks of each
kind, the preferred tool's share of calls before and after GRPO, as the trainer's evaluation and
`orchestrax eval` measure it, and the GRPO policy's preference adherence against the warm start.
`<out>/preference_shares.png` plots the preferred tool's share per P kind per GRPO step and the
eval numbers. Rerunning resumes every run where it stopped.

The terminal shows the progress bars (each eval's too: the trainer's and `orchestrax eval`'s
episodes), a line per stage, warnings, a line for eval episodes that ended short of an answer
and the tables; every log line of the runs and the `orchestrax eval` output go to
`<out>/demo.log`.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import math
import re
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from orchestrax import models, registry
from orchestrax.agent import chat
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import prompt_messages
from orchestrax.checks import check_fields
from orchestrax.train import console, plots, setup
from orchestrax.train.checkpoint import load_model
from orchestrax.train.train_config import TrainConfig
from orchestrax.train.loop import train
from orchestrax.train.metrics_log import progress

CONFIG = "configs/demo.py"
KINDS = ("cost", "latency")
LOG = "demo.log"   # under --out: the runs' log lines and `orchestrax eval`'s output

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoCommand:
    """Everything `orchestrax demo` is told: the two runs and where they go."""

    warmstart: TrainConfig   # supervised warm start; its step-0 eval is the "before RL" row
    grpo: TrainConfig        # GRPO from the warm start (its init_from names the warm start's run)
    # Base directory: each run's out_dir (and the GRPO run's init_from) become out/<its last
    # path component>.
    out: str = "runs/demo"
    fresh: bool = False      # delete `out` first; otherwise a rerun resumes both runs

    def __post_init__(self):
        check_fields(self)


def config(path: str = CONFIG) -> DemoCommand:
    """The `DemoCommand` of a config file that defines `config_warmstart()` and `config()` (both
    returning a TrainConfig) and optionally `OUT` (the default --out)."""
    if not Path(path).is_file():
        raise ValueError(f"--config {path!r} not found; run from the repository root or give the "
                         f"path of {CONFIG}")
    namespace = runpy.run_path(path)
    missing = [f for f in ("config_warmstart", "config") if f not in namespace]
    if missing:
        raise ValueError(f"--config {path}: no function {missing[0]!r}; a demo config defines "
                         "config_warmstart() and config()")
    return DemoCommand(warmstart=namespace["config_warmstart"](), grpo=namespace["config"](),
                       out=str(namespace.get("OUT", DemoCommand.out)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Shorthands of `DemoCommand` fields (dest = the field); `p` has argument_default SUPPRESS,
    so one not given is absent."""
    p.add_argument("--out", help="base output directory (default: the config file's OUT)")
    p.add_argument("--fresh", action="store_true", help="delete the output directory first")


def runs(cmd: DemoCommand) -> tuple[TrainConfig, TrainConfig]:
    """The warm-start and GRPO TrainConfigs as they run: out_dir and init_from under `cmd.out`."""
    base = Path(cmd.out)
    return tuple(dataclasses.replace(
        c, out_dir=str(base / Path(c.out_dir).name),
        init_from=None if c.init_from is None else str(base / Path(c.init_from).name))
        for c in (cmd.warmstart, cmd.grpo))


def configure_logging(path: Path) -> None:
    """Every orchestrax log line (INFO and up; other libraries' from WARNING) into `path`; the
    terminal gets this module's lines and warnings, not the runs' per-step and checkpoint lines
    (the progress bars show those)."""
    setup.configure_logging()
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s", "%H:%M:%S"))
    # A filter, not a level: the trainer's logging_redirect_tqdm copies a console handler's
    # filters to the handler it puts in its place, but not its level.
    console = logging.StreamHandler()
    console.addFilter(lambda r: r.levelno >= logging.WARNING or r.name == __name__)
    console.setFormatter(_ConsoleFormat())
    logging.getLogger().handlers = [to_file, console]


class _ConsoleFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.name == __name__:
            return record.getMessage()
        return f"{record.levelname} {record.name}: {record.getMessage()}"


def run(cmd: DemoCommand) -> int:
    """Train both runs, evaluate both with `orchestrax eval`, print the table; 0 when done."""
    warm, grpo = runs(cmd)
    base = Path(cmd.out)
    if cmd.fresh:
        shutil.rmtree(base, ignore_errors=True)
    configure_logging(base / LOG)
    log.info("orchestrax demo: runs in %s, every log line in %s", base, base / LOG)
    start = time.perf_counter()
    log.info("warm start: %d supervised steps on demonstrations (tools picked at random), then "
             "an eval", warm.sft_steps)
    train(warm)
    log.info("GRPO: %d steps of one policy; the bar shows the preferred tool's share of calls "
             "per P kind", grpo.steps)
    train(grpo)
    trained = time.perf_counter()
    log.info("orchestrax eval of both policies on the held-out tasks")
    evals = {"warm start": orchestrax_eval(warm, base / "eval_warmstart", None, base / LOG,
                                           "warm start")}
    evals["GRPO"] = orchestrax_eval(grpo, base / "eval_grpo",
                                    base / "eval_warmstart" / "eval.json", base / LOG, "GRPO")
    minutes = ((trained - start) / 60, (time.perf_counter() - trained) / 60)
    rows = [("before RL (warm start)", eval_rows(warm)[-1], evals["warm start"]),
            ("GRPO, one policy", eval_rows(grpo)[-1], evals["GRPO"])]
    print(table(rows, warm))
    print(probability_table([(label, preferred_probabilities(c))
                             for label, c in (("before RL (warm start)", warm),
                                              ("GRPO, one policy", grpo))]))
    png = plots.plot_preference_shares(Path(grpo.out_dir) / "metrics.jsonl", KINDS, evals,
                                       base / "preference_shares.png")
    print(f"\ntraining took {minutes[0]:.1f} min, `orchestrax eval` {minutes[1]:.1f} min\n"
          f"picture: {png} (the preferred tool's share per P kind at every GRPO step and in "
          f"`orchestrax eval`)\nlog: {base / LOG}; metrics: {base}/*/metrics.jsonl "
          f"(TensorBoard: {base}/*/tensorboard)")
    return 0


def table(rows: list[tuple[str, dict[str, Any], dict[str, Any]]], cfg: TrainConfig) -> str:
    """The demo's table: per policy, the preferred tool's share of calls per P kind and the
    accuracy (trainer eval), then `orchestrax eval`'s shares, accuracy and adherence."""
    lines = [f"\npreferred tool's share of calls on held-out tasks per P kind (trainer eval and "
             f"`orchestrax eval` of its checkpoint: {cfg.eval_samples} samples a task at "
             f"T={cfg.eval_temperature:g}, the same seeds)",
             f"{'':24s}{'cost->cheap':>12s}{'latency->fast':>14s}{'accuracy':>9s}"
             f"{' | eval: cost':>13s}{'latency':>8s}{'accuracy':>9s}{'adherence':>10s}"]
    for label, row, ev in rows:
        adh = ev["adherence"]
        lines.append(
            f"{label:24s}{_cell(row.get(console.PREFERRED_SHARE + 'cost'), 12)}"
            f"{_cell(row.get(console.PREFERRED_SHARE + 'latency'), 14)}"
            f"{_cell(row['rollout/accuracy'], 9)}{_cell(ev['share']['cost'], 13)}"
            f"{_cell(ev['share']['latency'], 8)}{_cell(ev['accuracy'], 9)}"
            f"{_cell(adh, 10, '.3f')}")
    if any(math.isnan(ev["share"][k]) for _, _, ev in rows for k in KINDS):
        lines.append("(-: no tool call on that kind's tasks, so no share)")
    return "\n".join(lines)


def preferred_probabilities(cfg: TrainConfig) -> dict[str, float]:
    """Kind -> the policy's probability of the preferred tool's call on the eval split's tasks
    of that kind, averaged over them: the call turn a demonstration writes (the restated
    objective, then the call) teacher-forced after the task's prompt for each tool, at the
    run's sampling temperature, normalised over the tools. No sampling, so none of the eval's
    noise. A policy that ignores P gives the two kinds' preferred tools probabilities that sum
    to 1 (with two tools)."""
    model = load_model(cfg.out_dir)
    codec = Codec(registry.build_tokenizer(cfg.tokenizer))
    env = setup.make_env(cfg)
    names = [t.name for t in cfg.env.tools]
    length = cfg.rollout.context_tokens
    logprobs = jax.jit(lambda ids: jax.nn.log_softmax(
        models.forward(model.cfg, model.params, ids)[0] / cfg.rollout.temperature))
    probs: dict[str, list[float]] = {k: [] for k in KINDS}
    for task in env.tasks("eval"):
        kind = task.metadata["preference_kind"]
        if kind not in probs:
            continue
        prompt = codec.encode_prompt(chat.prompt_parts(
            prompt_messages(task), tools=[t.spec for t in env.tools(task)],
            enable_thinking=cfg.rollout.enable_thinking))
        scores = []
        for name in names:
            call = codec.encode(env.call_turn(task, name))
            ids = np.zeros(length, np.int32)   # right padding: a causal model never sees it
            ids[:len(prompt) + len(call)] = prompt + call
            lp = np.asarray(logprobs(ids[None]))
            scores.append(sum(lp[len(prompt) + i - 1, t] for i, t in enumerate(call)))
        p = np.exp(np.array(scores) - max(scores))
        probs[kind].append(float(p[names.index(task.metadata["preferred_tool"])] / p.sum()))
    return {k: float(np.mean(v)) if v else float("nan") for k, v in probs.items()}


def probability_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = ["\nthe policy's probability of the preferred tool's call per P kind (teacher-forced "
             "on the same held-out tasks, no sampling)",
             f"{'':24s}{'cost->cheap':>12s}{'latency->fast':>14s}"]
    lines += [f"{label:24s}{_cell(p['cost'], 12)}{_cell(p['latency'], 14)}" for label, p in rows]
    return "\n".join(lines)


def _cell(x: float | None, width: int, fmt: str = ".2f") -> str:
    """`x` right-aligned in `width`, or '-' where it is missing or NaN (a share of no calls)."""
    return f"{'-' if x is None or math.isnan(x) else format(x, fmt):>{width}s}"


def orchestrax_eval(cfg: TrainConfig, out: Path, baseline: Path | None, log_path: Path,
                    label: str) -> dict[str, Any]:
    """`orchestrax eval` of a run dir on the routing task set (episode settings and the routing
    env from the run's own config), its output appended to `log_path` and its episodes counted
    on a bar named by `label`: {"adherence" (against `baseline`'s eval.json, None without),
    "accuracy", "share": {kind: the preferred tool's share of calls on that kind's tasks, the
    env's `preferred_share_<kind>` as the trainer's eval computes it}}. Episodes that ended
    short of a tool's answer are said in one line."""
    # The command itself, in its own process: the trainer's layer does not import eval's.
    argv = [sys.executable, "-m", "orchestrax.cli", "eval", "--policy", cfg.out_dir,
            "--tasks", "routing", "--turn-sweep", "", "--out", str(out)]
    argv += ["--baseline", str(baseline)] if baseline else []
    # Shown from the start: the command loads the policy and compiles its sampler (~10 s)
    # before its first episode, when its own bar says how many there are.
    bar = progress(None, 0, f"orchestrax eval, {label}", unit="episode", leave=False)
    bar.bar_format = "{desc}: starting"
    bar.refresh()

    def count(done: int, total: int) -> None:
        if bar.total != total:
            bar.bar_format = None   # tqdm's own, now that there is a total
            bar.reset(total)
        bar.update(done - bar.n)

    try:
        code, lines = run_logged(argv, log_path, count)
    finally:
        bar.close()
    if code:
        tail = "\n".join(lines[-20:])
        raise SystemExit(f"{tail}\norchestrax eval of {cfg.out_dir} failed (exit "
                         f"{code}); its output is in {log_path}")
    payload = json.loads((out / "eval.json").read_text())
    (row,) = payload["rows"]
    short = short_episodes([r for recs in payload["records"].values() for r in recs])
    if short:
        log.info("orchestrax eval, %s: %s (each episode in %s)", label, short, out / "eval.json")
    env = row.get("env", {})   # the routing env's own stats, as the trainer's eval rows log them
    return {"adherence": row["adherence"], "accuracy": row["accuracy"],
            "share": {k: env.get(f"preferred_share_{k}", math.nan) for k in KINDS}}


# tqdm's frame "desc:  50%|█████     | 32/64 [00:05<00:05, ...": the episodes done and in all.
_FRAME = re.compile(rb"\| *(\d+)/(\d+) \[")


def run_logged(argv: list[str], log_path: Path, on_progress: Callable[[int, int], None]
               ) -> tuple[int, list[str]]:
    """Run `argv`, its output lines appended to `log_path` as they come; the progress-bar
    frames it draws (tqdm's, ended by a carriage return) go to `on_progress(done, total)`
    instead. Returns its exit code and output lines."""
    lines: list[str] = []
    with log_path.open("a") as f:
        f.write(f"$ {' '.join(argv)}\n")
        f.flush()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        pending = b""
        while chunk := proc.stdout.read1(65536):
            *segments, pending = re.split(rb"(\r\n|\r|\n)", pending + chunk)
            for text, end in zip(segments[::2], segments[1::2]):
                if end == b"\r":   # a bar's frame, or the blank one that erases it
                    if frame := _FRAME.search(text):
                        on_progress(int(frame[1]), int(frame[2]))
                    if frame or not text.strip():
                        continue
                lines.append(text.decode(errors="replace"))
                f.write(lines[-1] + "\n")
                f.flush()
        if pending.strip():
            lines.append(pending.decode(errors="replace"))
            f.write(lines[-1] + "\n")
    return proc.wait(), lines


# Why an eval episode ended before answering (`EpisodeRecord.end_reason`), as the user reads it.
# A failed one ("error") fails `orchestrax eval` itself.
_SHORT = {"context": "cut at the context limit", "max_turns": "out of turns"}


def short_episodes(records: list[dict[str, Any]]) -> str:
    """How many of an eval's episodes (eval.json records) ended before answering, and why, and
    how many answered with no valid tool call (a routing task's answer comes from a tool): what
    an accuracy below 1 is made of; "" when none."""
    counts = collections.Counter()
    for r in records:
        if r["end_reason"] != "answer":
            counts[_SHORT.get(r["end_reason"], r["end_reason"])] += 1
        elif not r["calls"]:
            counts["answered with no valid tool call"] += 1
    return "" if not counts else f"of {len(records)} episodes, " + ", ".join(
        f"{n} {why}" for why, n in counts.most_common())


def eval_rows(cfg: TrainConfig) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in
            (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "eval"]

