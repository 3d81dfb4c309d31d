"""Peak RSS of reading a training run's params through the one reader eval, serve and export use
(`train.checkpoint.read_params`: params only, fp32 or cast to bf16 as read) vs restoring the whole
train state (params + AdamW moments + counters, then params kept), on the same run, each in a
fresh process.

    python bench/eval_restore.py                       # hidden 512, 8 layers, vocab 32k
    python bench/eval_restore.py --hidden 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.common import record  # noqa: E402

MODES = ("whole", "params", "bf16")


def _status_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _reset_peak() -> None:
    """Start VmHWM over from the current RSS (Linux >= 4.0). getrusage's ru_maxrss cannot be
    reset, and a child started by fork + exec begins with its parent's."""
    pathlib.Path("/proc/self/clear_refs").write_text("5")


def _config(args):
    from orchestrax import models
    return models.tiny_config(vocab_size=args.vocab, hidden_size=args.hidden,
                              intermediate_size=3 * args.hidden, num_layers=args.layers,
                              num_heads=8, num_kv_heads=4, head_dim=args.hidden // 8)


def _write_run(run: pathlib.Path, args) -> int:
    """A run dir as `orchestrax train` leaves it: model card + one TrainState after one AdamW
    update (non-zero moments). Returns the parameter count."""
    from orchestrax import models, rl
    from orchestrax.agent.scripted import tiny_qwen3_tokenizer
    from orchestrax.train.checkpoint import Checkpointer
    from orchestrax.train.setup import write_model_card
    cfg = _config(args)
    write_model_card(run / "model", cfg, tiny_qwen3_tokenizer())
    params = models.init_params(cfg, 0)
    opt_cfg = rl.OptimizerConfig()
    state = rl.init_state(params, opt_cfg)
    _, opt_state = rl.make_optimizer(opt_cfg).update(params, state.opt_state, params)
    ckpt = Checkpointer(run / "checkpoints", every=1)
    ckpt.maybe_save(1, state._replace(opt_state=opt_state), {"phase": "rl", "step": 1},
                    force=True)
    ckpt.close()
    return models.num_params(cfg)


def _whole_state_params(checkpoints: pathlib.Path, param_dtype: str):
    """The previous eval restore, kept here as the peer: every leaf of the saved state is read
    (shapes from Orbax's metadata), then only params are kept. It had no cast."""
    assert param_dtype == "float32", param_dtype
    import jax
    import orbax.checkpoint as ocp
    from orchestrax.train.checkpoint import Checkpointer
    step = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    handler = ocp.StandardCheckpointHandler()
    tree = handler.metadata(checkpoints / str(step) / "state")
    handler.close()
    like = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree)
    ckpt = Checkpointer(checkpoints, every=0, read_only=True)
    try:
        restored, _ = ckpt.restore(like)
        return restored["params"], ckpt.restored_step
    finally:
        ckpt.close()


def _child(mode: str, run: str) -> None:
    import jax
    import numpy as np
    from orchestrax.train import checkpoint
    checkpoints = pathlib.Path(run).resolve() / "checkpoints"
    jax.devices()  # the backend is not the restore's memory
    base = _status_mib("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    if mode == "whole":
        params, step = _whole_state_params(checkpoints, "float32")
    else:
        params, step, _ = checkpoint.read_params(
            checkpoints, dtype="bfloat16" if mode == "bf16" else "float32")
    seconds = time.perf_counter() - t0
    peak = _status_mib("VmHWM")
    checksum = float(sum(np.asarray(x, np.float64).sum() for x in jax.tree.leaves(params)))
    print(json.dumps({"base": base, "peak": peak, "seconds": seconds, "checksum": checksum,
                      "version": str(step)}))


def _measure(mode: str, run: pathlib.Path) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--run", str(run)],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{mode} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.run)
    with tempfile.TemporaryDirectory() as tmp:
        run = pathlib.Path(tmp) / "run"
        n = _write_run(run, args)
        rows = {m: [] for m in MODES}
        for _ in range(args.rounds):  # alternate, so load on the box hits both alike
            for m in MODES:
                rows[m].append(_measure(m, run))
    sums = {r["checksum"] for m in ("whole", "params") for r in rows[m]}
    if len(sums) != 1 or {r["version"] for m in MODES for r in rows[m]} != {"1"}:
        raise SystemExit(f"the two restores disagree: checksums {sums}")
    med = {m: {k: statistics.median(r[k] for r in rows[m]) for k in ("base", "peak", "seconds")}
           for m in MODES}
    grow = {m: med[m]["peak"] - med[m]["base"] for m in MODES}
    w, p, h = med["whole"], med["params"], med["bf16"]
    record(f"eval restore (CPU, Qwen3 hidden {args.hidden}, {args.layers} layers, vocab "
           f"{args.vocab}: {n / 1e6:.1f}M params, {4 * n / 2**20:.0f} MiB fp32; one AdamW "
           f"state saved): read_params peak RSS whole-state {w['peak']:.0f} MiB vs params-only "
           f"{p['peak']:.0f} MiB = {p['peak'] / w['peak']:.2f}x; growth over the RSS "
           f"before the call {grow['whole']:.0f} vs {grow['params']:.0f} MiB = "
           f"{grow['params'] / grow['whole']:.2f}x; load time {w['seconds']:.2f} vs "
           f"{p['seconds']:.2f} s; same params (checksum); params-only cast to bf16 on read: "
           f"peak {h['peak']:.0f} MiB, growth {grow['bf16']:.0f} MiB = "
           f"{grow['bf16'] / grow['whole']:.2f}x the whole-state's, {h['seconds']:.2f} s; RSS "
           f"before the call {w['base']:.0f} MiB; medians of {args.rounds} alternating "
           f"rounds, fresh process each (python bench/eval_restore.py)")


if __name__ == "__main__":
    main()
