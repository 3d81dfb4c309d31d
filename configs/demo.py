"""The CPU demo: a tiny Qwen3 learns, by GRPO, to route lookups to the tool its preference
vector favours (cheap when cost matters, fast when latency matters). Minutes on 2 cores."""

from orchestrax import models
from orchestrax.parallel import MeshConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.train.config import RolloutConfig, TrainConfig


def config() -> TrainConfig:
    return TrainConfig(
        name="demo-routing",
        model=models.tiny_config(vocab_size=512, hidden_size=128, intermediate_size=256,
                                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32),
        tokenizer="tiny",
        mesh=MeshConfig(axes=(("data", 1), ("fsdp", -1), ("tensor", 1))),
        # Rollouts sample at T = 0.7 and the trainer scores tokens at the same temperature. The
        # small KL to the warm-start policy keeps the tiny model's tool-call format intact
        # (without it, negative advantages eroded the format within ~15 steps at this lr).
        grpo=GRPOConfig(clip_low=0.2, clip_high=0.28, adv_clip=3.0, min_group_std=0.1,
                        ppo_epochs=1, num_minibatches=2, temperature=0.7, kl="k3",
                        kl_coef=0.02),
        optim=OptimizerConfig(lr=3e-4, warmup_steps=0, schedule="constant", total_steps=10_000,
                              weight_decay=0.0, max_grad_norm=1.0),
        sft_optim=OptimizerConfig(lr=3e-3, warmup_steps=10, schedule="cosine", total_steps=150,
                                  weight_decay=0.0),
        rollout=RolloutConfig(backend="embedded", group_size=8, tasks_per_step=8,
                              temperature=0.7, max_new_tokens=48, max_turns=3,
                              context_tokens=768, enable_thinking=False, sampler_max_batch=64),
        env="routing",
        # The warm start leans towards the preferred tool (half the demonstrations use it, the
        # rest split over the other two); GRPO with the ToolOrchestra reward makes it a rule.
        env_kwargs=(("demo_preferred_prob", 0.5),),
        sft_steps=150,
        sft_batch=32,
        steps=30,
        out_dir="runs/demo",
        checkpoint_every=10,
        eval_every=10,
    )
