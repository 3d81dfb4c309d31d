"""A sandbox run beside a hostile one: its wall time alone and beside the hostile run.

    python bench/sandbox_neighbour.py [--rounds 3] [--limits cgroup] [--hostile spinners]
    python bench/sandbox_neighbour.py --hostile memory --limits uid

The neighbour does a fixed amount of Python work. `--hostile spinners`: the hostile run forks 24
spinners that each try to start a session of their own. `--hostile memory`: the hostile run
fills anonymous memory, tmpfs pages, tmpfs inodes and socket buffers past its `memory_bytes`
(256 MiB), and is started again each time its bound kills it, for as long as the neighbour runs;
the host's MemAvailable is sampled every 20 ms and its largest drop below the level before is
compared with that bound. Rounds alternate alone / beside, medians are compared; the ratio is
the slowdown the hostile run causes (target: <= 2x). Needs root (uid pool, cgroups). A line goes
to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrax.tools.sandbox import SandboxConfig, run_python  # noqa: E402
from orchestrax.tools.sandbox_limits import host_memory_bytes  # noqa: E402

NEIGHBOUR = "x = 0\nfor i in range(3_000_000):\n    x += i * i\nprint('DONE')\n"
SPINNERS = """
import os
for _ in range(24):
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:   # refused in uid mode: spin in the run's session
            pass
        while True:
            pass
import signal
signal.pause()
"""
# Each kind in turn, 8 MiB at a time, until the run's bound stops it.
MEMORY_HOG = """
import os, socket
keep, n = [], 0
while True:
    keep.append(bytearray(os.urandom(1 << 20)) * 8)
    with open(f'/tmp/f{n}', 'wb') as f:
        f.write(os.urandom(1 << 20) * 8)
    for i in range(2000):
        os.mkdir(f'/tmp/d{n}-{i}')
    keep += [socket.socketpair() for _ in range(4)]
    n += 1
"""
HOSTILE = {"spinners": SPINNERS, "memory": MEMORY_HOG}
HOG_BYTES = 256 << 20


def mem_available() -> int:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


async def neighbour_seconds(cfg: SandboxConfig, hostile: str | None) -> tuple[float, int, int]:
    """(the neighbour's wall seconds, the host's largest MemAvailable drop meanwhile, hostile
    runs started)."""
    base, drop, started = mem_available(), 0, 0
    done = asyncio.Event()

    async def sample():
        nonlocal drop
        while not done.is_set():
            drop = max(drop, base - mem_available())
            await asyncio.sleep(0.02)

    async def hostile_loop():
        nonlocal started
        hog_cfg = dataclasses.replace(cfg, memory_bytes=HOG_BYTES)
        while not done.is_set():
            started += 1
            await run_python(HOSTILE[hostile], hog_cfg)

    sampler = asyncio.ensure_future(sample())
    spin = asyncio.ensure_future(hostile_loop()) if hostile else None
    if spin is not None:
        await asyncio.sleep(1.0)   # the hostile run is up
    res = await run_python(NEIGHBOUR, cfg)
    assert res.stdout.strip() == "DONE", res
    done.set()
    for task in (spin, sampler):
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
    return res.seconds, drop, started


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--limits", default="cgroup", choices=("cgroup", "uid", "auto"))
    p.add_argument("--hostile", default="spinners", choices=tuple(HOSTILE))
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()
    cfg = SandboxConfig(limits=args.limits, wall_timeout_s=60, cpu_seconds=60, processes=32,
                        host_uid_base=270_000, open_files=1024)
    alone, beside, drops, hogs = [], [], [], 0
    for _ in range(args.rounds):
        alone.append(asyncio.run(neighbour_seconds(cfg, None))[0])
        seconds, drop, started = asyncio.run(neighbour_seconds(cfg, args.hostile))
        beside.append(seconds)
        drops.append(drop)
        hogs += started
    a, b = statistics.median(alone), statistics.median(beside)
    what = ("24 setsid() spinners" if args.hostile == "spinners" else
            f"a memory hog (anonymous, tmpfs pages, tmpfs inodes, socket buffers; memory_bytes="
            f"{HOG_BYTES >> 20} MiB, restarted {hogs} times over the rounds); the host's "
            f"largest MemAvailable drop meanwhile {max(drops) / 2**20:.0f} MiB (host "
            f"{host_memory_bytes() / 2**30:.0f} GiB, other jobs' memory included)")
    line = (f"- {datetime.date.today()} sandbox neighbour ({args.limits} limits, cpu_cores="
            f"{cfg.cpu_cores:g} per run): a run's wall time alone {a:.2f} s, beside {what}: "
            f"{b:.2f} s = {b / a:.2f}x (medians of {args.rounds} alternating rounds; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores) "
            f"(python bench/sandbox_neighbour.py --limits {args.limits} --hostile {args.hostile})")
    print(line)
    if not args.no_record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
