"""One training episode through `train.episodes.play` and the `Environment` base: the optional
hooks have working defaults, and whatever fails inside one episode (an environment hook, the
verifier, the episode) comes back as a failed trajectory with outcome 0, never an exception."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from agent_fixtures import SleepTool

from orchestrax.agent import chat
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig, UserReply
from orchestrax.agent.executor import ToolExecutor
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.base import Environment
from orchestrax.train import episodes

TOK = tiny_qwen3_tokenizer()
CODEC = Codec(TOK)
TASK = Task(task_id="q1", messages=({"role": "user", "content": "Add 2 and 2."},), answer="4")


class Adder(Environment):
    """Correct when the final answer is "4"; `fail` names the hook that raises."""

    def __init__(self, fail: str | None = None):
        self.fail = fail

    def _maybe_fail(self, hook: str):
        if self.fail == hook:
            raise RuntimeError(f"{hook} broke")

    def tasks(self, split="train"):
        return [TASK]

    def tools(self, task):
        self._maybe_fail("tools")
        return [SleepTool("calc")]

    async def verify(self, task, trajectory):
        self._maybe_fail("verify")
        return float(trajectory.final_answer == task.answer)


class Chatty(Adder):
    """A conversational environment: the user opens, then stops after the first answer."""

    def user_for(self, task):
        async def user(messages):
            return UserReply(text="", stop=True)
        return user

    async def open(self, task, user):
        self._maybe_fail("open")
        return Task(task_id=task.task_id, messages=task.messages + (
            {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Please add."}))


def play(env, turns):
    job = episodes.EpisodeJob(task=TASK, episode=EpisodeConfig(max_turns=4))

    async def main():
        return await episodes.play(env, ScriptedSampler(TOK, turns), CODEC, ToolExecutor(), job)
    return asyncio.run(main())


SCRIPT = [chat.render_tool_call("calc", {"q": "2+2"}), "<answer>4</answer>"]


def test_default_hooks():
    env = Adder()
    assert env.user_for(TASK) is None and env.stats([TASK], [[]]) == {}
    assert env.demonstration(TASK, np.random.default_rng(0)) is None
    assert asyncio.run(env.open(TASK, None)) is TASK
    traj, outcome = play(env, SCRIPT)
    assert outcome == 1.0 and traj.end_reason == "answer" and len(traj.tool_calls) == 1


def test_environment_must_define_tasks_tools_and_verify():
    class NoVerify(Environment):
        def tasks(self, split="train"):
            return []

        def tools(self, task):
            return []

    with pytest.raises(TypeError, match="verify"):
        NoVerify()


def test_conversational_hooks_are_used():
    traj, outcome = play(Chatty(), ["<answer>4</answer>"])
    assert traj.end_reason == "user_stop" and outcome == 1.0
    assert "Please add." in CODEC.decode(traj.token_ids[:traj.prompt_len])


@pytest.mark.parametrize("env, reaches_episode", [
    (Adder(fail="tools"), False), (Adder(fail="verify"), True), (Chatty(fail="open"), False)])
def test_a_failing_hook_is_a_failed_trajectory(env, reaches_episode):
    traj, outcome = play(env, SCRIPT)
    assert isinstance(traj, Trajectory) and outcome == 0.0
    assert traj.end_reason == "error" and traj.final_answer is None
    assert traj.error == f"RuntimeError: {env.fail} broke"
    assert bool(traj.token_ids) == reaches_episode
    traj.check()
