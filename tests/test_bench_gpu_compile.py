"""bench/gpu_compile.py compiles for a GPU that is not there (tiny model, real configs' layout):
one case per target, in a child process so the CUDA compile plugin never joins this one."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLUGIN = pathlib.Path(os.environ.get("ORCHESTRAX_XLA_CUDA", "/opt/xla-cuda").split(os.pathsep)[0])


@pytest.mark.slow
@pytest.mark.skipif(not (PLUGIN / "jax_plugins").is_dir(),
                    reason="the CUDA compile plugin is not installed (bench/gpu_compile.py says how)")
def test_gpu_compile_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_compile.py"), "--smoke", "--only",
         "one_h200/ref,one_h200/decode,embedded/decode,sampler:256/bench", "--results",
         str(tmp_path / "RESULTS.md")],
        capture_output=True, text=True, timeout=900, env={**os.environ, "XLA_FLAGS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "RESULTS.md").read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) == 4 and "FAILED" not in table, table
    ref, decode_one, decode, bench = rows
    # The reference pass picked cuDNN attention although this host's backend is the CPU.
    assert "config_one_h200/ref@1xh200" in ref and ref.split("|")[9].strip() == "1", ref
    # And no conditional: the trainer's rows are right-padded and it says so, so attention takes
    # cuDNN with no run-time layout check (a host read of its predicate, once per layer loop).
    assert ref.split("|")[13].strip() == "0", ref
    # One H200 runs the continuous engine: its decode step writes the donated slot cache in
    # place and copies none of it, nor any weights, in the HLO XLA made for it (a kernel that
    # only copies, transposes or slices a held buffer: hbm_traffic.copies). With the cache
    # stacked [L, ...] as a layer scan's carry this column was 2: each layer's K and V copied
    # out of the cache every step.
    assert "config_one_h200/decode@1xh200" in decode_one, decode_one
    assert decode_one.split("|")[2].strip().startswith("continuous: 8 slots"), decode_one
    assert decode_one.split("|")[10].strip() == "0 (0.00 GiB)", decode_one
    # Nor a conditional (sampling's top-k/top-p choice is the host's, made per dispatch).
    assert decode_one.split("|")[13].strip() == "0", decode_one
    # Its estimated HBM traffic (bench/hbm_traffic.py) is at least the floor: the weights and
    # the K and V of its span; the reference pass has no floor.
    assert float(decode_one.split("|")[15]) > 0, decode_one
    assert float(decode_one.split("|")[16].split()[0]) >= 1.0, decode_one
    assert ref.split("|")[16].strip() == "-", ref
    # config_embedded runs the continuous engine over eight H100s.
    assert "config_embedded/decode@8xh100" in decode and "| yes |" in decode, decode
    assert "continuous: 8 slots x 256, 1 step" in decode, decode
    # bench/gpu.py's sampler section at 256 requests, as its own code builds the engine.
    assert "sampler:256/bench@1xh200" in bench and "continuous: 256 slots" in bench, bench
    assert bench.split("|")[10].strip() == "0 (0.00 GiB)", bench   # 8 steps: nor in their loop

