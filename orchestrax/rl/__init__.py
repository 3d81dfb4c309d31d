"""GRPO core: ToolOrchestra reward, group advantages, filters, batches, policy/SFT losses, train
step."""

from orchestrax.rl.advantages import (compute_advantages, dr_grpo_advantages, group_advantages,
                                      group_mean_std, rloo_advantages)
from orchestrax.rl.batch import (check_right_padded, direct_batch, flow_batch, pack,
                                 rollout_stats, tool_totals, turn_batch)
from orchestrax.rl.grpo_config import GRPOConfig, OptimizerConfig
from orchestrax.rl.filters import has_final_answer, homogeneity_mask, sample_mask, validity_mask
from orchestrax.rl.losses import kl_penalty, policy_loss, sft_loss, token_weights
from orchestrax.rl.mfu import matmul_params, mfu, peak_flops, train_flops
from orchestrax.rl.optim import lr_schedule, make_optimizer
from orchestrax.rl.state import (TrainState, batch_shardings, data_parallel_degree, init_state,
                                 state_shardings)
from orchestrax.rl.train_step import TrainStep, make_train_step, reference_logprobs
from orchestrax.rl.reward import (RESOLUTION, GroupFeatures, Resolution,
                                  features_from_trajectories, group_features, outcome_reward,
                                  toolorchestra_reward)
from orchestrax.rl.scoring import GroupScores, score_groups

__all__ = [
    "GRPOConfig", "GroupFeatures", "GroupScores", "OptimizerConfig", "RESOLUTION", "Resolution",
    "TrainState", "TrainStep",
    "batch_shardings", "check_right_padded", "compute_advantages", "data_parallel_degree", "direct_batch", "dr_grpo_advantages", "features_from_trajectories",
    "flow_batch", "group_advantages", "group_features", "group_mean_std", "has_final_answer",
    "homogeneity_mask", "init_state", "kl_penalty", "lr_schedule", "make_optimizer",
    "make_train_step", "matmul_params", "mfu", "outcome_reward", "pack", "peak_flops", "policy_loss",
    "reference_logprobs", "rloo_advantages", "sample_mask", "score_groups", "sft_loss", "state_shardings", "token_weights",
    "rollout_stats", "tool_totals", "toolorchestra_reward", "train_flops", "turn_batch",
    "validity_mask",
]
