"""The escape and exhaustion corpus (tests/sandbox_corpus/NN_*.py) against the real sandbox.

Each program prints 'ESCAPED <what>' when an attempt succeeds that must not, and most end with
'DONE' so a program that died early cannot pass by printing nothing. Its first line says what the
run must end as. After every program the HOST is checked: no live process of a sandbox uid nor
child of this test, no leftover run cgroup, no canary file written outside, the host victim
process still alive, no connection reached the host's TCP or unix servers, no secret in the
output, host memory (and tmpfs) back near where it was. Runs as root in CI (as here), where the
uid pool and cgroups apply.
"""

import asyncio
import os
import pathlib
import socket
import subprocess
import threading
import time
import uuid

import pytest

from orchestrax.tools import sandbox_limits
from orchestrax.tools.sandbox import SandboxConfig, TRUNCATION_MARKER, run_python

CORPUS = pathlib.Path(__file__).parent / "sandbox_corpus"
PROGRAMS = sorted(CORPUS.glob("[0-9][0-9]_*.py"))
REPO = pathlib.Path(__file__).resolve().parents[1]
# the corpus's own host uids: other sandbox users on the host never show up in its checks
CFG = SandboxConfig(wall_timeout_s=4.0, cpu_seconds=2, memory_bytes=512 << 20, processes=32,
                    output_bytes=4096, host_uid_base=250_000)
EXPECTATIONS = ("done", "bounded", "memory_limit", "timed_out", "exit")


def test_the_corpus_is_large_and_every_program_declares_its_outcome():
    assert len(PROGRAMS) >= 30
    for p in PROGRAMS:
        first = p.read_text().splitlines()[0]
        assert first.startswith("# expect: ") and first.split()[-1] in EXPECTATIONS, p.name


def meminfo_mib(field: str) -> int:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no {field} in /proc/meminfo")


def host_memory_came_back(before: dict[str, int]) -> str | None:
    """None once the host's memory is back near `before`, else what is still missing. The kernel
    frees a dead run's pages lazily and the other jobs on this host move MemAvailable by hundreds
    of MB, so: a few seconds' grace, a 1 GiB margin on MemAvailable (the hogs ask for GBs), and a
    tight one on Shmem, where a surviving tmpfs of the run would show."""
    for _ in range(50):
        now = {f: meminfo_mib(f) for f in before}
        if now["MemAvailable"] > before["MemAvailable"] - 1024 and \
                now["Shmem"] < before["Shmem"] + 64:
            return None
        time.sleep(0.1)
    return f"{now} MiB, was {before} MiB"


def live_sandbox_pids(config=CFG) -> list[int]:
    lo, hi = config.host_uid_base, config.host_uid_base + config.host_uid_slots
    owners = sandbox_limits.processes_by_uid()
    return [p for uid, pids in owners.items() if lo <= uid < hi for p in pids
            if not sandbox_limits.is_zombie(p)]


def live_children() -> set[int]:
    """This test process's live child processes (the sandbox's outer processes must be gone)."""
    children = set()
    for entry in os.listdir("/proc"):
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2:].split() if stat else []
        if fields and int(fields[1]) == os.getpid() and fields[0] not in "ZX":
            children.add(int(entry))
    return children


def leftover_cgroups() -> list[pathlib.Path]:
    host = sandbox_limits.cgroup_host()
    if host is None:
        return []
    ours = {f"{sandbox_limits.CGROUP_PREFIX}{u}"
            for u in range(CFG.host_uid_base, CFG.host_uid_base + CFG.host_uid_slots)}
    return [d for parent in host.parents for d in parent.iterdir() if d.name in ours]


class Listener:
    """A host TCP server on loopback and an abstract unix socket; counts whoever connects."""

    def __init__(self):
        self.hits = 0
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.abstract = f"orchestrax-corpus-{uuid.uuid4().hex}"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(b"\0" + self.abstract.encode())
        self.unix.listen()
        for s in (self.tcp, self.unix):
            s.settimeout(0.2)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, server):
        while server.fileno() != -1:
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            self.hits += 1
            conn.close()

    def close(self):
        self.tcp.close()
        self.unix.close()


@pytest.fixture(scope="module")
def host():
    listener = Listener()
    victim = subprocess.Popen(["sleep", "600"])
    canary = f"orchestrax_canary_{uuid.uuid4().hex}"
    secret = f"_CORPUS_SECRET_{uuid.uuid4().hex}"
    secret_path = REPO / f".corpus_secret_{uuid.uuid4().hex}"
    secret_path.write_text(secret)
    os.environ["ORCHESTRAX_CORPUS_SECRET"] = secret
    env = dict(listener=listener, victim=victim, canary=canary, secret=secret,
               secret_path=secret_path,
               canary_paths=[REPO / canary, *(pathlib.Path(d) / canary
                                              for d in ("/usr", "/", "/etc", "/tmp"))])
    yield env
    del os.environ["ORCHESTRAX_CORPUS_SECRET"]
    secret_path.unlink()
    victim.kill()
    victim.wait()
    listener.close()


def source(program: pathlib.Path, host) -> str:
    text = program.read_text()
    for key, value in {"__PORT__": str(host["listener"].port),
                       "__ABSTRACT__": host["listener"].abstract,
                       "__SECRET_PATH__": str(host["secret_path"]),
                       "__CANARY__": str(REPO / host["canary"]),
                       "__CANARY_NAME__": host["canary"],
                       "__VICTIM_PID__": str(host["victim"].pid)}.items():
        text = text.replace(key, value)
    return (CORPUS / "_lib.py").read_text() + "\n" + text


def check_outcome(name: str, expect: str, r) -> None:
    obs = r.observation()  # must not raise, whatever the bytes were
    assert r.error is None, (name, r.error)
    assert "ESCAPED" not in r.stdout, (name, r.stdout)
    if expect == "done":
        assert "DONE" in r.stdout and not r.timed_out, (name, obs[-2000:])
    elif expect == "bounded":
        assert r.timed_out or r.memory_limit_hit or r.exit_code != 0 or "DONE" in r.stdout, name
    elif expect == "memory_limit":
        assert r.memory_limit_hit and "memory limit" in obs, (name, obs[-2000:])
    elif expect == "timed_out":
        assert r.timed_out, (name, obs[-2000:])


@pytest.mark.slow
def test_every_corpus_program_is_contained_and_the_host_is_unharmed(host):
    assert live_sandbox_pids() == [] and leftover_cgroups() == []
    # the victim, plus whatever earlier tests in this process left running (multiprocessing's
    # resource tracker, say): a program may add none
    children_before = live_children()
    assert host["victim"].pid in children_before
    seen = {}
    for program in PROGRAMS:
        expect = program.read_text().splitlines()[0].split()[-1]
        before = {f: meminfo_mib(f) for f in ("MemAvailable", "Shmem")}
        r = asyncio.run(run_python(source(program, host), CFG))
        seen[program.name] = r
        check_outcome(program.name, expect, r)
        # the host, after each program
        assert live_sandbox_pids() == [], program.name
        assert live_children() == children_before, program.name
        assert leftover_cgroups() == [], program.name
        assert host["victim"].poll() is None, program.name
        assert host["listener"].hits == 0, program.name
        assert host["secret"] not in r.stdout + r.stderr, program.name
        for path in host["canary_paths"]:
            assert not path.exists(), (program.name, path)
        assert host_memory_came_back(before) is None, (program.name, host_memory_came_back(before))
    # what specific programs must have shown
    assert seen["03_memory_hog_children.py"].memory_limit_hit
    huge = seen["21_huge_output.py"]
    assert huge.exit_code == 0 and huge.stdout.startswith("o" * CFG.output_bytes)
    assert huge.stdout.endswith(TRUNCATION_MARKER.format(n=(100 << 20) + 5 - CFG.output_bytes))
    assert huge.stderr.endswith(TRUNCATION_MARKER.format(n=(100 << 20) - CFG.output_bytes))
    assert "\ufffd" in seen["22_surrogate_output.py"].stdout
    assert seen["05_memory_hog_tmpfs.py"].stdout.count("No space left") == 8
    assert "blocked unshare -rm" in seen["08_nested_userns.py"].stdout
    assert "fork ok 7" in seen["09_clone_namespaces.py"].stdout
    assert "refused after" in seen["35_exec_many_processes.py"].stdout
    env = seen["18_read_secrets.py"].stdout
    assert "ORCHESTRAX_CORPUS_SECRET" not in env and f"blocked {host['secret_path']}" in env
    assert "interfaces ['lo']" in seen["16_network.py"].stdout
    # a later innocent run still works
    r = asyncio.run(run_python("print('victim ok')", CFG))
    assert r.stdout == "victim ok\n", r
