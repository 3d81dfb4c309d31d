"""The CPU demo: one tiny Qwen3 learns by GRPO, under the ToolOrchestra reward, to call the tool
each task's preference vector favours. A warm start teaches the tool-call format with tools
chosen uniformly (never told which tool a preference favours); then one GRPO run on tasks whose
P and instruction are drawn per task from the training pairs of the cost-weighted and the
latency-weighted profiles (the cheap tool is right under the first, the fast tool under the
second). Evaluated on held-out tasks of both kinds, with the training phrasings.

What made the one policy read P (README, "The demo"): each GRPO group holds one cost task and
one latency task of the same job (`kind_blocks`, `group_tasks=2`), whose episodes share their
sampling seeds, so a tool choice made whatever P says earns opposite advantages in one group and
cancels; malformed rollouts stay in their group as failures (`invalid="zero"`).
"""

import dataclasses

from orchestrax import models
from orchestrax.envs.routing import LookupTool, RoutingConfig
from orchestrax.parallel import MeshConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.train.train_config import RolloutConfig, TrainConfig

OUT = "runs/demo"
SFT_STEPS = 60
STEPS = 16  # GRPO steps of the one policy
# Short tool names: with them every demonstration fits one 512-token row (the attention's block).
TOOLS = (LookupTool(name="cheap", usd_per_call=0.001, latency_s=4.0),
         LookupTool(name="fast", usd_per_call=0.02, latency_s=0.2))
ENV = RoutingConfig(num_eval=16, tools=TOOLS, preferences=("pool:cost", "pool:latency"),
                    eval_preferences=("pool:cost", "pool:latency"), eval_pool="train",
                    restate_preference=True)


def config_warmstart() -> TrainConfig:
    """Supervised warm start only (steps=0); its step-0 evaluation is the "before RL" row."""
    return TrainConfig(
        name="demo-warmstart",
        model=models.tiny_config(vocab_size=512, hidden_size=128, intermediate_size=256,
                                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32),
        tokenizer="tiny",
        mesh=MeshConfig(axes=(("data", 1), ("fsdp", -1), ("tensor", 1))),
        # Rollouts sample at T = 0.7 and the trainer scores tokens at the same temperature. The
        # KL to the warm-start policy keeps the tiny model's tool-call format intact.
        grpo=GRPOConfig(clip_low=0.2, clip_high=0.28, adv_clip=3.0, min_group_std=0.1,
                        ppo_epochs=1, num_minibatches=2, temperature=0.7, kl="k3",
                        kl_coef=0.02, invalid="zero", group_tasks=2),
        optim=OptimizerConfig(lr=5e-4, warmup_steps=0, schedule="constant", total_steps=10_000,
                              weight_decay=0.0, max_grad_norm=1.0),
        sft_optim=OptimizerConfig(lr=3e-3, warmup_steps=6, schedule="cosine",
                                  total_steps=SFT_STEPS, weight_decay=0.0),
        rollout=RolloutConfig(backend="embedded", group_size=8, tasks_per_step=8,
                              temperature=0.7, max_new_tokens=48, max_turns=3,
                              context_tokens=512, enable_thinking=False, sampler_max_batch=64),
        env=ENV,
        sft_steps=SFT_STEPS,
        sft_batch=32,
        steps=0,
        out_dir=f"{OUT}/warmstart",
        checkpoint_every=20,
        eval_every=STEPS,
        eval_samples=4,          # the policy's own distribution, not its argmax
        eval_temperature=0.7,
    )


def config() -> TrainConfig:
    """GRPO from the warm start: one policy on tasks of both preference kinds."""
    c = config_warmstart()
    return dataclasses.replace(c, name="demo-grpo", sft_steps=0, steps=STEPS,
                               env=dataclasses.replace(c.env, kind_blocks=True),
                               init_from=c.out_dir, out_dir=f"{OUT}/grpo")
