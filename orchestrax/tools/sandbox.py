"""Run untrusted Python in a bubblewrap sandbox: no network, read-only system, private size-capped
tmpfs, no nested user namespaces, a seccomp filter (`sandbox_seccomp`), rlimits, a wall-clock kill,
and bounds on the whole run (`sandbox_limits`).

Why the host-side uid drop: as root, a process inside `--unshare-user --uid 65534` still maps to
host uid 0, so the kernel exempts it from RLIMIT_NPROC (fork bombs run free) and owner permissions
on root-owned files apply. As root every run is therefore started as a host uid of its own, leased
from a pool of free ones, and (where the host allows) inside a cgroup of its own that caps memory
and processes summed over the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from typing import Literal

from orchestrax.tools import sandbox_limits
from orchestrax.tools.sandbox_seccomp import build_filter, native_arch

log = logging.getLogger(__name__)

SandboxMode = Literal["bwrap", "none"]
LimitsMode = Literal["auto", "cgroup", "uid"]
TRUNCATION_MARKER = "\n[... truncated {n} bytes ...]\n"
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin")
_CHILD_PATH = "/usr/bin:/bin"   # bound read-only into every sandbox


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits: seconds of CPU and wall time, bytes of address space / file size / tmpfs / output.

    `memory_bytes` and `processes` bound the whole run (all its processes together): hard limits
    in the run's cgroup. `limits` says whether it must get one ('cgroup'), may ('auto') or must
    not ('uid'). Without a cgroup, processes are capped by RLIMIT_NPROC of the run's own leased
    uid (as root), memory by a watchdog that polls the run's process tree every 50 ms (a soft
    bound: the run can overshoot by what it allocates in that time), and CPU by nice 19 in one
    session (setsid is refused: on a host with scheduler autogroups the run is one group, one
    share as large as the trainer's session, whatever it spins; N concurrent runs take N
    shares). Not a quota: only a cgroup's `cpu_cores` bounds the run's CPU absolutely.
    """

    mode: SandboxMode = "bwrap"
    python: str = "/usr/bin/python3"
    extra_ro_binds: tuple[str, ...] = ()   # e.g. a site-packages dir for numpy (bound after /tmp)
    wall_timeout_s: float = 10.0
    cpu_seconds: int = 10
    address_space_bytes: int = 1 << 30     # raise to >= 1.5 GiB if numpy/jax are bound in
    file_size_bytes: int = 16 << 20
    tmpfs_bytes: int = 64 << 20            # each of /tmp and /dev/shm
    # Files and directories in each of /tmp and /dev/shm (as root; an empty one holds ~1 KiB
    # of kernel memory and no page, so `tmpfs_bytes` alone does not bound it)
    tmpfs_inodes: int = 65536
    open_files: int = 64
    processes: int = 32                    # per run (cgroup pids.max and the leased uid's NPROC)
    memory_bytes: int = 1 << 30            # per run (with a cgroup, tmpfs pages included)
    limits: LimitsMode = "auto"
    output_bytes: int = 16 << 10           # per stream, before the truncation marker
    host_uid_base: int = 200_000           # only used when running as root
    host_uid_slots: int = 64               # most runs at once; a run waits for a free uid
    cpu_cores: float = 1.0                 # CPU quota of the whole run (with a cgroup)
    # Host-wide cap on the memory limits of concurrent runs (as root, where leases are
    # host-wide): fewer runs are admitted at once when slots x memory_bytes would exceed it.
    # 0: half of the host's RAM.
    memory_budget_bytes: int = 0

    def __post_init__(self):
        if self.mode not in ("bwrap", "none"):
            raise ValueError(f"SandboxConfig.mode={self.mode!r}; allowed: 'bwrap', 'none'")
        if self.limits not in ("auto", "cgroup", "uid"):
            raise ValueError(f"SandboxConfig.limits={self.limits!r}; allowed: 'auto', 'cgroup', "
                             "'uid'")
        for field in ("wall_timeout_s", "cpu_seconds", "address_space_bytes", "file_size_bytes",
                      "tmpfs_bytes", "tmpfs_inodes", "open_files", "processes", "output_bytes",
                      "host_uid_slots",
                      "memory_bytes", "host_uid_base", "cpu_cores"):
            if getattr(self, field) <= 0:
                raise ValueError(f"SandboxConfig.{field}={getattr(self, field)}; must be > 0")
        if self.memory_budget_bytes < 0:
            raise ValueError(f"SandboxConfig.memory_budget_bytes={self.memory_budget_bytes}; "
                             "must be >= 0 (0: half of the host's RAM)")
        if not os.path.isabs(self.python):
            raise ValueError(f"SandboxConfig.python={self.python!r}; must be an absolute path")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None           # negative: killed by that signal
    timed_out: bool                 # the wall-clock limit fired
    seconds: float
    memory_limit_hit: bool = False  # the run's cgroup OOM-killed a process, or the watchdog
                                    # killed the run
    error: str | None = None        # the sandbox itself failed (not the code); nothing ran or
                                    # the run was cut short

    def observation(self) -> str:
        """What the policy sees: streams, then a one-line status when the run did not exit 0."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.error is not None:
            parts.append(f"[sandbox error: {self.error}]")
        elif self.memory_limit_hit:
            parts.append("[killed: memory limit of the run reached]")
        elif self.timed_out:
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
    try:
        native_arch()
    except ValueError as e:
        raise SandboxUnavailable(str(e)) from None
    if not _bwrap_disables_userns():
        raise SandboxUnavailable("bwrap lacks --disable-userns (bubblewrap >= 0.8.0 needed)")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        raise SandboxUnavailable("setpriv (util-linux) is not installed; it drops to the run's uid")
    if config.limits == "cgroup" and sandbox_limits.cgroup_host() is None:
        raise SandboxUnavailable(
            "SandboxConfig.limits='cgroup' but this process cannot create a cgroup with the memory "
            "and pids controllers (needs root and a writable cgroup v2 with them delegated, or "
            "writable v1 memory and pids hierarchies); use limits='auto' or 'uid'")


@functools.cache
def _filter() -> bytes:
    return build_filter()


@functools.cache
def _bwrap_disables_userns() -> bool:
    usage = subprocess.run([shutil.which("bwrap"), "--help"], capture_output=True, text=True)
    return "--disable-userns" in usage.stdout + usage.stderr


def _prlimit_argv(config: SandboxConfig) -> list[str]:
    cpu = config.cpu_seconds
    nproc = config.processes
    if os.geteuid() != 0:
        # RLIMIT_NPROC counts every process of the (shared) host uid, not just the sandbox's
        nproc += len(sandbox_limits.processes_of(os.geteuid()))
    # soft limit sends SIGXCPU, the hard one a second later SIGKILL
    # absolute paths: the child's PATH is /usr/bin:/bin, the caller's may differ
    return [shutil.which("prlimit"), f"--cpu={cpu}:{cpu + 1}", f"--as={config.address_space_bytes}",
            f"--fsize={config.file_size_bytes}", f"--nofile={config.open_files}",
            f"--nproc={nproc}", "--core=0", "--"]


def _bwrap_argv(config: SandboxConfig, info_fd: int | None, seccomp_fd: int | None,
                tmpfs_dirs: tuple[str, str] | None) -> list[str]:
    argv = [shutil.which("bwrap"), *(["--info-fd", str(info_fd)] if info_fd is not None else []),
            *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
            "--unshare-all", "--unshare-user", "--disable-userns", "--uid", "65534",
            "--gid", "65534", "--cap-drop", "ALL", "--die-with-parent", "--new-session",
            # The program is its namespace's pid 1, a child of bwrap: when it ends the kernel
            # kills and reaps the whole namespace before bwrap exits. bwrap's own init would
            # outlive bwrap and be left a zombie (holding the run's uid) for the host's pid 1,
            # which reaps late or never. Cost: as an init the program ignores SIGXCPU, so the
            # CPU limit kills it with the hard limit's SIGKILL, a second later.
            "--as-pid-1", "--clearenv",
            "--setenv", "PATH", _CHILD_PATH, "--setenv", "HOME", "/tmp",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    # bwrap's own root and /dev are unbounded tmpfs mounts (half the host's RAM each): make them
    # read-only so the only writable space is the size-capped /tmp and /dev/shm
    if tmpfs_dirs is None:
        size = str(config.tmpfs_bytes)
        shm, tmp = ["--size", size, "--tmpfs", "/dev/shm"], ["--size", size, "--tmpfs", "/tmp"]
    else:   # tmpfs mounted for this run with an inode cap (`tmpfs_mounts`)
        shm, tmp = ["--bind", tmpfs_dirs[1], "/dev/shm"], ["--bind", tmpfs_dirs[0], "/tmp"]
    argv += ["--proc", "/proc", "--dev", "/dev", *shm, "--remount-ro", "/dev", *tmp]
    # after the tmpfs, so an interpreter that lives under /tmp is not hidden by it
    for path in (config.python, *config.extra_ro_binds):
        if not any(path == d or path.startswith(d + "/") for d in _SYSTEM_DIRS):
            argv += ["--ro-bind", path, path]
    return argv + ["--remount-ro", "/", "--chdir", "/tmp"]


def build_argv(config: SandboxConfig, info_fd: int | None = None,
               seccomp_fd: int | None = None, args: tuple[str, ...] = ("-",),
               tmpfs_dirs: tuple[str, str] | None = None, lowest_priority: bool = False
               ) -> list[str]:
    """The command line after the run's lease prefix; by default the code itself goes to the
    interpreter's stdin (`args`: the interpreter's arguments after -I). bwrap writes
    {"child-pid": host pid of the namespace's init} to `info_fd` and reads the compiled seccomp
    filter from `seccomp_fd`. `tmpfs_dirs`: the (/tmp, /dev/shm) mounts `tmpfs_mounts` made,
    bound in place of bwrap's own tmpfs. `lowest_priority` (a run without a CPU quota): the
    interpreter starts at nice 19, after bwrap gave it a session (an autogroup) of its own.
    Niced earlier, the set-up steps would run at nice 19 inside the caller's autogroup and
    starve behind any busy thread of the caller's session (seconds per run under load, the wall
    limit reached before the program started)."""
    py = [config.python, "-I", *args]
    if lowest_priority:
        py = [shutil.which("nice", path=_CHILD_PATH), "-n", "19", *py]
    if config.mode == "none":
        return _prlimit_argv(config) + py
    return _prlimit_argv(config) + _bwrap_argv(config, info_fd, seccomp_fd, tmpfs_dirs) + py


def tmpfs_mounts(config: SandboxConfig) -> tuple[list[str], tuple[str, str]]:
    """(argv, dirs): as root, before the drop to the run's uid, `argv` gives the run a mount
    namespace of its own holding a tmpfs of `tmpfs_bytes` and `tmpfs_inodes` on each of `dirs`
    (for /tmp and /dev/shm). bwrap's `--tmpfs` takes a size but no inode count (each would get
    half the host's RAM in pages worth of inodes, ~1 KiB of kernel memory apiece). The host's
    directories stay empty: the mounts live and die with the run's namespace."""
    base = sandbox_limits.lock_dir().parent / "orchestrax-sandbox-tmpfs"
    dirs = (str(base / "tmp"), str(base / "shm"))
    for d in (base, *dirs):
        os.makedirs(d, mode=0o755, exist_ok=True)   # the run's uid must reach them for bwrap
    opts = f"size={config.tmpfs_bytes},nr_inodes={config.tmpfs_inodes},mode=1777,nosuid,nodev"
    mounts = " && ".join(f"{shutil.which('mount')} -t tmpfs -o {opts} orchestrax-run {d}"
                         for d in dirs)
    return [shutil.which("unshare"), "--mount", "--propagation", "private", "--", "/bin/sh",
            "-c", f'{mounts} && exec "$@"', "sh"], dirs


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> str:
    """Keep the first `cap` bytes, drain (and count) the rest so the child never blocks."""
    kept, dropped = bytearray(), 0
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    text = kept.decode("utf-8", errors="replace")
    return text + TRUNCATION_MARKER.format(n=dropped) if dropped else text


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
    start = sandbox_limits.start_time(pid)
    return (pid, start) if start is not None else None


async def _kill_namespace(init: tuple[int, str]) -> None:
    """SIGKILL the namespace's init; the kernel then kills every process in the namespace and
    init only turns zombie once they are all reaped, so waiting for that means none is left."""
    pid, start = init
    if sandbox_limits.start_time(pid) != start:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(1000):
        if sandbox_limits.start_time(pid) != start:
            return
        await asyncio.sleep(0.005)
    log.warning("sandbox namespace init %d still alive 5 s after SIGKILL", pid)


async def run_python(code: str, config: SandboxConfig) -> SandboxResult:
    """Run `code` with the sandbox's interpreter. Never raises (a failure of the sandbox itself
    comes back as `SandboxResult.error`) except `CancelledError`; when it returns or is cancelled
    (an executor's timeout) no process of the run is alive."""
    t0 = time.monotonic()
    try:
        check_available(config)
        budget = config.memory_budget_bytes or sandbox_limits.host_memory_bytes() // 2
        slots = sandbox_limits.concurrent_runs(config.host_uid_slots, config.memory_bytes,
                                               budget)
        if slots < 1:
            raise SandboxUnavailable(
                f"SandboxConfig.memory_bytes={config.memory_bytes} is over the memory budget of "
                f"all runs together ({budget} bytes, memory_budget_bytes)")
        lease = await sandbox_limits.acquire(
            uid_base=config.host_uid_base, uid_slots=slots,
            wait_s=config.wall_timeout_s, use_cgroup=config.limits != "uid",
            memory_bytes=config.memory_bytes, processes=config.processes,
            cpu_cores=config.cpu_cores)
    except (SandboxUnavailable, sandbox_limits.SandboxBusy) as e:
        return _failed(e, t0)
    except Exception as e:  # a host fault (cgroupfs, /proc, fds): the episode goes on without it
        log.exception("sandbox set-up failed")
        return _failed(e, t0)
    try:
        return await _run_leased(code, config, lease, t0)
    except Exception as e:
        log.exception("sandbox run failed")
        return _failed(e, t0)
    finally:
        await asyncio.shield(lease.release())


def _failed(e: BaseException, t0: float) -> SandboxResult:
    return SandboxResult(stdout="", stderr="", exit_code=None, timed_out=False,
                         seconds=time.monotonic() - t0, error=f"{type(e).__name__}: {e}")


def _filter_pipe() -> int:
    """A pipe's read end holding the compiled seccomp filter (under 1 KiB: fits the pipe
    buffer, so no reader is needed yet). One per run: bwrap reads it to EOF."""
    r, w = os.pipe()
    try:
        os.write(w, _filter())
    finally:
        os.close(w)
    return r


async def spawn(config: SandboxConfig, lease: sandbox_limits.Lease,
                args: tuple[str, ...] = ("-",), **kwargs) -> tuple[asyncio.subprocess.Process,
                                                                    int | None]:
    """Start the sandboxed interpreter under `lease` with piped stdin/stdout/stderr; returns it
    and the read end of bwrap's --info-fd pipe (None without bwrap), for `_namespace_init`.
    `kwargs` go to create_subprocess_exec (e.g. `limit`)."""
    bwrap = config.mode == "bwrap"
    info_r, info_w = os.pipe() if bwrap else (None, None)
    seccomp_r = _filter_pipe() if bwrap else None
    child_fds = tuple(fd for fd in (info_w, seccomp_r) if fd is not None)
    mount_argv, tmpfs_dirs = tmpfs_mounts(config) if bwrap and lease.uid is not None else ([],
                                                                                        None)
    try:
        proc = await asyncio.create_subprocess_exec(
            *lease.argv_prefix(mount_argv), *build_argv(config, info_w, seccomp_r, args,
                                                        tmpfs_dirs, lease.cgroup is None),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, process_group=0, env={"PATH": _CHILD_PATH},
            cwd="/", pass_fds=child_fds, **kwargs)
    except BaseException:
        if info_r is not None:
            os.close(info_r)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    return proc, info_r


async def _run_leased(code: str, config: SandboxConfig, lease: sandbox_limits.Lease,
                      t0: float) -> SandboxResult:
    bwrap = config.mode == "bwrap"
    proc, info_r = await spawn(config, lease)
    readers = asyncio.gather(_read_capped(proc.stdout, config.output_bytes),
                             _read_capped(proc.stderr, config.output_bytes))
    init, timed_out, over_memory, watchdog = None, False, False, None
    try:
        if info_r is not None:
            init = await _namespace_init(info_r, config.wall_timeout_s)
        if init is not None and lease.cgroup is None:
            watchdog = asyncio.ensure_future(
                sandbox_limits.watch_memory(init[0], config.memory_bytes))
        try:
            # a lone surrogate goes through as bytes: the interpreter reports the bad source
            proc.stdin.write(code.encode("utf-8", "surrogatepass"))
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child died before reading all its code; its stderr says why
        finally:
            proc.stdin.close()
        exited = asyncio.ensure_future(proc.wait())
        done, _ = await asyncio.wait({exited} | ({watchdog} if watchdog else set()),
                                     timeout=config.wall_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        over_memory = watchdog in done
        timed_out = not done
    finally:
        if watchdog is not None:
            watchdog.cancel()
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
    if bwrap and status is not None and status > 128:
        status = -(status - 128)  # bwrap reports a signalled child as 128 + signal number
    oom = over_memory or (lease.cgroup is not None and lease.cgroup.oom_kills() > 0)
    return SandboxResult(stdout=stdout, stderr=stderr, exit_code=status, timed_out=timed_out,
                         seconds=time.monotonic() - t0, memory_limit_hit=oom)
