"""orchestrax.checks: the one validation module (ranges, choices, types) and the configs of every
layer that use it, each error `Owner.field=value; ...` naming the bad field."""

import dataclasses

import pytest

from orchestrax import models, rl
from orchestrax.checks import above, at_least, one_of, require
from orchestrax.agent.episode import EpisodeConfig
from orchestrax.agent.subagent import MemoryLimits, OrchestratorConfig, SubAgentConfig
from orchestrax.eval.subagent_runner import SubagentOptions


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


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "2", True])
def test_above_refuses_what_is_not_a_finite_number_over_the_bound(value):
    with pytest.raises(ValueError, match=r"^Box.a=.*; must be a finite number > 0$"):
        above(Box(a=value), 0, "a")
    above(Box(a=1e-9), 0, "a")


def test_one_of_and_require_name_the_owner_a_config_or_a_function():
    one_of(Box(), "a", "x", ("x", "y"))
    with pytest.raises(ValueError, match=r"^Box.a='z'; allowed: x, y$"):
        one_of(Box(), "a", "z", ("x", "y"))
    with pytest.raises(ValueError, match=r"^policy_loss.agg='sum'; allowed: token-mean$"):
        one_of("policy_loss", "agg", "sum", ("token-mean",))
    with pytest.raises(ValueError, match=r"^Box.b=2; must be in \[0, 1\)$"):
        require(False, Box(), "b", 2, "in [0, 1)")


@pytest.mark.parametrize("make, message", [
    (lambda: rl.GRPOConfig(temperature=float("nan")),
     "GRPOConfig.temperature=nan; must be a finite number > 0"),
    (lambda: rl.GRPOConfig(kl_coef=-1.0), "GRPOConfig.kl_coef=-1.0; must be >= 0"),
    (lambda: rl.GRPOConfig(adv_ddof=2), "GRPOConfig.adv_ddof=2; allowed: 0, 1"),
    (lambda: rl.OptimizerConfig(lr=0.0), "OptimizerConfig.lr=0.0; must be a finite number > 0"),
    (lambda: models.ModelConfig(vocab_size=0, hidden_size=8, intermediate_size=8, num_layers=1,
                                num_heads=1, num_kv_heads=1, head_dim=8),
     "ModelConfig.vocab_size=0; must be >= 1"),
    (lambda: models.ModelConfig(arch="gpt", vocab_size=8, hidden_size=8, intermediate_size=8,
                                num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8),
     "ModelConfig.arch='gpt'; allowed: qwen3, llama"),
])
def test_the_rl_and_model_configs_use_it(make, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        make()
