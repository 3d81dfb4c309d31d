"""A new environment and a new sampler backend plug in as one definition plus one registry line
each: both are defined here, registered, and driven through one GRPO step (with the trainer's
step-0 evaluation) and through `orchestrax eval`'s evaluation of a task set. Also: typed env
configs name their bad fields, and the registry refuses what it does not know."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np
import pytest

from orchestrax import models, registry
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig
from orchestrax.data.records import Task
from orchestrax.envs.environment import EnvConfig, Environment
from orchestrax.envs.qa import QAConfig
from orchestrax.envs.routing import RoutingConfig
from orchestrax.eval.core import evaluate
from orchestrax.eval.policy import TokenPolicy
from orchestrax.eval.runners import EvalConfig
from orchestrax.eval.tasksets import TaskSetOptions, load_task_set
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.rollout.sampler import GenerateResult, Sampler, SamplerConfig
from orchestrax.train.train_config import RolloutConfig, TrainConfig
from orchestrax.train.loop import train


# --- the new environment: one config, one class ------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class EchoConfig(EnvConfig):
    num_tasks: int = 4

    def __post_init__(self):
        if self.num_tasks < 1:
            raise ValueError(f"EchoConfig.num_tasks={self.num_tasks}; must be >= 1")


class EchoEnv(Environment):
    """Each task asks for "yes"; no tools; P weighs the outcome alone."""

    def __init__(self, cfg: EchoConfig):
        self.cfg = cfg

    def tasks(self, split="train"):
        return [Task(task_id=f"echo/{split}/{i}", answer="yes", preference=(1.0, 0.0, 0.0),
                     messages=({"role": "user", "content": "Say yes."},))
                for i in range(self.cfg.num_tasks)]

    def tools(self, task):
        return []

    async def verify(self, task, trajectory):
        return float(trajectory.final_answer == task.answer)


# --- the new sampler backend: one class ---------------------------------------------------------
class AlternatingSampler(Sampler):
    """Answers "yes" and "no" in turn, so every group of two holds one right and one wrong
    rollout; reports the version it was last published."""

    def __init__(self, codec: Codec, version: str):
        self.codec, self.version, self.published = codec, version, []
        self.calls = self.reported = 0

    async def generate(self, requests):
        out = []
        for r in requests:
            text = "<answer>yes</answer>" if self.calls % 2 == 0 else "<answer>no</answer>"
            self.calls += 1
            ids = (*self.codec.encode(text), self.codec.im_end)
            out.append(GenerateResult(output_ids=ids, logprobs=(-0.5,) * len(ids),
                                      finish_reason="stop", prompt_tokens=len(r.input_ids),
                                      weight_version=self.version, rid=r.rid))
        return out

    async def publish(self, params, version):
        self.version = version
        self.published.append(version)

    def take_counters(self):
        delta, self.reported = self.calls - self.reported, self.calls
        return {"requests": delta}


@pytest.fixture
def registered(monkeypatch):
    """The two registry lines (undone after the test); returns the samplers the registry built."""
    built = []

    def build(cfg: SamplerConfig, model, params):
        built.append(AlternatingSampler(registry.build_codec("tiny"), cfg.weight_version))
        return built[-1]

    monkeypatch.setitem(registry.ENVS, EchoConfig, lambda cfg, tools: EchoEnv(cfg))
    monkeypatch.setitem(registry.SAMPLERS, "alternating", build)
    return built


def test_a_new_env_and_sampler_backend_train_one_step_and_evaluate(tmp_path, registered):
    cfg = TrainConfig(
        name="plug-in", out_dir=str(tmp_path / "run"), env=EchoConfig(num_tasks=4),
        model=models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64,
                                 num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16),
        grpo=GRPOConfig(num_minibatches=1), optim=OptimizerConfig(lr=1e-3, total_steps=10),
        rollout=RolloutConfig(backend="alternating", group_size=2, tasks_per_step=4,
                              max_new_tokens=16, max_turns=1, context_tokens=256,
                              enable_thinking=False),
        steps=1, checkpoint_every=0, eval_every=1)
    history = train(cfg)
    (sampler,) = registered
    assert [h["phase"] for h in history] == ["eval", "rl", "eval"]  # step 0 and the final
    evaluation, step, _ = history
    # Step-0 evaluation: 4 tasks x 1 sample, answered yes, no, yes, no.
    assert evaluation["rollout/accuracy"] == 0.5 and evaluation["sampler/requests"] == 4
    # The step: 4 tasks x 2 rollouts (8 rows: the 8-device mesh), one right and one wrong in
    # each group, all kept.
    assert step["rollout/accuracy"] == 0.5 and step["rollout/episodes"] == 8.0
    assert step["sampler/requests"] == 8
    assert step["rollout/reward_mean"] == 0.5 and np.isfinite(step["train/loss"])
    # Published before the first rollout and after the update, as the trainer's global steps.
    assert sampler.published == ["0", "1"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["phase"] for r in rows] == ["eval", "rl", "eval"]

    # The same parts measured by `orchestrax eval`'s evaluation.
    task_set = load_task_set(EchoConfig(num_tasks=3), TaskSetOptions(preferences=False))
    policy = TokenPolicy(registry.build_sampler(SamplerConfig(backend="alternating")),
                         registry.build_tokenizer("tiny"), name="alternating")
    eval_cfg = EvalConfig(episode=EpisodeConfig(max_turns=1, max_new_tokens=16,
                                                context_tokens=256, enable_thinking=False))
    records = asyncio.run(evaluate(task_set, policy, eval_cfg, progress=False))
    assert [r.outcome for r in records] == [1.0, 0.0, 1.0]
    assert task_set.name == "EchoConfig"


def test_registry_names_what_it_does_not_know():
    with pytest.raises(ValueError, match=r"RolloutConfig.backend='vllm'; allowed: "
                                         r"\('embedded', 'sglang'\)"):
        RolloutConfig(backend="vllm")
    with pytest.raises(ValueError, match=r"SamplerConfig.backend='vllm'; allowed"):
        registry.build_sampler(SamplerConfig(backend="vllm"))
    with pytest.raises(ValueError, match=r"env config EchoConfig; registered: \['MixConfig', "
                                         r"'QAConfig', 'RoutingConfig', 'Tau2Config', "
                                         r"'ToolScaleConfig'\]"):
        registry.build_env(EchoConfig())
    with pytest.raises(ValueError, match="TrainConfig.env=EchoConfig.*allowed: a config of"):
        TrainConfig(name="x", model=models.tiny_config(), env=EchoConfig())
    with pytest.raises(ValueError, match="RoutingConfig brings its own tools"):
        registry.build_env(RoutingConfig(), tools={"python": object()})
    with pytest.raises(ValueError, match="SamplerConfig.max_batch=0; must be an int >= 1"):
        SamplerConfig(max_batch=0)
    with pytest.raises(ValueError, match="needs the model config and params"):
        registry.build_sampler(SamplerConfig(backend="embedded"))


def test_typed_env_configs_check_themselves_and_take_set_overrides(tmp_path):
    from orchestrax.train.overrides import apply_overrides
    with pytest.raises(ValueError, match=r"QAConfig.grader='fuzzy'; allowed: exact, math, judge"):
        QAConfig(path="x.jsonl", grader="fuzzy")
    with pytest.raises(ValueError, match=r"RoutingConfig.preferences=\('speed',\); allowed"):
        RoutingConfig(preferences=("speed",))
    cfg = TrainConfig(name="x", model=models.tiny_config())
    changed = apply_overrides(cfg, ["env.num_eval=3", "env.preferences=('latency',)"])
    assert changed.env == RoutingConfig(num_eval=3, preferences=("latency",))
    with pytest.raises(ValueError, match="RoutingConfig has no field 'domain'"):
        apply_overrides(cfg, ["env.domain=/x"])
    env = registry.build_env(changed.env)
    assert len(env.tasks("eval")) == 3 and dict(env.catalog) == {}
