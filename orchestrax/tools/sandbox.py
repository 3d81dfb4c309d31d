"""Run untrusted Python in a bubblewrap sandbox: no network, read-only system, private tmpfs,
rlimits and a wall-clock kill of the whole process group.

Why the extra host-side uid drop: as root, a process inside `--unshare-user --uid 65534` still maps
to host uid 0, so the kernel exempts it from RLIMIT_NPROC (fork bombs run free) and owner
permissions on root-owned files apply. We therefore start bwrap as an unprivileged host uid (one per
concurrent slot, so one sandbox's process budget does not starve another's) when we are root.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import pathlib
import shutil
import signal
import time
from typing import Literal

log = logging.getLogger(__name__)

SandboxMode = Literal["bwrap", "none"]
TRUNCATION_MARKER = "\n[... truncated {n} bytes ...]\n"
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
_slots = itertools.count()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits: seconds of CPU and wall time, bytes of address space / file size / tmpfs / output."""

    mode: SandboxMode = "bwrap"
    python: str = "/usr/bin/python3"
    extra_ro_binds: tuple[str, ...] = ()   # e.g. a site-packages dir for numpy (bound after /tmp)
    wall_timeout_s: float = 10.0
    cpu_seconds: int = 10
    address_space_bytes: int = 1 << 30     # raise to >= 1.5 GiB if numpy/jax are bound in
    file_size_bytes: int = 16 << 20
    tmpfs_bytes: int = 64 << 20            # each of /tmp and /dev/shm
    open_files: int = 64
    processes: int = 32                    # per host uid slot; contains fork bombs
    output_bytes: int = 16 << 10           # per stream, before the truncation marker
    host_uid_base: int = 200_000           # only used when running as root
    host_uid_slots: int = 64

    def __post_init__(self):
        if self.mode not in ("bwrap", "none"):
            raise ValueError(f"SandboxConfig.mode={self.mode!r}; allowed: 'bwrap', 'none'")
        for field in ("wall_timeout_s", "cpu_seconds", "address_space_bytes", "file_size_bytes",
                      "tmpfs_bytes", "open_files", "processes", "output_bytes", "host_uid_slots"):
            if getattr(self, field) <= 0:
                raise ValueError(f"SandboxConfig.{field}={getattr(self, field)}; must be > 0")
        if not os.path.isabs(self.python):
            raise ValueError(f"SandboxConfig.python={self.python!r}; must be an absolute path")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None           # negative: killed by that signal
    timed_out: bool                 # the wall-clock limit fired
    seconds: float

    def observation(self) -> str:
        """What the policy sees: streams, then a one-line status when the run did not exit 0."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.timed_out:
            parts.append(f"[killed: wall-clock limit reached after {self.seconds:.1f} s]")
        elif self.exit_code is not None and self.exit_code < 0:
            name = signal.Signals(-self.exit_code).name
            hint = {"SIGXCPU": " (CPU-time limit)",
                    "SIGKILL": " (CPU-time or resource limit)"}.get(name, "")
            parts.append(f"[killed by {name}{hint}]")
        elif self.exit_code:
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts) if parts else "[no output]"


class SandboxUnavailable(RuntimeError):
    pass


def check_available(config: SandboxConfig) -> None:
    """Raise `SandboxUnavailable` when the sandbox cannot run; warn once for mode='none'."""
    if config.mode == "none":
        log.warning("sandbox mode 'none': untrusted code runs UNSANDBOXED (rlimits only)")
        return
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed; install it (apt-get install bubblewrap) or "
            "opt out explicitly with SandboxConfig(mode='none')")
    if shutil.which("prlimit") is None:
        raise SandboxUnavailable("prlimit (util-linux) is not installed; it sets the rlimits")
    if not os.access(config.python, os.X_OK):
        raise SandboxUnavailable(f"SandboxConfig.python={config.python!r} is not an executable")


def _processes_of(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except FileNotFoundError:
                pass
    return n


def _prlimit_argv(config: SandboxConfig) -> list[str]:
    cpu = config.cpu_seconds
    nproc = config.processes
    if os.geteuid() != 0:
        # RLIMIT_NPROC counts every process of the (shared) host uid, not just the sandbox's
        nproc += _processes_of(os.geteuid())
    # soft limit sends SIGXCPU, the hard one a second later SIGKILL
    # absolute paths: the child's PATH is /usr/bin:/bin, the caller's may differ
    return [shutil.which("prlimit"), f"--cpu={cpu}:{cpu + 1}", f"--as={config.address_space_bytes}",
            f"--fsize={config.file_size_bytes}", f"--nofile={config.open_files}",
            f"--nproc={nproc}", "--core=0", "--"]


def _bwrap_argv(config: SandboxConfig, info_fd: int | None) -> list[str]:
    argv = [shutil.which("bwrap"), *(["--info-fd", str(info_fd)] if info_fd is not None else []),
            "--unshare-all", "--unshare-user", "--uid", "65534",
            "--gid", "65534", "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    # bwrap's own root and /dev are unbounded tmpfs mounts (half the host's RAM each): make them
    # read-only so the only writable space is the size-capped /tmp and /dev/shm
    size = str(config.tmpfs_bytes)
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", "--size", size, "--tmpfs", "/tmp"]
    # after the tmpfs, so an interpreter that lives under /tmp is not hidden by it
    for path in (config.python, *config.extra_ro_binds):
        if not any(path == d or path.startswith(d + "/") for d in _SYSTEM_DIRS):
            argv += ["--ro-bind", path, path]
    return argv + ["--remount-ro", "/", "--chdir", "/tmp"]


def build_argv(config: SandboxConfig, info_fd: int | None = None) -> list[str]:
    """The full command line; the code itself goes to the interpreter's stdin. bwrap writes
    {"child-pid": host pid of the namespace's init} to `info_fd`."""
    py = [config.python, "-I", "-"]
    if config.mode == "none":
        return _prlimit_argv(config) + py
    return _prlimit_argv(config) + _bwrap_argv(config, info_fd) + py


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> str:
    """Keep the first `cap` bytes, drain (and count) the rest so the child never blocks."""
    kept, dropped = bytearray(), 0
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    text = kept.decode("utf-8", errors="replace")
    return text + TRUNCATION_MARKER.format(n=dropped) if dropped else text


def _host_ids(config: SandboxConfig) -> dict:
    if os.geteuid() != 0:
        return {}
    uid = config.host_uid_base + next(_slots) % config.host_uid_slots
    return {"user": uid, "group": uid, "extra_groups": []}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _start_time(pid: int) -> str | None:
    """Start time (clock ticks, /proc/pid/stat field 22) of a live process; None once it is gone
    or a zombie. Pairs with the pid so a recycled pid is never mistaken for ours."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


async def _namespace_init(fd: int, timeout: float) -> tuple[int, str] | None:
    """(pid, start time) of the sandbox's pid-namespace init, from bwrap's --info-fd JSON."""
    reader = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    data = b""
    try:
        async with asyncio.timeout(timeout):
            while b"}" not in data and (chunk := await reader.read(4096)):
                data += chunk
        pid = int(json.loads(data)["child-pid"])
    except (TimeoutError, ValueError, KeyError):
        return None  # bwrap failed before starting the child; its stderr says why
    finally:
        transport.close()
    start = _start_time(pid)
    return (pid, start) if start is not None else None


async def _kill_namespace(init: tuple[int, str]) -> None:
    """SIGKILL the namespace's init; the kernel then kills every process in the namespace and
    init only turns zombie once they are all reaped, so waiting for that means none is left."""
    pid, start = init
    if _start_time(pid) != start:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(1000):
        if _start_time(pid) != start:
            return
        await asyncio.sleep(0.005)
    log.warning("sandbox namespace init %d still alive 5 s after SIGKILL", pid)


async def run_python(code: str, config: SandboxConfig) -> SandboxResult:
    """Run `code` with the sandbox's interpreter; never raises for anything the code does.
    When it returns (or is cancelled: an executor's timeout) no process of the run is alive."""
    check_available(config)
    t0 = time.monotonic()
    info_r, info_w = os.pipe() if config.mode == "bwrap" else (None, None)
    try:
        proc = await asyncio.create_subprocess_exec(
            *build_argv(config, info_w), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, process_group=0,
            env={"PATH": "/usr/bin:/bin"}, cwd="/",
            pass_fds=(info_w,) if info_w is not None else (), **_host_ids(config))
    except BaseException:
        if info_r is not None:
            os.close(info_r)
        raise
    finally:
        if info_w is not None:
            os.close(info_w)
    readers = asyncio.gather(_read_capped(proc.stdout, config.output_bytes),
                             _read_capped(proc.stderr, config.output_bytes))
    init, timed_out = None, False
    try:
        if info_r is not None:
            init = await _namespace_init(info_r, config.wall_timeout_s)
        try:
            proc.stdin.write(code.encode())
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child died before reading all its code; its stderr says why
        finally:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), config.wall_timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
    finally:
        _kill_group(proc.pid)
        if init is not None:
            await _kill_namespace(init)
        if proc.returncode is None:
            await asyncio.shield(proc.wait())
    try:
        stdout, stderr = await asyncio.wait_for(readers, 5.0)
    except asyncio.TimeoutError:  # a daemonised grandchild kept the pipe open (mode='none' only)
        stdout, stderr = "", "[output pipes held open by a surviving process]"
    status = proc.returncode
    if config.mode == "bwrap" and status is not None and status > 128:
        status = -(status - 128)  # bwrap reports a signalled child as 128 + signal number
    return SandboxResult(stdout=stdout, stderr=stderr, exit_code=status,
                         timed_out=timed_out, seconds=time.monotonic() - t0)
