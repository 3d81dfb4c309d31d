"""`orchestrax eval` with scripted policies: every reported number is worked out by hand here.

Routing tools (orchestrax/envs/routing.py): lookup_cheap $0.001 / 4 s, lookup_fast $0.02 / 0.2 s,
lookup_premium $0.05 / 10 s; eval tasks alternate P = cost, latency, cost, latency.
"""

import asyncio
import dataclasses
import json

import pytest

from orchestrax.agent.episode import EpisodeConfig
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.envs.routing import RoutingConfig
from orchestrax.eval.core import at_turn_limit, evaluate
from orchestrax.eval.scores import preference_adherence, summarize
from orchestrax.eval.episode_records import EpisodeRecord
from orchestrax.eval.policy import TokenPolicy
from orchestrax.eval.runners import EvalConfig
from orchestrax.eval.suite import EvalRun, run_eval, write_outputs
from orchestrax.eval.tasksets import TaskSetOptions, load_task_set
from orchestrax.rollout.sampler import SamplingParams

CHEAP = '<tool_call>\n{"name": "lookup_cheap", "arguments": {}}\n</tool_call>'
FAST = '<tool_call>\n{"name": "lookup_fast", "arguments": {}}\n</tool_call>'
ANSWER = "<answer>done</answer>"
OPTS = TaskSetOptions(routing=RoutingConfig(num_eval=4))


def routing_policy(tok, rule):
    """`rule(prompt_text, calls_so_far) -> turn text`: a scripted orchestrator."""
    def script(_, input_ids):
        text = tok.decode(list(input_ids))
        return rule(text, text.count("<tool_response>"))
    return TokenPolicy(ScriptedSampler(tok, script=script), tok, name="scripted")


def follows_preference(text, done):
    if done:
        return ANSWER
    return CHEAP if "low cost" in text else FAST


def n_tokens(tok, text):
    return len(tok.encode(text, add_special_tokens=False)) + 1  # + <|im_end|>


def cfg(max_turns=50, seconds_per_token=0.0):
    return EvalConfig(episode=EpisodeConfig(max_turns=max_turns, enable_thinking=False),
                      seconds_per_token=seconds_per_token)


def test_accuracy_cents_minutes_and_calls_by_hand():
    tok = tiny_qwen3_tokenizer()
    ts = load_task_set("routing", OPTS)
    assert [t.metadata["preference_kind"] for t in ts.tasks] == ["cost", "latency"] * 2
    policy = routing_policy(tok, follows_preference)
    recs = asyncio.run(evaluate(ts, policy, cfg(seconds_per_token=0.5), progress=False))
    s = summarize(recs)
    assert s["tasks"] == 4 and s["accuracy"] == 1.0
    # two tasks at $0.001 and two at $0.02: (2 * 0.1 + 2 * 2.0) / 4 cents
    assert s["cents_per_task"] == pytest.approx(1.05)
    assert s["calls_per_task"] == {"lookup_cheap": 0.5, "lookup_fast": 0.5}
    assert s["turns"] == 2.0
    # tool time (4 s or 0.2 s) plus 0.5 s per generated token of the two turns
    cheap_tokens = n_tokens(tok, CHEAP) + n_tokens(tok, ANSWER)
    fast_tokens = n_tokens(tok, FAST) + n_tokens(tok, ANSWER)
    assert s["completion_tokens"] == (cheap_tokens + fast_tokens) / 2
    seconds = (2 * (4.0 + 0.5 * cheap_tokens) + 2 * (0.2 + 0.5 * fast_tokens)) / 4
    assert s["minutes_per_task"] == pytest.approx(seconds / 60)
    assert all(r.task_set == "routing" and r.end_reason == "answer" for r in recs)


def test_wrong_answers_count_zero_and_measured_latency_is_positive():
    tok = tiny_qwen3_tokenizer()
    ts = load_task_set("routing", OPTS)
    # never calls a tool: routing's verifier needs a call that ran the job
    recs = asyncio.run(evaluate(ts, routing_policy(tok, lambda text, done: ANSWER),
                                EvalConfig(episode=EpisodeConfig(enable_thinking=False)),
                                progress=False))
    s = summarize(recs)
    assert s["accuracy"] == 0.0 and s["cents_per_task"] == 0.0 and s["calls_per_task"] == {}
    assert all(r.policy_latency_s > 0 and r.tool_latency_s == 0 for r in recs)


def three_calls_then_answer(text, done):
    return ANSWER if done >= 3 else CHEAP


def test_turn_sweep_by_hand_and_equal_to_real_runs():
    """Three cheap calls, then the answer (4 turns). Cut at 2 turns: 2 calls, no answer."""
    tok = tiny_qwen3_tokenizer()
    ts = load_task_set("routing", OPTS)
    long = asyncio.run(evaluate(ts, routing_policy(tok, three_calls_then_answer), cfg(50),
                                progress=False))
    for limit, acc, calls in ((2, 0.0, 2), (3, 0.0, 3), (4, 1.0, 3), (10, 1.0, 3)):
        cut = asyncio.run(at_turn_limit(long, ts, limit, cfg(50)))
        s = summarize(cut)
        assert s["accuracy"] == acc and s["turns"] == min(limit, 4)
        assert s["cents_per_task"] == pytest.approx(calls * 0.1)
        assert s["calls_per_task"] == {"lookup_cheap": calls}
        real = asyncio.run(evaluate(ts, routing_policy(tok, three_calls_then_answer),
                                    cfg(limit), progress=False))
        assert summarize(real) == s  # the cut is what a run with that limit does


def test_preference_adherence_pairs_samples_in_order():
    """Two samples of one cost-weighted task (P over cheap, fast, outcome, cost, latency =
    (0, 0, 1, 1, 0)), all solved. Policy: cheap then fast; baseline: cheap then fast too. Sample k
    pairs with the baseline's sample k, so both pairs are equal and score 0 (pairing both with
    the baseline's last sample, fast, would score the cheap one 1 for its lower cost: 0.5). A
    baseline of one sample (fast) pairs with both: 1 and 0, mean 0.5."""
    def rec(tool: str, usd: float) -> EpisodeRecord:
        return EpisodeRecord(task_id="t0", task_set="routing", outcome=1.0, tool_cost_usd=usd,
                             calls={tool: 1}, tool_names=("cheap", "fast"),
                             preference=(0.0, 0.0, 1.0, 1.0, 0.0))
    policy = [rec("cheap", 0.001), rec("fast", 0.02)]
    assert preference_adherence(policy, [rec("cheap", 0.001), rec("fast", 0.02)]) == {
        "adherence": 0.0, "tasks": 1, "pairs": 2, "missing": 0}
    assert preference_adherence(policy, [rec("fast", 0.02)])["adherence"] == pytest.approx(0.5)
    s = summarize(policy)
    assert (s["tasks"], s["episodes"]) == (1, 2)


def test_preference_adherence_by_hand():
    """Policy: cheap everywhere; baseline: fast everywhere. On a cost task the pair normalises to
    cheap-count (1, 0), fast-count (0, 1), -cost (1, 0), -latency (0, 1); outcome ties (0).
    P_cost = (0,0,0, 1,1,0) scores the policy 1; P_latency = (0,0,0, 1,0,1) scores it 0."""
    tok = tiny_qwen3_tokenizer()
    ts = load_task_set("routing", OPTS)
    cheap = asyncio.run(evaluate(ts, routing_policy(tok, lambda t, d: ANSWER if d else CHEAP),
                                 cfg(), progress=False))
    fast = asyncio.run(evaluate(ts, routing_policy(tok, lambda t, d: ANSWER if d else FAST),
                                cfg(), progress=False))
    assert preference_adherence(cheap, fast) == {"adherence": 0.5, "tasks": 4, "pairs": 4,
                                                 "missing": 0}
    assert preference_adherence(fast, fast)["adherence"] == 0.0   # nothing differs
    assert preference_adherence(fast, cheap[:2]) == {"adherence": 0.5, "tasks": 2, "pairs": 2,
                                                     "missing": 2}
    wrong = asyncio.run(evaluate(ts, routing_policy(tok, lambda t, d: ANSWER), cfg(),
                                 progress=False))
    assert preference_adherence(wrong, fast)["adherence"] == 0.0  # unsolved tasks score 0


def test_run_eval_outputs_and_baseline_file(tmp_path):
    tok = tiny_qwen3_tokenizer()
    run = EvalRun(task_sets=("routing",), cfg=cfg(4), turn_limits=(2, 4), options=OPTS,
                  progress=False)
    base = asyncio.run(run_eval(routing_policy(tok, lambda t, d: ANSWER if d else FAST), run))
    write_outputs(base, tmp_path / "base")
    run = EvalRun(task_sets=("routing",), cfg=cfg(4), turn_limits=(2, 4), options=OPTS,
                  progress=False, baseline=str(tmp_path / "base" / "eval.json"))
    payload = asyncio.run(run_eval(routing_policy(tok, lambda t, d: ANSWER if d else CHEAP), run))
    files = write_outputs(payload, tmp_path / "cheap")
    assert {f.name for f in files} == {"eval.json", "eval.csv", "accuracy_vs_cost.png",
                                       "calls_per_tool.png"}
    assert all(f.stat().st_size > 0 for f in files)
    payload = json.loads((tmp_path / "cheap" / "eval.json").read_text())
    rows = {r["turn_limit"]: r for r in payload["rows"]}
    assert sorted(rows) == [2, 4]
    assert rows[4]["accuracy"] == 1.0 and rows[4]["adherence"] == 0.5
    assert rows[2]["cents_per_task"] == pytest.approx(0.1)
    csv_lines = (tmp_path / "cheap" / "eval.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and "calls_lookup_cheap" in csv_lines[0]


def test_sweep_at_temperature_runs_every_limit():
    """Sampling (T > 0) cannot be cut after the fact: each limit is its own run. The scripted
    policy ignores T, so the runs must agree with the hand-worked cut numbers."""
    tok = tiny_qwen3_tokenizer()
    hot = EvalConfig(episode=EpisodeConfig(max_turns=4, enable_thinking=False,
                                           sampling=SamplingParams(temperature=0.7)),
                     seconds_per_token=0.0)
    policy = routing_policy(tok, three_calls_then_answer)
    run = EvalRun(task_sets=("routing",), cfg=hot, turn_limits=(2,), options=OPTS, progress=False)
    rows = {r["turn_limit"]: r for r in asyncio.run(run_eval(policy, run))["rows"]}
    assert rows[2]["accuracy"] == 0.0 and rows[4]["accuracy"] == 1.0
    assert rows[2]["cents_per_task"] == pytest.approx(0.2)
    assert rows[4]["cents_per_task"] == pytest.approx(0.3)
    # 4 tasks x (3 turns at limit 4 + 2 at limit 2) generate calls
    assert policy.sampler.calls == 4 * (4 + 2)


def test_tau2_task_set_gets_eval_preferences(shared_data):
    ts = load_task_set("tau2:retail", TaskSetOptions(limit=3))
    assert ts.name == "tau2:retail" and len(ts.tasks) == 3
    for task in ts.tasks:
        tools = ts.env.tools(task)
        assert len(task.preference) == len(tools) + 3
        assert task.preference[:len(tools)] == (0.0,) * len(tools)  # no wish names a DB function
        assert task.preference_instruction
    again = load_task_set("tau2:retail", TaskSetOptions(limit=3))
    assert [t.preference_instruction for t in again.tasks] == [
        t.preference_instruction for t in ts.tasks]


def test_task_set_errors_name_what_is_allowed(tmp_path):
    with pytest.raises(ValueError, match="allowed: routing, tau2:retail"):
        load_task_set("gsm8k")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_task_set(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="turn_limits"):
        EvalRun(task_sets=("routing",), turn_limits=(0,))


def test_tau2_episode_through_eval_by_hand(shared_data):
    """A scripted agent replays a retail task's gold actions, one call per turn, then talks; a
    scripted user opens and then stops. tau2's own scoring passes it: accuracy 1, one turn per
    action plus the closing message, every call counted under its tool, all free."""
    import json as _json

    from orchestrax.envs.tau2.user import ScriptedUser
    from orchestrax.envs.tau2.verify import gold_actions

    tok = tiny_qwen3_tokenizer()
    ts = load_task_set("tau2:retail", TaskSetOptions())
    raw_by_id = {t["id"]: t for t in ts.env.domain.tasks}
    task = next(t for t in ts.tasks if len(gold_actions(raw_by_id[t.metadata["tau2_id"]])) >= 2
                and not raw_by_id[t.metadata["tau2_id"]]["evaluation_criteria"].get(
                    "communicate_info"))
    gold = gold_actions(raw_by_id[task.metadata["tau2_id"]])
    ts = dataclasses.replace(ts, tasks=[task])
    ts.env.user_for = lambda _: ScriptedUser(["Hi, please help with my order."])
    turns = ['<tool_call>\n%s\n</tool_call>' % _json.dumps(
        {"name": a["name"], "arguments": a["arguments"]}) for a in gold] + ["All done."]
    policy = TokenPolicy(ScriptedSampler(tok, turns=turns), tok, name="gold")
    (rec,) = asyncio.run(evaluate(ts, policy, cfg(), progress=False))
    assert rec.outcome == 1.0 and rec.end_reason == "user_stop"
    assert rec.turns == len(gold) + 1 and rec.cost_usd == 0.0
    want = {}
    for a in gold:
        want[a["name"]] = want.get(a["name"], 0) + 1
    assert rec.calls == want


def test_subagent_runner_refuses_a_chat_policy_by_its_type():
    from orchestrax.eval.policy import ChatPolicy
    from orchestrax.eval.subagent_runner import run_subagent
    from orchestrax.tools.chat_client import ChatEndpoint

    ts = load_task_set("routing", OPTS)
    chat = ChatPolicy(ChatEndpoint(base_url="http://127.0.0.1:9/v1", model="m"))
    task = ts.tasks[0]
    with pytest.raises(ValueError, match="policy 'm' is a ChatPolicy, not token-in/token-out"):
        asyncio.run(run_subagent(task, ts.env, chat, ts.env.tools(task), cfg()))


def test_preference_adherence_ignores_differences_below_the_floors():
    """Hand-worked pairs on one tool, P = (0, outcome 0, compute 0, latency 1): a policy 1 ms
    faster than the baseline (min-max over the pair used to make it 1.0, 1 ms slower 0.0) ties
    it, 0; 2 s faster scores 1. Cost the same way with P_compute: 1e-5 $ cheaper ties, 1 cent
    cheaper scores 1."""
    def rec(task_id, latency, cost=0.01):
        return EpisodeRecord(task_id=task_id, task_set="t", outcome=1.0, tool_cost_usd=cost,
                             tool_latency_s=latency, calls={"x": 1}, tool_names=("x",),
                             preference=(0.0, 0.0, 0.0, 1.0) if task_id.startswith("lat")
                             else (0.0, 0.0, 1.0, 0.0))
    base = [rec("lat-a", 5.0), rec("lat-b", 5.0), rec("cost-a", 5.0), rec("cost-b", 5.0)]
    near = [rec("lat-a", 4.999), rec("lat-b", 5.001), rec("cost-a", 5.0, 0.01 - 1e-5),
            rec("cost-b", 5.0, 0.01 + 1e-5)]
    assert preference_adherence(near, base)["adherence"] == 0.0
    far = [rec("lat-a", 3.0), rec("lat-b", 7.0), rec("cost-a", 5.0, 0.0), rec("cost-b", 5.0)]
    assert preference_adherence(far, base)["adherence"] == pytest.approx((1 + 0 + 1 + 0) / 4)
