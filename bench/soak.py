"""Soak: the demo's GRPO config for N minutes with faults injected, checking nothing is lost.

    python bench/soak.py [--minutes 30] [--out runs/soak] [--init-from runs/demo/warmstart]

Rollouts go through the SGLang client to two `orchestrax serve` processes, each behind a
fault-injecting proxy (this script) that answers a share of /generate calls with HTTP 500 and
cuts a share of the answers' JSON in half; every `--kill-every` seconds one server is SIGKILLed
and restarted on its port. Inside the trainer, the routing env's tools hang (until the
executor's 1 s timeout) or fail with a transient error at random. The trainer runs until the
time is up and is then stopped with SIGTERM. Reported: RL steps, the client's retries and failed
requests, faults injected, RSS of the trainer at its first RL step and at the end, lost episodes
(episodes asked for minus episodes returned, must be 0) and failed ones. A line goes to
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
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
P_TOOL_HANG, P_TOOL_ERROR = 0.03, 0.05       # per tool call, in the trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultProxy:
    """Forwards to one server; injects 500s and truncated JSON on /generate."""

    def __init__(self, backend: str, seed: int):
        self.backend, self.rng = backend, random.Random(seed)
        self.counts = {"500": 0, "truncated": 0, "backend_down": 0}

    async def handle(self, request):
        from aiohttp import ClientError, ClientSession, web
        body = await request.read()
        generate = request.path == "/generate"
        if generate and self.rng.random() < P_500:
            self.counts["500"] += 1
            return web.Response(status=500, text="injected fault")
        try:
            async with ClientSession() as session, session.request(
                    request.method, self.backend + request.path_qs, data=body,
                    headers={"Content-Type": request.content_type}) as resp:
                data, status, ctype = await resp.read(), resp.status, resp.content_type
        except (ClientError, OSError):
            self.counts["backend_down"] += 1
            return web.Response(status=502, text="backend down")
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
        *(["--init-from", args.init_from] if args.init_from else []), cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=open(out / "trainer.log", "w"))
    start, deadline = time.time(), time.time() + 60 * args.minutes
    rss_start = rss_end = None
    kills, next_kill, victim = 0, time.time() + args.kill_every, 0
    while time.time() < deadline and trainer.returncode is None:
        await asyncio.sleep(1.0)
        rss = _rss_mb(trainer.pid)
        if rss is not None:
            rss_end = rss
            if rss_start is None and any(r["phase"] == "rl" for r in _rows(out / "run")):
                rss_start = rss
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

    rows = [r for r in _rows(out / "run") if r["phase"] == "rl"]
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
    injected = {k: sum(p.counts[k] for p in proxies) for k in proxies[0].counts}
    return {
        "minutes": (time.time() - start) / 60, "steps": len(rows), "crashed": crashed,
        "retries": sum(r.get("rollout_retries", 0) for r in rows),
        "failed_requests": sum(r.get("rollout_failures", 0) for r in rows),
        "server_kills": kills, **{f"injected_{k}": v for k, v in injected.items()},
        "stale_turns": sum(r.get("rollout/stale_turns", 0) for r in rows),
        "episodes": sum(r["episodes"] for r in rows),
        "lost_episodes": sum(per_step - r["episodes"] for r in rows),
        "failed_episodes": sum(r["episodes_failed"] for r in rows),
        "rss_start_mb": rss_start, "rss_end_mb": rss_end,
    }


def _demo():
    import runpy
    return runpy.run_path(str(ROOT / "configs" / "demo.py"))["config"]("cost")


def _config(out: pathlib.Path, urls, init_from):
    """The demo's cost run, its rollouts through the proxies, until stopped."""
    import dataclasses
    demo = _demo()
    rollout = dataclasses.replace(demo.rollout, backend="sglang", server_urls=tuple(urls),
                                  weight_sync_dir=str(out / "weights"))
    return dataclasses.replace(demo, name="soak", out_dir=str(out / "run"), steps=10**6,
                               checkpoint_every=5, eval_every=0, rollout=rollout,
                               init_from=init_from)


def child(args) -> None:
    """The trainer, with the routing tools made flaky and a 1 s tool timeout."""
    import functools

    from orchestrax.agent import executor as ex
    from orchestrax.envs import routing
    from orchestrax.train import loop, setup

    rng = random.Random(0)

    class Flaky:
        def __init__(self, tool):
            self.spec, self._tool = tool.spec, tool

        async def __call__(self, arguments):
            draw = rng.random()
            if draw < P_TOOL_HANG:
                await asyncio.sleep(3600)  # the executor's timeout ends it
            if draw < P_TOOL_HANG + P_TOOL_ERROR:
                raise ConnectionError("injected transient tool failure")
            return await self._tool(arguments)

    tools = routing.RoutingEnv.tools
    routing.RoutingEnv.tools = lambda self, task: [Flaky(t) for t in tools(self, task)]
    limits = ex.ToolLimits(timeout_s=1.0, backoff_s=0.05, backoff_max_s=0.2)
    loop.ToolExecutor = functools.partial(ex.ToolExecutor, ex.ExecutorConfig(default=limits))
    setup.configure_logging()
    out = pathlib.Path(args.out)
    loop.train(_config(out, args.urls.split(","), args.init_from))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between server kills")
    ap.add_argument("--out", default="runs/soak")
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
            f"on): {result['steps']} RL steps, {result['retries']:.0f} client retries, "
            f"{result['failed_requests']:.0f} failed requests, {result['server_kills']} server "
            f"kills, injected {result['injected_500']} x 500 / {result['injected_truncated']} "
            f"truncated, {result['stale_turns']:.0f} stale turns dropped, "
            f"{result['episodes']:.0f} episodes, lost {result['lost_episodes']:.0f}, failed "
            f"{result['failed_episodes']:.0f}; trainer RSS {result['rss_start_mb'] or 0:.0f} -> "
            f"{result['rss_end_mb'] or 0:.0f} MB; {'OK' if ok else 'FAILED'} "
            f"(python bench/soak.py --minutes {args.minutes:g})\n")
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write(line)
    print(line, end="")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
