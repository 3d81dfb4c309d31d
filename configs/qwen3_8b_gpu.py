"""Qwen3-8B orchestrator on one 8-GPU node: trainer FSDP over 4 GPUs, rollouts by SGLang servers
on the other 4 (see launch/gpu_single_node.sh). Edit HF_PATH and, if needed, the server URLs."""

import dataclasses

from orchestrax.parallel import MeshConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.train.config import RolloutConfig, TrainConfig

HF_PATH = "/models/Qwen3-8B"                     # a HF Qwen3 checkpoint directory
SGLANG_URLS = tuple(f"http://127.0.0.1:{30000 + i}" for i in range(4))


def config() -> TrainConfig:
    return TrainConfig(
        name="qwen3-8b-toolorchestra",
        hf_path=HF_PATH,
        tokenizer=HF_PATH,
        # bf16 compute; params and Adam moments stay fp32 (load_hf makes fp32 master weights),
        # weight syncs to SGLang are written in bf16 (save_hf's default is the compute dtype).
        dtype="bfloat16",
        # Recompute each block in the backward pass: bench/memory.py's per-device figures (and
        # the fit of a 24k-token episode) assume it.
        remat="full",
        mesh=MeshConfig(axes=(("data", 1), ("fsdp", -1), ("tensor", 1))),
        # Published run: clip 0.2/0.28, advantages clipped to ±3, homogeneity filter 0.1.
        grpo=GRPOConfig(clip_low=0.2, clip_high=0.28, dual_clip=10.0, adv_clip=3.0,
                        min_group_std=0.1, agg="token-mean", ppo_epochs=1, num_minibatches=4,
                        num_microbatches=8, tis_cap=2.0,
                        # 24k-token episodes x 151,936 vocab: logits 1024 positions at a time.
                        logprob_chunk=1024),
        optim=OptimizerConfig(lr=1e-6, warmup_steps=10, schedule="constant", total_steps=10_000,
                              weight_decay=0.01, max_grad_norm=1.0),
        rollout=RolloutConfig(backend="sglang", server_urls=SGLANG_URLS, group_size=8,
                              tasks_per_step=16, temperature=1.0, max_new_tokens=8192,
                              max_turns=50, context_tokens=24_000, enable_thinking=True,
                              max_in_flight=1024, weight_sync_dir="/tmp/orchestrax_weights"),
        env="tau2",
        # tau2 episodes need a simulated user: any OpenAI-compatible endpoint (a Qwen3-32B served
        # by SGLang on another node, or a hosted model with its key in the named env variable).
        env_kwargs=(("domain", "../shared/data/tau2/retail"),
                    ("user_url", "http://127.0.0.1:31000/v1"), ("user_model", "Qwen3-32B")),
        steps=500,
        out_dir="runs/qwen3-8b",
        checkpoint_every=10,
    )


def config_embedded() -> TrainConfig:
    """Same run with the built-in JAX sampler instead of SGLang (one process, all 8 GPUs).

    Sized by bench/memory.py: the train step at T=24k on 8 devices needs ~56 GiB per GPU
    (16.4 of it fp32 params + AdamW), and a 24k-slot bf16 KV cache row of Qwen3-8B is 3.5 GB,
    so 32 rows (14 GB per GPU) fit next to it on 80 GB cards; 128 would need 57 GB per GPU."""
    c = config()
    return c.replace(rollout=dataclasses.replace(c.rollout, backend="embedded", server_urls=(),
                                                 sampler_max_batch=32))


def config_one_h200() -> TrainConfig:
    """One H200 (141 GB): Qwen3-4B with the embedded sampler. Qwen3-8B does not fit one card:
    its fp32 params + AdamW moments alone are 131 GB (bench/memory.py: 171 GiB for the step).
    Qwen3-4B at T=24k: ~95 GiB for the step, plus 8 cache rows of 3.5 GB; run with
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (XLA takes 75% of the card by default)."""
    c = config_embedded()
    return c.replace(name="qwen3-4b-toolorchestra-h200", hf_path="/models/Qwen3-4B",
                     tokenizer="/models/Qwen3-4B", out_dir="runs/qwen3-4b",
                     mesh=MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))),
                     rollout=dataclasses.replace(c.rollout, sampler_max_batch=8))
