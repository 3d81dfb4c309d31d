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
import dataclasses
import json
import pathlib
import sys

from orchestrax.checks import check_fields, require
from orchestrax.synth.generator import BudgetExhausted, Generator, GeneratorConfig
from orchestrax.synth.pipeline import SynthConfig, run as run_pipeline, summary
from orchestrax.tools.chat_client import ChatEndpoint


@dataclasses.dataclass(frozen=True, kw_only=True)
class SynthCommand:
    """Everything `orchestrax synth` is told: a `--config` function returns one, `--set` and the
    flags (shorthands of these fields) change it."""

    out: str = ""                           # output directory (rerun to resume)
    domains: tuple[str, ...] = ()           # tau2-format domain folders to write tasks for
    describe: tuple[tuple[str, str], ...] = ()  # (name, paragraph) of domains to generate first
    base_url: str = ""                      # OpenAI-compatible endpoint of the generator
    model: str = ""
    api_key_env: str | None = None          # environment variable holding the endpoint's key
    tasks_per_domain: int = 8
    evolve: bool = True
    concurrency: int = 8                    # generator requests at once
    usd_per_m_input: float = 0.0            # $ per 1M prompt tokens
    usd_per_m_output: float = 0.0           # $ per 1M output tokens
    budget_usd: float | None = None         # stop once this much is spent
    max_tokens: int = 2048
    temperature: float = 0.7
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        check_fields(self)

    def parts(self) -> tuple[SynthConfig, GeneratorConfig]:
        """The pipeline's and the generator's configs (each checks its own fields)."""
        for name, flag in (("out", "--out DIR"), ("base_url", "--base-url URL"),
                           ("model", "--model NAME")):
            require(bool(getattr(self, name)), self, name, getattr(self, name), f"given ({flag})")
        endpoint = ChatEndpoint(base_url=self.base_url, model=self.model,
                                api_key_env=self.api_key_env, max_tokens=self.max_tokens,
                                temperature=self.temperature, seed=self.seed)
        generator = GeneratorConfig(endpoint=endpoint, concurrency=self.concurrency,
                                    usd_per_m_input=self.usd_per_m_input,
                                    usd_per_m_output=self.usd_per_m_output,
                                    budget_usd=self.budget_usd)
        return SynthConfig(out_dir=self.out, domains=self.domains, describe=self.describe,
                           tasks_per_domain=self.tasks_per_domain, evolve=self.evolve,
                           seed=self.seed), generator


def config() -> SynthCommand:
    """What `orchestrax synth` starts from without --config (its flags then say the rest)."""
    return SynthCommand()


def _describe(text: str) -> tuple[str, str]:
    name, sep, description = text.partition("=")
    if not sep or not description.strip():
        raise argparse.ArgumentTypeError(f"--describe {text!r}: write NAME=one paragraph")
    return name.strip(), description.strip()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Shorthands of `SynthCommand` fields (dest = the field); `p` has argument_default
    SUPPRESS, so a flag not given is absent."""
    p.add_argument("--out", help="output directory (rerun to resume)")
    p.add_argument("--domain", dest="domains", action="append", metavar="FOLDER",
                   help="a tau2-format domain folder to write tasks for (repeatable)")
    p.add_argument("--describe", action="append", type=_describe, metavar="NAME=TEXT",
                   help="generate a domain from a description first (repeatable)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint of the generator")
    p.add_argument("--model")
    p.add_argument("--api-key-env", help="environment variable holding the endpoint's key")
    p.add_argument("--tasks-per-domain", type=int, help="8")
    p.add_argument("--no-evolve", dest="evolve", action="store_false",
                   help="skip the evolve stage")
    p.add_argument("--concurrency", type=int, help="generator requests at once (8)")
    p.add_argument("--usd-per-m-input", type=float, help="$ per 1M prompt tokens (0)")
    p.add_argument("--usd-per-m-output", type=float, help="$ per 1M output tokens (0)")
    p.add_argument("--budget-usd", type=float, help="stop once this much is spent")
    p.add_argument("--max-tokens", type=int, help="2048")
    p.add_argument("--temperature", type=float, help="0.7")
    p.add_argument("--seed", type=int, help="0")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def run(cmd: SynthCommand) -> int:
    cfg, gen_cfg = cmd.parts()

    async def go() -> dict:
        pathlib.Path(cmd.out).mkdir(parents=True, exist_ok=True)
        async with Generator(gen_cfg, pathlib.Path(cmd.out) / "calls.jsonl",
                             progress=cmd.progress) as gen:
            return await run_pipeline(cfg, gen)

    try:
        result = asyncio.run(go())
    except BudgetExhausted as e:
        print(f"synth stopped: {e}; rerun with a larger --budget-usd to resume", file=sys.stderr)
        return 3
    print(json.dumps(result, indent=1))
    print(summary(result), file=sys.stderr)
    return 0 if result["tasks_kept"] else 4
