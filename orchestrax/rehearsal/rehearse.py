"""`orchestrax rehearse`: the whole ToolOrchestra run in miniature on this machine, every process
real and on loopback, then `summary.json`.

    orchestrax rehearse [--config configs/toolorchestra.py:config_rehearsal] [--set k=v ...]
                        [--out DIR] [--processes 2] [--kill-after-step N]

Phases (wall seconds of each in the summary): `servers` (one `orchestrax serve` per
`rollout.server_urls` entry, on a random start checkpoint of the run's model; one `orchestrax
serve --tiny` per loopback LLM endpoint of the config, LLM tools and tau2 user alike; the real
`sglang-router` in front of the rollout servers), `data` (the warm-start JSONL of tool-call
conversations, if absent), `train` (the trainer as `--processes` JAX processes joined by
`jax.distributed` on loopback, 8 / processes CPU devices each: SFT, then GRPO with rollouts
and weight syncs through each process's own servers, Orbax checkpoints), `export` (HF
directory), `eval` (the export loaded into the rollout servers and evaluated through the
router on held-out tasks with the held-out pricing sheet).

`--kill-after-step N` rehearses a crash: once RL step N is in metrics.jsonl, trainer process 1
is SIGKILLed (then process 0, which can only wait on it), and both are restarted with the same
command; they resume from the newest complete checkpoint. Every child runs in its own session
and gets SIGKILL if this process dies; all are stopped on exit, Ctrl-C or failure included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import sys
import time
import urllib.request
from typing import Any, Iterator, Sequence

from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.rehearsal.children import (Child, Fleet, free_port, get_json, post_json,
                                           url_port, wait_until)
from orchestrax.train.train_config import TrainConfig
from orchestrax.train.overrides import apply_overrides, load_config

DEFAULT_CONFIG = "configs/toolorchestra.py:config_rehearsal"
EVAL_TASKS = ("bamboogle", "aime")
EVAL_LIMIT = 2     # tasks per eval set
EVAL_SHEET = "eval_heldout"
# The held-out eval offers the whole catalog (as the paper evaluates), whose schemas alone are
# ~2,000 tiny-tokenizer tokens: its longest prompt is 2,524 tokens, past the training context
# (instances offer one tool). The rollout servers hold this much and the eval runs at it; the
# training rows (SFT, GRPO) stay at `rollout.context_tokens`.
EVAL_CONTEXT_TOKENS = 3072
# Warm-start conversations: 96 train tasks, each with 4 of the 8 tools (48 calls of each tool).
# With one tool a task, the policy learnt each question's tool and named it on instances that
# offer another one (BUILD.md, "The rehearsal").
SFT_TASKS, SFT_TOOLS_PER_TASK = 96, 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help=f"configs/x.py:function (default {DEFAULT_CONFIG})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, passed to the trainer too (repeatable)")
    p.add_argument("--out", help="run directory (default: the config's out_dir); its "
                                 "weights/ and sft.jsonl move with it")
    p.add_argument("--processes", type=int, default=2, choices=(1, 2, 4, 8),
                   help="trainer JAX processes, 8 / processes CPU devices each")
    p.add_argument("--kill-after-step", type=int, metavar="N",
                   help="SIGKILL trainer process 1 once RL step N is logged, then restart both")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")


def _endpoints(obj: Any) -> Iterator[ChatEndpoint]:
    """Every ChatEndpoint inside a config (LLM tools, tau2 users, judges)."""
    if isinstance(obj, ChatEndpoint):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _endpoints(getattr(obj, f.name))
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _endpoints(x)


# --- the phases ----------------------------------------------------------------------------------
def _start_model(cfg: TrainConfig, directory: pathlib.Path) -> pathlib.Path:
    """A random checkpoint of the run's architecture for the rollout servers to start on (the
    trainer publishes its own weights before the first rollout)."""
    if (directory / "config.json").exists():
        return directory
    from orchestrax import models, registry
    if cfg.model is None:
        raise ValueError("rehearsal: the config needs `model` (a random-init architecture), "
                         "not hf_path")
    tok = directory.with_name(directory.name + "_tokenizer")
    registry.build_tokenizer(cfg.tokenizer).save_pretrained(tok)
    models.save_hf(cfg.model, models.init_params(cfg.model, cfg.seed + 1), directory,
                   tokenizer_dir=tok)
    return directory


def _python_env() -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # a server needs one device; trainers get theirs below
    return env


def start_servers(cfg: TrainConfig, out: pathlib.Path, fleet: Fleet,
                  deadline: float) -> dict[str, Any]:
    py = [sys.executable, "-m", "orchestrax.cli", "serve"]
    start = out / "start_model"
    pathlib.Path(cfg.rollout.weight_sync_dir).mkdir(parents=True, exist_ok=True)
    weight_roots = sorted({str(out.resolve()),
                           str(pathlib.Path(cfg.rollout.weight_sync_dir).resolve())})
    rollout = list(dict.fromkeys(cfg.rollout.server_urls))
    env = _python_env()
    for i, url in enumerate(rollout):
        fleet.start(f"rollout-{i}", [*py, "--model", str(start), "--port", str(url_port(url)),
                                     "--max-len",
                                     str(max(cfg.rollout.context_tokens, EVAL_CONTEXT_TOKENS) + 1),
                                     "--max-batch", "16", "--seed", str(cfg.seed),
                                     *(a for r in weight_roots for a in ("--weight-root", r))],
                    env=env)
    experts = sorted({e.base_url.rstrip("/").removesuffix("/v1") for e in _endpoints(cfg)})
    for i, base in enumerate(experts):
        fleet.start(f"expert-{i}", [*py, "--tiny", "--port", str(url_port(base)), "--max-len",
                                    "4096", "--max-batch", "16", "--seed", str(100 + i)],
                    env=env)
    router = f"http://127.0.0.1:{free_port()}"
    fleet.start("router", [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
                           *rollout, "--host", "127.0.0.1", "--port", str(url_port(router)),
                           "--policy", "round_robin", "--log-level", "warn"], env=env)
    for url in [*rollout, *experts]:
        wait_until(fleet, lambda u=url: urllib.request.urlopen(f"{u}/health", timeout=5).status
              == 200, f"{url}/health", deadline)

    def router_ready() -> bool:
        workers = get_json(f"{router}/workers")["workers"]
        return len(workers) == len(rollout) and all(w["is_healthy"] for w in workers)

    wait_until(fleet, router_ready, f"sglang-router at {router} to register {rollout}", deadline)
    return {"rollout": rollout, "experts": experts, "router": router}


def _question(task: Any, words: int = 3) -> str:
    """The task's question, cut to its first `words` words (a call the tiny policy's
    `max_new_tokens` holds)."""
    text = next((m["content"] for m in reversed(task.messages) if m["role"] == "user"), "")
    return " ".join(str(text).split()[:words]) or "What is 6 times 7?"


def tool_arguments(name: str, task: Any) -> dict[str, Any]:
    """A short, valid call of tool `name` for `task`: code for the sandbox, the question as
    the search query or as the LLM's query."""
    if name == "python":
        return {"code": "print(6 * 7)"}
    return {"query": _question(task)}


async def _observe(tools: dict[str, Any], calls: list[tuple[str, dict[str, Any]]],
                   concurrency: int) -> list[str]:
    """Each call run through the real tool; a failed call's observation is its error text, as
    the executor would show it."""
    from orchestrax.agent.fanout import fan_out
    from orchestrax.tools.tool import ToolError

    async def one(call: tuple[str, dict[str, Any]]) -> str:
        name, args = call
        try:
            return (await tools[name](args)).observation
        except ToolError as e:
            return f"Error: tool {name!r} failed: {e}"

    return await fan_out(one, calls, max_in_flight=concurrency)


def _instance_offering(cfg: TrainConfig, env: Any, task: Any, name: str, draws: int = 64):
    """A training instance of `task` (tool subset, sheet, P, drawn as the RL steps draw them)
    whose tools include `name`: the first of `draws` seeded draws that offers it."""
    from orchestrax.data.instances import prepare_instance
    from orchestrax.tools.randomize import instance_seed
    for k in range(draws):
        inst = prepare_instance(task, env, split="train", config=cfg.instances,
                                seed=instance_seed(cfg.seed, task.task_id, "warm-start", k))
        tools = env.tools(inst)
        if name in {t.spec.name for t in tools}:
            return inst, tools
    raise ValueError(f"rehearsal: no instance of {task.task_id} in {draws} draws offers tool "
                     f"{name!r}; check instances.randomize")


def write_sft_data(cfg: TrainConfig, path: pathlib.Path, tools: dict[str, Any],
                   limit: int | None = None, tools_per_task: int = 1) -> dict[str, int]:
    """Warm-start conversations over the run's train tasks (`limit` of them evenly spaced, so
    every source of a mixture, laid end to end, has its prompts in): each task's question
    `tools_per_task` times, each time calling a different tool of `tools` (task i the tools i,
    i+1, ... round robin, so every kind is demonstrated equally and no question predicts the
    tool: the called name can only come from the instance's offered tools), with the
    observation the real tool returned, then answers (the gold answer where the task has one).
    Each record holds the prompt an RL rollout of that task sees: an instance's tools (its
    subset and prices, one that offers the called tool) and its preference instruction, so the
    format is learnt in the context the policy will use it in. Returns the calls per tool."""
    from orchestrax.agent.episode import prompt_messages
    from orchestrax.data.tasks import spread
    from orchestrax.train import setup
    env = setup.make_env(cfg)
    names = sorted(tools)
    if not names:
        raise ValueError("rehearsal: the config has no tools to warm-start calls to")
    if not 1 <= tools_per_task <= len(names):
        raise ValueError(f"rehearsal: tools_per_task={tools_per_task}; allowed 1..{len(names)}")
    tasks = [(t, names[(i + j) % len(names)])
             for i, t in enumerate(spread(env.tasks("train"), limit))
             for j in range(tools_per_task)]
    calls = [(name, tool_arguments(name, t)) for t, name in tasks]
    observations = asyncio.run(_observe(tools, calls, concurrency=16))
    lines, counts = [], {}
    for (task, name), (_, args), seen in zip(tasks, calls, observations):
        instance, offered = _instance_offering(cfg, env, task, name)
        messages = prompt_messages(instance)
        if messages[-1]["role"] != "user":  # tau2: the simulated user opens
            messages.append({"role": "user", "content": "Hi, I need help with an order."})
        answer = task.answer[0] if task.answer else "Done."
        call = {"name": name, "arguments": args}
        messages += [{"role": "assistant",
                      "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"},
                     {"role": "tool", "content": seen},
                     {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
        lines.append(json.dumps({"messages": messages,
                                 "tools": [t.spec.to_openai() for t in offered]}))
        counts[name] = counts.get(name, 0) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)
    return counts


def _trainer_argv(spec: str, sets: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "orchestrax.cli", "train", "--config", spec,
            *(a for s in sets for a in ("--set", s))]


def _start_trainers(fleet: Fleet, argv: list[str], processes: int) -> list[Child]:
    port = free_port()
    out = []
    for i in range(processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // processes}")
        if processes > 1:
            env |= {"COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                    "NUM_PROCESSES": str(processes), "PROCESS_ID": str(i)}
        out.append(fleet.start(f"trainer-{i}", argv, env=env))
    return out


def _rows(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _checkpoints(out: pathlib.Path) -> list[int]:
    """Committed checkpoint steps (Orbax writes a step under a temporary name and renames it
    when every process has finished it)."""
    root = out / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []


def train(cfg: TrainConfig, spec: str, sets: Sequence[str], out: pathlib.Path, fleet: Fleet,
          processes: int, kill_after: int | None, deadline: float) -> dict[str, Any]:
    argv = _trainer_argv(spec, sets)
    metrics = out / "metrics.jsonl"
    info: dict[str, Any] = {"resumed_from": None, "killed_after_step": None}
    # A rerun of a finished or crashed rehearsal resumes too: the newest checkpoint before start.
    before = _checkpoints(out)
    if before:
        info["resumed_from"] = before[-1]
    timeline = _Timeline()
    trainers = _start_trainers(fleet, argv, processes)
    while True:
        fleet.check(trainers, done_ok=True)
        if all(t.proc.poll() == 0 for t in trainers):
            break
        rows = timeline.rows(metrics)
        if kill_after is not None and info["killed_after_step"] is None and any(
                r["phase"] == "rl" and r["step"] >= kill_after for r in rows):
            os.killpg(trainers[-1].proc.pid, signal.SIGKILL)
            trainers[-1].proc.wait()
            fleet.stop(trainers)  # the others can only wait on the dead one's collectives
            shutil.copyfile(metrics, out / "metrics.killed.jsonl")
            steps = _checkpoints(out)
            info |= {"killed_after_step": kill_after, "resumed_from": steps[-1] if steps else None}
            timeline.mark("killed and restarted")
            trainers = _start_trainers(fleet, argv, processes)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError("rehearsal: the trainer did not finish in time")
        time.sleep(0.5)
    rows = timeline.rows(metrics)
    timeline.mark("trainers exited")
    fleet.stop(trainers)
    rl = [r for r in rows if r["phase"] == "rl"]
    info["train_seconds"] = timeline.seconds | {
        f"rl {r['step']} {part}": round(r[f"time/{part}_s"], 1)
        for r in rl for part in ("rollout", "update", "step") if f"time/{part}_s" in r}
    return info


class _Timeline:
    """Seconds from the trainers' start at which each metrics row was first seen (SFT rows come
    every 10 steps; a row a resumed run writes anew is marked "again"), and named events."""

    def __init__(self):
        self.start, self.seconds, self.restarted = time.monotonic(), {}, False
        self.parsed: dict[str, dict[str, Any]] = {}   # line -> its row, each parsed once

    def mark(self, event: str) -> None:
        self.seconds[event] = round(time.monotonic() - self.start, 1)
        self.restarted |= event.startswith("killed")

    def rows(self, path: pathlib.Path) -> list[dict[str, Any]]:
        """The rows of `path`'s whole lines, marking those first seen; the train loop's one
        read and parse of metrics.jsonl per poll."""
        lines = path.read_text().split("\n")[:-1] if path.exists() else []  # whole lines
        lines = [line for line in lines if line.strip()]
        for line in lines:
            if line not in self.parsed:
                r = self.parsed[line] = json.loads(line)
                self.mark(f"{r['phase']} {r['step']} logged" + (" again" if self.restarted
                                                                 else ""))
        return [self.parsed[line] for line in lines]


def evaluate(spec: str, out: pathlib.Path, export: pathlib.Path, servers: dict[str, Any],
             cfg: TrainConfig, fleet: Fleet) -> dict[str, Any]:
    """The export, loaded by every rollout server and evaluated through the router on held-out
    tasks, repriced with the held-out sheet."""
    for url in servers["rollout"]:
        reply = post_json(f"{url}/update_weights_from_disk",
                      {"model_path": str(export.resolve()), "weight_version": "export"})
        if not reply.get("success"):
            raise RuntimeError(f"{url} did not load the export: {reply.get('message')}")
    users = [e for e in _endpoints(cfg.env)]
    argv = [sys.executable, "-m", "orchestrax.cli", "eval", "--policy",
            f"sglang:{servers['router']}", "--tokenizer", str(export), "--tasks", *EVAL_TASKS,
            "--limit", str(EVAL_LIMIT), "--train-config", spec, "--sheet", EVAL_SHEET,
            "--out", str(out / "eval"), "--no-progress", "--max-error-rate", "1",
            "--max-turns", str(cfg.rollout.max_turns), "--turn-sweep", str(cfg.rollout.max_turns),
            "--max-new-tokens", str(cfg.rollout.max_new_tokens),
            "--context-tokens", str(EVAL_CONTEXT_TOKENS),
            "--seconds-per-token", str(cfg.rollout.seconds_per_token)]
    if not cfg.rollout.enable_thinking:
        argv.append("--no-thinking")
    if users:
        argv += ["--user-url", users[0].base_url, "--user-model", users[0].model]
    child = fleet.start("eval", argv, env=_python_env())
    if child.proc.wait() != 0:
        raise RuntimeError(f"orchestrax eval exited with {child.proc.returncode}:\n{child.tail()}")
    fleet.children.remove(child)
    print(child.tail(2000).strip(), flush=True)  # eval's table: accuracy, cents, minutes
    payload = json.loads((out / "eval" / "eval.json").read_text())
    rows = [r for r in payload["rows"] if r.get("turn_limit") in (None, cfg.rollout.max_turns)]
    return {r["task_set"]: {"accuracy": r["accuracy"], "cents": r["cents_per_task"],
                           "minutes": r["minutes_per_task"], "tasks": r.get("tasks")}
            for r in rows}


def check_eval_context(cfg: TrainConfig, context_tokens: int = EVAL_CONTEXT_TOKENS) -> int:
    """The held-out eval's prompts (its task sets as `orchestrax eval` prepares them: the whole
    catalog on the eval sheet, each task's own instruction) fit `context_tokens`, checked before
    any process starts; else one line naming the limit and the sizes. Returns the longest."""
    from orchestrax import registry
    from orchestrax.data.instances import InstanceConfig
    from orchestrax.eval.tasksets import TaskSetOptions, load_task_set
    from orchestrax.train.train_config import longest_prompt
    catalog, codec = registry.build_catalog(cfg.tools), registry.build_codec(cfg.tokenizer)
    opts = TaskSetOptions(limit=EVAL_LIMIT, tools=catalog,
                          instances=InstanceConfig(eval_sheet=EVAL_SHEET))
    longest = max(longest_prompt(cfg, ts.env, codec, ts.tasks, "eval")
                  for ts in (load_task_set(name, opts) for name in EVAL_TASKS))
    if longest[0] >= context_tokens:
        raise ValueError(f"rehearsal: EVAL_CONTEXT_TOKENS={context_tokens} cannot hold the "
                         f"prompt of eval task {longest[1]!r}, {longest[0]} tokens before any "
                         f"reply; must be > {longest[0]}")
    return longest[0]


def summarize(out: pathlib.Path, cfg: TrainConfig, processes: int, servers: dict[str, Any],
              info: dict[str, Any], export: pathlib.Path, evals: dict[str, Any],
              seconds: dict[str, float]) -> dict[str, Any]:
    rows = _rows(out / "metrics.jsonl")
    rl = [r for r in rows if r["phase"] == "rl"]
    calls: dict[str, float] = {}
    cost: dict[str, float] = {}
    for r in rows:
        if r["phase"] not in ("rl", "eval"):
            continue
        for k, v in r.items():
            if k.startswith("tools/") and k.endswith("/calls"):
                calls[k[6:-6]] = calls.get(k[6:-6], 0) + v
            elif k.startswith("tools/") and k.endswith("/cost_usd"):
                cost[k[6:-9]] = cost.get(k[6:-9], 0.0) + v
    per_server = {}
    for url in servers["rollout"]:
        state = get_json(f"{url}/server_info")["internal_states"][0]
        per_server[url] = state
    return {
        "processes": processes, "devices": 8 // processes * processes,
        "sft_steps": max((r["step"] for r in rows if r["phase"] == "sft"), default=0),
        "rl_steps": max((r["step"] for r in rl), default=0),
        "sft_loss": [r["train/loss"] for r in rows if r["phase"] == "sft"],
        "rl_loss": [r.get("train/loss") for r in rl],
        "reward_mean": [r.get("rollout/reward_mean") for r in rl],
        "accuracy": [r.get("rollout/accuracy") for r in rl],
        "tool_calls": calls, "cost_usd": cost,
        "requests": {u: s["requests"] for u, s in per_server.items()},
        "weight_syncs": {u: {"count": s["weight_updates"] - 1,  # the export's load is not one
                             "weight_version": info["weight_versions"][u]}
                         for u, s in per_server.items()},
        "checkpoints": _checkpoints(out), "resumed_from": info["resumed_from"],
        "killed_after_step": info["killed_after_step"],
        "export_dir": str(export), "eval": evals, "seconds": seconds,
        "train_seconds": info["train_seconds"],
        "exercised": ["sglang-router", "orchestrax serve (rollout)", "orchestrax serve --tiny "
                      "(LLM tools, tau2 user)", "jax.distributed (gloo)", "SFT from JSONL",
                      "GRPO", "update_weights_from_disk", "Orbax checkpoints", "HF export",
                      "orchestrax eval"] + (["SIGKILL and resume"] if info["killed_after_step"]
                                            is not None else []),
    }


def run(args: argparse.Namespace) -> int:
    sets = list(args.set)
    if args.out:
        out = pathlib.Path(args.out)
        sets += [f"out_dir={out}", f"rollout.weight_sync_dir={out / 'weights'}",
                 f"sft_data=('{out / 'sft.jsonl'}',)"]
    cfg = apply_overrides(load_config(args.config), sets)
    if cfg.rollout.backend != "sglang":
        raise ValueError(f"rehearsal: rollout.backend={cfg.rollout.backend!r}; the rehearsal "
                         "runs the SGLang path (backend 'sglang')")
    if len(set(cfg.rollout.server_urls)) < args.processes:
        raise ValueError(f"rehearsal: rollout.server_urls has {len(set(cfg.rollout.server_urls))} "
                         f"distinct servers for {args.processes} trainer processes; each process "
                         "syncs weights to its own")
    out = pathlib.Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.timeout
    seconds: dict[str, float] = {}
    fleet = Fleet(out / "logs")
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        # In children: this process forks the others, and a forked JAX process can deadlock.
        with _phase(seconds, "start_model"):
            _prepare_child(fleet, "model", args.config, sets)
        with _phase(seconds, "servers"):
            servers = start_servers(cfg, out, fleet, deadline)
        with _phase(seconds, "data"):  # the tools' real replies: the expert servers are up
            _prepare_child(fleet, "data", args.config, sets)
        with _phase(seconds, "train"):
            info = train(cfg, args.config, sets, out, fleet, args.processes,
                         args.kill_after_step, deadline)
        # What each server reports after the trainer's last sync, before the export replaces it.
        info["weight_versions"] = {u: get_json(f"{u}/model_info")["weight_version"]
                                   for u in servers["rollout"]}
        export = out / "export"
        with _phase(seconds, "export"):
            child = fleet.start("export", [sys.executable, "-m", "orchestrax.train.export",
                                           str(out), str(export), "--overwrite"],
                                env=_python_env())
            if child.proc.wait() != 0:
                raise RuntimeError(f"export exited with {child.proc.returncode}:\n{child.tail()}")
            fleet.children.remove(child)
        with _phase(seconds, "eval"):
            evals = evaluate(args.config, out, export, servers, cfg, fleet)
        seconds["total"] = sum(seconds.values())
        summary = summarize(out, cfg, args.processes, servers, info, export, evals, seconds)
    finally:
        fleet.close()
        signal.signal(signal.SIGTERM, previous)
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2))
    print(f"rehearsal done in {seconds['total']:.0f} s ("
          + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items() if k != "total")
          + f"): {summary['sft_steps']} SFT + {summary['rl_steps']} GRPO steps, "
          f"{sum(summary['tool_calls'].values()):.0f} tool calls; wrote {path}", flush=True)
    return 0


@contextlib.contextmanager
def _phase(seconds: dict[str, float], name: str):
    print(f"rehearsal: {name} ...", flush=True)
    t0 = time.monotonic()
    try:
        yield
    finally:
        seconds[name] = round(time.monotonic() - t0, 1)


def _prepare_child(fleet: Fleet, what: str, spec: str, sets: Sequence[str]) -> None:
    child = fleet.start(f"prepare-{what}", [sys.executable, "-m", "orchestrax.rehearsal.rehearse",
                                            what, spec, *sets], env=_python_env())
    if child.proc.wait() != 0:
        raise RuntimeError(f"preparing the rehearsal ({what}) failed:\n{child.tail()}")
    fleet.children.remove(child)
    print(child.tail(400).strip(), flush=True)


def prepare(what: str, spec: str, sets: Sequence[str]) -> None:
    """`model`: the rollout servers' start checkpoint; `data`: the warm-start JSONL through the
    config's real tools (the expert servers must be up); each only where absent."""
    cfg = apply_overrides(load_config(spec), sets)
    if what == "model":
        check_eval_context(cfg)
        _start_model(cfg, pathlib.Path(cfg.out_dir) / "start_model")
    elif cfg.sft_data and not pathlib.Path(cfg.sft_data[0]).exists():
        from orchestrax import registry
        counts = write_sft_data(cfg, pathlib.Path(cfg.sft_data[0]),
                                registry.build_catalog(cfg.tools), limit=SFT_TASKS,
                                tools_per_task=SFT_TOOLS_PER_TASK)
        print(f"rehearsal: {sum(counts.values())} warm-start conversations in "
              f"{cfg.sft_data[0]}, calls per tool {counts}")


if __name__ == "__main__":
    prepare(sys.argv[1], sys.argv[2], sys.argv[3:])
