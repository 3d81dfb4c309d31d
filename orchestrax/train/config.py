"""The whole training run as one frozen config, composed from the parts' own configs.

Configs are built by Python functions in `configs/` that start from one another and change what
differs (`dataclasses.replace`); nothing is read from YAML.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrax.models import ModelConfig
from orchestrax.parallel import MeshConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig

BACKENDS = ("embedded", "sglang")
ENVS = ("routing", "tau2", "qa")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    backend: str = "embedded"               # "sglang": server_urls must name the servers
    server_urls: tuple[str, ...] = ()
    group_size: int = 8                     # G rollouts per task
    tasks_per_step: int = 8                 # Q tasks per step
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 2048              # per assistant turn
    max_turns: int = 50
    context_tokens: int = 24_000
    enable_thinking: bool = True
    max_in_flight: int = 1024               # episodes alive at once (over all workers)
    workers: int = 0                        # 0: episodes on the trainer's event loop; N: an
                                            # EpisodePool of N processes (see train/episodes.py)
    sampler_max_batch: int = 64             # embedded sampler batch
    weight_sync_dir: str = "/tmp/orchestrax_weights"  # sglang: HF dirs written here per step

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"RolloutConfig.backend={self.backend!r}; allowed: {BACKENDS}")
        if self.backend == "sglang" and not self.server_urls:
            raise ValueError("RolloutConfig.server_urls is empty; backend='sglang' needs at least "
                             "one SGLang server (or one sglang-router) URL")
        for name in ("group_size", "tasks_per_step", "max_new_tokens", "max_turns",
                     "context_tokens", "max_in_flight", "sampler_max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name}={getattr(self, name)}; must be >= 1")
        if self.workers < 0:
            raise ValueError(f"RolloutConfig.workers={self.workers}; must be >= 0 (0 runs "
                             "episodes in the trainer process)")
        if self.group_size < 2:
            raise ValueError(f"RolloutConfig.group_size={self.group_size}; GRPO needs >= 2")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    name: str
    model: ModelConfig | None = None        # random init from this config when hf_path is None
    hf_path: str | None = None              # a HF Qwen3 checkpoint directory to start from
    dtype: str = "float32"                  # compute dtype when loading hf_path
    tokenizer: str = "tiny"                 # "tiny" (the test tokenizer) or a HF tokenizer dir
    mesh: MeshConfig = MeshConfig()
    grpo: GRPOConfig = GRPOConfig()
    optim: OptimizerConfig = OptimizerConfig()
    sft_optim: OptimizerConfig | None = None  # warm-start optimizer (defaults to optim)
    rollout: RolloutConfig = RolloutConfig()
    env: str = "routing"
    env_kwargs: tuple[tuple[str, Any], ...] = ()
    sft_steps: int = 0                      # supervised warm-start steps before RL
    sft_batch: int = 64
    steps: int = 100                        # RL steps
    seed: int = 0
    out_dir: str = "runs/default"           # checkpoints, metrics.jsonl, exported HF dirs
    checkpoint_every: int = 10
    eval_every: int = 10
    eval_samples: int = 1                   # episodes per eval task
    eval_temperature: float = 0.0           # 0: greedy
    resume: bool = True
    # Start from another run's newest checkpoint (e.g. a warm-start run) instead of `model` or
    # `hf_path` weights; its params are taken, its optimizer state is not. Ignored on resume.
    init_from: str | None = None

    def __post_init__(self):
        if (self.model is None) == (self.hf_path is None):
            raise ValueError("TrainConfig: set exactly one of model (random init) or hf_path")
        if self.env not in ENVS:
            raise ValueError(f"TrainConfig.env={self.env!r}; allowed: {ENVS}")
        if self.grpo.temperature != self.rollout.temperature:
            raise ValueError(f"TrainConfig: grpo.temperature={self.grpo.temperature} differs from "
                             f"rollout.temperature={self.rollout.temperature}; the trainer must "
                             "score tokens at the temperature the sampler drew them at")
        for name in ("sft_steps", "steps", "checkpoint_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)}; must be >= 0")

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)
