"""`orchestrax eval`: one policy over task sets; table, JSON, CSV and plots.

    orchestrax eval --policy runs/demo/grpo --tasks routing --tokenizer tiny
    orchestrax eval --policy openai:http://127.0.0.1:30000/v1 --model qwen3-8b --tasks frames \
        --train-config configs/qwen3_8b_gpu.py --sheet eval_heldout \
        --baseline runs/eval_base/eval.json

Configured like every command: `--config` (a function returning an `EvalCommand`), `--set
field=value`, and flags that are shorthands of its fields. The evaluation itself is `eval.suite`
(one policy over task sets) and `eval.grid` (the paper's agent × thinking × ablation grid); this
module holds the command's config and calls them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import pathlib
import sys
from typing import Any

from orchestrax import registry
from orchestrax.checks import at_least_or_none, one_of, require
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig
from orchestrax.envs.routing import LookupTool, RoutingConfig
from orchestrax.eval import grid, report
from orchestrax.eval.policy import PARAM_DTYPES, load_policy
from orchestrax.eval.runners import EvalConfig
from orchestrax.eval.suite import DEFAULT_SWEEP, EvalRun, run_eval, write_outputs
from orchestrax.eval.tasksets import TaskSetOptions
from orchestrax.rollout.sampler import SamplingParams
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.train import compile_cache
from orchestrax.train.compile_cache import FLAG_HELP as COMPILE_CACHE_HELP
from orchestrax.train.arg_types import at_least, tokenizer_dir
from orchestrax.train.overrides import add_arguments as add_config_arguments


def _endpoint(url: str | None, model: str | None, key_env: str | None, flag: str):
    if url is None:
        return None
    if not model:
        raise ValueError(f"--{flag}-url needs --{flag}-model")
    return ChatEndpoint(base_url=url, model=model, api_key_env=key_env)


def _catalog(config: str | None, sheet: str | None):
    """The tool set and pricing of a TrainConfig (its `tools` field), optionally repriced by
    `sheet` (e.g. the held-out eval sheet), and its env config if that is a routing one; None,
    None without --config."""
    if config is None:
        return None, None
    from orchestrax.train.overrides import load_config
    cfg = load_config(config)
    routing = cfg.env if isinstance(cfg.env, RoutingConfig) else None
    if cfg.tools is None:
        return None, routing
    catalog_cfg = cfg.tools if sheet is None else dataclasses.replace(cfg.tools, sheet=sheet)
    return registry.build_catalog(catalog_cfg), routing


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalCommand:
    """What `orchestrax eval` measures and how; each field has the flag of the same name
    (`--no-thinking`/`--thinking-on` set `enable_thinking`). The help of `orchestrax eval -h`
    says what each means; None: the policy's training run decides, else DEFAULTS."""
    policy: str = ""                  # run dir | HF dir | sglang:URL | openai:URL
    tasks: tuple[str, ...] = ()
    model: str | None = None
    api_key_env: str | None = None
    tokenizer: str | None = None
    split: str | None = None
    limit: int | None = None
    train_config: str | None = None   # configs/x.py[:fn] whose TrainConfig gives tools, pricing
    sheet: str | None = None
    policy_price: str | None = None
    agent: str = "direct"
    thinking: str | None = None
    ablate: str = "none"
    subagent_policy: str | None = None
    subagent_price: str | None = None
    experts: str | None = None        # --agent orchestrator8b: slot -> endpoint JSON
    protocol_tools: str | None = None  # --agent orchestrator8b: the released tools.json
    protocol_format_errors: int | None = None  # --agent orchestrator8b; None: the released eval's
    max_turns: int | None = None
    turn_sweep: str | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    context_tokens: int | None = None
    param_dtype: str = "float32"
    enable_thinking: bool | None = None
    max_error_rate: float = 0.0
    seconds_per_token: float | None = None
    max_in_flight: int = 64
    grader: str | None = None
    judge_url: str | None = None
    judge_model: str | None = None
    judge_key_env: str | None = None
    user_url: str | None = None
    user_model: str | None = None
    user_key_env: str | None = None
    baseline: str | None = None
    seed: int | None = None
    samples: int | None = None
    no_preferences: bool = False
    out: str = "runs/eval"
    no_progress: bool = False
    compile_cache_dir: str | None = compile_cache.DEFAULT_DIR  # None: no persistent cache

    def __post_init__(self):
        at_least_or_none(self, 1, "limit", "max_turns", "max_new_tokens", "context_tokens",
                         "max_in_flight", "samples", "protocol_format_errors")
        for name, allowed in (("param_dtype", PARAM_DTYPES), ("grader", GRADERS)):
            one_of(self, name, getattr(self, name), allowed)
        compile_cache.check_dir(self)
        require(0 <= self.max_error_rate <= 1, self, "max_error_rate", self.max_error_rate,
                "in [0, 1]")


GRADERS = (None, "exact", "math", "judge")


def config() -> EvalCommand:
    """What `orchestrax eval` starts from without --config (--policy and --tasks then needed)."""
    return EvalCommand()


# What eval assumes when neither a flag nor the policy's run says otherwise.
# seconds_per_token None: the policy's latency is its measured generation time.
DEFAULTS = {"enable_thinking": True, "max_new_tokens": 4096, "max_turns": 50,
            "context_tokens": 32_768, "temperature": 0.0, "samples": 1, "seed": 0,
            "seconds_per_token": None}
_FLAG = {"enable_thinking": "--thinking-on/--no-thinking", "max_new_tokens": "--max-new-tokens",
         "max_turns": "--max-turns", "context_tokens": "--context-tokens",
         "temperature": "--temperature", "samples": "--samples", "seed": "--seed",
         "seconds_per_token": "--seconds-per-token"}
# Followed from the run with no flag of their own (its eval's sampler and task set).
_RUN_ONLY = {"top_p": 1.0, "top_k": -1, "sampler_max_batch": 64,
             "eval_tasks": None, "eval_sheet": None}


def routing_from_json(fields: dict[str, Any]) -> RoutingConfig:
    """The RoutingConfig a run's train_config.json holds (lists back to tuples)."""
    return RoutingConfig(**{k: tuple(LookupTool(**t) for t in v) if k == "tools" else
                            tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def resolve_settings(args: EvalCommand) -> tuple[dict[str, Any], list[str]]:
    """The settings eval uses: a flag, else the policy's training run (a run dir or an HF export
    of one carries train_config.json: its episode budgets and its eval rows' samples per task,
    temperature, seed, sampler and task subset), else DEFAULTS; plus the lines that say so."""
    from orchestrax.train import run_info
    found = None
    if ":" not in args.policy and pathlib.Path(args.policy).is_dir():
        found = run_info.policy_settings(args.policy)
    trained, source = found if found else ({}, None)
    if trained:
        trained = trained | {"samples": trained["eval_samples"]}
    used, notes = {}, []
    for key, default in DEFAULTS.items():
        flag = getattr(args, key)
        used[key] = flag if flag is not None else trained.get(key, default)
        if flag is not None and key in trained and flag != trained[key]:
            notes.append(f"warning: {_FLAG[key]} {flag} differs from training ({trained[key]})")
    used |= {k: trained.get(k, v) for k, v in _RUN_ONLY.items()}
    origin = (f"from {source}, flags override" if source else
              "eval defaults (the policy carries no train_config.json), flags override")
    shown = [*DEFAULTS, *(k for k in _RUN_ONLY if used[k] != _RUN_ONLY[k])]
    notes.insert(0, "eval settings: " + " ".join(f"{k}={used[k]}" for k in shown)
                 + f" ({origin})")
    used["routing"] = (routing_from_json(trained["env"])
                       if trained.get("env_kind") == "RoutingConfig" else None)
    if used["routing"] is None:
        used["eval_tasks"] = None  # the run's subset is of its own env's eval split
    used["preferences"] = trained.get("preferences", True)
    return used, notes


def seed_schedule(settings: dict[str, Any], policy) -> tuple[tuple[int, int] | None, str]:
    """The run's eval seeds for a run dir's checkpoint (its step is what the seeds depend on),
    else None (the sampler's stream, seeded by `seed`); plus the line that says which."""
    from orchestrax.eval.policy import TokenPolicy
    step = policy.step if isinstance(policy, TokenPolicy) else None
    if step is None:
        return None, (f"eval seeds: drawn from the sampler's stream (seed {settings['seed']}); "
                      "only a run dir's checkpoint step gives its eval's seeds")
    return (settings["seed"], step), (
        f"eval seeds: the run's eval at checkpoint step {step} (seed {settings['seed']}, "
        f"{settings['samples']} sample(s) per task), so the same checkpoint scores its eval row")


PROTOCOL = "orchestrator8b"


def protocol_options(args: EvalCommand, policy, catalog):
    """The released Orchestrator-8B protocol's settings: experts from `--experts`, the
    retriever from the --train-config catalog (local_search, else web_search), the sandbox for
    enhance_reasoning when bubblewrap runs here."""
    from orchestrax.agent.orchestrator8b_protocol import load_tools
    from orchestrax.agent.orchestrator8b_experts import ExpertPool, load_experts, tool_retriever
    from orchestrax.eval.orchestrator8b_runner import Orchestrator8BOptions
    from orchestrax.tools.sandbox import SandboxConfig, SandboxUnavailable, check_available
    if args.experts is None:
        raise ValueError("EvalCommand.experts=None; --agent orchestrator8b needs --experts FILE "
                         "(JSON: slot such as search-1 or answer-2 -> base_url and model)")
    from orchestrax.eval.policy import TokenPolicy
    tokens = policy.codec if isinstance(policy, TokenPolicy) else None
    if tokens is None and args.tokenizer is not None:
        tokens = Codec(registry.build_tokenizer(args.tokenizer))
    if tokens is None:
        raise ValueError("--agent orchestrator8b with an openai: policy needs --tokenizer "
                         "(the context budget is counted in the policy's tokens)")
    search = next((catalog[k] for k in ("local_search", "web_search") if catalog and k in catalog),
                  None)
    sandbox = SandboxConfig()
    try:
        check_available(sandbox)
    except SandboxUnavailable as e:
        print(f"orchestrator8b: enhance_reasoning calls will fail: {e}", flush=True)
        sandbox = None
    if search is None:
        print("orchestrator8b: no search tool in --train-config's catalog; search calls will "
              "fail", flush=True)
    pool = ExpertPool(load_experts(args.experts), tokens, sandbox=sandbox,
                      retriever=tool_retriever(search) if search is not None else None)
    tools = tuple(load_tools(args.protocol_tools)) if args.protocol_tools else None
    return Orchestrator8BOptions(experts=pool, tools=tools, tokens=tokens,
                                 max_format_errors=args.protocol_format_errors)


def error_rates(rows: list[dict[str, Any]], main_limit: int | None) -> dict[str, float]:
    """Task set -> fraction of its episodes that ended in an error (failed requests), at the
    main turn limit."""
    out = {}
    for r in rows:
        if (main_limit is None or r.get("turn_limit") == main_limit) and r.get("episodes"):
            name = r["task_set"] if "point" not in r else f"{r['task_set']} {r['point']}"
            out[name] = max(out.get(name, 0.0), r.get("errors", 0) / r["episodes"])
    return out


def run(args: EvalCommand) -> int:
    from orchestrax.train.setup import configure_logging
    if not args.policy or not args.tasks:
        raise ValueError(f"EvalCommand: policy={args.policy!r}, tasks={args.tasks!r}; give "
                         "both (--policy P --tasks T [T ...], or --set / a --config function)")
    configure_logging()
    compile_cache.use_compile_cache(args.compile_cache_dir)
    settings, notes = resolve_settings(args)
    for line in notes:
        print(line, flush=True)
    catalog, routing = _catalog(args.train_config, args.sheet)
    routing = routing or settings["routing"] or RoutingConfig()
    from orchestrax.data.instances import InstanceConfig
    options = TaskSetOptions(
        split=args.split, limit=args.limit, grader=args.grader, tools=catalog, routing=routing,
        preferences=settings["preferences"] and not args.no_preferences, seed=settings["seed"],
        instances=InstanceConfig(eval_sheet=settings["eval_sheet"]),
        routing_tasks=settings["eval_tasks"],
        judge=_endpoint(args.judge_url, args.judge_model, args.judge_key_env, "judge"),
        tau2_user=_endpoint(args.user_url, args.user_model, args.user_key_env, "user"))
    pricing = None
    if args.policy_price:
        from orchestrax.tools.sheets import load_sheet
        pricing = load_sheet(args.sheet or "train_list").model_pricing(args.policy_price)
    cfg = EvalConfig(
        episode=EpisodeConfig(max_turns=settings["max_turns"],
                              context_tokens=settings["context_tokens"],
                              max_new_tokens=settings["max_new_tokens"],
                              enable_thinking=settings["enable_thinking"],
                              sampling=SamplingParams(temperature=settings["temperature"],
                                                      top_p=settings["top_p"],
                                                      top_k=settings["top_k"])),
        policy_pricing=pricing, seconds_per_token=settings["seconds_per_token"],
        samples=settings["samples"])
    if args.turn_sweep is None:  # cuts of the main run only: the sweep never runs it longer
        sweep = tuple(n for n in DEFAULT_SWEEP if n < settings["max_turns"])
    else:
        sweep = tuple(int(x) for x in args.turn_sweep.split(",") if x)
    if args.agent == PROTOCOL:
        runner, is_grid, points = PROTOCOL, False, []
    else:  # --agent/--thinking/--ablate lists: the paper's grid (eval/grid.py), one run a point
        points = grid.grid_points(args.agent, args.thinking or (
            "orchestrator" if settings["enable_thinking"] else "none"), args.ablate)
        is_grid = len(points) > 1 or points[0].agent != "direct" or args.thinking is not None
        runner = points[0].agent
    spec = EvalRun(task_sets=tuple(args.tasks), cfg=cfg, turn_limits=sweep, runner=runner,
                   max_in_flight=args.max_in_flight, baseline=args.baseline, options=options,
                   progress=not args.no_progress)
    # An embedded sampler's continuous engine holds context_tokens positions for every slot
    # from its first request on: no more slots than episodes run at once (--max-in-flight).
    slots = min(settings["sampler_max_batch"], args.max_in_flight)
    policy = load_policy(args.policy, model=args.model, tokenizer=args.tokenizer,
                         api_key_env=args.api_key_env, max_len=settings["context_tokens"],
                         param_dtype=args.param_dtype, seed=settings["seed"],
                         max_batch=slots)
    schedule, line = seed_schedule(settings, policy)
    print(line, flush=True)
    cfg = dataclasses.replace(cfg, seed_schedule=schedule)
    spec = dataclasses.replace(spec, cfg=cfg)
    if runner == PROTOCOL:
        spec = dataclasses.replace(spec, cfg=dataclasses.replace(
            cfg, agent_options=protocol_options(args, policy, catalog)))
    sub_pricing = None
    if args.subagent_price:
        from orchestrax.tools.sheets import load_sheet
        sub_pricing = load_sheet(args.sheet or "train_list").model_pricing(args.subagent_price)
    sub_policy = (load_policy(args.subagent_policy, tokenizer=args.tokenizer,
                              max_len=settings["context_tokens"], param_dtype=args.param_dtype,
                              seed=settings["seed"], max_batch=slots)
                  if args.subagent_policy else None)

    async def go():
        try:
            if is_grid:
                return await grid.run_grid(policy, spec, points, subagent_policy=sub_policy,
                                           subagent_pricing=sub_pricing)
            return await run_eval(policy, spec)
        finally:
            await policy.aclose()
            if sub_policy is not None:
                await sub_policy.aclose()

    payload = asyncio.run(go())
    print(grid.grid_table(payload["rows"]) if is_grid else report.table(payload["rows"]))
    for path in (grid.write_grid if is_grid else write_outputs)(payload, args.out):
        print(f"wrote {path}")
    rates = error_rates(payload["rows"], payload.get("main_turn_limit"))
    over = {k: v for k, v in rates.items() if v > args.max_error_rate}
    if over:
        worst = max(over, key=over.get)
        print(f"orchestrax eval: error: {len(over)} task set(s) above --max-error-rate "
              f"{args.max_error_rate:g}: {worst} had {over[worst]:.0%} failed episodes (first "
              f"error: {_first_error(payload) or 'see eval.json'})", file=sys.stderr)
        return 1
    return 0


def _first_error(payload: dict[str, Any]) -> str | None:
    for recs in payload.get("records", {}).values():
        for r in recs:
            if r.get("end_reason") == "error" and r.get("error"):
                return r["error"]
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """EvalCommand's flags, on a parser made with argument_default=SUPPRESS: a flag not given is
    absent, so the config's value stands."""
    add_config_arguments(p)
    p.add_argument("--policy",
                   help="a training run dir or HF dir (embedded sampler), sglang:URL, or "
                        "openai:URL")
    p.add_argument("--model", help="model name for an openai: policy")
    p.add_argument("--api-key-env", help="env var with the bearer key of an openai: policy")
    p.add_argument("--tokenizer", type=tokenizer_dir, help="'tiny' or a HF tokenizer dir (default: the policy dir's)")
    p.add_argument("--tasks", nargs="+",
                   help="routing, tau2:retail, tau2:airline, frames, musique, bamboogle, aime, "
                        "or a .jsonl path")
    p.add_argument("--split", help="override the task set's default split")
    p.add_argument("--limit", type=at_least(1), help="first N tasks of each set")
    p.add_argument("--train-config",
                   help="configs/x.py[:fn] of a TrainConfig: tool set and pricing (its tools)")
    p.add_argument("--sheet", help="pricing sheet to reprice the tools with (e.g. eval_heldout)")
    p.add_argument("--policy-price", metavar="MODEL",
                   help="bill the policy's own tokens at this model's row of the sheet")
    p.add_argument("--agent",
                   help="direct | subagent; a comma list sweeps (with --thinking, --ablate: "
                        "the paper's grid, written as grid.json/csv/png)")
    p.add_argument("--thinking", help="none | subagents | orchestrator | all (where Qwen3's "
                   "thinking is on); a comma list sweeps. Default: orchestrator (--no-thinking: "
                   "none)")
    p.add_argument("--ablate",
                   help="sub-agent mode component ablations, comma list of none, "
                        "no_web_searcher, no_coder, no_file_inspector, no_memory")
    p.add_argument("--subagent-policy", help="the sub-agents' model (run or HF dir, sglang:URL); "
                   "default: --policy")
    p.add_argument("--experts", help="--agent orchestrator8b: JSON file of expert slots "
                   "(search-1, reasoner-2, answer-math-1, ..., or default) -> {base_url, model}")
    p.add_argument("--protocol-tools", help="--agent orchestrator8b: the released tools.json to "
                   "render instead of the built-in tool descriptions")
    p.add_argument("--protocol-format-errors", type=at_least(1), metavar="N",
                   help="--agent orchestrator8b: end an episode after N rounds in a row without "
                        "a usable call (default: never; the released evaluation plays on to "
                        "its round limit)")
    p.add_argument("--subagent-price", metavar="MODEL",
                   help="bill the sub-agents' tokens at this model's row of the sheet")
    p.add_argument("--max-turns", type=at_least(1),
                   help="turns per episode (default: the policy's training run, else 50)")
    p.add_argument("--turn-sweep",
                   help="comma-separated turn limits ('' for none; default: those of "
                        "10,20,50,100 below --max-turns, cut from the main run)")
    p.add_argument("--temperature", type=float,
                   help="sampling temperature (default: the run's eval_temperature, else 0)")
    p.add_argument("--max-new-tokens", type=at_least(1),
                   help="tokens per turn (default: the policy's training run, else 4096)")
    p.add_argument("--context-tokens", type=at_least(1),
                   help="context limit (default: the policy's training run, else 32768)")
    p.add_argument("--param-dtype", choices=PARAM_DTYPES,
                   help="the embedded sampler's params (a run's fp32 master weights are cast as "
                        "they are read: bfloat16 halves their memory)")
    p.add_argument("--no-thinking", dest="enable_thinking", action="store_false",
                   help="Qwen3 thinking off (default: as the policy's training run, else on)")
    p.add_argument("--thinking-on", dest="enable_thinking", action="store_true",
                   help="Qwen3 thinking on whatever the run trained with")
    p.add_argument("--max-error-rate", type=float,
                   help="exit 1 when more than this fraction of a task set's episodes failed "
                        "(a failed request is an error, not a wrong answer)")
    p.add_argument("--seconds-per-token", type=float,
                   help="charge this per generated token instead of measured generation time "
                        "(default: the run's rollout.seconds_per_token, the clock of its eval "
                        "rows' latency, else measured)")
    p.add_argument("--max-in-flight", type=at_least(1))
    p.add_argument("--compile-cache-dir", help=COMPILE_CACHE_HELP)
    p.add_argument("--grader", choices=("exact", "math", "judge"))
    p.add_argument("--judge-url")
    p.add_argument("--judge-model")
    p.add_argument("--judge-key-env")
    p.add_argument("--user-url", help="OpenAI-compatible endpoint of the tau2 user simulator")
    p.add_argument("--user-model")
    p.add_argument("--user-key-env")
    p.add_argument("--baseline", help="an earlier eval.json: preference adherence against it")
    p.add_argument("--seed", type=int,
                   help="sampler seed and the seed of each task's preference draw (default: the "
                        "run's seed, whose eval seeds a run dir's checkpoint is sampled with, "
                        "else 0)")
    p.add_argument("--samples", type=at_least(1),
                   help="episodes per task (default: the run's eval_samples, else 1)")
    p.add_argument("--no-preferences", action="store_true",
                   help="no preference instruction for tasks that have none")
    p.add_argument("--out")
    p.add_argument("--no-progress", action="store_true")
