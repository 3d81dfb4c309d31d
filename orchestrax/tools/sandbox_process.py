"""A long-lived sandboxed interpreter that its owner talks to over stdin/stdout (a tool worker).

Same sandbox as `sandbox.run_python` (bubblewrap, seccomp, rlimits, the run's own uid and
cgroup, the memory watchdog where there is no cgroup), except that there is no wall clock on the
whole run: the owner bounds each exchange and ends the process with `close()`. A process that
dies or is killed (memory watchdog, CPU limit) shows as end-of-file on `stdout`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os

from orchestrax.tools import sandbox_limits
from orchestrax.tools.sandbox import (SandboxConfig, _kill_group, _kill_namespace, _namespace_init,
                                      check_available, spawn)

log = logging.getLogger(__name__)
_STDERR_KEPT = 8192


class SandboxProcess:
    """`proc = await SandboxProcess.start(("-c", source), config)`; then write lines to
    `proc.stdin`, read them from `proc.stdout`; `await proc.close()` kills every process of it
    and gives its uid and cgroup back (safe to call twice)."""

    def __init__(self, proc: asyncio.subprocess.Process, lease: sandbox_limits.Lease,
                 init: tuple[int, str] | None, memory_bytes: int):
        self._proc, self._lease, self._init = proc, lease, init
        self.stdin, self.stdout = proc.stdin, proc.stdout
        self._stderr: collections.deque[bytes] = collections.deque()
        self._tasks = [asyncio.ensure_future(self._drain_stderr())]
        if init is not None and lease.cgroup is None:
            self._tasks.append(asyncio.ensure_future(self._watch(memory_bytes)))
        self.memory_limit_hit = False
        self._closed = False

    @classmethod
    async def start(cls, args: tuple[str, ...], config: SandboxConfig, *,
                    line_limit: int = 64 << 20) -> "SandboxProcess":
        """Raises `SandboxUnavailable`, `SandboxBusy` or OSError when nothing could start."""
        check_available(config)
        lease = await sandbox_limits.acquire(
            uid_base=config.host_uid_base, uid_slots=config.host_uid_slots,
            wait_s=config.wall_timeout_s, use_cgroup=config.limits != "uid",
            memory_bytes=config.memory_bytes, processes=config.processes)
        try:
            proc, info_r = await spawn(config, lease, args, limit=line_limit)
        except BaseException:
            await asyncio.shield(lease.release())
            raise
        init = await _namespace_init(info_r, config.wall_timeout_s) if info_r is not None else None
        return cls(proc, lease, init, config.memory_bytes)

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode("utf-8", errors="replace")[-_STDERR_KEPT:]

    async def _drain_stderr(self) -> None:
        kept = 0
        while chunk := await self._proc.stderr.read(65536):
            self._stderr.append(chunk)
            kept += len(chunk)
            while kept > _STDERR_KEPT and len(self._stderr) > 1:
                kept -= len(self._stderr.popleft())

    async def _watch(self, memory_bytes: int) -> None:
        await sandbox_limits.watch_memory(self._init[0], memory_bytes)
        self.memory_limit_hit = True
        self._kill()

    def _kill(self) -> None:
        _kill_group(self._proc.pid)
        if self._init is not None and sandbox_limits.start_time(self._init[0]) == self._init[1]:
            try:
                os.kill(self._init[0], 9)
            except ProcessLookupError:
                pass

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._kill()
            if self._init is not None:
                await _kill_namespace(self._init)
            if self._proc.returncode is None:
                await self._proc.wait()
            if self._lease.cgroup is not None and self._lease.cgroup.oom_kills() > 0:
                self.memory_limit_hit = True
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.shield(self._lease.release())
