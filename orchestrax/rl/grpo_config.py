"""Frozen, keyword-only configs for the GRPO update and its optimizer.

Defaults follow the published ToolOrchestra run where it states them (clip 0.2 / 0.28, dual clip
10, advantage clip ±3, homogeneity threshold 0.1, KL coefficient 1e-4 when a reference is used).
"""

from __future__ import annotations

import dataclasses

from orchestrax.checks import above, at_least, one_of, require

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
             "rollout-turn-token-mean")
KL_ESTIMATORS = ("k1", "k3", "mse")
ADV_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
REWARD_SCOPES = ("group", "batch")
INVALID_MODES = ("drop", "zero")
SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """Loss, advantage and batching hyperparameters of one GRPO update (`train_step`)."""

    # Policy loss.
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 10.0          # c > 1; None disables
    log_ratio_clamp: float = 20.0           # |log ratio| cap before exp, for float safety
    agg: str = "token-mean"
    norm_len: int | None = None             # seq-mean-token-sum-norm's fixed divisor (required
                                            # there: the maximum response length), times B rows
    kl: str = "k3"
    kl_coef: float = 0.0                    # 1e-4 is the usual value when a reference is used
    tis_cap: float | None = None            # truncated importance weight cap vs sampler logprobs
    temperature: float = 1.0                # logprobs are log_softmax(logits / temperature)
    compute_entropy: bool = True            # entropy is a metric only; costs one extra reduction
    logprob_chunk: int | None = None        # positions per chunk of the [B, T, V] logits (None:
                                            # all at once); ~1024 for long Qwen3 sequences
    # Advantages (used by `compute_advantages`).
    adv_estimator: str = "grpo"
    adv_eps: float = 1e-6
    adv_ddof: int = 0
    adv_clip: float | None = 3.0
    # Filters and reward.
    min_group_std: float = 0.1
    reward_scope: str = "group"
    # Rollouts with a malformed turn or no final answer: "drop" them (the paper's filter: no
    # gradient, no part in the group's statistics) or score them "zero" (they stay in the group
    # as failed tasks, R = 0, so a policy that breaks the format is pushed back).
    invalid: str = "drop"
    # Tasks per group: 1 (the paper: each task's G rollouts are one group). k > 1: k consecutive
    # tasks of a step form one group of k·G rollouts for the reward's min–max, the filters and
    # the advantage baseline, and rollout g of each of them samples with the same seed (common
    # random numbers). With tasks that differ only in P, a choice the policy makes whatever P
    # says then earns opposite advantages in the same group, and cancels out of the gradient.
    group_tasks: int = 1
    # Resolution floors of the reward's features (a smaller spread over the scope is no
    # difference): dollars and seconds; a tool call's floor is one call.
    cost_resolution: float = 1e-4
    latency_resolution: float = 1.0
    # Batching: one call of train_step = ppo_epochs × num_minibatches optimizer updates, each
    # accumulating gradients over num_microbatches micro-batches.
    ppo_epochs: int = 1
    num_minibatches: int = 1
    num_microbatches: int = 1
    shuffle_seed: int | None = None         # reassign rows to micro-batches every epoch from a
                                            # key of (seed, step, epoch); None: fixed strided order
    # Objective: "grpo" uses policy_loss, "sft" the masked token cross-entropy.
    objective: str = "grpo"

    def __post_init__(self):
        require(0 <= self.clip_low < 1, self, "clip_low", self.clip_low, "in [0, 1)")
        require(self.dual_clip is None or self.dual_clip > 1, self, "dual_clip", self.dual_clip,
                "None or > 1")
        one_of(self, "agg", self.agg, AGG_MODES)
        require(self.norm_len is None or self.norm_len > 0, self, "norm_len", self.norm_len,
                "None or > 0")
        require(self.agg != "seq-mean-token-sum-norm" or self.norm_len is not None, self,
                "norm_len", self.norm_len, "a fixed int > 0 with agg='seq-mean-token-sum-norm' "
                "(the padded length changes from batch to batch)")
        one_of(self, "kl", self.kl, KL_ESTIMATORS)
        at_least(self, 0, "clip_high", "kl_coef", "adv_eps", "min_group_std", "cost_resolution",
                 "latency_resolution")
        above(self, 0, "log_ratio_clamp", "temperature")
        require(self.tis_cap is None or self.tis_cap > 0, self, "tis_cap", self.tis_cap,
                "None or > 0")
        require(self.logprob_chunk is None or self.logprob_chunk >= 1, self, "logprob_chunk",
                self.logprob_chunk, "None or >= 1")
        one_of(self, "adv_estimator", self.adv_estimator, ADV_ESTIMATORS)
        one_of(self, "adv_ddof", self.adv_ddof, (0, 1))
        require(self.adv_clip is None or self.adv_clip > 0, self, "adv_clip", self.adv_clip,
                "None or > 0")
        one_of(self, "reward_scope", self.reward_scope, REWARD_SCOPES)
        one_of(self, "invalid", self.invalid, INVALID_MODES)
        for f in ("ppo_epochs", "num_minibatches", "num_microbatches", "group_tasks"):
            v = getattr(self, f)
            require(isinstance(v, int) and v >= 1, self, f, v, "an int >= 1")
        one_of(self, "objective", self.objective, ("grpo", "sft"))
        require(self.shuffle_seed is None or isinstance(self.shuffle_seed, int), self,
                "shuffle_seed", self.shuffle_seed, "None or an int")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW with linear warmup then cosine decay (to lr·min_lr_ratio) or constant, plus global-norm
    gradient clipping. Steps count optimizer updates, not train_step calls."""

    lr: float = 1e-6
    warmup_steps: int = 0
    schedule: str = "constant"
    total_steps: int = 1000                 # cosine horizon, warmup included
    min_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0       # None disables clipping
    mu_dtype: str | None = None             # Adam's first moment: "bfloat16" halves its memory;
                                            # None keeps the params' dtype
    nu_dtype: str | None = None             # the second moment, likewise. A bf16 moment is
                                            # stored by stochastic rounding (rl/optim.py says why)

    def __post_init__(self):
        above(self, 0, "lr", "eps")
        at_least(self, 0, "warmup_steps", "weight_decay")
        one_of(self, "schedule", self.schedule, SCHEDULES)
        require(self.total_steps > self.warmup_steps, self, "total_steps", self.total_steps,
                f"> warmup_steps ({self.warmup_steps})")
        require(0 <= self.min_lr_ratio <= 1, self, "min_lr_ratio", self.min_lr_ratio,
                "in [0, 1]")
        require(0 <= self.b1 < 1, self, "b1", self.b1, "in [0, 1)")
        require(0 <= self.b2 < 1, self, "b2", self.b2, "in [0, 1)")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, self, "max_grad_norm",
                self.max_grad_norm, "None or > 0")
        for f in ("mu_dtype", "nu_dtype"):
            one_of(self, f, getattr(self, f), (None, "float32", "bfloat16"))
