"""The settings of the orchestrator + sub-agents system that training (Flow-GRPO) and evaluation
share, and the one place they become the orchestrator's and the sub-agents' configs."""

from __future__ import annotations

import dataclasses

from orchestrax.agent.subagent.orchestrator import THINKING, OrchestratorConfig, thinking_flags
from orchestrax.agent.subagent.roles import ROLES, SubAgentConfig
from orchestrax.checks import at_least, one_of
from orchestrax.rollout.sampler import SamplingParams
from orchestrax.tools.tool import Pricing

# The paper's component ablation (Table 2): name -> (sub-agents left out, structured memory on).
ABLATIONS: dict[str, tuple[tuple[str, ...], bool]] = {
    "none": ((), True), "no_web_searcher": (("web_searcher",), True),
    "no_coder": (("coder",), True), "no_file_inspector": (("file_inspector",), True),
    "no_memory": ((), False)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SystemConfig:
    """Where thinking is on, which sub-agents play, memory or history replay, and the sub-agents'
    budget; `train.agent_config.AgentConfig` and `eval.subagent_runner.SubagentOptions` extend
    it."""

    thinking: str = "orchestrator"          # none | subagents | orchestrator | all
    memory: bool = True                     # False: the memory ablation (history replay)
    exclude: tuple[str, ...] = ()           # sub-agents left out (the component ablation)
    subagent_steps: int = 3
    subagent_new_tokens: int = 256

    def __post_init__(self):
        one_of(self, "thinking", self.thinking, THINKING)
        bad = sorted(set(self.exclude) - set(ROLES))
        if bad:
            raise ValueError(f"{type(self).__name__}.exclude={bad}; allowed: {sorted(ROLES)}")
        at_least(self, 1, "subagent_steps", "subagent_new_tokens")

    def with_ablation(self, name: str) -> "SystemConfig":
        """The same settings under the component ablation `name` (a key of `ABLATIONS`)."""
        one_of(self, "ablation", name, tuple(ABLATIONS))
        exclude, memory = ABLATIONS[name]
        return dataclasses.replace(self, exclude=exclude, memory=memory)

    def configs(self, *, max_turns: int, max_new_tokens: int, context_tokens: int,
                sampling: SamplingParams | None = None,
                subagent_sampling: SamplingParams | None = None,
                pricing: Pricing | None = None, subagent_pricing: Pricing | None = None
                ) -> tuple[OrchestratorConfig, SubAgentConfig]:
        """(orchestrator, sub-agents) configs: the orchestrator's turn budget and sampling come
        from the caller (the run's rollout or eval episode settings); None keeps each config's
        default sampling (the sub-agents' is greedy)."""
        orch_think, sub_think = thinking_flags(self.thinking)
        orch = OrchestratorConfig(max_turns=max_turns, max_new_tokens=max_new_tokens,
                                  turn_tokens=context_tokens, enable_thinking=orch_think,
                                  memory=self.memory, pricing=pricing,
                                  **({} if sampling is None else {"sampling": sampling}))
        sub = SubAgentConfig(max_steps=self.subagent_steps,
                             max_new_tokens=self.subagent_new_tokens,
                             context_tokens=context_tokens, enable_thinking=sub_think,
                             pricing=subagent_pricing,
                             **({} if subagent_sampling is None
                                else {"sampling": subagent_sampling}))
        return orch, sub
