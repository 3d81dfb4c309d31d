"""The LM head's backward pass runs in the compute dtype with float32 accumulation: read from the
compiled HLO (dot operand and result dtypes), and gradients as close to fp32 as autodiff's."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestrax import models
from orchestrax.models import model as model_lib

_DEF = re.compile(r"\s*(?:ROOT )?%(\S+) = (\w+)\[")
_DOT = re.compile(r"\s*(?:ROOT )?%\S+ = (\w+)\[([\d,]*)\]\S* dot\(([^)]*)\)")


def head_dots(hlo_text: str) -> list[tuple[str, tuple[str, ...], str]]:
    """(result dtype, operand dtypes, result shape) of every dot the lm_head scope compiled to."""
    dtype = {m.group(1): m.group(2) for m in map(_DEF.match, hlo_text.splitlines()) if m}
    out = []
    for line in hlo_text.splitlines():
        m = _DOT.match(line)
        if m and "lm_head" in line:
            ops = tuple(dtype[o.strip().lstrip("%")] for o in m.group(3).split(","))
            out.append((m.group(1), ops, m.group(2)))
    return out


def _grad_hlo(cfg, params) -> str:
    tokens = jnp.zeros((2, 16), jnp.int32)
    loss = lambda p: models.token_logprobs(cfg, p, tokens).sum()  # noqa: E731
    return jax.jit(jax.grad(loss)).lower(params).compile().as_text()


@pytest.mark.parametrize("tie", [True, False])
def test_compiled_lm_head_dots_are_bf16_in_and_f32_out(tie):
    """On a GPU target the three head dots are bf16 x bf16 -> f32 (the CPU lowering keeps the
    backward's operands f32: XLA:CPU has no bf16 x bf16 -> f32 dot kernel at run time)."""
    cfg = models.tiny_config(dtype="bfloat16", tie_embeddings=tie, num_layers=1)
    params = models.init_params(cfg, seed=0)
    dots = head_dots(_grad_hlo(cfg, params))
    print("CPU lm_head dots (result, operands, shape):", dots)
    # forward logits [B·T, V], dh [B·T, D], dw [V, D] (or [D, V])
    assert len(dots) == 3, dots
    assert sorted((r, ops) for r, ops, _ in dots) == [("f32", ("bf16", "bf16"))] + \
        [("f32", ("f32", "f32"))] * 2
    # The same gradient lowered for CUDA (jax.export lowers for a platform this box lacks).
    tokens = jnp.zeros((2, 16), jnp.int32)
    loss = lambda p: models.token_logprobs(cfg, p, tokens).sum()  # noqa: E731
    mlir = jax.export.export(jax.jit(jax.grad(loss)), platforms=["cuda"])(params).mlir_module()
    v = cfg.vocab_size
    sigs = re.findall(r"stablehlo\.dot_general[^\n]*: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> "
                      r"(tensor<[^>]*>)", mlir)
    head = [sig for sig in sigs if any(f"x{v}x" in t or f"<{v}x" in t for t in sig)]
    assert len(head) == 3, head
    assert all(a.endswith("xbf16>") and b.endswith("xbf16>") and out.endswith("xf32>")
               for a, b, out in head), head


def _autodiff_logits(cfg, params, h):
    """The head as autodiff differentiates it: the fp32 cotangent meets the weights in fp32."""
    w = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return jnp.einsum("BTD,DV->BTV", h, w.astype(h.dtype), preferred_element_type=jnp.float32)


def _rel(a, b) -> float:
    num = sum(float(jnp.sum((x - y) ** 2)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    return (num / sum(float(jnp.sum(y ** 2)) for y in jax.tree.leaves(b))) ** 0.5


def test_gradients_match_autodiff(monkeypatch):
    cfg32 = models.tiny_config(tie_embeddings=False, num_layers=1)
    cfg16 = models.tiny_config(dtype="bfloat16", tie_embeddings=False, num_layers=1)
    params = models.init_params(cfg32, seed=1)
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, cfg32.vocab_size)

    def grads(cfg):
        f = lambda p: models.token_logprobs(cfg, p, tokens).mean()  # noqa: E731
        return jax.jit(jax.value_and_grad(f))(params)

    (l32, g32), (l16, g16) = grads(cfg32), grads(cfg16)
    monkeypatch.setattr(model_lib, "lm_logits", _autodiff_logits)
    (l32_ad, g32_ad), (l16_ad, g16_ad) = grads(cfg32), grads(cfg16)
    # fp32: the same numbers as autodiff; forward values unchanged in either dtype.
    assert float(l32) == float(l32_ad) and float(l16) == float(l16_ad)
    for a, b in zip(jax.tree.leaves(g32), jax.tree.leaves(g32_ad)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert {x.dtype for x in jax.tree.leaves(g16)} == {jnp.dtype(jnp.float32)}
    # bf16: as far from the fp32 gradient as autodiff's bf16 gradient is (measured ~0.9% both).
    new, old = _rel(g16, g32), _rel(g16_ad, g32)
    assert new < 0.02 and new < 1.25 * old, (new, old)


GPU_PLUGIN = pathlib.Path("/opt/xla-cuda")
TARGET = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "gpu_targets" / "h200.txtpb"


@pytest.mark.slow
@pytest.mark.skipif(not (GPU_PLUGIN.is_dir() and TARGET.is_file()),
                    reason="needs the CUDA compile-only plugin in /opt/xla-cuda and the H200 "
                           "target (../shared/gpu_targets)")
def test_h200_compile_keeps_lm_head_dots_bf16(tmp_path):
    """The same HLO check compiled for an H200 (XLA's GPU compiler, no GPU needed)."""
    script = tmp_path / "h200.py"
    script.write_text(f"""
import jax, sys
from jax.experimental import topologies
sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
from test_models_lm_head import _grad_hlo, head_dots
from orchestrax import models
topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                    target_config=open({str(TARGET)!r}).read())
s = jax.sharding.NamedSharding(jax.sharding.Mesh(topo.devices, ("x",)),
                               jax.sharding.PartitionSpec())
cfg = models.tiny_config(dtype="bfloat16", tie_embeddings=False)
shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      jax.eval_shape(lambda: models.init_params(cfg, seed=0)))
print(head_dots(_grad_hlo(cfg, shapes)))
""")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1",
               PYTHONPATH=os.pathsep.join([str(GPU_PLUGIN), "/opt/xla-cudnn",
                                           os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    dots = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own script's repr
    print("H200 lm_head dots:", dots)
    assert len(dots) == 3 and {(r, ops) for r, ops, _ in dots} == {("f32", ("bf16", "bf16"))}
