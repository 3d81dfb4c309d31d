"""`orchestrax synth`: tasks (and optionally whole domains) for tau2-format domains from any
OpenAI-compatible generator.

    orchestrax synth --out runs/synth --domain ../shared/data/toolscale/bank \
        --domain ../shared/data/toolscale/movie --base-url http://127.0.0.1:30000/v1 \
        --model orchestrax --usd-per-m-input 0.15 --usd-per-m-output 0.6 --budget-usd 5

Rerunning the same command resumes (finished stages are read back; paid calls come from the
ledger `<out>/calls.jsonl`). Prints the report (also `<out>/report.json`) and, on stderr, a
summary per domain; exits 4 when no task was kept (3: the budget stopped it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys

from orchestrax.synth.generator import BudgetExhausted, Generator, GeneratorConfig
from orchestrax.synth.pipeline import SynthConfig, run as run_pipeline, summary
from orchestrax.tools.chat_client import ChatEndpoint


def _describe(text: str) -> tuple[str, str]:
    name, sep, description = text.partition("=")
    if not sep or not description.strip():
        raise argparse.ArgumentTypeError(f"--describe {text!r}: write NAME=one paragraph")
    return name.strip(), description.strip()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory (rerun to resume)")
    p.add_argument("--domain", action="append", default=[], metavar="FOLDER",
                   help="a tau2-format domain folder to write tasks for (repeatable)")
    p.add_argument("--describe", action="append", default=[], type=_describe,
                   metavar="NAME=TEXT", help="generate a domain from a description first")
    p.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint of the generator")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key-env", help="environment variable holding the endpoint's key")
    p.add_argument("--tasks-per-domain", type=int, default=8)
    p.add_argument("--no-evolve", action="store_true", help="skip the evolve stage")
    p.add_argument("--concurrency", type=int, default=8, help="generator requests at once")
    p.add_argument("--usd-per-m-input", type=float, default=0.0, help="$ per 1M prompt tokens")
    p.add_argument("--usd-per-m-output", type=float, default=0.0, help="$ per 1M output tokens")
    p.add_argument("--budget-usd", type=float, help="stop once this much is spent")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    endpoint = ChatEndpoint(base_url=args.base_url, model=args.model,
                            api_key_env=args.api_key_env, max_tokens=args.max_tokens,
                            temperature=args.temperature, seed=args.seed)
    gen_cfg = GeneratorConfig(endpoint=endpoint, concurrency=args.concurrency,
                              usd_per_m_input=args.usd_per_m_input,
                              usd_per_m_output=args.usd_per_m_output, budget_usd=args.budget_usd)
    cfg = SynthConfig(out_dir=args.out, domains=tuple(args.domain), describe=tuple(args.describe),
                      tasks_per_domain=args.tasks_per_domain, evolve=not args.no_evolve,
                      seed=args.seed)

    async def go() -> dict:
        pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
        async with Generator(gen_cfg, pathlib.Path(args.out) / "calls.jsonl",
                             progress=not args.no_progress) as gen:
            return await run_pipeline(cfg, gen)

    try:
        result = asyncio.run(go())
    except BudgetExhausted as e:
        print(f"synth stopped: {e}; rerun with a larger --budget-usd to resume", file=sys.stderr)
        return 3
    print(json.dumps(result, indent=1))
    print(summary(result), file=sys.stderr)
    return 0 if result["tasks_kept"] else 4
