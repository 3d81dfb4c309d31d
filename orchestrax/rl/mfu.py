"""Model-FLOPs utilisation: training FLOPs / seconds / peak FLOP/s (forward + backward).

Per token, a forward pass costs 2 FLOPs per matmul weight and, in each layer, 4·N·H per key it
attends to (q·k and p·v, N query heads of H dims); the backward pass costs twice the forward:
  6 · (matmul params) + 6 · L · N · H · (T + 1)      per token of a causal row of T tokens
(query t sees t + 1 keys, (T + 1) / 2 on average). The embedding lookup is no matmul, so its
table is not counted, unless it is tied to the LM head, whose matmul it then is. Recomputation
(remat) is not counted: MFU measures useful work. This is the PaLM appendix-B convention with
attention counted for a causal mask.
"""

from __future__ import annotations

from orchestrax.models import ModelConfig, num_params

# Dense peak FLOP/s per chip, no sparsity. bf16 is what MFU is usually quoted against.
PEAK_FLOPS = {
    ("h100", "bfloat16"): 989e12, ("h100", "float32"): 67e12,
    ("h200", "bfloat16"): 989e12, ("h200", "float32"): 67e12,
    ("a100", "bfloat16"): 312e12, ("a100", "float32"): 19.5e12,
    ("tpu-v5e", "bfloat16"): 197e12, ("tpu-v5p", "bfloat16"): 459e12,
}


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that multiply activations: all but an untied embedding table."""
    table = cfg.vocab_size * cfg.hidden_size
    return num_params(cfg) - (0 if cfg.tie_embeddings else table)


def train_flops(cfg: ModelConfig, tokens: int, seq_len: int) -> float:
    """FLOPs of one forward + backward pass over `tokens` tokens in causal rows of `seq_len`."""
    attention = 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * (seq_len + 1)
    return (6.0 * matmul_params(cfg) + attention) * tokens


def mfu(cfg: ModelConfig, tokens: int, seq_len: int, seconds: float, peak_flops: float) -> float:
    """Fraction of `peak_flops` (FLOP/s, all chips together) achieved by training on `tokens`
    tokens in rows of `seq_len` in `seconds`."""
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"seconds={seconds} and peak_flops={peak_flops} must be > 0")
    return train_flops(cfg, tokens, seq_len) / seconds / peak_flops


def peak_flops(chip: str, dtype: str = "bfloat16", n_chips: int = 1) -> float:
    """Peak FLOP/s of n_chips of a known chip (keys of PEAK_FLOPS)."""
    key = (chip.lower(), dtype)
    if key not in PEAK_FLOPS:
        raise ValueError(f"chip/dtype={key}; known: {sorted(PEAK_FLOPS)}")
    return PEAK_FLOPS[key] * n_chips
