"""How the trainer plays episodes: Direct mode or the orchestrator + sub-agents system.

Its own module so that `train.train_config` (every config of a run) and `train.flow` (sub-agent-mode
rollouts) both import it without importing each other.
"""

from __future__ import annotations

import dataclasses

from orchestrax.agent.subagent import SystemConfig
from orchestrax.checks import at_least, at_least_or_none, one_of

MODES = ("direct", "subagent", "orchestrator8b")
FLOW_AGGS = ("rollout-turn-token-mean", "token-mean")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig(SystemConfig):
    """How episodes are played. "direct": one agent holds every tool (agent/episode.py);
    "subagent": the orchestrator + sub-agents system (its `SystemConfig` settings: thinking,
    memory, exclude, sub-agent budget), trained with Flow-GRPO (train/flow.py);
    "orchestrator8b": the released Orchestrator-8B protocol, its rounds trained like sub-agent
    mode's turns (train/orchestrator8b_rollouts.py), its experts from `experts`."""

    mode: str = "direct"
    orchestrator_turns: int = 8
    orchestrator_new_tokens: int = 512
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
    # mode "orchestrator8b": JSON of expert slot -> endpoint (agent.orchestrator8b_experts)
    experts: str | None = None
    # mode "orchestrator8b": rounds in a row without a usable call that end a rollout; None: none
    # do, as the released evaluation plays on to its round limit.
    protocol_format_errors: int | None = None

    def __post_init__(self):
        one_of(self, "mode", self.mode, MODES)
        if (self.mode == "orchestrator8b") != (self.experts is not None):
            raise ValueError(f"AgentConfig.experts={self.experts!r} with mode={self.mode!r}; "
                             "mode 'orchestrator8b' needs experts (a JSON file of expert slots) "
                             "and only it takes them")
        one_of(self, "flow_agg", self.flow_agg, FLOW_AGGS)
        super().__post_init__()
        at_least(self, 1, "orchestrator_turns", "orchestrator_new_tokens")
        at_least_or_none(self, 0, "subagent_seconds_per_token")
        at_least_or_none(self, 2, "train_turn_tokens")
        at_least_or_none(self, 1, "protocol_format_errors")
