"""The SGLang client after a server restart, against real `orchestrax serve
--tiny` processes on loopback.

A server SIGKILLed and restarted between two weight syncs comes back on its start weights. The
client that published (the trainer's) replays its last sync to it before routing to it again;
a client that publishes nothing (an episode worker's) does not route to it meanwhile; neither
hands back a turn from the start weights, so nothing is dropped as stale. A restarted server that
reports the published version string on other weights (a colliding `--weight-version`) is told
apart by the model path. With one server dead, a 500 from the live one never sends a request to
the dead one.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request

import aiohttp
import pytest
from aiohttp import web
from loopback import check_token_episode, free_port, serve_app, token_episode

from orchestrax import models
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.data.records import Trajectory, TurnRecord
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams
from orchestrax.rollout.sglang_client import UNSYNCED_VERSION, SGLangClient, SGLangClientConfig
from orchestrax.train.rollouts import drop_stale


async def _serve(port: int, weight_root, *extra: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrax.cli", "serve", "--tiny", "--port", str(port),
        "--max-len", "256", "--max-batch", "16", "--weight-root", str(weight_root), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=180)
    assert b"listening" in line, line
    return proc


async def _two_servers(weight_root) -> tuple[list[int], tuple[str, ...], list]:
    """(ports, urls, processes) of two `orchestrax serve --tiny` on free loopback ports."""
    ports = [free_port(), free_port()]
    procs = list(await asyncio.gather(*(_serve(p, weight_root) for p in ports)))
    return ports, tuple(f"http://127.0.0.1:{p}" for p in ports), procs


def _weights(tmp_path, version: str) -> str:
    """An HF directory of the tiny served architecture with other weights than `--tiny`'s."""
    cfg = models.tiny_config(vocab_size=len(tiny_qwen3_tokenizer()))
    path = tmp_path / f"v{version}"
    models.save_hf(cfg, models.init_params(cfg, seed=7), path)
    return str(path.resolve())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


def _trajectory(results) -> Trajectory:
    return Trajectory(task_id="t", turns=[TurnRecord(text="", weight_version=r.weight_version)
                                          for r in results])


async def _episodes(client, first: int, n: int = 6, turns: int = 3) -> list[list]:
    out = await asyncio.gather(*(token_episode(client, i, turns, max_new_tokens=6)
                                 for i in range(first, first + n)))
    for ids, mask, results in out:
        check_token_episode(ids, mask, results, turns)
    return [results for _, _, results in out]


@pytest.mark.slow
def test_a_server_restarted_between_syncs_is_resynced_before_it_serves(tmp_path):
    path = _weights(tmp_path, "1")

    async def main():
        ports, urls, procs = await _two_servers(tmp_path)
        # Health checks far apart: the restart falls between two of them, so only the answers
        # themselves can show that server A came back on its start weights.
        cfg = SGLangClientConfig(urls=urls, health_interval_s=60.0, retry_backoff_s=0.01)
        try:
            async with SGLangClient(cfg) as trainer, SGLangClient(cfg) as worker:
                await trainer.update_weights_from_disk(path, "1")
                before = await _episodes(worker, 0)   # the worker learns the versions served
                procs[0].kill()
                await procs[0].wait()
                procs[0] = await _serve(ports[0], tmp_path)
                assert _get(f"{urls[0]}/model_info")["weight_version"] == UNSYNCED_VERSION
                after = await _episodes(worker, 10) + await _episodes(trainer, 20)
                # The trainer's client saw A's stale answer and replayed the sync at once.
                if trainer.servers[0].check is not None:
                    await trainer.servers[0].check
                # Stale answers still in flight during that replay leave the client's record of
                # A behind until the next check (every second by default; here, this one).
                await trainer.check_health(trainer.servers[0])
                info_a = _get(f"{urls[0]}/model_info")
                served_a = _get(f"{urls[0]}/server_info")["internal_states"][0]["requests"]
                later = await _episodes(worker, 30) + await _episodes(trainer, 40)
                served_a = (_get(f"{urls[0]}/server_info")["internal_states"][0]["requests"]
                            - served_a)
                return (before, after, later, info_a, served_a, trainer.stats, worker.stats)
        finally:
            await asyncio.gather(*(_kill(p) for p in procs))

    before, after, later, info_a, served_a, t_stats, w_stats = asyncio.run(main())
    trajectories = [_trajectory(r) for r in before + after + later]
    for name, phase in (("before", before), ("after", after), ("later", later)):
        assert {r.weight_version for t in phase for r in t} == {"1"}, (name, phase)
    assert drop_stale(trajectories, "1") == {"rollout/stale_trajectories": 0.0,
                                             "rollout/stale_turns": 0.0}
    assert (info_a["weight_version"], info_a["model_path"]) == ("1", path)
    assert served_a > 0  # A serves again once synced
    assert t_stats["failures"] == w_stats["failures"] == 0
    assert t_stats["stale_answers"] + w_stats["stale_answers"] >= 1
    assert t_stats["stale_answers"] <= t_stats["retries"]


@pytest.mark.slow
def test_a_restarted_server_reporting_the_published_version_is_told_apart_by_its_path(tmp_path):
    """A server restarted with `--weight-version 1` after the trainer published "1" reports the
    same version string on its start weights; its /model_info model_path gives it away and the
    health check replays the sync. Then A and B sample the same tokens with the same logprobs
    for the same seeded request."""
    path = _weights(tmp_path, "1")
    probe = GenerateRequest(input_ids=(3, 5, 7, 9), sampling=SamplingParams(
        temperature=1.0, max_new_tokens=4, sampling_seed=11))

    async def main():
        ports, urls, procs = await _two_servers(tmp_path)
        cfg = SGLangClientConfig(urls=urls, health_interval_s=0.2, retry_backoff_s=0.01)
        try:
            async with SGLangClient(cfg) as trainer:
                await trainer.update_weights_from_disk(path, "1")
                procs[0].kill()
                await procs[0].wait()
                procs[0] = await _serve(ports[0], tmp_path, "--weight-version", "1")
                for _ in range(100):
                    info = _get(f"{urls[0]}/model_info")
                    if info["model_path"] == path:
                        break
                    await asyncio.sleep(0.1)
            async with SGLangClient(SGLangClientConfig(urls=(urls[0],))) as a, \
                    SGLangClient(SGLangClientConfig(urls=(urls[1],))) as b:
                out_a, out_b = (await a.generate([probe]))[0], (await b.generate([probe]))[0]
            return info, out_a, out_b
        finally:
            await asyncio.gather(*(_kill(p) for p in procs))

    info, out_a, out_b = asyncio.run(main())
    assert (info["weight_version"], info["model_path"]) == ("1", path)
    assert out_a.output_ids == out_b.output_ids
    assert out_a.logprobs == pytest.approx(out_b.logprobs, abs=1e-5)


def test_a_turn_from_an_unsynced_server_is_stale_once_the_trainer_published():
    """Step 0 of a run without SFT publishes "0"; a restarted server reports SGLang's default
    instead, which no step number equals, so its turns are dropped."""
    traj = Trajectory(task_id="t", turns=[TurnRecord(text="", weight_version="0"),
                                          TurnRecord(text="", weight_version=UNSYNCED_VERSION)])
    assert drop_stale([traj], "0")["rollout/stale_trajectories"] == 1.0
    assert traj.end_reason == "error"


def _dead_backend_proxy(upstream: str, fail_first: int = 0):
    """Forwards /generate, /health and /model_info to `upstream` like the soak's proxy: a backend
    that refuses the connection becomes a 502. The first `fail_first` /generate calls get a 500.
    Counts the /generate calls it receives."""
    calls = {"generate": 0}

    async def forward(request: web.Request) -> web.Response:
        if request.path == "/generate":
            calls["generate"] += 1
            if calls["generate"] <= fail_first:
                return web.Response(status=500, text="injected")
        try:
            async with aiohttp.ClientSession() as s, s.request(
                    request.method, upstream + request.path, data=await request.read(),
                    headers={"Content-Type": request.content_type}) as r:
                return web.Response(body=await r.read(), status=r.status,
                                    content_type=r.content_type)
        except (aiohttp.ClientError, OSError):
            return web.Response(status=502, text="backend down")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app, calls


@pytest.mark.slow
def test_a_500_from_the_live_server_never_sends_a_request_to_the_dead_one(tmp_path):
    async def main():
        live_port = free_port()
        proc = await _serve(live_port, tmp_path)
        dead_app, dead = _dead_backend_proxy(f"http://127.0.0.1:{free_port()}")  # nothing there
        live_app, live = _dead_backend_proxy(f"http://127.0.0.1:{live_port}", fail_first=1)
        try:
            async with serve_app(dead_app) as url_dead, serve_app(live_app) as url_live:
                cfg = SGLangClientConfig(urls=(url_dead, url_live), health_interval_s=60.0,
                                         retry_backoff_s=0.01)
                async with SGLangClient(cfg) as client:
                    await client.check_health(client.servers[0])  # known dead from here on
                    known_dead = not client.servers[0].healthy
                    out = await _episodes(client, 0, n=8)
                    return known_dead, out, dict(client.stats), dict(dead), dict(live)
        finally:
            await _kill(proc)

    known_dead, out, stats, dead, live = asyncio.run(main())
    assert known_dead
    assert dead["generate"] == 0
    assert len(out) == 8 and stats["failures"] == 0
    assert stats["retries"] == 1 and live["generate"] == stats["requests"] + 1 == 25
