"""Soak: the demo's GRPO config for N minutes with faults injected, checking nothing is lost.

    python bench/soak.py [--minutes 30] [--out runs/soak] [--init-from runs/demo/warmstart]

Rollouts go through the SGLang client to two `orchestrax serve` processes, each behind a
fault-injecting proxy (this script) that answers a share of /generate calls with HTTP 500 and
cuts a share of the answers' JSON in half; every `--kill-every` seconds one server is SIGKILLed
and restarted on its port. Episodes run in `--workers` episode worker processes (each with its
own SGLang client, whose counters come back with the episodes), or on the trainer's event loop
with `--workers 0`. The routing env's tools hang (until the executor's 1 s timeout) or fail
with a transient error at random, in the trainer and in its workers. The trainer runs until the
time is up and is then stopped with SIGTERM. Reported: RL steps, the retries and failed requests
the trainer logged (summed over its rows), the failed /generate answers the proxies sent (the
retries as the servers saw them: logged retries, less the stale answers the client retried,
can only be fewer, by the unfinished last step's), RSS of the trainer and of its workers at
the first RL step and at the end, lost episodes (episodes asked for minus episodes returned,
must be 0), failed ones, stale answers and stale drops, and the load average. A line goes to
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
P_500, P_TRUNCATED = 0.05, 0.02              # per /generate call, at the proxy
P_TOOL_HANG, P_TOOL_ERROR = 0.03, 0.05       # per tool call, in the trainer and its workers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultProxy:
    """Forwards to one server; injects 500s and truncated JSON on /generate. `counts` are per
    /generate call: every one but "generate" is an answer the client retries."""

    def __init__(self, backend: str, seed: int):
        self.backend, self.rng = backend, random.Random(seed)
        self.counts = {"generate": 0, "500": 0, "truncated": 0, "backend_down": 0,
                       "backend_5xx": 0}

    async def handle(self, request):
        from aiohttp import ClientError, ClientSession, web
        body = await request.read()
        generate = request.path == "/generate"
        self.counts["generate"] += generate
        if generate and self.rng.random() < P_500:
            self.counts["500"] += 1
            return web.Response(status=500, text="injected fault")
        try:
            async with ClientSession() as session, session.request(
                    request.method, self.backend + request.path_qs, data=body,
                    headers={"Content-Type": request.content_type}) as resp:
                data, status, ctype = await resp.read(), resp.status, resp.content_type
        except (ClientError, OSError):
            self.counts["backend_down"] += generate
            return web.Response(status=502, text="backend down")
        self.counts["backend_5xx"] += generate and status >= 500
        if generate and status == 200 and self.rng.random() < P_TRUNCATED:
            self.counts["truncated"] += 1
            data = data[: len(data) // 2]
        return web.Response(status=status, body=data, content_type=ctype)

    async def start(self) -> str:
        from aiohttp import web
        app = web.Application(client_max_size=1 << 28)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"


async def _start_server(model_dir: pathlib.Path, port: int, weight_root: pathlib.Path):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrax.cli", "serve", "--model", str(model_dir), "--port",
        str(port), "--max-len", "1024", "--max-batch", "64", "--weight-root", str(weight_root),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=300)
    if b"listening" not in line:
        raise RuntimeError(f"orchestrax serve did not start: {line!r}")
    return proc


def _rss_mb(pid: int) -> float | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (the trainer's episode workers), from /proc."""
    kids = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _rows(out: pathlib.Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def soak(args) -> dict:
    from orchestrax import models
    from orchestrax.agent.scripted import tiny_qwen3_tokenizer

    out = pathlib.Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = _demo()
    tok_dir, model_dir = out / "tok", out / "start"
    tiny_qwen3_tokenizer(512).save_pretrained(tok_dir)
    models.save_hf(cfg.model, models.init_params(cfg.model, 123), model_dir, tokenizer_dir=tok_dir)

    ports = [_free_port() for _ in range(2)]
    servers = [await _start_server(model_dir, p, out) for p in ports]
    proxies = [FaultProxy(f"http://127.0.0.1:{p}", seed=i) for i, p in enumerate(ports)]
    urls = [await p.start() for p in proxies]
    trainer = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--child", "--out", str(out), "--urls", ",".join(urls),
        "--workers", str(args.workers),
        *(["--init-from", args.init_from] if args.init_from else []), cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=open(out / "trainer.log", "w"))
    start, deadline = time.time(), time.time() + 60 * args.minutes
    rss_start = rss_end = workers_start = workers_end = None
    loads = []
    kills, next_kill, victim = 0, time.time() + args.kill_every, 0
    while time.time() < deadline and trainer.returncode is None:
        await asyncio.sleep(1.0)
        loads.append(os.getloadavg()[0])
        rss = _rss_mb(trainer.pid)
        if rss is not None:
            workers = sum(filter(None, map(_rss_mb, _children(trainer.pid))))
            rss_end, workers_end = rss, workers
            if rss_start is None and any(r["phase"] == "rl" for r in _rows(out / "run")):
                rss_start, workers_start = rss, workers
        if time.time() >= next_kill:
            servers[victim].send_signal(signal.SIGKILL)
            await servers[victim].wait()
            kills += 1
            await asyncio.sleep(2.0)  # requests meanwhile fail over to the other server
            servers[victim] = await _start_server(model_dir, ports[victim], out)
            victim, next_kill = 1 - victim, time.time() + args.kill_every
    crashed = trainer.returncode is not None
    if not crashed:
        trainer.send_signal(signal.SIGTERM)
        await trainer.wait()
    for s in servers:
        s.send_signal(signal.SIGTERM)
        await s.wait()

    logged = _rows(out / "run")  # eval rows carry their rollouts' counters too
    rows = [r for r in logged if r["phase"] == "rl"]
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    injected = {k: sum(p.counts[k] for p in proxies) for k in proxies[0].counts}
    return {
        "minutes": (time.time() - start) / 60, "steps": len(rows), "crashed": crashed,
        "workers": args.workers,
        "retries": sum(r.get("sampler/retries", 0) for r in logged),
        "failed_requests": sum(r.get("sampler/failures", 0) for r in logged),
        "requests": sum(r.get("sampler/requests", 0) for r in logged),
        "server_failed_answers": sum(injected[k] for k in ("500", "truncated", "backend_down",
                                                            "backend_5xx")),
        "server_kills": kills, **{f"injected_{k}": v for k, v in injected.items()},
        "stale_turns": sum(r.get("rollout/stale_turns", 0) for r in rows),
        "stale_trajectories": sum(r.get("rollout/stale_trajectories", 0) for r in rows),
        # Answers from a server behind the published weights, retried elsewhere by the client
        # (counted in its retries too, though no proxy sent a failure).
        "stale_answers": sum(r.get("sampler/stale_answers", 0) for r in logged),
        "episodes": sum(r["rollout/episodes"] for r in rows),
        "lost_episodes": sum(per_step - r["rollout/episodes"] for r in rows),
        "failed_episodes": sum(r["rollout/episodes_failed"] for r in rows),
        "rss_start_mb": rss_start, "rss_end_mb": rss_end,
        "workers_rss_start_mb": workers_start, "workers_rss_end_mb": workers_end,
        "load_mean": sum(loads) / max(1, len(loads)), "load_max": max(loads, default=0.0),
    }


def _demo():
    import runpy
    return runpy.run_path(str(ROOT / "configs" / "demo.py"))["config"]("cost")


def _config(out: pathlib.Path, urls, init_from, workers: int):
    """The demo's cost run, its rollouts through the proxies, until stopped."""
    import dataclasses
    demo = _demo()
    rollout = dataclasses.replace(demo.rollout, backend="sglang", server_urls=tuple(urls),
                                  weight_sync_dir=str(out / "weights"), workers=workers)
    return dataclasses.replace(demo, name="soak", out_dir=str(out / "run"), steps=10**6,
                               checkpoint_every=5, eval_every=0, rollout=rollout,
                               init_from=init_from)


class _Flaky:
    """A tool that hangs (the executor's 1 s timeout ends it) or fails now and then."""

    def __init__(self, tool, rng: random.Random):
        self.spec, self._tool, self._rng = tool.spec, tool, rng

    async def __call__(self, arguments):
        draw = self._rng.random()
        if draw < P_TOOL_HANG:
            await asyncio.sleep(3600)  # the executor's timeout ends it
        if draw < P_TOOL_HANG + P_TOOL_ERROR:
            raise ConnectionError("injected transient tool failure")
        return await self._tool(arguments)


def flaky_executor():
    """The episodes' tool executor with faults injected into every call and a 1 s tool timeout;
    the trainer takes it by constructor (`Trainer(make_executor=...)`) and hands it to its
    episode workers, which unpickle it from this module."""
    from orchestrax.agent import executor as ex

    class FlakyExecutor(ex.ToolExecutor):
        def __init__(self):
            super().__init__(ex.ExecutorConfig(default=ex.ToolLimits(
                timeout_s=1.0, backoff_s=0.05, backoff_max_s=0.2)))
            self._rng = random.Random(os.getpid())

        async def call(self, tool, arguments):
            return await super().call(_Flaky(tool, self._rng), arguments)

    return FlakyExecutor()


def child(args) -> None:
    """The trainer, with every tool call made flaky and a 1 s tool timeout."""
    from orchestrax.train import loop, setup

    setup.configure_logging()
    out = pathlib.Path(args.out)
    loop.Trainer(_config(out, args.urls.split(","), args.init_from, args.workers),
                 make_executor=flaky_executor).run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between server kills")
    ap.add_argument("--out", default="runs/soak")
    ap.add_argument("--workers", type=int, default=2,
                    help="episode worker processes (0: episodes on the trainer's event loop)")
    ap.add_argument("--init-from", help="a warm-start run directory (e.g. runs/demo/warmstart)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--urls", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    result = asyncio.run(soak(args))
    print(json.dumps(result, indent=1))
    ok = result["lost_episodes"] == 0 and not result["crashed"] and result["steps"] > 0
    line = (f"- {datetime.date.today()} soak ({result['minutes']:.1f} min, demo config, faults "
            f"on, {args.workers} episode workers): {result['steps']} RL steps, "
            f"{result['retries']:.0f} client retries logged (the proxies sent "
            f"{result['server_failed_answers']} failed answers to "
            f"{result['injected_generate']} /generate calls; the client logged "
            f"{result['requests'] + result['retries']:.0f} attempts), "
            f"{result['failed_requests']:.0f} failed requests, {result['server_kills']} server "
            f"kills, injected {result['injected_500']} x 500 / {result['injected_truncated']} "
            f"truncated, {result['stale_answers']:.0f} stale answers retried, "
            f"{result['stale_turns']:.0f} stale turns in {result['stale_trajectories']:.0f} "
            f"trajectories dropped, "
            f"{result['episodes']:.0f} episodes, lost {result['lost_episodes']:.0f}, failed "
            f"{result['failed_episodes']:.0f}; trainer RSS {result['rss_start_mb'] or 0:.0f} -> "
            f"{result['rss_end_mb'] or 0:.0f} MB, workers' RSS "
            f"{result['workers_rss_start_mb'] or 0:.0f} -> {result['workers_rss_end_mb'] or 0:.0f}"
            f" MB; load average {result['load_mean']:.1f} (max {result['load_max']:.1f}) on "
            f"{os.cpu_count()} cores; {'OK' if ok else 'FAILED'} "
            f"(python bench/soak.py --minutes {args.minutes:g} --workers {args.workers})\n")
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write(line)
    print(line, end="")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
