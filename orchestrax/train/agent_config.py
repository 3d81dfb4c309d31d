"""How the trainer plays episodes: Direct mode or the orchestrator + sub-agents system.

Its own module so that `train.config` (every config of a run) and `train.flow` (sub-agent-mode
rollouts) both import it without importing each other.
"""

from __future__ import annotations

import dataclasses

from orchestrax.agent.checks import at_least
from orchestrax.agent.subagent import ROLES, THINKING

MODES = ("direct", "subagent")
FLOW_AGGS = ("rollout-turn-token-mean", "token-mean")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """How episodes are played. "direct": one agent holds every tool (agent/episode.py);
    "subagent": the orchestrator + sub-agents system, trained with Flow-GRPO (train/flow.py)."""

    mode: str = "direct"
    thinking: str = "orchestrator"          # none | subagents | orchestrator | all
    memory: bool = True                     # False: the memory ablation (history replay)
    exclude: tuple[str, ...] = ()           # sub-agents left out (the component ablation)
    orchestrator_turns: int = 8
    orchestrator_new_tokens: int = 512
    subagent_steps: int = 3
    subagent_new_tokens: int = 256
    subagent_urls: tuple[str, ...] = ()     # SGLang servers of the (frozen) sub-agent model;
                                            # () = a frozen embedded copy of the starting weights
    sandbox: str | None = "bwrap"           # the Coder's python tool; None: no Coder
    search_corpus: str | None = None        # BM25 corpus of the Web Searcher; None: no searcher
    train_turn_tokens: int | None = None    # longer turns are dropped (None: context_tokens)
    # Sub-agent mode's loss aggregation over turn rows (it replaces grpo.agg there): Flow-GRPO's
    # 1/G per rollout, 1/T_i per turn, 1/|a| per token, or one token-mean over every turn.
    flow_agg: str = "rollout-turn-token-mean"
    # The sub-agents' generation speed in the latency feature (None: rollout.seconds_per_token,
    # the same model by default).
    subagent_seconds_per_token: float | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"AgentConfig.mode={self.mode!r}; allowed: {MODES}")
        if self.flow_agg not in FLOW_AGGS:
            raise ValueError(f"AgentConfig.flow_agg={self.flow_agg!r}; allowed: {FLOW_AGGS}")
        if self.thinking not in THINKING:
            raise ValueError(f"AgentConfig.thinking={self.thinking!r}; allowed: {THINKING}")
        bad = sorted(set(self.exclude) - set(ROLES))
        if bad:
            raise ValueError(f"AgentConfig.exclude={bad}; allowed: {sorted(ROLES)}")
        at_least(self, 1, "orchestrator_turns", "orchestrator_new_tokens", "subagent_steps",
                 "subagent_new_tokens")
        if self.subagent_seconds_per_token is not None:
            at_least(self, 0, "subagent_seconds_per_token")
        if self.train_turn_tokens is not None and self.train_turn_tokens < 2:
            raise ValueError(f"AgentConfig.train_turn_tokens={self.train_turn_tokens}; must be "
                             ">= 2 or None")
