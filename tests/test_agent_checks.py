"""agent.checks.at_least: the one range check of the agent layer's configs."""

import dataclasses

import pytest

from orchestrax.agent.checks import at_least
from orchestrax.agent.episode import EpisodeConfig
from orchestrax.agent.subagent import MemoryLimits, OrchestratorConfig, SubAgentConfig
from orchestrax.eval.subagent import SubagentOptions


@dataclasses.dataclass
class Box:
    a: object = 1
    b: object = 0.0


def test_bounds_are_inclusive_and_the_first_bad_field_is_named():
    at_least(Box(a=1, b=1), 1, "a", "b")
    with pytest.raises(ValueError, match=r"^Box.b=0.5; must be >= 1$"):
        at_least(Box(a=3, b=0.5), 1, "a", "b")
    with pytest.raises(ValueError, match=r"^Box.a=0; must be >= 1$"):
        at_least(Box(a=0, b=0), 1, "a", "b")


@pytest.mark.parametrize("value", ["3", None, True, [1]])
def test_non_numbers_are_refused_by_name_not_by_a_type_error(value):
    with pytest.raises(ValueError, match=r"^Box.a=.*; must be a number >= 1$"):
        at_least(Box(a=value), 1, "a")


def test_nan_is_below_every_bound():
    with pytest.raises(ValueError, match=r"^Box.b=nan; must be >= 0$"):
        at_least(Box(b=float("nan")), 0, "b")


@pytest.mark.parametrize("make, message", [
    (lambda: EpisodeConfig(context_tokens=0), "EpisodeConfig.context_tokens=0; must be >= 1"),
    (lambda: EpisodeConfig(sampler_backoff_s=-0.1),
     "EpisodeConfig.sampler_backoff_s=-0.1; must be >= 0"),
    (lambda: OrchestratorConfig(max_turns="10"),
     "OrchestratorConfig.max_turns='10'; must be a number >= 1"),
    (lambda: SubAgentConfig(max_steps=0), "SubAgentConfig.max_steps=0; must be >= 1"),
    (lambda: MemoryLimits(result_chars=15), "MemoryLimits.result_chars=15; must be >= 16"),
    (lambda: SubagentOptions(subagent_new_tokens=0),
     "SubagentOptions.subagent_new_tokens=0; must be >= 1"),
])
def test_every_agent_config_uses_it(make, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        make()


def test_the_boundary_values_are_accepted():
    EpisodeConfig(max_turns=1, sampler_backoff_s=0.0)
    OrchestratorConfig(max_turns=1, sampler_backoff_s=0)
    MemoryLimits(**{f.name: 16 for f in dataclasses.fields(MemoryLimits)})
