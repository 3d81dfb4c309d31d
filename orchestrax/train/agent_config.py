"""How the trainer plays episodes: Direct mode or the orchestrator + sub-agents system.

Its own module so that `train.config` (every config of a run) and `train.flow` (sub-agent-mode
rollouts) both import it without importing each other.
"""

from __future__ import annotations

import dataclasses

from orchestrax.agent.checks import at_least
from orchestrax.agent.subagent import ROLES, THINKING

MODES = ("direct", "subagent")


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

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"AgentConfig.mode={self.mode!r}; allowed: {MODES}")
        if self.thinking not in THINKING:
            raise ValueError(f"AgentConfig.thinking={self.thinking!r}; allowed: {THINKING}")
        bad = sorted(set(self.exclude) - set(ROLES))
        if bad:
            raise ValueError(f"AgentConfig.exclude={bad}; allowed: {sorted(ROLES)}")
        at_least(self, 1, "orchestrator_turns", "orchestrator_new_tokens", "subagent_steps",
                 "subagent_new_tokens")
        if self.train_turn_tokens is not None and self.train_turn_tokens < 2:
            raise ValueError(f"AgentConfig.train_turn_tokens={self.train_turn_tokens}; must be "
                             ">= 2 or None")
