"""Bounds on a whole sandbox run, not on each of its processes.

As root, every run gets a host uid of its own, leased from a pool: a uid is taken only when no
other run holds its lock file (`flock`, so leases are exclusive across processes and die with
their holder) and no process of that uid is alive, zombies included (they still count against
RLIMIT_NPROC). RLIMIT_NPROC on that uid is then a process cap for this run alone, so a fork bomb
cannot starve its neighbours. Where the host lets us create cgroups with the memory and pids
controllers (v2, else v1), the run also gets its own cgroup: memory (tmpfs pages included) and
process count summed over all its processes. Without a cgroup, `watch_memory` polls the run's
process tree instead. Without root there is no uid pool: the caller falls back to rlimits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import pathlib
import shlex
import shutil
import signal
import tempfile
import time

log = logging.getLogger(__name__)

CGROUP_PREFIX = "orchestrax-sandbox-"
_CONTROLLERS = ("memory", "pids")   # required; "cpu" is used where the host has it
CPU_PERIOD_US = 100_000


class SandboxBusy(RuntimeError):
    """No free host uid within the wait (every slot leased or still holding processes)."""


# ---------------------------------------------------------------- host processes by uid

def processes_by_uid() -> dict[int, list[int]]:
    """uid -> pids of every process on the host (zombies included)."""
    owners: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                owners.setdefault(os.stat(f"/proc/{entry}").st_uid, []).append(int(entry))
            except FileNotFoundError:
                pass
    return owners


def processes_of(uid: int) -> list[int]:
    return processes_by_uid().get(uid, [])


def start_time(pid: int) -> str | None:
    """Start time (clock ticks, /proc/pid/stat field 22) of a live process; None once it is gone
    or a zombie. Paired with the pid it names one process: a recycled pid starts at another time."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


def is_zombie(pid: int) -> bool:
    """A zombie, or already gone."""
    return start_time(pid) is None


async def kill_uid(uid: int, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every live process of `uid` until none is left; returns pids still alive after
    `timeout_s` (empty on success). Zombies are skipped: they hold no memory and their parent
    (or the host's init) reaps them."""
    deadline = time.monotonic() + timeout_s
    while True:
        live = [p for p in processes_of(uid) if not is_zombie(p)]
        if not live or time.monotonic() > deadline:
            return live
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------- memory without a cgroup

# What one inode of the run's tmpfs costs the kernel (inode + dentry slab, rounded up): empty
# files and directories hold no pages but do hold this.
INODE_BYTES = 1024
_TMPFS_DIRS = ("tmp", "dev/shm")


@functools.cache
def socket_buffer_bytes() -> int:
    """The most one socket of a run can hold queued: the host's default send plus receive
    buffer (the seccomp filter refuses setsockopt of a larger one)."""
    total = 0
    for name in ("wmem_default", "rmem_default"):
        try:
            total += int(pathlib.Path(f"/proc/sys/net/core/{name}").read_text())
        except (OSError, ValueError):
            total += 212_992  # the kernel's default
    return total


def tree_private_bytes(root_pid: int) -> int:
    """What the run under `root_pid` holds that no cgroup counts for it here: resident anonymous
    + shared-memory bytes of every process of the tree (file-backed pages such as the
    interpreter's libraries are left out: shared and reclaimable), the pages and inodes of its
    private tmpfs mounts, and the buffers its sockets can hold (each counted in full: what is
    queued in a socket shows in no process's memory)."""
    total, stack, seen, mounts, sockets = 0, [root_pid], set(), set(), set()
    host_tmp = {os.stat(f"/{d}").st_dev for d in _TMPFS_DIRS if os.path.isdir(f"/{d}")}
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
            for d in _TMPFS_DIRS:
                path = f"/proc/{pid}/root/{d}"
                dev = os.stat(path).st_dev
                if dev not in mounts and dev not in host_tmp:
                    mounts.add(dev)
                    vfs = os.statvfs(path)
                    total += ((vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
                              + (vfs.f_files - vfs.f_ffree) * INODE_BYTES)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except FileNotFoundError:
                    continue
                if target.startswith("socket:"):
                    sockets.add(target)
            for tid in os.listdir(f"/proc/{pid}/task"):
                children = pathlib.Path(f"/proc/{pid}/task/{tid}/children").read_text()
                stack += map(int, children.split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # exited between two reads
    return total + len(sockets) * socket_buffer_bytes()


async def watch_memory(root_pid: int, limit_bytes: int, period_s: float = 0.05) -> None:
    """Return as soon as the tree under `root_pid` holds more than `limit_bytes` (see
    `tree_private_bytes`); never returns otherwise. A soft bound: the run can overshoot by what
    it allocates in one period. If /proc cannot be read it logs once and stops watching."""
    try:
        while tree_private_bytes(root_pid) <= limit_bytes:
            await asyncio.sleep(period_s)
    except (OSError, ValueError):
        log.exception("sandbox memory watchdog stopped; the run's memory is not bounded")
        await asyncio.Event().wait()


# ---------------------------------------------------------------- the uid pool

def lock_dir() -> pathlib.Path:
    base = pathlib.Path("/run" if os.access("/run", os.W_OK) else tempfile.gettempdir())
    path = base / "orchestrax-sandbox"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _try_lease(uid: int, busy: set[int]) -> int | None:
    """The lock fd of `uid` when it is free, else None. Lock first, then look at processes, so a
    uid another holder is about to use is never seen as free."""
    if uid in busy:
        return None
    fd = os.open(lock_dir() / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    if processes_of(uid):  # a leftover of a crashed holder, or a host user we must not share
        os.close(fd)
        return None
    return fd


async def lease_uid(base: int, slots: int, wait_s: float) -> tuple[int, int]:
    """(uid, lock fd) of the lowest free uid in [base, base + slots); waits up to `wait_s` for one
    to free up, then raises `SandboxBusy`."""
    deadline = time.monotonic() + wait_s
    while True:
        owners = processes_by_uid()
        busy = {u for u in owners if base <= u < base + slots}
        for uid in range(base, base + slots):
            fd = _try_lease(uid, busy)
            if fd is not None:
                return uid, fd
        if time.monotonic() > deadline:
            # a run's orphans (mode 'none') are left zombies for the host's pid 1 to reap
            only_zombies = sum(all(is_zombie(p) for p in owners[u]) for u in busy)
            raise SandboxBusy(
                f"no free sandbox host uid in [{base}, {base + slots}) after {wait_s:.1f} s; "
                f"{len(busy)} hold processes, {only_zombies} of them only zombies (if that is "
                f"most, the host's pid 1 does not reap orphans: run under an init such as tini "
                f"or `docker run --init`; else raise SandboxConfig.host_uid_slots or lower the "
                f"concurrency)")
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------- cgroups

@dataclasses.dataclass(frozen=True)
class CgroupHost:
    """Where run cgroups are created: for v2 one directory with memory and pids (and cpu, where
    the host has it) enabled in its subtree; for v1 the caller's own cgroup in the memory, pids
    and (where writable) cpu hierarchies."""

    version: int
    parents: tuple[pathlib.Path, ...]  # v2: (dir,); v1: (memory dir, pids dir[, cpu dir])
    cpu: bool = False                  # runs get a CPU quota (and an equal share)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, mount root, fs type, super options) of the cgroup mounts."""
    out = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields, rfields = left.split(), right.split()
        if rfields[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], fields[3], rfields[0], set(rfields[2].split(","))))
    return out


def _own_cgroups() -> dict[str, str]:
    """controller (or '' for v2) -> this process's cgroup path."""
    own = {}
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            own[c] = path
    return own


def _under(mount: str, root: str, path: str) -> pathlib.Path:
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return pathlib.Path(mount) / rel.lstrip("/")


def _v2_parent(mount: str, root: str, own: str) -> pathlib.Path | None:
    """The nearest cgroup, from ours upwards, whose children can get memory and pids."""
    d, top = _under(mount, root, own), pathlib.Path(mount)
    while True:
        try:
            available = set((d / "cgroup.controllers").read_text().split())
            if set(_CONTROLLERS) <= available:
                enabled = set((d / "cgroup.subtree_control").read_text().split())
                want = set(_CONTROLLERS) | ({"cpu"} & available)
                if not want <= enabled:
                    # fails (EBUSY) when d holds processes and is not the root: then go up
                    (d / "cgroup.subtree_control").write_text(
                        " ".join(f"+{c}" for c in sorted(want - enabled)))
                return d
        except OSError:
            pass
        if d == top:
            return None
        d = d.parent


@functools.cache
def cgroup_host() -> CgroupHost | None:
    """The host's cgroup set-up as seen by this (root) process; None when we cannot make a cgroup
    with both memory and pids limits."""
    if os.geteuid() != 0:
        return None
    try:
        mounts, own = _mounts(), _own_cgroups()
    except OSError:
        return None
    for mount, root, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            parent = _v2_parent(mount, root, own[""])
            if parent is not None:
                cpu = "cpu" in (parent / "cgroup.subtree_control").read_text().replace(
                    "+", "").split()
                return CgroupHost(version=2, parents=(parent,), cpu=cpu)
    parents = []
    for controller in _CONTROLLERS:
        found = [_under(m, r, own[controller]) for m, r, t, opts in mounts
                 if t == "cgroup" and controller in opts and controller in own]
        if not found or not os.access(found[0], os.W_OK):
            return None
        parents.append(found[0])
    cpu = [_under(m, r, own["cpu"]) for m, r, t, opts in mounts
           if t == "cgroup" and "cpu" in opts and "cpu" in own]
    if cpu and os.access(cpu[0], os.W_OK):
        return CgroupHost(version=1, parents=(*parents, cpu[0]), cpu=True)
    return CgroupHost(version=1, parents=tuple(parents))


@dataclasses.dataclass(frozen=True)
class RunCgroup:
    host: CgroupHost
    name: str

    @property
    def dirs(self) -> tuple[pathlib.Path, ...]:
        return tuple(p / self.name for p in self.host.parents)

    def _file(self, controller: str, name: str) -> pathlib.Path:
        d = self.dirs[0] if self.host.version == 2 else self.dirs[
            (*_CONTROLLERS, "cpu").index(controller)]
        return d / name

    def create(self, memory_bytes: int, processes: int, cpu_cores: float = 1.0) -> None:
        for d in self.dirs:
            d.mkdir()
        if self.host.cpu:
            # A quota on the whole run, however many processes (or sessions) it spins up, and
            # the default weight, so every run gets the same share of a contended CPU.
            quota = max(1000, int(cpu_cores * CPU_PERIOD_US))
            if self.host.version == 2:
                self._file("cpu", "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            else:
                self._file("cpu", "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                self._file("cpu", "cpu.cfs_quota_us").write_text(str(quota))
        mem = functools.partial(self._file, "memory")
        if self.host.version == 2:
            mem("memory.max").write_text(str(memory_bytes))
            _write_if_present(mem("memory.swap.max"), "0")
            mem("memory.oom.group").write_text("1")  # an OOM kills the whole run, not one child
        else:
            mem("memory.limit_in_bytes").write_text(str(memory_bytes))
            _write_if_present(mem("memory.memsw.limit_in_bytes"), str(memory_bytes))
        self._file("pids", "pids.max").write_text(str(processes))

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except FileNotFoundError:
                pass
        return found

    def oom_kills(self) -> int:
        name = "memory.events" if self.host.version == 2 else "memory.oom_control"
        try:
            for line in self._file("memory", name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except FileNotFoundError:
            pass
        return 0

    async def kill_and_remove(self, timeout_s: float = 5.0) -> None:
        """SIGKILL everything in the cgroup, then remove it (retried while exits finish)."""
        if self.host.version == 2:
            _write_if_present(self.dirs[0] / "cgroup.kill", "1")
        deadline = time.monotonic() + timeout_s
        while True:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                for d in self.dirs:
                    if d.exists():
                        d.rmdir()
                return
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.warning("sandbox cgroup %s not removed: %s", self.name, e)
                    return
            await asyncio.sleep(0.005)


def _write_if_present(path: pathlib.Path, value: str) -> None:
    try:
        path.write_text(value)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------- one run's lease

@dataclasses.dataclass
class Lease:
    """What a run holds: its host uid (None when not root) and its cgroup (None without one)."""

    uid: int | None
    cgroup: RunCgroup | None
    lock_fd: int | None

    def argv_prefix(self, as_root: list[str] | tuple[str, ...] = ()) -> list[str]:
        """Prepended to the run's command: join the cgroup (as root, before anything else runs),
        then `as_root` (e.g. the run's mounts), then drop to the leased uid. Without a cgroup the
        program itself runs at nice 19 (`sandbox.build_argv`), not these steps."""
        argv: list[str] = []
        if self.cgroup is not None:
            joins = " && ".join(f"echo $$ > {shlex.quote(f)}" for f in self.cgroup.procs_files())
            argv += ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh"]
        argv += as_root
        if self.uid is not None:
            argv += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={self.uid}",
                     f"--regid={self.uid}", "--clear-groups", "--"]
        return argv

    async def release(self) -> None:
        """Kill whatever of the run is left (cgroup, then every process of the uid), then give the
        uid back. Safe to call twice."""
        try:
            if self.cgroup is not None:
                await self.cgroup.kill_and_remove()
                self.cgroup = None
            if self.uid is not None:
                left = await kill_uid(self.uid)
                if left:
                    log.warning("sandbox uid %d: %d processes survived SIGKILL", self.uid,
                                len(left))
        finally:
            if self.lock_fd is not None:
                os.close(self.lock_fd)
                self.lock_fd = None


def host_memory_bytes() -> int:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def concurrent_runs(uid_slots: int, memory_bytes: int, budget_bytes: int) -> int:
    """How many runs may hold a lease at once, host-wide: the uid slots, fewer when their
    memory limits would add up past the budget (leases are host-wide, so this bounds every
    process's runs together)."""
    return min(uid_slots, budget_bytes // memory_bytes)


_reaped: set[pathlib.Path] = set()


async def reap_orphans(host: CgroupHost, uid_base: int, uid_slots: int) -> list[str]:
    """Remove the run cgroups a crashed holder left in our parents (their uid's lease is free),
    once per process and parent set; returns their names."""
    if host.parents in _reaped:
        return []
    _reaped.add(host.parents)
    names = sorted({d.name for parent in host.parents if parent.is_dir()
                    for d in parent.iterdir() if d.name.startswith(CGROUP_PREFIX)})
    reaped = []
    for name in names:
        try:
            uid = int(name.removeprefix(CGROUP_PREFIX))
        except ValueError:
            continue
        fd = _try_lease(uid, set())
        if fd is None:   # leased now, or its processes are still alive
            continue
        try:
            await RunCgroup(host=host, name=name).kill_and_remove()
            reaped.append(name)
        finally:
            os.close(fd)
    if reaped:
        log.info("removed %d sandbox cgroups left by crashed runs: %s", len(reaped),
                 ", ".join(reaped))
    return reaped


async def acquire(*, uid_base: int, uid_slots: int, wait_s: float, use_cgroup: bool,
                  memory_bytes: int, processes: int, cpu_cores: float = 1.0) -> Lease:
    """A lease for one run. As root: a free uid, plus a cgroup when `use_cgroup` and the host
    allows one. Not root: an empty lease."""
    if os.geteuid() != 0:
        return Lease(uid=None, cgroup=None, lock_fd=None)
    host = cgroup_host() if use_cgroup else None
    if host is not None:
        await reap_orphans(host, uid_base, uid_slots)
    uid, fd = await lease_uid(uid_base, uid_slots, wait_s)
    lease = Lease(uid=uid, cgroup=None, lock_fd=fd)
    try:
        if host is not None:
            lease.cgroup = RunCgroup(host=host, name=f"{CGROUP_PREFIX}{uid}")
            await lease.cgroup.kill_and_remove()  # a leftover of a crashed holder of this uid
            lease.cgroup.create(memory_bytes, processes, cpu_cores)
    except BaseException:
        await lease.release()
        raise
    return lease
