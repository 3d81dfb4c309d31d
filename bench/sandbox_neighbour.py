"""A sandbox run beside a hostile one: its wall time alone and beside 24 `setsid()` spinners.

    python bench/sandbox_neighbour.py [--rounds 3] [--limits cgroup]

The neighbour does a fixed amount of Python work; the hostile run forks 24 spinners that each
start a session of their own. Rounds alternate alone / beside, medians are compared; the ratio
is the slowdown the hostile run causes (target: <= 2x). Needs root (uid pool, cgroups). A line
goes to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrax.tools.sandbox import SandboxConfig, run_python  # noqa: E402

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


async def neighbour_seconds(cfg: SandboxConfig, hostile: bool) -> float:
    spin = asyncio.ensure_future(run_python(SPINNERS, cfg)) if hostile else None
    if spin is not None:
        await asyncio.sleep(1.0)   # the spinners are up
    res = await run_python(NEIGHBOUR, cfg)
    assert res.stdout.strip() == "DONE", res
    if spin is not None:
        spin.cancel()
        try:
            await spin
        except asyncio.CancelledError:
            pass
    return res.seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--limits", default="cgroup", choices=("cgroup", "uid", "auto"))
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()
    cfg = SandboxConfig(limits=args.limits, wall_timeout_s=60, cpu_seconds=60, processes=32,
                        host_uid_base=270_000)
    alone, beside = [], []
    for _ in range(args.rounds):
        alone.append(asyncio.run(neighbour_seconds(cfg, False)))
        beside.append(asyncio.run(neighbour_seconds(cfg, True)))
    a, b = statistics.median(alone), statistics.median(beside)
    line = (f"- {datetime.date.today()} sandbox neighbour ({args.limits} limits, cpu_cores="
            f"{cfg.cpu_cores:g} per run): a run's wall time alone {a:.2f} s, beside 24 setsid() "
            f"spinners {b:.2f} s = {b / a:.2f}x (medians of {args.rounds} alternating rounds; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores) "
            f"(python bench/sandbox_neighbour.py --limits {args.limits})")
    print(line)
    if not args.no_record:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
