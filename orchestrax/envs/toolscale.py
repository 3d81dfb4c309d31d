"""Any tau2-format domain folder (the ten released ToolScale domains, or one the synth pipeline
wrote) as a task source: its code runs in sandboxed domain workers (`tools.domain_worker`),
never in this process.

    env = ToolScaleEnv("../shared/data/toolscale/bank", tasks="runs/synth/tasks.json")

Tasks come from a tau2 tasks file (the folder's own tasks.json by default; a file holding
several domains' tasks gives this domain the ones whose "domain" field names it). Each episode
gets its own worker and DB copy; the verdict is the three ToolScale checks of
`envs.tau2.verify`, computed from replays in one long-lived replay worker per environment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import pathlib
import threading
import weakref
from typing import Any, Mapping, Sequence

from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.tau2.env import Tau2Config, Tau2Env
from orchestrax.envs.tau2.verify import (Verdict, gold_actions, missing_info, trajectory_calls,
                                         trajectory_texts)
from orchestrax.tools.tool import Tool, ToolSpec
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.domain_worker import (DomainWorker, EpisodeTools, WorkerConfig,
                                            WorkerFailed, WorkerGate, WorkerState, WorkerTool,
                                            tool_specs)
from orchestrax.tools.randomize import instance_tools


def read_tasks(path: str | pathlib.Path, domain: str | None = None) -> list[dict]:
    """A tau2 tasks file; with `domain`, only tasks without a "domain" field or naming it."""
    path = pathlib.Path(path)
    try:
        tasks = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON at line {e.lineno} ({e.msg})") from None
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and "id" in t for t in tasks):
        raise ValueError(f"{path}: a tau2 tasks file is a JSON list of objects with an 'id'")
    return [t for t in tasks if domain is None or t.get("domain", domain) == domain]


class _Replayer:
    """A domain's replay worker on an event loop of its own (a daemon thread), so replays may
    be awaited from any loop: the trainer's, an evaluation's, each `asyncio.run` of a script.
    Holds no reference to its `WorkerDomain`, whose finalizer calls `shutdown`."""

    def __init__(self, folder: pathlib.Path, config: WorkerConfig):
        self.folder, self.config = folder, config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name=f"domain-{folder.name}")
        self.thread.start()
        self.worker: DomainWorker | None = None
        self.lock: asyncio.Lock | None = None

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def describe(self) -> list[dict[str, Any]]:
        worker = DomainWorker(self.folder, self.config)
        try:
            return await worker.start()
        finally:
            await worker.close()

    async def replay(self, payload: list[dict[str, Any]]) -> tuple[WorkerState, list[dict]]:
        if self.lock is None:  # made on the own loop, the only one that awaits it
            self.lock = asyncio.Lock()
        async with self.lock:
            for attempt in range(2):
                try:
                    if self.worker is None or not self.worker.alive:
                        self.worker = DomainWorker(self.folder, self.config)
                        await self.worker.start()
                    reply = await self.worker.request({"op": "replay", "actions": payload})
                    if reply.get("ok"):
                        return WorkerState.from_reply(reply), reply["outcomes"]
                    raise WorkerFailed(f"replay refused: {reply.get('error')}")
                except WorkerFailed:
                    await self.worker.close()
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    async def close_worker(self) -> None:
        if self.worker is not None:
            await self.worker.close()

    def shutdown(self) -> None:
        """End the worker and the loop's thread (from any other thread; from its own, only
        scheduled)."""
        if threading.current_thread() is self.thread:
            self.submit(self.close_worker()).add_done_callback(
                lambda _: self.loop.call_soon_threadsafe(self.loop.stop))
            return
        try:
            self.submit(self.close_worker()).result(60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


class WorkerDomain:
    """What the verifier and the env need of a worker-run domain: name, policy, tasks, splits,
    tool specs, and `replay(actions)` on fresh DB copies, awaitable from any event loop. The
    replay worker lives as long as this object (or until `close()`; the next replay starts
    another)."""

    def __init__(self, folder: str | pathlib.Path, tasks: str | pathlib.Path | None = None,
                 config: WorkerConfig = WorkerConfig()):
        self.folder = pathlib.Path(folder).resolve()
        self.name = self.folder.name
        self.config = config
        policy = self.folder / "policy.md"
        self.policy = policy.read_text() if policy.is_file() else ""
        tasks_path = pathlib.Path(tasks) if tasks is not None else self.folder / "tasks.json"
        self.tasks = read_tasks(tasks_path, self.name) if tasks_path.is_file() else []
        if tasks is not None and not tasks_path.is_file():
            raise FileNotFoundError(f"tasks file {tasks_path} does not exist")
        split_file = tasks_path.parent / "split_tasks.json"
        ids = [t["id"] for t in self.tasks]
        self.splits = (json.loads(split_file.read_text()) if split_file.is_file()
                       else {"train": ids, "test": ids, "all": ids})
        self._replayer = _Replayer(self.folder, config)
        # a run's environments are never closed explicitly: their replay worker (a sandboxed
        # process holding a host uid) ends with them
        weakref.finalize(self, self._replayer.shutdown)
        self.descriptions = self._replayer.submit(self._replayer.describe()).result()
        self.specs: list[ToolSpec] = tool_specs(self.descriptions)
        self.functions = {s.name for s in self.specs}

    async def replay(self, actions: Sequence[dict[str, Any]]) -> tuple[WorkerState, list[dict]]:
        """(final state, per-action {"ok", "observation"}) of `actions` on a fresh DB. A worker
        that fails is replaced once; a second failure raises `WorkerFailed`."""
        payload = [{"name": a.get("name"), "arguments": a.get("arguments") or {}} for a in actions]
        return await asyncio.wrap_future(self._replayer.submit(self._replayer.replay(payload)))

    async def close(self) -> None:
        await asyncio.wrap_future(self._replayer.submit(self._replayer.close_worker()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolScaleConfig(Tau2Config):
    """A tau2-format domain folder whose tool code runs in domain workers (`ToolScaleEnv`)."""

    tasks: str | None = None             # a tau2 tasks file (None: the folder's own tasks)
    worker: WorkerConfig = WorkerConfig()


class ToolScaleEnv(Tau2Env):
    """A tau2-format domain run in domain workers. `domain`: a folder or a loaded
    `WorkerDomain`; the other arguments as `Tau2Env` (`completeness=True`: the ToolScale
    verdict, all three checks)."""

    def __init__(self, domain: WorkerDomain | str | pathlib.Path, *,
                 tasks: str | pathlib.Path | None = None, user_endpoint: ChatEndpoint | None = None,
                 completeness: bool = True, tools: Mapping[str, Tool] | None = None,
                 worker: WorkerConfig = WorkerConfig()):
        self.domain = (domain if isinstance(domain, WorkerDomain)
                       else WorkerDomain(domain, tasks, worker))
        self._telecom = None
        self.catalog: dict[str, Tool] = dict(tools or {})
        clash = sorted(set(self.catalog) & self.domain.functions)
        if clash:
            raise ValueError(f"ToolScaleEnv tools {clash} have the names of {self.domain.name} "
                             "domain tools; rename them in the catalog")
        self.user_endpoint = user_endpoint
        self.completeness = completeness
        self._by_id = {t["id"]: t for t in self.domain.tasks}
        self._gold: dict[str, WorkerState] = {}
        self.gate = WorkerGate(self.domain.config.max_live)

    def tools(self, task: Task) -> list[Tool]:
        """The domain's tools on one fresh worker (started at the first call, once one of
        `worker.max_live` slots is free), then the catalog or the instance's subset of it."""
        episode = EpisodeTools(self.domain.folder, self.domain.specs, self.domain.config,
                               self.gate)
        return [*episode.tools(), *instance_tools(self.catalog, task)]

    async def release(self, tools: Sequence[Tool]) -> None:
        for tool in tools:
            if isinstance(tool, WorkerTool):
                await tool.aclose()

    async def gold_state(self, raw: dict) -> WorkerState:
        if raw["id"] not in self._gold:
            self._gold[raw["id"]] = (await self.domain.replay(gold_actions(raw)))[0]
        return self._gold[raw["id"]]

    async def verdict(self, task: Task, trajectory: Trajectory) -> Verdict:
        raw = self.raw(task)
        texts = trajectory_texts(trajectory) + [m["content"] for m in trajectory.messages
                                                if m.get("role") == "assistant"
                                                and isinstance(m.get("content"), str)]
        calls = [c for c in trajectory_calls(trajectory) if c["name"] in self.domain.functions]
        gold = await self.gold_state(raw)
        state, _ = await self.domain.replay(calls)
        return Verdict(db_match=state.same_state(gold), missing_info=missing_info(raw, texts),
                       missing_entries=tuple(sorted(gold.touched - state.touched)))

    def check(self, task: Task, trajectory: Trajectory) -> Verdict:
        raise TypeError("ToolScaleEnv verdicts come from worker replays: await env.verdict(...)")

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        verdict = await self.verdict(task, trajectory)
        return float(verdict.passed if self.completeness else verdict.benchmark_passed)

