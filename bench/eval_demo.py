"""The demo's trained policy vs its warm start vs a prompted baseline, measured by `orchestrax
eval` on held-out routing tasks and one QA set: accuracy, cents and minutes per task, calls per
tool, preference adherence (against the warm start).

    python bench/eval_demo.py [--demo runs/demo] [--out runs/eval_demo] [--rl-steps 8]

Policies: the GRPO "cost" run and its warm start from `--demo` (trained here, shorter, when
`<demo>/cost` has no checkpoint), both on the embedded sampler; the prompted baseline is the
warm-start weights served by `orchestrax serve` and driven through its OpenAI-compatible chat
API (text protocol, same prompt and tools). No real prompted LLM runs on this box, so the
baseline shows the path, not a strong competitor. QA tools: BM25 local search over the shared
wiki corpus and the sandboxed Python tool (when bwrap is installed), priced by `train_list`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import pathlib
import runpy
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import peak_rss_mib, record  # noqa: E402

from orchestrax.agent.episode import EpisodeConfig  # noqa: E402
from orchestrax.eval.suite import EvalRun, run_eval, write_outputs  # noqa: E402
from orchestrax.eval.policy import load_policy  # noqa: E402
from orchestrax.eval.report import table  # noqa: E402
from orchestrax.eval.runners import EvalConfig  # noqa: E402
from orchestrax.eval.tasksets import TaskSetOptions, data_dir  # noqa: E402
from orchestrax.rollout.sampler import SamplingParams  # noqa: E402


def trained_runs(demo: pathlib.Path, sft_steps: int,
                 rl_steps: int) -> tuple[pathlib.Path, pathlib.Path]:
    """(warm start run dir, cost run dir); trains them (shorter than the demo) when absent."""
    warm, cost = demo / "warmstart", demo / "cost"
    if (cost / "checkpoints").is_dir() and any((cost / "checkpoints").iterdir()):
        return warm, cost
    from orchestrax.train.loop import train
    from orchestrax.train.setup import configure_logging
    configure_logging()
    configs = runpy.run_path(str(ROOT / "configs" / "demo.py"))
    w = dataclasses.replace(configs["config_warmstart"](), out_dir=str(warm), eval_every=0,
                            sft_steps=sft_steps)
    c = dataclasses.replace(configs["config"]("cost"), out_dir=str(cost), init_from=str(warm),
                            steps=rl_steps, eval_every=0)
    t0 = time.perf_counter()
    train(w)
    train(c)
    print(f"trained {sft_steps} warm-start + {rl_steps} GRPO steps in "
          f"{time.perf_counter() - t0:.0f} s")
    return warm, cost


def qa_catalog():
    import shutil

    from orchestrax.tools.catalog import CatalogConfig, build_catalog
    from orchestrax.tools.sandbox import SandboxConfig
    from orchestrax.tools.search_index import SearchIndexConfig
    corpus = data_dir() / "corpus" / "wiki_summaries_en.json"
    return build_catalog(CatalogConfig(
        python=SandboxConfig() if shutil.which("bwrap") else None, web=None,
        search=SearchIndexConfig(corpus_path=str(corpus), backend="bm25"), sheet="train_list"))


DIRS = {"warm start": "warm_start", "GRPO cost": "grpo_cost", "prompted (serve)": "prompted"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", default="runs/demo")
    ap.add_argument("--out", default="runs/eval_demo")
    ap.add_argument("--sft-steps", type=int, default=100, help="when training here")
    ap.add_argument("--rl-steps", type=int, default=8, help="when training here")
    ap.add_argument("--qa", default="bamboogle")
    ap.add_argument("--limit", type=int, default=32, help="tasks per set")
    ap.add_argument("--temperature", type=float, default=0.7, help="the demo's eval temperature")
    ap.add_argument("--seconds-per-token", type=float, default=0.01,
                    help="policy generation time charged per token (a notional 100 tok/s)")
    args = ap.parse_args()
    warm, cost = trained_runs(pathlib.Path(args.demo), args.sft_steps, args.rl_steps)
    out = pathlib.Path(args.out)
    export = runpy.run_path(str(ROOT / "tools" / "export_hf.py"))["export"]
    hf_warm = export(str(warm), str(out / "hf_warmstart"))

    # The demo's own episode shape (3 turns, 48 new tokens) and sampling temperature: greedy,
    # the warm start already calls the cheap tool everywhere, so greedy runs cannot show what
    # GRPO changed. Generation time is charged per token: measured wall time on this shared
    # box is mostly JIT compilation and other people's jobs, which would decide the latency
    # feature (and so preference adherence) by noise.
    cfg = EvalConfig(episode=EpisodeConfig(max_turns=3, max_new_tokens=48, context_tokens=2048,
                                           enable_thinking=False,
                                           sampling=SamplingParams(temperature=args.temperature)),
                     seconds_per_token=args.seconds_per_token)
    sweep = (1, 2) if args.temperature == 0 else ()  # at T > 0 every limit is its own run
    options = TaskSetOptions(limit=args.limit, tools=qa_catalog())
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "orchestrax.cli", "serve", "--model",
                               str(hf_warm), "--port", str(port), "--max-len", "2048",
                               "--served-model-name", "warmstart-prompted"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "listening" in server.stdout.readline()
        rows, walls = [], {}
        for label, spec in (("warm start", str(warm)), ("GRPO cost", str(cost)),
                            ("prompted (serve)", f"openai:http://127.0.0.1:{port}/v1")):
            baseline = None if label == "warm start" else str(out / DIRS["warm start"] / "eval.json")
            run = EvalRun(task_sets=("routing", args.qa), cfg=cfg, turn_limits=sweep,
                          options=options, baseline=baseline)
            policy = load_policy(spec, model="warmstart-prompted", max_len=2048)

            async def go(policy=policy, run=run):
                try:
                    return await run_eval(policy, run)
                finally:
                    await policy.aclose()

            t0 = time.perf_counter()
            payload = asyncio.run(go())
            walls[label] = time.perf_counter() - t0
            write_outputs(payload, out / DIRS[label])
            for r in payload["rows"]:
                if r["turn_limit"] == 3:
                    rows.append(dict(r, task_set=f"{r['task_set']}:{label}"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(table(rows))
    by = {(r["task_set"].split(":")[0], r["task_set"].split(":", 1)[1]): r for r in rows}
    parts = []
    for ts in ("routing", args.qa):
        w, c, p = by[(ts, "warm start")], by[(ts, "GRPO cost")], by[(ts, "prompted (serve)")]
        parts.append(
            f"{ts} ({w['tasks']} tasks): accuracy warm {w['accuracy']:.3f} / GRPO-cost "
            f"{c['accuracy']:.3f} / prompted {p['accuracy']:.3f}; cents/task {w['cents_per_task']:.4f} "
            f"/ {c['cents_per_task']:.4f} / {p['cents_per_task']:.4f} (GRPO/warm "
            f"{c['cents_per_task'] / max(w['cents_per_task'], 1e-12):.2f}x); min/task "
            f"{w['minutes_per_task']:.4f} / {c['minutes_per_task']:.4f} / {p['minutes_per_task']:.4f}; "
            f"calls/task {fmt_calls(w)} / {fmt_calls(c)} / {fmt_calls(p)}; preference adherence "
            f"vs warm start: GRPO {c['adherence']:.3f}, prompted {p['adherence']:.3f}")
    record(f"eval_demo (CPU, 2 shared cores, T={args.temperature}, 3 turns, "
           f"{args.seconds_per_token} s per generated token): " + "; ".join(parts)
           + f"; wall s warm/GRPO/prompted {walls['warm start']:.0f}/{walls['GRPO cost']:.0f}/"
           f"{walls['prompted (serve)']:.0f}; peak RSS {peak_rss_mib():,.0f} MiB "
           f"(python bench/eval_demo.py)")


def fmt_calls(row) -> str:
    return "{" + ", ".join(f"{k}: {v:.2f}" for k, v in row["calls_per_task"].items()) + "}"


if __name__ == "__main__":
    main()
