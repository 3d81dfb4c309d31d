"""What processes a test left behind: the live sandboxed processes (run under the sandbox's host
uids) that descend from this test process. Processes of other tests' runs on the same host are
not descendants, so they are not counted."""

import os
import subprocess

from orchestrax.tools.sandbox import SandboxConfig


def our_sandbox_processes(config: SandboxConfig = SandboxConfig()) -> set[int]:
    lo, hi = config.host_uid_base, config.host_uid_base + config.host_uid_slots
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,uid=,stat="], capture_output=True,
                         text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    parent = {int(pid): int(ppid) for pid, ppid, _, _ in rows}

    def descends(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parent.get(pid, 0)
        return False

    return {int(pid) for pid, _, uid, stat in rows
            if lo <= int(uid) < hi and not stat.startswith("Z") and descends(int(pid))}
