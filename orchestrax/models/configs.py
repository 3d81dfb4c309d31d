"""Model configs: one frozen dataclass for the Qwen3 / Llama decoder family, plus size presets.

Preset numbers are the published `config.json` values of the Qwen3 dense checkpoints.
"""

from __future__ import annotations

import dataclasses

from orchestrax.checks import above, at_least, one_of

ARCHITECTURES = ("qwen3", "llama")
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_KERNELS = ("auto", "cudnn", "chunked")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    arch: str = "qwen3"                 # "llama" is the same block without q_norm/k_norm
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_embeddings: bool = False
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40_960
    dtype: str = "float32"              # compute dtype (matmuls, activations, HF syncs)
    param_dtype: str = "float32"        # storage of params: float32 for anything that trains;
                                        # bfloat16 only for a serve-only copy
    remat: str = "none"                 # jax.checkpoint policy around each scanned layer
    attention: str = "auto"             # "auto": cuDNN flash attention when the default backend
                                        # is a GPU, else chunked; "cudnn" forces it (compiling
                                        # for a GPU from a CPU host); "chunked": never cuDNN
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self):
        one_of(self, "arch", self.arch, ARCHITECTURES)
        for name in ("dtype", "param_dtype"):
            one_of(self, name, getattr(self, name), DTYPES)
        one_of(self, "remat", self.remat, REMAT_POLICIES)
        one_of(self, "attention", self.attention, ATTENTION_KERNELS)
        if self.attention == "cudnn" and (self.dtype != "bfloat16" or self.head_dim % 8
                                          or self.head_dim > 128):
            raise ValueError(f"ModelConfig.attention='cudnn' needs dtype='bfloat16' and a head_dim "
                             f"that is a multiple of 8 and <= 128 (got dtype={self.dtype!r}, "
                             f"head_dim={self.head_dim}); use 'auto' or 'chunked'")
        at_least(self, 1, "vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim")
        # A negative theta or eps trains to NaN.
        above(self, 0, "rope_theta", "rms_norm_eps", "max_position_embeddings")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")

    @property
    def qk_norm(self) -> bool:
        return self.arch == "qwen3"

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _qwen3(**kw) -> ModelConfig:
    return ModelConfig(arch="qwen3", vocab_size=151_936, head_dim=128, rope_theta=1_000_000.0,
                       rms_norm_eps=1e-6, max_position_embeddings=40_960,
                       bos_token_id=151_643, eos_token_id=151_645, **kw)


_PRESETS = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                       num_kv_heads=8, tie_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
                       num_kv_heads=8, tie_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                     num_kv_heads=8, tie_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                     num_kv_heads=8, tie_embeddings=False),
    "qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_layers=40, num_heads=40,
                      num_kv_heads=8, tie_embeddings=False),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_layers=64, num_heads=64,
                      num_kv_heads=8, tie_embeddings=False),
}


def preset(name: str, **overrides) -> ModelConfig:
    """A published Qwen3 size by name, e.g. `preset("qwen3-8b", dtype="bfloat16", remat="full")`."""
    if name not in _PRESETS:
        raise ValueError(f"unknown model preset {name!r}; allowed: {sorted(_PRESETS)}")
    return _qwen3(**{**_PRESETS[name], **overrides})


def tiny_config(**overrides) -> ModelConfig:
    """A 2-layer Qwen3 for tests and the CPU demo (head_dim != hidden/heads on purpose)."""
    base = dict(arch="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=4, num_kv_heads=2, head_dim=32, tie_embeddings=True,
                rope_theta=10_000.0, max_position_embeddings=2048)
    return ModelConfig(**{**base, **overrides})


def num_params(cfg: ModelConfig) -> int:
    """Closed-form parameter count (the tests check it against init_params under eval_shape)."""
    d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    attn = d * h * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + (2 * h if cfg.qk_norm else 0)
    layer = attn + 3 * d * f + 2 * d
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return cfg.num_layers * layer + embed + d
