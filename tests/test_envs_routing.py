"""Synthetic routing environment: determinism, simulated cost/latency, the preference deciding
the right tool under the real ToolOrchestra reward, and demos through the real agent loop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrax import rl
from orchestrax.agent import chat
from orchestrax.agent.episode import EpisodeConfig, prompt_messages, run_episode
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord
from orchestrax.envs.routing import LookupTool, RoutingConfig, RoutingEnv
from orchestrax.tools.tool import ToolError


def _fingerprint(tasks):
    return [(t.task_id, t.messages, t.preference, t.preference_instruction, t.answer, t.metadata)
            for t in tasks]


def test_eval_split_mixes_preferences_whatever_the_training_one():
    env = RoutingEnv(RoutingConfig(preferences=("cost",)))
    assert {t.metadata["preference_kind"] for t in env.tasks("train")} == {"cost"}
    assert {t.metadata["preference_kind"] for t in env.tasks("eval")} == {"cost", "latency"}


def test_deterministic_from_seed():
    a, b, c = RoutingEnv(RoutingConfig(seed=3)), RoutingEnv(RoutingConfig(seed=3)), RoutingEnv(RoutingConfig(seed=4))
    for split in ("train", "eval"):
        assert _fingerprint(a.tasks(split)) == _fingerprint(b.tasks(split))
        assert _fingerprint(a.tasks(split)) != _fingerprint(c.tasks(split))
    assert _fingerprint(a.tasks("test")) == _fingerprint(a.tasks("eval"))
    assert len(a.tasks("train")) == 256 and len(a.tasks("eval")) == 32
    assert {t.task_id for t in a.tasks("train")}.isdisjoint(t.task_id for t in a.tasks("eval"))
    with pytest.raises(ValueError, match="allowed: train, eval, test"):
        a.tasks("dev")


def test_preference_vectors_and_preferred_tools():
    env = RoutingEnv(RoutingConfig(preferences=("cost", "latency", "lookup_premium")))
    names = [t.spec.name for t in env.tools(env.tasks()[0])]
    assert names == ["lookup_cheap", "lookup_fast", "lookup_premium"]
    seen = {}
    for task in env.tasks("train"):
        p = task.preference
        assert len(p) == len(names) + 3 and all(0.0 <= x <= 1.0 for x in p)
        assert task.messages[-1]["content"].startswith(task.metadata["job"])
        seen[task.metadata["preference_kind"]] = (p, task.metadata["preferred_tool"],
                                                  task.messages[-1]["content"].split(". ", 1)[1])
    assert seen == {
        "cost": ((0, 0, 0, 1, 1, 0), "lookup_cheap", "Preference: low cost."),
        "latency": ((0, 0, 0, 1, 0, 1), "lookup_fast", "Preference: low latency."),
        "lookup_premium": ((0, 0, 1, 1, 0, 0), "lookup_premium", "Preference: use lookup_premium."),
    }


def test_tools_report_simulated_cost_and_latency_without_sleeping():
    env = RoutingEnv()
    task = env.tasks("train")[5]
    tools = env.tools(task)

    async def call_all():
        return await asyncio.gather(*(t({}) for t in tools))

    results = asyncio.run(call_all())
    assert [r.observation for r in results] == [f"Done: {task.metadata['job']}"] * 3
    assert [(r.cost, r.latency) for r in results] == [(0.001, 4.0), (0.02, 0.2), (0.05, 10.0)]
    assert [t.spec.pricing.usd_per_call for t in tools] == [0.001, 0.02, 0.05]
    with pytest.raises(ToolError, match=r"takes no arguments; got \['key'\]"):
        asyncio.run(tools[0]({"key": "k1"}))


def _traj(task, tool, answer):
    call = ToolCallRecord(name=tool.spec.name, arguments={},
                          observation=f"Done: {task.metadata['job']}",
                          cost=tool.spec.pricing.usd_per_call,
                          latency=tool.spec.latency_s)
    return Trajectory(task_id=task.task_id, turns=[TurnRecord(text="", tool_calls=[call]),
                                                   TurnRecord(text=answer)], final_answer=answer)


def test_preference_picks_the_tool_under_the_real_reward():
    """For each preference kind, the group member that used the preferred tool gets the highest
    ToolOrchestra reward; a wrong answer gets 0."""
    env = RoutingEnv(RoutingConfig(preferences=("cost", "latency", "lookup_premium")))
    by_kind = {}
    for task in env.tasks("train"):
        by_kind.setdefault(task.metadata["preference_kind"], task)
    for kind, task in by_kind.items():
        tools = env.tools(task)
        names = [t.spec.name for t in tools]
        group = [_traj(task, t, task.answer) for t in tools] + [_traj(task, tools[0], None)]
        outcome = np.array([[asyncio.run(env.verify(task, tr)) for tr in group]], np.float32)
        assert outcome.tolist() == [[1.0, 1.0, 1.0, 0.0]]
        counts, cost, latency = rl.features_from_trajectories(group, names)
        R = np.asarray(rl.toolorchestra_reward(counts[None], outcome, cost[None], latency[None],
                                               np.asarray([task.preference], np.float32)))[0]
        best = names[int(np.argmax(R[:3]))]
        assert best == task.metadata["preferred_tool"], (kind, R)
        assert R[3] == 0.0 and np.sum(R[:3] == R[:3].max()) == 1


def test_no_tool_wins_without_reading_the_preference():
    """Averaged over the two preference kinds, cheap and fast earn the same reward in a group
    that tries every tool: only conditioning on P pays."""
    env = RoutingEnv()
    mean_r = {}
    for kind in ("cost", "latency"):
        task = next(t for t in env.tasks() if t.metadata["preference_kind"] == kind)
        tools = env.tools(task)
        names = [t.spec.name for t in tools]
        group = [_traj(task, t, "done") for t in tools]
        counts, cost, latency = rl.features_from_trajectories(group, names)
        R = np.asarray(rl.toolorchestra_reward(counts[None], np.ones((1, 3), np.float32),
                                               cost[None], latency[None],
                                               np.asarray([task.preference], np.float32)))[0]
        for name, r in zip(names, R):
            mean_r[name] = mean_r.get(name, 0.0) + r / 2
    assert mean_r["lookup_cheap"] == pytest.approx(mean_r["lookup_fast"], abs=2e-3)
    assert mean_r["lookup_premium"] == 0.0


def test_verify_needs_a_call_that_ran_the_job_and_a_final_answer():
    env = RoutingEnv()
    task = env.tasks("eval")[0]
    tool = env.tools(task)[1]
    assert asyncio.run(env.verify(task, _traj(task, tool, "done"))) == 1.0
    assert asyncio.run(env.verify(task, _traj(task, tool, None))) == 0.0       # never answered
    no_call = Trajectory(task_id=task.task_id, final_answer="done")
    assert asyncio.run(env.verify(task, no_call)) == 0.0                      # no tool ran
    failed = _traj(task, tool, "done")
    failed.turns[0].tool_calls[0].ok = False
    assert asyncio.run(env.verify(task, failed)) == 0.0                       # the call failed


def test_prompt_is_short_for_the_tiny_model():
    """Task-specific text is tens of tokens; the rest is the fixed tools header and schemas."""
    tok = tiny_qwen3_tokenizer(512)
    env = RoutingEnv()
    task = env.tasks("train")[0]
    msgs = prompt_messages(task)
    text = chat.render_messages(msgs, tools=[t.spec for t in env.tools(task)], add_generation_prompt=True,
                                enable_thinking=False)
    n_task = len(tok.encode(msgs[-1]["content"] + msgs[0]["content"], add_special_tokens=False))
    assert n_task < 60
    assert len(tok.encode(text, add_special_tokens=False)) < 560


def test_demonstrations_play_through_the_agent_loop_and_stats():
    tok = tiny_qwen3_tokenizer(512)
    env = RoutingEnv(RoutingConfig(num_train=6))
    rng = np.random.default_rng(0)
    cfg = EpisodeConfig(max_turns=3, context_tokens=768, max_new_tokens=48, enable_thinking=False)

    async def play(task):
        sampler = ScriptedSampler(tok, turns=env.demonstration(task, rng))
        return await run_episode(sampler, tok, task, env.tools(task), config=cfg)

    tasks = env.tasks("train")
    trajs = [asyncio.run(play(t)) for t in tasks]
    for task, traj in zip(tasks, trajs):
        assert traj.end_reason == "answer", (traj.end_reason, traj.error)
        assert len(traj.token_ids) < 700  # a whole episode fits the demo's 768-token context
        assert asyncio.run(env.verify(task, traj)) == 1.0
        (call,) = traj.tool_calls
        assert call.ok and call.observation == f"Done: {task.metadata['job']}"
        tool = next(t for t in env.tools(task) if t.spec.name == call.name)
        assert (traj.cost, traj.latency) == (tool.spec.pricing.usd_per_call, tool.spec.latency_s)
    stats = env.stats(tasks, [[t] for t in trajs])
    expect = {}
    for task, traj in zip(tasks, trajs):
        expect.setdefault(task.metadata["preference_kind"], []).append(
            traj.tool_calls[0].name == task.metadata["preferred_tool"])
    used = [traj.tool_calls[0].name for traj in trajs]
    shares = {f"tool_share_{t.spec.name}": used.count(t.spec.name) / len(used)
              for t in env.tools(tasks[0])}
    assert stats == pytest.approx({
        "preferred_tool_rate_cost": np.mean(expect["cost"]),
        "preferred_tool_rate_latency": np.mean(expect["latency"]),
        # one call an episode: the share of calls equals the share of episodes
        "preferred_share_cost": np.mean(expect["cost"]),
        "preferred_share_latency": np.mean(expect["latency"]),
        "preferred_tool_rate": np.mean(expect["cost"] + expect["latency"]), "tool_calls_mean": 1.0,
        **shares})


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_train=0), "num_train=0"),
    (dict(preferences=("speed",)), r"preferences=\('speed',\); allowed: \['cost', 'latency'"),
    (dict(tools=(LookupTool(name="a", usd_per_call=1, latency_s=1),)), "at least|>= 2 tools"),
    (dict(tools=(LookupTool(name="a", usd_per_call=1, latency_s=1),
                 LookupTool(name="b", usd_per_call=1, latency_s=2))), "preference 'cost' needs one tool"),
])
def test_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RoutingConfig(**kwargs)


def test_pool_preferences_come_from_disjoint_train_and_eval_pairs():
    from orchestrax.data import preferences

    cfg = RoutingConfig(preferences=("pool",), eval_preferences=("pool",), num_train=60,
                        num_eval=40)
    env = RoutingEnv(cfg)
    names = [t.name for t in cfg.tools]

    def texts(split):
        return {p.instruction.format(tool=n) for p in preferences.pairs(split) for n in names}

    for split, pool in (("train", texts("train")), ("eval", texts("eval"))):
        tasks = env.tasks(split)
        said = {t.messages[1]["content"].split("Preference: ", 1)[1] for t in tasks}
        assert said <= pool and len(said) > 4
        for t in tasks:
            P, want = t.preference, t.metadata["preferred_tool"]
            assert len(P) == len(names) + 3 and P[len(names)] == 1.0
            named = [n for n, w in zip(names, P) if w > 0]
            if named:
                assert want == named[0]
            elif P[-2] > P[-1]:
                assert want == "lookup_cheap"
            elif P[-1] > P[-2]:
                assert want == "lookup_fast"
            else:
                assert want is None
    assert texts("train").isdisjoint(texts("eval"))
    again = RoutingEnv(cfg)
    assert [t.messages for t in again.tasks("eval")] == [t.messages for t in env.tasks("eval")]
    # stats skip tasks whose P favours no single tool
    neutral = [t for t in env.tasks("train") if t.metadata["preferred_tool"] is None][:1]
    one = [t for t in env.tasks("train") if t.metadata["preferred_tool"] == "lookup_cheap"][:1]
    call = Trajectory(task_id="x", turns=[TurnRecord(text="", tool_calls=[ToolCallRecord(
        name="lookup_cheap", arguments={}, observation="")])])
    assert neutral and one
    stats = env.stats(neutral + one, [[call], [call]])
    assert stats["preferred_tool_rate"] == 1.0 and stats["tool_share_lookup_cheap"] == 1.0


def test_pool_kinds_draw_that_profile_and_eval_pool_picks_the_phrasings():
    from orchestrax.data import preferences

    def phrasings(split, compute, latency):
        return {p.instruction for p in preferences.pairs(split) if not p.names_tool
                and (p.outcome, p.compute, p.latency) == (1.0, compute, latency)}

    kinds = ("pool:cost", "pool:latency")
    for eval_pool in ("train", "eval"):
        env = RoutingEnv(RoutingConfig(preferences=kinds, eval_preferences=kinds,
                                       eval_pool=eval_pool, num_train=48, num_eval=24))
        for split, pool in (("train", "train"), ("eval", eval_pool)):
            said = {}
            for t in env.tasks(split):
                kind = t.metadata["preference_kind"]
                assert t.preference == {"cost": (0, 0, 0, 1, 1, 0),
                                        "latency": (0, 0, 0, 1, 0, 1)}[kind]
                assert t.metadata["preferred_tool"] == {"cost": "lookup_cheap",
                                                        "latency": "lookup_fast"}[kind]
                said.setdefault(kind, set()).add(
                    t.messages[1]["content"].split("Preference: ", 1)[1])
            # every phrasing of the profile shows up (3 train / 2 eval phrasings), no other
            assert said == {"cost": phrasings(pool, 1.0, 0.0),
                            "latency": phrasings(pool, 0.0, 1.0)}, (split, eval_pool)
    with pytest.raises(ValueError, match="eval_pool='dev'; allowed: 'train', 'eval'"):
        RoutingConfig(eval_pool="dev")


def test_preferred_share_counts_calls_and_the_rate_counts_episodes():
    env = RoutingEnv(RoutingConfig(num_train=2))
    cost, latency = env.tasks("train")  # kinds alternate: cost, latency
    tools = {t.spec.name: t for t in env.tools(cost)}

    def played(task, *names):
        calls = [ToolCallRecord(name=n, arguments={}, observation=f"Done: {task.metadata['job']}",
                                cost=tools[n].spec.pricing.usd_per_call,
                                latency=tools[n].spec.latency_s) for n in names]
        return Trajectory(task_id=task.task_id, turns=[TurnRecord(text="", tool_calls=calls)])

    stats = env.stats([cost, latency], [
        [played(cost, "lookup_cheap", "lookup_fast"), played(cost, "lookup_cheap")],
        [played(latency, "lookup_premium"), played(latency)]])
    # cost: 2 of 3 calls cheap, 1 of 2 episodes only cheap; latency: 0 of 1 call, 0 of 2
    assert stats["preferred_share_cost"] == pytest.approx(2 / 3)
    assert stats["preferred_tool_rate_cost"] == 0.5
    assert stats["preferred_share_latency"] == 0.0 and stats["preferred_tool_rate_latency"] == 0.0
    assert stats["tool_share_lookup_cheap"] == 0.5 and stats["tool_calls_mean"] == 1.0


def test_every_training_step_holds_the_kinds_in_equal_shares():
    import grain
    env = RoutingEnv(RoutingConfig(preferences=("pool:cost", "pool:latency")))
    tasks = env.tasks("train")
    stream = iter(env.task_stream(len(tasks), 8, seed=3).to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    for _ in range(40):  # past one epoch of each kind's 128 tasks
        step = [tasks[i] for i in next(stream)]
        kinds = [t.metadata["preference_kind"] for t in step]
        assert kinds.count("cost") == kinds.count("latency") == 4
        assert len({t.task_id for t in step}) == 8


def test_kind_blocks_keep_each_job_s_cost_and_latency_task_together():
    """kind_blocks: train tasks (2i, 2i+1) share a job and are one cost and one latency task;
    every step holds whole blocks, in order, no block twice; the eval split is unchanged."""
    import grain
    from orchestrax.train.run_info import episode_seeds
    plain = RoutingEnv(RoutingConfig(preferences=("pool:cost", "pool:latency")))
    env = RoutingEnv(RoutingConfig(preferences=("pool:cost", "pool:latency"), kind_blocks=True))
    tasks = env.tasks("train")
    assert _fingerprint(env.tasks("eval")) == _fingerprint(plain.tasks("eval"))
    for a, b in zip(tasks[::2], tasks[1::2]):
        assert a.metadata["job"] == b.metadata["job"]
        assert (a.metadata["preference_kind"], b.metadata["preference_kind"]) == ("cost", "latency")
    assert len({t.metadata["job"] for t in tasks[::2]}) > 1
    stream = iter(env.task_stream(len(tasks), 8, seed=3).to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    for _ in range(40):  # past one epoch of the 128 blocks
        ids = next(stream)
        assert len(ids) == 8 and len(set(ids.tolist())) == 8
        assert (ids[::2] % 2 == 0).all() and (ids[1::2] == ids[::2] + 1).all()
    with pytest.raises(ValueError, match="multiple of 4"):
        env.task_stream(len(tasks), 6, seed=0, process_count=2)
    # the two tasks of a block sample with the same seeds; blocks and steps differ
    seeds = episode_seeds(0, 5, 0, 32, group=4, shared=2).reshape(4, 2, 4)
    assert (seeds[:, 0] == seeds[:, 1]).all() and len(np.unique(seeds[:, 0])) == 16
    plain_seeds = episode_seeds(0, 5, 0, 32)
    np.testing.assert_array_equal(episode_seeds(0, 5, 0, 32, group=4), plain_seeds)
    assert not np.array_equal(episode_seeds(0, 5, 0, 32), episode_seeds(0, 6, 0, 32))


def test_restated_preference_opens_the_call_turn_and_never_picks_the_tool():
    """restate_preference: the demonstration's call turn starts with the objective the task's
    P weighs, the call still parses and runs, and the tool stays uniform whatever the kind."""
    tok = tiny_qwen3_tokenizer(512)
    env = RoutingEnv(RoutingConfig(num_train=64, preferences=("pool:cost", "pool:latency"),
                                   restate_preference=True))
    cfg = EpisodeConfig(max_turns=3, context_tokens=768, max_new_tokens=48, enable_thinking=False)
    rng = np.random.default_rng(0)
    tasks = env.tasks("train")
    scripts = [env.demonstration(t, rng) for t in tasks]
    for task, turns in zip(tasks, scripts):
        assert turns[0].startswith(f"Priority: low {task.metadata['preference_kind']}.\n")
    traj = asyncio.run(run_episode(ScriptedSampler(tok, turns=scripts[0]), tok, tasks[0],
                                   env.tools(tasks[0]), config=cfg))
    assert traj.end_reason == "answer" and traj.format_errors == 0
    assert asyncio.run(env.verify(tasks[0], traj)) == 1.0
    for kind in ("cost", "latency"):
        picked = [s[0].split('"name": "')[1].split('"')[0]
                  for t, s in zip(tasks, scripts) if t.metadata["preference_kind"] == kind]
        assert set(picked) == {t.name for t in env.config.tools}  # all three, for either kind
    plain = RoutingEnv(RoutingConfig(num_train=4, preferences=("pool:cost", "pool:latency")))
    assert plain.demonstration(plain.tasks("train")[0], rng)[0].startswith("<tool_call>")
