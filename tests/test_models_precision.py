"""fp32 master weights whatever the compute dtype; bf16 only where weights leave the trainer.
(That fp32 weights move under AdamW at lr 1e-6 and bf16 ones do not: tests/test_rl_precision.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from orchestrax import models

CFG = models.tiny_config(dtype="bfloat16")


def test_init_and_load_give_fp32_params_with_bf16_compute(tmp_path):
    params = models.init_params(CFG, seed=0)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    models.save_hf(CFG, params, tmp_path, dtype="bfloat16")
    cfg, loaded = models.load_hf(tmp_path, dtype="bfloat16")
    assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "float32")
    assert {x.dtype for x in jax.tree.leaves(loaded)} == {jnp.dtype(jnp.float32)}
    # The bf16 file's values, widened exactly.
    want = np.asarray(params["layers"]["gate"].astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(loaded["layers"]["gate"]), want)
    _, serve_only = models.load_hf(tmp_path, dtype="bfloat16", param_dtype="bfloat16")
    assert serve_only["embed"].dtype == jnp.bfloat16


def test_save_hf_writes_the_compute_dtype_unless_told(tmp_path):
    params = models.init_params(CFG, seed=0)
    sync = models.save_hf(CFG, params, tmp_path / "sync")               # a weight sync
    full = models.save_hf(CFG, params, tmp_path / "full", dtype="float32")
    for out, dtype in ((sync, "BF16"), (full, "F32")):
        with safe_open(out / "model.safetensors", framework="numpy") as f:
            names = list(f.keys())
            assert {f.get_slice(n).get_dtype() for n in names} == {dtype}
    size = lambda d: (d / "model.safetensors").stat().st_size  # noqa: E731
    assert 0.49 < size(sync) / size(full) < 0.51
