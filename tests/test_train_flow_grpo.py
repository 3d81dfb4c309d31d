"""Flow-GRPO batches: one row per orchestrator turn, the rollout's advantage on every turn,
groups per task, loss only on the turn's sampled tokens, over-budget turns dropped after the
advantages. Rewards and advantages are checked against numbers worked by hand."""

import asyncio
import dataclasses
import math

import numpy as np
import pytest

from orchestrax.agent.codec import Codec
from orchestrax.agent.subagent import FileReadTool, OrchestratorConfig, build_subagents, run_query
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.data.records import Task
from orchestrax.rl import GRPOConfig, flow_batch
from orchestrax.train.agent_config import AgentConfig
from orchestrax.train.rollouts import drop_stale
from orchestrax.train.flow import preferences

NAMES = ["web_searcher", "coder", "file_inspector"]
DISPATCH = ('<tool_call>\n{"name": "file_inspector", "arguments": {"task": "Read a.txt"}}\n'
            '</tool_call>')
PAD = 0


@pytest.fixture(scope="module")
def tok():
    return tiny_qwen3_tokenizer(512)


def rollout(tok, tmp_path, task, dispatches, malformed=False):
    """A real sub-agent-mode rollout whose orchestrator dispatches the File Inspector
    `dispatches` times, then answers (or writes a malformed call first)."""
    (tmp_path / "a.txt").write_text("alpha")
    turns = (['<tool_call>{"name": </tool_call>'] if malformed else []) + [DISPATCH] * dispatches
    turns.append("<answer>done</answer>")
    sub = ScriptedSampler(tok, script=lambda n, ids: (
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
        if n % 2 == 0 else "<answer>alpha</answer>"))
    codec = Codec(tok)
    agents = build_subagents([FileReadTool([tmp_path / "a.txt"])], sub, codec)
    return asyncio.run(run_query(task, agents, ScriptedSampler(tok, turns), codec,
                                 OrchestratorConfig(enable_thinking=False)))


def task(name, preference=None):
    return Task(task_id=name, preference=preference,
                messages=({"role": "user", "content": f"question {name}"},))


@pytest.fixture(scope="module")
def setup(tok, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flow")
    tasks = [task("A"), task("B", preference=(0, 0, 1, 1, 0, 0))]
    counts = [[2, 0, 1, 1], [1, 2, 3, 0]]
    groups = [[rollout(tok, tmp, t, k) for k in ks] for t, ks in zip(tasks, counts)]
    outcome = np.array([[1, 0, 0, 0], [1, 1, 0, 1]], np.float32)
    return tasks, groups, outcome


def build(setup, max_turn_tokens=4096, outcome=None, grpo=GRPOConfig()):
    tasks, groups, default = setup
    return flow_batch(groups, default if outcome is None else outcome, NAMES,
                      preferences(tasks, NAMES), grpo, pad_id=PAD,
                      max_turn_tokens=max_turn_tokens, row_multiple=8)


def expected_advantages():
    """By hand. Task A: P scores the outcome only, R = [1, 0, 0, 0], mean 1/4, std √3/4.
    Task B: P = file_inspector dispatches + outcome; dispatches [1, 2, 3, 0] min–max to
    [1/3, 2/3, 1, 0], outcome [1, 1, 0, 1], R = [4/3, 5/3, 0, 1] (0 where wrong): mean 1,
    population std √14/6."""
    a = [(r - 0.25) / (math.sqrt(3) / 4 + 1e-6) for r in (1, 0, 0, 0)]
    b = [(r - 1.0) / (math.sqrt(14) / 6 + 1e-6) for r in (4 / 3, 5 / 3, 0, 1)]
    return np.array([a, b])


def test_every_turn_carries_its_rollouts_advantage(setup):
    tasks, groups, _ = setup
    batch, stats = build(setup)
    want = expected_advantages()
    n = sum(len(r.samples) for gr in groups for r in gr)   # (3+1+2+2) + (2+3+4+1) = 18 turns
    assert n == 18 and stats["flow/turn_samples"] == 18
    assert batch["tokens"].shape[0] == 24   # padded to a multiple of row_multiple=8
    assert (batch["sample_mask"][18:] == 0).all() and (batch["attention_mask"][18:] == 0).all()
    row = 0
    for q, group in enumerate(groups):
        for g, r in enumerate(group):
            for _ in r.samples:
                assert batch["advantages"][row] == pytest.approx(want[q, g], abs=1e-5)
                assert batch["sample_mask"][row] == 1.0
                row += 1
    assert stats["rollout/reward_mean"] == pytest.approx(np.mean([1, 0, 0, 0, 4 / 3, 5 / 3, 0, 1]),
                                                 abs=1e-6)
    assert stats["dispatches/file_inspector"] == pytest.approx(np.mean([2, 0, 1, 1, 1, 2, 3, 0]))


def test_groups_are_per_task(setup):
    """Changing task A's outcomes moves only task A's rows."""
    base, _ = build(setup)
    other, _ = build(setup, outcome=np.array([[0, 1, 1, 0], [1, 1, 0, 1]], np.float32))
    tasks, groups, _ = setup
    n_a = sum(len(r.samples) for r in groups[0])
    assert np.array_equal(base["advantages"][n_a:], other["advantages"][n_a:])
    assert not np.array_equal(base["advantages"][:n_a], other["advantages"][:n_a])


def test_loss_mask_covers_only_the_turns_sampled_tokens(setup):
    tasks, groups, _ = setup
    batch, _ = build(setup)
    samples = [s for gr in groups for r in gr for s in r.samples]
    for row, s in enumerate(samples):
        p, o = len(s.prompt_ids), len(s.output_ids)
        mask = batch["loss_mask"][row]
        assert mask[:p].sum() == 0 and mask[p:p + o].all() and mask[p + o:].sum() == 0
        assert list(batch["tokens"][row, :p + o]) == s.prompt_ids + s.output_ids
        assert np.allclose(batch["sampler_logprobs"][row, p:p + o], s.logprobs)
        assert batch["attention_mask"][row].sum() == p + o
    # each turn's prompt is the memory-rebuilt one: two messages, not the history
    assert all(s.prompt_text.count("<|im_start|>") == 3 for s in samples)


def test_dropping_over_budget_turns_keeps_the_others_advantages(setup):
    tasks, groups, _ = setup
    lengths = [len(s.prompt_ids) + len(s.output_ids) for gr in groups for r in gr
               for s in r.samples]
    budget = sorted(lengths)[len(lengths) // 2]   # about half the turns are over it
    full, _ = build(setup)
    cut, stats = build(setup, max_turn_tokens=budget)
    kept = [i for i, n in enumerate(lengths) if n <= budget]
    assert 0 < len(kept) < len(lengths)
    assert stats["flow/dropped_over_budget"] == len(lengths) - len(kept)
    assert np.array_equal(cut["advantages"][:len(kept)], full["advantages"][kept])
    assert cut["sample_mask"][len(kept):].sum() == 0   # padding rows
    assert cut["tokens"].shape[1] <= max(64, budget)


def test_malformed_rollouts_are_filtered_on_every_turn(tok, tmp_path):
    t = task("C")
    groups = [[rollout(tok, tmp_path, t, 1), rollout(tok, tmp_path, t, 1, malformed=True),
               rollout(tok, tmp_path, t, 0), rollout(tok, tmp_path, t, 2)]]
    batch, stats = flow_batch(groups, np.array([[1, 1, 0, 0]], np.float32), NAMES,
                              preferences([t], NAMES), GRPOConfig(), pad_id=PAD,
                              max_turn_tokens=4096, row_multiple=4)
    assert stats["rollout/format_error_rate"] == 0.25
    n0 = len(groups[0][0].samples)
    n1 = len(groups[0][1].samples)
    assert (batch["sample_mask"][n0:n0 + n1] == 0).all()
    assert (batch["advantages"][n0:n0 + n1] == 0).all()
    assert (batch["sample_mask"][:n0] == 1).all()


def test_preferences_and_config_errors():
    tasks = [task("a"), task("b", (0.5, 0, 1, 1, 0.2, 0.3)), task("c", (1, 1, 0, 1)),
             task("d", (0.2, 0.9, 0.4, 1, 0, 1))]
    tools = [[], [], ["x"], ["web_search", "local_search", "python"]]
    got = preferences(tasks, NAMES, tools)
    assert np.allclose(got, [
        [0, 0, 0, 1, 0, 0],                 # no P: the outcome alone
        [0.5, 0, 1, 1, 0.2, 0.3],           # P over the sub-agents: as is
        [0, 0, 0, 1, 0, 1],                 # P over a tool no sub-agent holds: last three
        [0.9, 0.4, 0, 1, 0, 1]])            # searcher = max(web 0.2, local 0.9), coder = python
    with pytest.raises(ValueError, match=r"AgentConfig.mode='flow'; allowed: direct, subagent"):
        AgentConfig(mode="flow")
    with pytest.raises(ValueError, match=r"AgentConfig.exclude=\['memory'\]"):
        AgentConfig(exclude=("memory",))


@pytest.mark.slow
def test_flow_batch_drives_the_real_train_step(setup):
    """The per-turn batch goes through the jitted train step: the loss counts exactly the kept
    rows' sampled tokens, weighs them as Flow-GRPO does across micro-batches, and the
    orchestrator's weights move."""
    import jax

    from orchestrax import models, rl
    from orchestrax.rl import OptimizerConfig, make_train_step

    batch, _ = build(setup)
    mcfg = models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64, num_heads=2,
                              num_kv_heads=1, head_dim=16)
    step = make_train_step(mcfg, GRPOConfig(agg="rollout-turn-token-mean", num_microbatches=2),
                           OptimizerConfig(lr=1e-2, total_steps=10))
    params = models.init_params(mcfg, 0)
    before = jax.tree.map(np.asarray, params)
    state, metrics = step.step(step.init(params), batch)
    kept_tokens = (batch["loss_mask"] * batch["sample_mask"][:, None]).sum()
    assert kept_tokens > 0
    assert float(metrics["policy_tokens"]) == kept_tokens
    assert float(metrics["grad_norm"]) > 0
    # ratio 1 on the first update: loss = −Σ A_b · w_bt with the whole batch's Flow-GRPO weights
    w = np.asarray(rl.token_weights(batch["loss_mask"] * batch["sample_mask"][:, None],
                                    "rollout-turn-token-mean", rollout_ids=batch["rollout_ids"]))
    want = -float(np.sum(batch["advantages"][:, None] * w))
    assert float(metrics["loss_first"]) == pytest.approx(want, abs=1e-5)
    moved = jax.tree.map(lambda a, b: not np.allclose(a, np.asarray(b)), before, state.params)
    assert any(jax.tree.leaves(moved))


class _Versioned(ScriptedSampler):
    """The orchestrator's sampler reporting the weight version it served each turn from."""

    def __init__(self, tok, turns, versions):
        super().__init__(tok, turns)
        self.versions = list(versions)

    async def generate(self, requests):
        k = self.calls
        return [dataclasses.replace(r, weight_version=self.versions[k])
                for r in await super().generate(requests)]


def test_stale_orchestrator_turns_drop_their_rollout(tok, tmp_path):
    """A forced stale sync: the trainer published "2", but one rollout's second orchestrator
    turn came from a server still on "1". The turns record their versions, `drop_stale` fails
    that rollout (it used to raise: SubagentRollout had no final_answer setter), and the Flow-GRPO
    batch gives every one of its turns sample_mask 0; the fresh rollouts keep theirs."""
    (tmp_path / "a.txt").write_text("alpha")
    sub = ScriptedSampler(tok, script=lambda n, ids: (
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
        if n % 2 == 0 else "<answer>alpha</answer>"))
    codec = Codec(tok)
    agents = build_subagents([FileReadTool([tmp_path / "a.txt"])], sub, codec)
    t = task("A", preference=(0, 0, 1, 1, 0, 0))

    def play(versions):
        turns = [DISPATCH] * (len(versions) - 1) + ["<answer>done</answer>"]
        orch = _Versioned(tok, turns, versions)
        return asyncio.run(run_query(t, agents, orch, codec,
                                     OrchestratorConfig(enable_thinking=False)))

    # the last answers at once (a sampler that reports no version is trusted)
    group = [play(["2", "2"]), play(["2", "1"]), play(["2", "2"]), play([""])]
    assert [tr.weight_version for tr in group[1].turns] == ["2", "1"]
    assert drop_stale(group, "2") == {"rollout/stale_trajectories": 1.0,
                                      "rollout/stale_turns": 1.0}
    assert group[1].final_answer is None and group[1].end_reason == "error"
    assert "stale weights ['1']" in group[1].error
    assert group[1].trajectory.final_answer is None
    assert all(r.final_answer == "done" for r in (group[0], group[2], group[3]))
    batch, _ = flow_batch([group], np.ones((1, 4), np.float32), NAMES, preferences([t], NAMES),
                          GRPOConfig(), pad_id=PAD, max_turn_tokens=4096, row_multiple=8)
    rows = batch["rollout_ids"]
    assert set(rows[rows >= 0]) == {0, 1, 2, 3}
    assert np.all(batch["sample_mask"][rows == 1] == 0)
    # the others differ in dispatches (1, 1, 0), so their group survives the filters
    assert np.all(batch["sample_mask"][(rows >= 0) & (rows != 1)] == 1)
