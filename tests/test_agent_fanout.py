"""The one bounded fan-out (`agent.fanout.fan_out`) and the after-turn rules the token loop and
eval's text-space loop share (`agent.episode.TurnRules`)."""

from __future__ import annotations

import asyncio

import pytest
from agent_fixtures import SleepTool
from loopback import ScriptedChatServer

from orchestrax.agent.episode import EpisodeConfig, UserReply, run_episode
from orchestrax.agent.fanout import fan_out
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.data.records import Task
from orchestrax.eval.policy import ChatPolicy
from orchestrax.tools.chat_client import ChatEndpoint

TOK = tiny_qwen3_tokenizer()


def test_fan_out_keeps_the_bound_and_the_order_and_pulls_items_lazily():
    active, peak, pulled, seen_when_first_done = 0, 0, 0, []

    def items():
        nonlocal pulled
        for i in range(10):
            pulled += 1
            yield i

    async def fn(i):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        for _ in range(10 - i):  # later items finish sooner: results must still be in order
            await asyncio.sleep(0)
        active -= 1
        if not seen_when_first_done:
            seen_when_first_done.append(pulled)
        return i * i

    assert asyncio.run(fan_out(fn, items(), max_in_flight=3)) == [i * i for i in range(10)]
    assert peak == 3
    assert seen_when_first_done == [3]  # 3 in flight, nothing read ahead
    assert asyncio.run(fan_out(fn, [], max_in_flight=3)) == []


def test_fan_out_cancels_the_rest_on_the_first_error_and_raises_it_as_itself():
    cancelled = []

    async def fn(i):
        if i == 1:
            raise KeyError("bad item")
        try:
            await asyncio.Event().wait()  # never set: only cancellation ends it
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    with pytest.raises(KeyError, match="bad item"):
        asyncio.run(fan_out(fn, range(4), max_in_flight=4))
    assert sorted(cancelled) == [0, 2, 3]
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=f"fan_out max_in_flight={bad!r}; must be an int >= 1"):
            asyncio.run(fan_out(fn, range(4), max_in_flight=bad))


# One script of assistant turns, played by the token loop (a scripted sampler) and by eval's
# text-space loop (an OpenAI-compatible server replying the same texts): a malformed call, a
# good call, a message the simulated user answers, then an empty answer that makes the user stop
# (no answer, as the paper counts it).
SCRIPT = ['<tool_call>\n{"name": "calc", "arguments": 3}\n</tool_call>',
          '<tool_call>\n{"name": "calc", "arguments": {"q": "2+2"}}\n</tool_call>',
          "Is 4 right?",
          "<answer></answer>"]
TASK = Task(task_id="t", messages=({"role": "user", "content": "Add 2 and 2."},))


def _user():
    async def user(messages):
        return UserReply(text="", stop=True) if "<answer>" in messages[-1]["content"] \
            else UserReply(text="Yes, go on.")
    return user


async def _both(config: EpisodeConfig):
    token = await run_episode(ScriptedSampler(TOK, turns=SCRIPT), TOK, TASK, [SleepTool("calc")],
                              config=config, user=_user())
    turns = iter(SCRIPT)
    async with ScriptedChatServer(lambda body: next(turns)) as srv:
        policy = ChatPolicy(ChatEndpoint(base_url=srv.base_url, model="m"))
        try:
            text = (await policy.episode(TASK, [SleepTool("calc")], config=config,
                                         user=_user())).trajectory
        finally:
            await policy.aclose()
    return token, text


def _decisions(traj):
    return (traj.end_reason, traj.final_answer, traj.error,
            [(t.format_error is not None, [(c.name, c.ok, c.observation) for c in t.tool_calls])
             for t in traj.turns],
            [(m["role"], m["content"]) for m in traj.messages])


@pytest.mark.parametrize("max_turns,max_format_errors,end", [(8, 3, "user_stop"),
                                                             (2, 3, "max_turns"),
                                                             (8, 1, "format_errors")])
def test_token_and_text_loops_take_the_same_decisions_after_each_turn(max_turns,
                                                                      max_format_errors, end):
    config = EpisodeConfig(max_turns=max_turns, max_format_errors=max_format_errors,
                           enable_thinking=False, max_new_tokens=64, context_tokens=4096)
    token, text = asyncio.run(_both(config))
    assert token.end_reason == end
    assert _decisions(token) == _decisions(text)
    if end == "user_stop":  # an empty answer is no answer in both loops
        assert token.final_answer is None and len(token.turns) == 4
