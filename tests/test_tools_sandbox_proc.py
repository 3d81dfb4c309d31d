"""The one /proc/pid/stat reader the sandbox uses (`sandbox_limits.start_time`, `is_zombie`):
a live process, one whose name holds spaces and parentheses, a zombie, a reaped pid."""

import os
import subprocess
import sys
import time

from orchestrax.tools import sandbox_limits

# Waits for a line, renames itself to a name that breaks a plain split of /proc/pid/stat, waits.
RENAME = ("import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"
          "open('/proc/self/comm', 'w').write('a) b (c')\n"
          "print('renamed', flush=True)\nsys.stdin.read()\n")


def test_start_time_survives_a_name_with_spaces_and_parentheses_then_goes():
    child = subprocess.Popen([sys.executable, "-c", RENAME], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        # while its name has no spaces, field 22 (start time in clock ticks) is a plain split's
        start = open(f"/proc/{child.pid}/stat").read().split()[21]
        assert sandbox_limits.start_time(child.pid) == start
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "renamed\n"
        assert open(f"/proc/{child.pid}/comm").read() == "a) b (c\n"
        assert sandbox_limits.start_time(child.pid) == start
        assert not sandbox_limits.is_zombie(child.pid)
    finally:
        child.stdin.close()
    deadline = time.monotonic() + 10
    while sandbox_limits.start_time(child.pid) is not None:  # exited, not yet reaped: a zombie
        assert time.monotonic() < deadline, "child did not exit"
        time.sleep(0.01)
    assert os.path.exists(f"/proc/{child.pid}") and sandbox_limits.is_zombie(child.pid)
    child.wait()
    assert sandbox_limits.start_time(child.pid) is None and sandbox_limits.is_zombie(child.pid)
