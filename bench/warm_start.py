"""Start-up of `orchestrax serve --tiny`: the first request of a fresh server with and without
`--warm`, and a second start with the persistent compilation cache populated against one with
it empty, same run, same box.

Four fresh server processes, each on its own cache directory state:
  cold        empty cache, no warm-up: the first request waits for its programs' compiles
  warm        empty cache, --warm: every program compiled before "listening"
  warm+cache  --warm again on the cache `warm` filled: the programs load instead
  cold+cache  no warm-up on that cache: the first request loads what it needs
Each gets one greedy request (20-token prompt, 8 new tokens; time to its result) and then a
second one (the steady state). Ratios: the first request cold / warm, and the warm-up's seconds
with an empty cache / a populated one.

CPU numbers (tiny model, fp32, shared cores) say what the mechanism saves here, not on a GPU,
where an 8B program compiles in tens of seconds to minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import record  # noqa: E402


def first_requests(url: str, n_prompt: int = 20, n_new: int = 8) -> tuple[float, float]:
    body = json.dumps({"input_ids": list(range(3, 3 + n_prompt)),
                       "sampling_params": {"max_new_tokens": n_new, "temperature": 0.0}}).encode()
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        req = urllib.request.Request(url + "/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1800) as r:
            json.load(r)
        out.append(time.perf_counter() - t0)
    return out[0], out[1]


def serve(cache: pathlib.Path, warm: bool, max_len: int, max_batch: int) -> dict[str, float]:
    """One fresh server: seconds to "listening" and of its first two requests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")
           and not k.startswith("JAX_PERSISTENT_CACHE")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), XLA_FLAGS="")
    cmd = [sys.executable, "-m", "orchestrax.cli", "serve", "--tiny", "--port", "0",
           "--max-len", str(max_len), "--max-batch", str(max_batch),
           "--compile-cache-dir", str(cache)] + (["--warm"] if warm else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        warmed = ""
        for line in proc.stdout:
            if "warmed" in line:
                warmed = line.strip()
            if "listening on" in line:
                url = line.split("listening on ")[1].strip()
                break
        else:
            raise RuntimeError(f"server exited: {proc.wait()}")
        listen = time.perf_counter() - t0
        first, second = first_requests(url)
        found = re.search(r"warmed (\d+) .* in ([0-9.]+) s", warmed)
        return {"listen_s": listen, "first_s": first, "second_s": second,
                "programs": int(found[1]) if found else 0,
                "warm_s": float(found[2]) if found else 0.0}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=2)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        empty, filled = pathlib.Path(tmp, "empty"), pathlib.Path(tmp, "filled")
        runs = {"cold": serve(empty, False, args.max_len, args.max_batch),
                "warm": serve(filled, True, args.max_len, args.max_batch),
                "warm+cache": serve(filled, True, args.max_len, args.max_batch),
                "cold+cache": serve(filled, False, args.max_len, args.max_batch)}
        entries = len(list(filled.glob("*-cache")))
    for name, r in runs.items():
        print(f"{name:>10}: listening after {r['listen_s']:6.1f} s (warm-up {r['warm_s']:.1f} s), "
              f"first request {r['first_s']:6.2f} s, second {r['second_s']:.2f} s")
    cold, warm, again, cached = (runs[k] for k in ("cold", "warm", "warm+cache", "cold+cache"))
    record(
        f"warm start (CPU fp32, orchestrax serve --tiny --max-len {args.max_len} --max-batch "
        f"{args.max_batch}, load {load:.1f} on {os.cpu_count()} cores): first request "
        f"{cold['first_s']:.2f} s cold vs {warm['first_s']:.2f} s after --warm "
        f"({cold['first_s'] / warm['first_s']:.0f}x; second request {cold['second_s']:.2f} vs "
        f"{warm['second_s']:.2f} s); --warm of {warm['programs']} programs took "
        f"{warm['warm_s']:.1f} s with an empty compilation cache vs {again['warm_s']:.1f} s "
        f"from the cache it filled ({entries} entries): {warm['warm_s'] - again['warm_s']:.1f} s "
        f"of compiles saved, {warm['warm_s'] / max(again['warm_s'], 0.05):.1f}x; "
        f"start to listening {cold['listen_s']:.1f} s cold vs {cached['listen_s']:.1f} s on the "
        f"filled cache, and its first request without --warm {cached['first_s']:.2f} s "
        f"({cold['first_s'] / cached['first_s']:.0f}x faster than cold) "
        "(python bench/warm_start.py)")

if __name__ == "__main__":
    main()
