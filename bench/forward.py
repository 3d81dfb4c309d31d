"""Prefill throughput of jitted `models.forward` vs transformers' Qwen3 (torch fp32 eager), same
config and inputs, one process. On a GPU it also reports a 4-layer slice of Qwen3-8B in bf16
with achieved TFLOP/s.

    python bench/forward.py [--batch 4 --seq 512 --layers 4 --hidden 512]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from common import median_seconds, peak_rss_mib, record
from orchestrax import models


def forward_flops(cfg: models.ModelConfig, batch: int, seq: int) -> float:
    """2·N_matmul·tokens plus attention scores and values (causal, counted in full)."""
    # The embedding lookup is no matmul; a tied table still does the LM head matmul.
    n = models.num_params(cfg) - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size)
    attn = 4 * cfg.num_layers * seq * cfg.num_heads * cfg.head_dim
    return batch * seq * (2 * n + attn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    cfg = models.tiny_config(vocab_size=32_000, hidden_size=args.hidden,
                             intermediate_size=3 * args.hidden, num_layers=args.layers,
                             num_heads=8, num_kv_heads=4, head_dim=args.hidden // 8,
                             tie_embeddings=False)
    params = models.init_params(cfg, seed=0)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)
    ids_j = jnp.asarray(ids)
    fwd = jax.jit(models.forward, static_argnums=0)
    t_ours = median_seconds(lambda: fwd(cfg, params, ids_j).block_until_ready(),
                            repeats=args.repeats)

    with tempfile.TemporaryDirectory() as d:
        models.save_hf(cfg, params, d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids_t = torch.tensor(ids, dtype=torch.long)

    def torch_fwd():
        with torch.no_grad():
            return hf(input_ids=ids_t).logits

    t_torch = median_seconds(torch_fwd, repeats=args.repeats)
    diff = float(np.max(np.abs(np.asarray(fwd(cfg, params, ids_j)) - torch_fwd().numpy())))
    tokens = args.batch * args.seq
    ours, theirs = tokens / t_ours, tokens / t_torch
    record(f"forward (CPU fp32, {jax.devices()[0].platform}): L={args.layers} D={args.hidden} "
           f"B={args.batch} T={args.seq} V={cfg.vocab_size}: orchestrax {ours:,.0f} tok/s, "
           f"transformers eager {theirs:,.0f} tok/s, ratio {ours / theirs:.2f}x, "
           f"max|dlogit| {diff:.1e}, peak RSS {peak_rss_mib():,.0f} MiB "
           f"(python bench/forward.py)")

    if jax.devices()[0].platform == "gpu":
        gpu_slice(args.repeats)


def gpu_slice(repeats: int) -> None:
    cfg = models.preset("qwen3-8b", num_layers=4, dtype="bfloat16", param_dtype="bfloat16")
    params = jax.jit(models.init_params, static_argnums=0)(cfg)
    batch, seq = 8, 2048
    ids = jnp.zeros((batch, seq), jnp.int32)
    fwd = jax.jit(models.forward, static_argnums=0)
    t = median_seconds(lambda: fwd(cfg, params, ids).block_until_ready(), repeats=repeats)
    tflops = forward_flops(cfg, batch, seq) / t / 1e12
    record(f"forward (GPU {jax.devices()[0].device_kind}, bf16): Qwen3-8B 4-layer slice "
           f"B={batch} T={seq}: {batch * seq / t:,.0f} tok/s, {tflops:.1f} TFLOP/s "
           f"(python bench/forward.py)")


if __name__ == "__main__":
    main()
