"""Per-instance preferences (Pairs_train / Pairs_eval) and tool/pricing randomisation."""

import asyncio
import dataclasses

import pytest
from agent_fixtures import SleepTool

from orchestrax.data import preferences
from orchestrax.data.instances import InstanceConfig, prepare_instance
from orchestrax.envs.qa import QAConfig
from orchestrax.envs.qa import QAEnv
from orchestrax.tools.randomize import RandomizeConfig
from orchestrax.tools.sheets import bundled_sheets, load_sheet

CATALOG_NAMES = ("local_search", "python", "web_search")


def in_pool(text, split):
    return any(text == p.instruction.format(tool=t) for p in preferences.pairs(split)
               for t in CATALOG_NAMES)


def test_pools_never_overlap_and_cover_every_profile():
    train, evals = preferences.pairs("train"), preferences.pairs("eval")
    assert set(train).isdisjoint(evals)
    assert {p.instruction for p in train}.isdisjoint(p.instruction for p in evals)
    profile = lambda p: (p.outcome, p.compute, p.latency, p.tool)  # noqa: E731
    assert {profile(p) for p in train} == {profile(p) for p in evals}
    with pytest.raises(ValueError, match="allowed: 'train', 'eval'"):
        preferences.pairs("test")


def test_draw_is_seeded_and_lays_p_out_over_the_instance_tools():
    tools = ["a", "b", "c"]
    assert preferences.draw("train", tools, 5) == preferences.draw("train", tools, 5)
    drawn = [preferences.draw("train", tools, s) for s in range(60)]
    assert len({text for _, text in drawn}) > 5
    train_texts = {p.instruction for p in preferences.pairs("train")}
    for P, text in drawn:
        assert len(P) == len(tools) + 3 and all(0 <= x <= 1 for x in P) and P[3] == 1.0
        named = [t for t, w in zip(tools, P[:3]) if w > 0]
        assert len(named) <= 1
        if named:  # the instruction names the tool that carries the weight
            assert named[0] in text
        assert any(text == t.format(tool=named[0]) if named else text == t for t in train_texts)
    # no nameable tool: only wishes about outcome, cost and latency
    for s in range(40):
        P, text = preferences.draw("eval", tools, s, nameable=[])
        assert P[:3] == (0.0, 0.0, 0.0) and "{tool}" not in text
    with pytest.raises(ValueError, match="not among tool_names"):
        preferences.draw("train", tools, 0, nameable=["z"])


@pytest.fixture
def qa_env(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(f'{{"id": {i}, "question": "q{i}?", "answer": "a{i}"}}\n'
                            for i in range(20)))
    catalog = {n: SleepTool(n, cost=0.5) for n in CATALOG_NAMES}
    return QAEnv(path=str(path), tools=catalog)


def test_qa_env_offers_its_catalog(qa_env):
    task = qa_env.tasks("all")[0]
    assert [t.spec.name for t in qa_env.tools(task)] == sorted(CATALOG_NAMES)


def test_training_instances_are_seeded_differ_and_never_use_heldout_sheets(qa_env):
    cfg = InstanceConfig(randomize=RandomizeConfig(min_tools=1))
    task = qa_env.tasks("all")[0]
    a = prepare_instance(task, qa_env, split="train", seed=11, config=cfg)
    assert a == prepare_instance(task, qa_env, split="train", seed=11, config=cfg)
    seen_tools, seen_sheets, seen_texts = set(), set(), set()
    for seed in range(120):
        inst = prepare_instance(task, qa_env, split="train", seed=seed, config=cfg)
        tools = qa_env.tools(inst)
        names = tuple(t.spec.name for t in tools)
        sheet = inst.metadata["tool_config"]["sheet"]
        seen_tools.add(names)
        seen_sheets.add(sheet)
        seen_texts.add(inst.preference_instruction)
        assert len(inst.preference) == len(names) + 3
        # every tool is billed by the instance's sheet
        for t in tools:
            assert t.spec.pricing == load_sheet(sheet).tools[t.spec.name]
    assert len(seen_tools) >= 5 and seen_sheets == set(bundled_sheets("train"))
    assert "eval_heldout" not in seen_sheets
    assert all(in_pool(t, "train") and not in_pool(t, "eval") for t in seen_texts)
    bad = InstanceConfig(randomize=RandomizeConfig(sheets=("train_list", "eval_heldout")))
    with pytest.raises(ValueError, match="held-out evaluation sheet"):
        for seed in range(50):
            prepare_instance(task, qa_env, split="train", seed=seed, config=bad)


def test_eval_instances_use_the_heldout_sheet_and_the_eval_pool(qa_env):
    task = qa_env.tasks("all")[3]
    cfg = InstanceConfig(eval_sheet="eval_heldout")
    inst = prepare_instance(task, qa_env, split="eval", seed=0, config=cfg)
    assert inst.metadata["tool_config"] == {"tools": sorted(CATALOG_NAMES), "sheet": "eval_heldout"}
    heldout = load_sheet("eval_heldout")
    assert all(t.spec.pricing == heldout.tools[t.spec.name] for t in qa_env.tools(inst))
    texts = {prepare_instance(task, qa_env, split="eval", seed=s, config=cfg)
             .preference_instruction for s in range(40)}
    assert len(texts) > 3 and all(in_pool(t, "eval") and not in_pool(t, "train") for t in texts)


def test_an_existing_preference_is_kept(qa_env):
    task = dataclasses.replace(qa_env.tasks("all")[0], preference=(0, 0, 0, 1, 0, 0),
                               preference_instruction="mine")
    inst = prepare_instance(task, qa_env, split="train", seed=1)
    assert inst.preference == (0, 0, 0, 1, 0, 0) and inst.preference_instruction == "mine"


def test_tau2_env_offers_a_catalog_that_the_verdict_ignores(shared_data):
    from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord
    from orchestrax.envs.tau2 import load_domain
    from orchestrax.envs.tau2.env import Tau2Env
    from orchestrax.envs.tau2.verify import gold_actions

    dom = load_domain(shared_data / "tau2" / "retail")
    env = Tau2Env(dom, tools={"ask_llm": SleepTool("ask_llm")})
    raw = next(t for t in dom.tasks if gold_actions(t)
               and not t["evaluation_criteria"].get("communicate_info"))
    task = next(t for t in env.tasks("all") if t.metadata["tau2_id"] == raw["id"])
    names = [t.spec.name for t in env.tools(task)]
    assert names[-1] == "ask_llm" and len(names) == len(dom.tools()) + 1
    calls = [ToolCallRecord(name="ask_llm", arguments={"q": "?"}, observation="x")]
    calls += [ToolCallRecord(name=c["name"], arguments=c["arguments"], observation="")
              for c in gold_actions(raw)]
    traj = Trajectory(task_id=task.task_id, turns=[TurnRecord(text="", tool_calls=calls)])
    assert asyncio.run(env.verify(task, traj)) == 1.0
    clash = dom.tools()[0].spec.name
    with pytest.raises(ValueError, match=clash):
        Tau2Env(dom, tools={clash: SleepTool(clash)})


@pytest.mark.slow
def test_trainer_gives_every_instance_its_tools_sheet_and_p(tmp_path, monkeypatch):
    """Two GRPO steps on a QA env whose tools come from TrainConfig.tools (two LLM tools on an
    unreachable endpoint: the tiny model never calls them well anyway). Every rolled-out task
    was prepared from Pairs_train with a training sheet and a seed that changes per step; eval
    tasks from Pairs_eval; the reward ran with each instance's P (no outcome-only fallback)."""
    from orchestrax import models
    from orchestrax.data import instances
    from orchestrax.rl import GRPOConfig, OptimizerConfig
    from orchestrax.tools.catalog import CatalogConfig
    from orchestrax.tools.chat_client import ChatEndpoint
    from orchestrax.tools.llm_tool import LLMToolConfig
    from orchestrax.train import loop
    from orchestrax.train.train_config import RolloutConfig, TrainConfig

    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(f'{{"id": {i}, "question": "q{i}?", "answer": "a{i}"}}\n'
                          for i in range(16)))
    dead = ChatEndpoint(base_url="http://127.0.0.1:9/v1", model="gpt-5-mini", max_retries=0)
    llms = tuple(LLMToolConfig(name=n, role="generalist", chat=dead) for n in ("ask_a", "ask_b"))
    seen = []

    def spy(task, env, *, split, seed, config):
        out = instances.prepare_instance(task, env, split=split, seed=seed, config=config)
        seen.append((split, seed, out))
        return out

    monkeypatch.setattr(loop, "prepare_instance", spy)
    cfg = TrainConfig(
        name="qa-instances", out_dir=str(tmp_path / "run"),
        model=models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64,
                                 num_heads=2, num_kv_heads=1, head_dim=16),
        grpo=GRPOConfig(num_minibatches=1), optim=OptimizerConfig(lr=1e-3, total_steps=10),
        rollout=RolloutConfig(group_size=2, tasks_per_step=4, max_new_tokens=8, max_turns=1,
                              context_tokens=1024, enable_thinking=False),
        env=QAConfig(path=str(qa), test_fraction=0.25),
        tools=CatalogConfig(python=None, web=None, llms=llms),
        instances=InstanceConfig(randomize=RandomizeConfig(min_tools=1)),
        steps=2, checkpoint_every=0, eval_every=0)
    history = loop.train(cfg)
    assert [h["step"] for h in history if h["phase"] == "rl"] == [1, 2]
    train_seen = [(seed, t) for split, seed, t in seen if split == "train"]
    eval_seen = [t for split, _, t in seen if split == "eval"]
    assert len(train_seen) == 2 * 4 and eval_seen
    for seed, t in train_seen:
        sheet = t.metadata["tool_config"]["sheet"]
        assert load_sheet(sheet).split == "train"
        assert in_pool(t.preference_instruction.replace("ask_a", "python").replace(
            "ask_b", "python"), "train")
        assert len(t.preference) == len(t.metadata["tool_config"]["tools"]) + 3
    assert len({seed for seed, _ in train_seen}) == 8  # per task and per step
    for t in eval_seen:
        assert "tool_config" not in t.metadata
        assert in_pool(t.preference_instruction.replace("ask_a", "python").replace(
            "ask_b", "python"), "eval")
