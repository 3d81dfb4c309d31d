"""A short CPU training run in sub-agent mode on a QA environment: orchestrator rollouts with
frozen sub-agents (real BM25 search, the sandboxed Python tool), Flow-GRPO batches through the
real jitted train step, metrics written."""

import json
import shutil

import numpy as np
import pytest

from orchestrax import models
from orchestrax.envs.qa import QAConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.train.train_config import RolloutConfig, TrainConfig
from orchestrax.train.agent_config import AgentConfig
from orchestrax.train.loop import Trainer

QUESTIONS = [("q1", "What is the capital of France?", "Paris"),
             ("q2", "Which river flows through Berlin?", "Spree"),
             ("q3", "What is 6 times 7?", "42"),
             ("q4", "Who wrote Hamlet?", "Shakespeare"),
             ("q5", "What colour is the sky?", "blue"),
             ("q6", "How many legs has a spider?", "8")]


@pytest.mark.slow
def test_subagent_mode_trains_and_writes_metrics(tmp_path):
    data = tmp_path / "tiny_qa.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n"
                            for i, q, a in QUESTIONS))
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps([{"title": "Paris", "text": "Paris is the capital of France."},
                                  {"title": "Spree", "text": "The Spree flows through Berlin."}]))
    sandbox = "bwrap" if shutil.which("bwrap") else None
    cfg = TrainConfig(
        name="subagent-test", out_dir=str(tmp_path / "run"),
        env=QAConfig(path=str(data), test_fraction=0.6),
        model=models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64,
                                 num_heads=2, num_kv_heads=1, head_dim=16),
        grpo=GRPOConfig(num_minibatches=2), optim=OptimizerConfig(lr=1e-3, total_steps=10),
        rollout=RolloutConfig(group_size=4, tasks_per_step=2, context_tokens=1024,
                              enable_thinking=False),
        agent=AgentConfig(mode="subagent", thinking="none", orchestrator_turns=2,
                          orchestrator_new_tokens=16, subagent_steps=1, subagent_new_tokens=8,
                          sandbox=sandbox, search_corpus=str(corpus)),
        steps=1, checkpoint_every=1, eval_every=1)
    trainer = Trainer(cfg)
    assert trainer.eval_tasks and trainer.train_tasks
    history = trainer.run()

    rl_rows = [h for h in history if h["phase"] == "rl"]
    assert [h["step"] for h in rl_rows] == [1]
    for row in rl_rows:
        for key in ("rollout/reward_mean", "rollout/accuracy", "train/loss", "train/grad_norm",
                    "flow/turn_samples", "flow/dropped_over_budget", "tokens/prompt_mean",
                    "rollout/turns_mean", "dispatches/web_searcher", "filter/kept"):
            assert key in row, key
        # every one of the 8 rollouts has at least one orchestrator turn, each its own row
        assert row["flow/turn_samples"] >= 8 and row["rollout/turns_mean"] >= 1
        # nothing over budget here: one row per orchestrator turn of the 2 x 4 rollouts
        assert row["flow/turn_samples"] == 8 * row["rollout/turns_mean"]
        assert np.isfinite(row["train/loss"])
    assert history[0]["phase"] == "eval" and np.isfinite(history[0]["rollout/accuracy"])
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(history)
    # the policy's sampler follows the updates; the sub-agents' sampler stays frozen
    assert trainer.sampler.weight_version == "1"
    assert trainer.rollouts.subagent_sampler is not trainer.sampler
    assert trainer.rollouts.subagent_sampler.weight_version == "0"
    # reward features: dispatches per sub-agent, in the fixed role order
    assert trainer.rollouts.agent_names == ["web_searcher", "coder", "file_inspector"]
    assert [t.spec.name for t in trainer.rollouts.tools] == (["python", "local_search"] if sandbox
                                                         else ["local_search"])


def test_subagent_mode_refuses_episode_workers():
    with pytest.raises(ValueError, match=r"rollout.workers=2 with agent.mode='subagent'"):
        TrainConfig(name="x", model=models.tiny_config(), rollout=RolloutConfig(workers=2),
                    agent=AgentConfig(mode="subagent"))


def test_subagent_mode_refuses_an_env_whose_tools_no_subagent_holds():
    from orchestrax.envs.routing import RoutingEnv
    from orchestrax.train.flow import FlowRunner
    cfg = TrainConfig(name="x", model=models.tiny_config(), agent=AgentConfig(mode="subagent"))
    with pytest.raises(ValueError, match=r"environment's tools \['lookup_cheap', 'lookup_fast', "
                                         r"'lookup_premium'\] belong to no sub-agent"):
        FlowRunner(cfg, RoutingEnv(), None, None, None, None)
