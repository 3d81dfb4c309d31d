"""Model-FLOPs utilisation: 6·N·tokens / seconds / peak FLOP/s (forward + backward, dense).

The 6N rule ignores attention FLOPs (≈ 12·L·T·D per token), so it slightly under-states MFU
for long sequences; that is the usual convention (PaLM appendix B, MaxText, torchtitan).
"""

from __future__ import annotations

# Dense peak FLOP/s per chip, no sparsity. bf16 is what MFU is usually quoted against.
PEAK_FLOPS = {
    ("h100", "bfloat16"): 989e12, ("h100", "float32"): 67e12,
    ("h200", "bfloat16"): 989e12, ("h200", "float32"): 67e12,
    ("a100", "bfloat16"): 312e12, ("a100", "float32"): 19.5e12,
    ("tpu-v5e", "bfloat16"): 197e12, ("tpu-v5p", "bfloat16"): 459e12,
}


def train_flops(n_params: int, tokens: int) -> float:
    """FLOPs of one forward + backward pass over `tokens` tokens: 6·N·tokens."""
    return 6.0 * n_params * tokens


def mfu(n_params: int, tokens: int, seconds: float, peak_flops: float) -> float:
    """Fraction of `peak_flops` (FLOP/s, all chips together) achieved: 6·N·tokens/seconds/peak."""
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"seconds={seconds} and peak_flops={peak_flops} must be > 0")
    return train_flops(n_params, tokens) / seconds / peak_flops


def peak_flops(chip: str, dtype: str = "bfloat16", n_chips: int = 1) -> float:
    """Peak FLOP/s of n_chips of a known chip (keys of PEAK_FLOPS)."""
    key = (chip.lower(), dtype)
    if key not in PEAK_FLOPS:
        raise ValueError(f"chip/dtype={key}; known: {sorted(PEAK_FLOPS)}")
    return PEAK_FLOPS[key] * n_chips
