"""tau2 user simulators over real loopback HTTP, and a whole tau2 episode through the agent loop."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import pytest

from orchestrax.agent import chat
from orchestrax.agent.episode import EpisodeConfig, run_episode
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.envs import tau2
from orchestrax.tools.chat_client import ChatEndpoint, ChatError, chat as chat_call
from orchestrax.envs.tau2.env import Tau2Env
from orchestrax.envs.tau2.user import GREETING, LLMUser, ScriptedUser, flip_roles, render_scenario
from orchestrax.envs.tau2.verify import gold_actions
from loopback import ScriptedChatServer


@pytest.fixture(scope="module")
def retail(shared_data):
    return tau2.load_domain(shared_data / "tau2" / "retail")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_llm_user_prompt_roles_and_stop(retail):
    env = Tau2Env(retail)
    task = env.tasks("test")[0]
    raw = env.raw(task)
    replies = iter(["Hi, I need help with an order.", "Thanks, that is all. ###STOP###"])

    async def main():
        async with ScriptedChatServer(lambda body: next(replies)) as srv:
            user = LLMUser(raw, ChatEndpoint(base_url=srv.base_url, model="user-sim"))
            opened = await env.open(task, user)
            assert [m["role"] for m in opened.messages] == ["system", "assistant", "user"]
            assert opened.messages[-1]["content"] == "Hi, I need help with an order."
            history = [*opened.messages,
                       {"role": "assistant", "content": '<think>look up</think><tool_call>\n{"name": '
                        '"get_order_details", "arguments": {}}\n</tool_call>'},
                       {"role": "tool", "content": '{"status": "pending"}'},
                       {"role": "assistant", "content": "Your order is pending."}]
            reply = await user(history)
            return srv.requests, reply, user.usage

    requests, reply, usage = asyncio.run(main())
    assert reply.stop and "###STOP###" in reply.text
    first, second = requests
    assert first["model"] == "user-sim" and first["messages"][0]["role"] == "system"
    system = first["messages"][0]["content"]
    assert "###STOP###" in system and render_scenario(raw) in system
    instructions = raw["user_scenario"]["instructions"]
    assert instructions["reason_for_call"].strip()[:40] in system
    # the agent's words reach the simulator as "user" turns, its own earlier words as "assistant"
    assert first["messages"][1:] == [{"role": "user", "content": GREETING}]
    assert second["messages"][1:] == [
        {"role": "user", "content": GREETING},
        {"role": "assistant", "content": "Hi, I need help with an order."},
        {"role": "user", "content": "Your order is pending."}]
    assert usage[0] > 0 and usage[1] > 0


def test_chat_client_retries_transient_then_succeeds_and_fails_fast_on_4xx():
    statuses = iter([(503, "overloaded"), (429, "slow down"), "fine"])

    async def main():
        async with ScriptedChatServer(lambda body: next(statuses)) as srv:
            ep = ChatEndpoint(base_url=srv.base_url, model="m", backoff_s=0.01)
            ok = await chat_call(ep, [{"role": "user", "content": "hi"}], seed=3)
            n_ok = len(srv.requests)
        async with ScriptedChatServer(lambda body: (400, "bad request: no model")) as srv:
            ep = ChatEndpoint(base_url=srv.base_url.removesuffix("/v1"), model="m", backoff_s=0.01)
            with pytest.raises(ChatError, match="400: bad request"):
                await chat_call(ep, [{"role": "user", "content": "hi"}])
            return ok, n_ok, len(srv.requests), srv.requests

    ok, n_ok, n_bad, _ = asyncio.run(main())
    assert ok.text == "fine" and n_ok == 3
    assert n_bad == 1


def test_dead_user_endpoint_ends_episode_instead_of_crashing(retail):
    ep = ChatEndpoint(base_url=f"http://127.0.0.1:{_free_port()}/v1", model="m",
                      max_retries=1, backoff_s=0.01, timeout_s=2)
    user = LLMUser(retail.tasks[0], ep)
    reply = asyncio.run(user([{"role": "assistant", "content": GREETING}]))
    assert reply.stop and "user simulator unavailable" in reply.text


def test_endpoint_config_errors_name_the_field(monkeypatch):
    with pytest.raises(ValueError, match="base_url"):
        ChatEndpoint(base_url="localhost:8000", model="m")
    with pytest.raises(ValueError, match="temperature"):
        ChatEndpoint(base_url="http://x", model="m", temperature=-1)
    monkeypatch.delenv("ORCHESTRAX_TEST_KEY", raising=False)
    ep = ChatEndpoint(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="ORCHESTRAX_TEST_KEY")
    with pytest.raises(ChatError, match="ORCHESTRAX_TEST_KEY"):
        asyncio.run(chat_call(ep, [{"role": "user", "content": "hi"}]))


def test_scripted_user_and_role_flip():
    user = ScriptedUser(["first", "second"])
    msgs = [{"role": "assistant", "content": "hello"}]
    out = [asyncio.run(user(msgs)) for _ in range(3)]
    assert [(r.text, r.stop) for r in out] == [("first", False), ("second", False), ("###STOP###", True)]
    assert user.heard == ["hello"] * 3
    assert flip_roles([{"role": "system", "content": "s"}, {"role": "tool", "content": "t"},
                       {"role": "assistant", "content": "<tool_call>{}</tool_call>"}]) == []
    assert render_scenario({"user_scenario": {"persona": "Terse.", "instructions": "Cancel it."}}) \
        == "Persona:\nTerse.\nInstructions:\nCancel it."
    with pytest.raises(ValueError, match="instructions"):
        render_scenario({"id": "7", "user_scenario": {"instructions": 3}})


def _episode(env, task, calls, final_text):
    """Run the real agent loop: one domain call per turn, then `final_text` to the user."""
    tok = tiny_qwen3_tokenizer()
    turns = [chat.render_tool_call(c["name"], c["arguments"]) for c in calls] + [final_text]
    sampler = ScriptedSampler(tok, turns)
    user = ScriptedUser(["I want to sort out my orders."])

    async def main():
        opened = await env.open(task, user)
        cfg = EpisodeConfig(context_tokens=400_000, max_new_tokens=2_000, max_turns=len(turns) + 2,
                            enable_thinking=False)
        traj = await run_episode(sampler, tok, opened, env.tools(opened), config=cfg, user=user)
        return traj, await env.verify(opened, traj)

    return asyncio.run(main())


def test_full_episode_through_agent_loop_is_verified(retail):
    env = Tau2Env(retail)
    raw = next(t for t in retail.tasks if t["id"] == "1")  # a task with writes and no rejections
    task = next(t for t in env.tasks("all") if t.metadata["tau2_id"] == "1")
    actions = gold_actions(raw)
    infos = raw["evaluation_criteria"]["communicate_info"]
    final = "All done. " + " ".join(infos)
    traj, score = _episode(env, task, actions, final)
    assert traj.end_reason == "user_stop", (traj.end_reason, traj.error)
    assert [c.name for c in traj.tool_calls] == [a["name"] for a in actions]
    assert all(c.ok for c in traj.tool_calls)
    assert score == 1.0
    # the same episode with the last write left out fails
    last_write = max(k for k, a in enumerate(actions) if retail.functions[a["name"]].kind == "write")
    traj2, score2 = _episode(env, task, actions[:last_write] + actions[last_write + 1:], final)
    assert traj2.end_reason == "user_stop" and score2 == 0.0


def test_env_construction_splits_and_user_hook(shared_data):
    env = tau2.Tau2Env(domain=str(shared_data / "tau2" / "airline"))  # the trainer's make_env form
    assert [t.task_id for t in env.tasks("eval")] == [t.task_id for t in env.tasks("test")]
    assert len(env.tasks("all")) == 50
    with pytest.raises(ValueError, match="split='dev'; allowed: .*'all', 'eval'"):
        env.tasks("dev")
    task = env.tasks("train")[0]
    # no endpoint: no user simulator; the scenario is the task's first user message
    assert env.user_for(task) is None
    system, request = task.messages
    assert system["role"] == "system" and "<policy>" in system["content"]
    assert request == {"role": "user", "content": render_scenario(env.raw(task))}
    assert "Reason for call:" in request["content"]
    with_user = tau2.Tau2Env(env.domain, user_endpoint=ChatEndpoint(base_url="http://127.0.0.1:9", model="u"))
    assert [m["role"] for m in with_user.tasks("train")[0].messages] == ["system"]  # user speaks at open
    assert isinstance(with_user.user_for(task), LLMUser)
    with pytest.raises(KeyError, match="not a task of tau2 domain airline"):
        env.raw(dataclasses.replace(task, metadata={"tau2_id": "nope"}))


def test_without_a_user_the_episode_opens_with_the_scenario_and_ends_at_the_answer(retail):
    """The trainer's episode function on a userless tau2 task: no user simulator reaches the
    episode, the policy's prompt holds the scenario, and the episode ends at its answer."""
    from orchestrax.agent.codec import Codec
    from orchestrax.agent.executor import ToolExecutor
    from orchestrax.envs.environment import play_task

    env = Tau2Env(retail)
    task = next(t for t in env.tasks("all") if t.metadata["tau2_id"] == "1")
    reason = env.raw(task)["user_scenario"]["instructions"]["reason_for_call"].strip()
    codec = Codec(tiny_qwen3_tokenizer())
    users = []

    async def run(start, tools, user):
        users.append(user)
        cfg = EpisodeConfig(context_tokens=400_000, max_new_tokens=64, max_turns=3,
                            enable_thinking=False)
        return await run_episode(ScriptedSampler(codec, ["<answer>Done.</answer>"]), codec, start,
                                 tools, config=cfg, executor=ToolExecutor(), user=user)

    traj, outcome = asyncio.run(play_task(env, task, run))
    assert users == [None]
    assert traj.end_reason == "answer" and traj.final_answer == "Done." and outcome == 0.0
    prompt = codec.decode(traj.token_ids[:traj.prompt_len])
    assert reason[:60] in prompt and GREETING not in prompt
