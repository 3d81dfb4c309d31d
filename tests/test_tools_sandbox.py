"""Hostile code against the bubblewrap sandbox; every check looks at the HOST side."""

import asyncio
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile
import uuid

import pytest

from orchestrax.tools.tool import Pricing, ToolError
from orchestrax.tools.python_tool import PythonTool
from orchestrax.tools.sandbox import (SandboxConfig, SandboxUnavailable, TRUNCATION_MARKER,
                                      build_argv, check_available, run_python)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

# this module's own host uids: other sandbox users on the host (default 200000..) never show up
# in its process checks
UID_BASE = 240_000
CFG = SandboxConfig(wall_timeout_s=4.0, cpu_seconds=3, host_uid_base=UID_BASE)
REPO = pathlib.Path(__file__).resolve().parents[1]


def run(code, config=CFG):
    return asyncio.run(run_python(code, config))


def live_sandbox_pids(config=CFG) -> list[str]:
    """Non-zombie processes owned by the sandbox's host uids (zombies hold no resources and are
    reaped by the host's init)."""
    lo, hi = config.host_uid_base, config.host_uid_base + config.host_uid_slots
    out = subprocess.run(["ps", "-eo", "uid=,pid=,stat="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if lo <= int(line.split()[0]) < hi and not line.split()[2].startswith("Z")]


def test_trivial_code_runs_as_nobody_in_an_empty_root():
    r = run("import os; print(os.getuid(), sorted(os.listdir('/')))")
    assert r.exit_code == 0 and not r.timed_out
    uid, listing = r.stdout.split(" ", 1)
    assert uid == "65534"
    assert "work" not in listing and "etc" not in listing and "root" not in listing


def test_infinite_loop_is_killed_by_the_wall_clock():
    cfg = SandboxConfig(wall_timeout_s=1.5, cpu_seconds=60, host_uid_base=UID_BASE)
    r = run("while True: pass", cfg)
    assert r.timed_out
    assert "wall-clock limit" in r.observation()
    assert live_sandbox_pids(cfg) == []


def test_cancelling_the_call_kills_the_run():
    cfg = SandboxConfig(wall_timeout_s=60.0, cpu_seconds=60, host_uid_base=UID_BASE)

    async def scenario():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(run_python("while True: pass", cfg), 1.0)
        await asyncio.sleep(0.3)
        return live_sandbox_pids(cfg)  # checked while the event loop still runs

    assert asyncio.run(scenario()) == []


def test_cpu_rlimit_kills_a_busy_loop_before_the_wall_clock():
    cfg = SandboxConfig(wall_timeout_s=30.0, cpu_seconds=1)
    r = run("while True: pass", cfg)
    assert not r.timed_out and r.exit_code is not None and r.exit_code < 0
    assert "CPU-time" in r.observation()


def test_fork_bomb_is_contained_and_leaves_no_process_behind():
    bomb = ("import os\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n")
    cfg = SandboxConfig(wall_timeout_s=2.0, cpu_seconds=2, processes=16, host_uid_base=UID_BASE)
    r = run(bomb, cfg)
    assert r.timed_out or (r.exit_code or 0) < 0
    assert live_sandbox_pids(cfg) == []
    # the host can still start processes
    assert subprocess.run(["true"]).returncode == 0


def test_ten_gigabyte_allocation_fails_inside():
    r = run("x = bytearray(10 * 2**30)\nprint('allocated')")
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout
    assert live_sandbox_pids() == []


def test_writes_outside_the_tmpfs_do_not_reach_the_host(tmp_path):
    canary = f"orchestrax_canary_{uuid.uuid4().hex}"
    targets = [REPO / canary, pathlib.Path("/usr") / canary, pathlib.Path("/tmp") / canary,
               tmp_path / canary]
    code = "\n".join(
        f"try:\n    open({str(t)!r}, 'w').write('pwned'); print('wrote', {str(t)!r})\n"
        f"except OSError as e:\n    print('blocked', type(e).__name__)" for t in targets)
    # the sandbox's own root and /dev are unbounded tmpfs mounts: they must be read-only too
    code += "\n" + "\n".join(
        f"try:\n    open({p!r}, 'w').write('x'); print('wrote', {p!r})\n"
        f"except OSError as e:\n    print('blocked', e.errno)" for p in ("/x", "/dev/x"))
    r = run(code)
    # /tmp inside is the sandbox's own tmpfs: that write succeeds there and vanishes with it
    assert f"wrote /tmp/{canary}" in r.stdout
    assert r.stdout.count("blocked") == 5, r.stdout
    for t in targets:
        assert not t.exists(), t


def test_tmpfs_is_size_limited():
    cfg = SandboxConfig(tmpfs_bytes=1 << 20, file_size_bytes=64 << 20)
    code = ("for p in ['/tmp/big', '/dev/shm/big']:\n"
            "    try:\n"
            "        open(p, 'wb').write(b'x' * (8 << 20)); print('wrote', p)\n"
            "    except OSError as e:\n"
            "        print(p, e.strerror)\n")
    r = run(code, cfg)
    assert r.stdout.count("No space left") == 2, r.stdout


def test_cannot_read_shadow_the_repo_or_the_host_environment(monkeypatch):
    secret_line = "_SANDBOX_SECRET_" + uuid.uuid4().hex
    monkeypatch.setenv("ORCHESTRAX_TEST_SECRET", secret_line)
    secret = REPO / f".sandbox_secret_{uuid.uuid4().hex}"
    secret.write_text(secret_line)
    try:
        code = ("for p in ['/etc/shadow', " + repr(str(secret)) + ", '/proc/1/root/etc/shadow',\n"
                "          '/proc/1/environ', '/proc/self/environ']:\n"
                "    try:\n"
                "        print(open(p).read())\n"
                "    except OSError as e:\n"
                "        print('blocked', p, type(e).__name__)\n")
        r = run(code)
    finally:
        secret.unlink()
    assert secret_line not in r.observation()
    shadow = pathlib.Path("/etc/shadow")
    if os.access(shadow, os.R_OK):
        for line in shadow.read_text().splitlines():
            if line.strip():
                assert line not in r.observation()
    # the sandbox's own /proc holds only its clean environment
    assert r.stdout.count("blocked") == 3 and "PATH=/usr/bin:/bin" in r.stdout


def test_sockets_cannot_reach_a_host_server():
    async def scenario():
        hits = []

        async def on_conn(reader, writer):
            hits.append(1)
            writer.close()

        server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        code = ("import socket\n"
                f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80)]:\n"
                "    try:\n"
                "        s = socket.create_connection(addr, timeout=1); s.send(b'hi'); print('connected')\n"
                "    except OSError as e:\n"
                "        print('blocked', type(e).__name__)\n")
        r = await run_python(code, CFG)
        await asyncio.sleep(0.2)
        server.close()
        await server.wait_closed()
        return r, hits

    r, hits = asyncio.run(scenario())
    assert hits == []
    assert "connected" not in r.stdout and r.stdout.count("blocked") == 2


def test_remounting_a_bind_read_write_fails():
    canary = f"orchestrax_canary_{uuid.uuid4().hex}"
    code = ("import ctypes, subprocess\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "MS_REMOUNT, MS_BIND = 32, 4096\n"
            "rc = libc.mount(None, b'/usr', None, MS_REMOUNT | MS_BIND, None)\n"
            "print('mount rc', rc, ctypes.get_errno())\n"
            "p = subprocess.run(['unshare', '-rm', 'sh', '-c',\n"
            f"    'mount -o remount,bind,rw /usr && touch /usr/{canary}'], capture_output=True)\n"
            "print('nested rc', p.returncode)\n")
    r = run(code)
    assert "mount rc -1" in r.stdout
    assert "nested rc 0" not in r.stdout
    assert not (pathlib.Path("/usr") / canary).exists()


def test_output_is_truncated_with_a_marker():
    cfg = SandboxConfig(output_bytes=1000)
    r = run("import sys; sys.stdout.write('y' * 50000)", cfg)
    assert r.stdout.startswith("y" * 1000)
    assert TRUNCATION_MARKER.format(n=49000) in r.stdout


def test_missing_bwrap_refuses_unless_opted_out(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no bwrap, no prlimit
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        check_available(SandboxConfig())
    with pytest.raises(SandboxUnavailable):
        PythonTool(SandboxConfig())
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with caplog.at_level(logging.WARNING):
        r = run("print(6 * 7)", SandboxConfig(mode="none"))
    assert r.stdout == "42\n"
    assert "UNSANDBOXED" in caplog.text


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="mode"):
        SandboxConfig(mode="docker")
    with pytest.raises(ValueError, match="wall_timeout_s"):
        SandboxConfig(wall_timeout_s=0)
    with pytest.raises(ValueError, match=r"limits='docker'.*'auto', 'cgroup', 'uid'"):
        SandboxConfig(limits="docker")
    with pytest.raises(ValueError, match="memory_bytes=0"):
        SandboxConfig(memory_bytes=0)
    assert "--disable-userns" in build_argv(CFG)
    assert "--unshare-all" in build_argv(CFG) and "--cap-drop" in build_argv(CFG)


def test_python_tool_bills_wall_seconds_and_rejects_bad_arguments():
    tool = PythonTool(CFG, pricing=Pricing(kind="per_second", usd_per_second=0.5))
    res = asyncio.run(tool({"code": "print(sum(range(10)))"}))
    assert res.observation == "45"
    assert res.cost == pytest.approx(0.5 * res.latency)
    with pytest.raises(ToolError, match="code"):
        asyncio.run(tool({"cmd": "print(1)"}))
    with pytest.raises(ToolError, match="code"):
        asyncio.run(tool({"code": 3}))


def test_twenty_concurrent_runs_all_succeed():
    async def many():
        return await asyncio.gather(*[run_python(f"print({i} * 2)", CFG) for i in range(20)])

    results = asyncio.run(many())
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(20)]


def _readable_copy_of_the_sandbox(dest_root: pathlib.Path) -> pathlib.Path:
    """The sandbox modules copied where any user can read them: a CI clone may sit under a
    directory the unprivileged uid cannot enter (root's home)."""
    dest = dest_root / "orchestrax" / "tools"
    dest.mkdir(parents=True)
    src = REPO / "orchestrax" / "tools"
    for name in ("__init__.py", "sandbox.py", "sandbox_limits.py", "sandbox_seccomp.py"):
        shutil.copy(src / name, dest / name)
    for d in (dest_root, dest_root / "orchestrax", dest):
        d.chmod(0o755)
    for f in dest.iterdir():
        f.chmod(0o644)
    return dest_root


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged user")
def test_sandbox_started_by_an_unprivileged_user():
    """CI may run as a normal user: RLIMIT_NPROC then counts that user's other processes too,
    so the limit is raised by their number; the fork bomb is still contained, the seccomp filter
    and --disable-userns still apply (no uid pool or cgroup without root)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="orchestrax-unpriv-", dir="/tmp"))
    try:
        copy = _readable_copy_of_the_sandbox(root)
        script = (
            "import asyncio, sys\n"
            f"sys.path.insert(0, {str(copy)!r})\n"
            "from orchestrax.tools.sandbox import SandboxConfig, run_python\n"
            "cfg = SandboxConfig(wall_timeout_s=2, cpu_seconds=2, processes=16)\n"
            "probe = 'import os, ctypes; l = ctypes.CDLL(None, use_errno=True); '"
            "        'print(os.getuid(), l.unshare(0x10000000), ctypes.get_errno())'\n"
            "print(asyncio.run(run_python(probe, cfg)).stdout.strip())\n"
            "bomb = 'import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass\\n'\n"
            "r = asyncio.run(run_python(bomb, cfg))\n"
            "print(r.timed_out or (r.exit_code or 0) < 0)\n")
        uid = 54321
        out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                              "env", "-i", "PATH=/usr/bin:/bin", "/usr/bin/python3", "-c", script],
                             capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(root)
    assert out.stdout.split() == ["65534", "-1", "1", "True"], out.stderr
    ps = subprocess.run(["ps", "-eo", "uid=,stat="], capture_output=True, text=True).stdout
    assert [l for l in ps.splitlines() if l.split()[0] == str(uid) and "Z" not in l.split()[1]] == []


def test_run_python_never_raises():
    r = run("print('\ud800')")  # a lone surrogate in the source itself (was UnicodeEncodeError)
    assert r.error is None and r.exit_code == 1 and "SyntaxError" in r.stderr
    r = run("print('\\ud800')")  # one the program makes and prints
    assert r.exit_code == 1 and "UnicodeEncodeError" in r.stderr
    r = run("import sys; sys.stdout.buffer.write(b'\\xff\\xfe ok')")
    assert r.stdout == "\ufffd\ufffd ok"
    r = run("print(1)", SandboxConfig(python="/nonexistent/python3"))
    assert r.error is not None and "SandboxConfig.python" in r.error
    assert r.observation().startswith("[sandbox error: SandboxUnavailable")
    res = asyncio.run(PythonTool(CFG)({"code": "print('\ud800')"}))
    assert "SyntaxError" in res.observation
