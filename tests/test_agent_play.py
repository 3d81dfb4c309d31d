"""One training episode through `train.rollouts.play` and the `Environment` base: the optional
hooks have working defaults, and whatever fails inside one episode (an environment hook, the
verifier, the episode) comes back as a failed trajectory with outcome 0, never an exception;
turns record the policy's generation time and weight version, stale ones fail their trajectory,
and an empty answer is no answer."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from agent_fixtures import SleepTool

from orchestrax.agent import chat
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import EpisodeConfig, UserReply, run_episode
from orchestrax.agent.executor import ToolExecutor
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import Environment
from orchestrax.train import rollouts

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
    job = rollouts.EpisodeJob(task=TASK, episode=EpisodeConfig(max_turns=4))

    async def main():
        return await rollouts.play(env, ScriptedSampler(TOK, turns), CODEC, ToolExecutor(), job)
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


# --- what a trajectory records for the trainer ---------------------------

class VersionedSampler(ScriptedSampler):
    """Reports `versions[k]` as the weight version of its k-th call, after `delay_s`."""

    def __init__(self, turns, versions, delay_s):
        super().__init__(TOK, turns, delay_s=delay_s)
        self.versions = versions

    async def generate(self, requests):
        k = self.calls
        return [dataclasses.replace(r, weight_version=self.versions[k])
                for r in await super().generate(requests)]


def run_versioned(turns, versions, delay_s=0.0):
    async def main():
        return await run_episode(VersionedSampler(turns, versions, delay_s), CODEC, TASK,
                                 [SleepTool("calc")], config=EpisodeConfig(max_turns=4))
    return asyncio.run(main())


def test_turns_record_generation_seconds_and_weight_version():
    traj = run_versioned(SCRIPT, ["7", "8"], delay_s=0.05)
    assert [t.weight_version for t in traj.turns] == ["7", "8"]
    assert all(t.generation_s >= 0.05 for t in traj.turns)
    assert traj.generation_s == sum(t.generation_s for t in traj.turns)
    # Tool time stays its own feature; the policy's time is not charged to the tools.
    assert traj.latency < traj.generation_s


def test_stale_turns_fail_their_trajectory_and_are_counted():
    fresh, stale, unknown = (run_versioned(SCRIPT, v) for v in (["3", "3"], ["2", "3"], ["", ""]))
    counts = rollouts.drop_stale([fresh, stale, unknown], "3")
    assert counts == {"rollout/stale_trajectories": 1.0, "rollout/stale_turns": 1.0}
    assert fresh.final_answer == "4" and unknown.final_answer == "4"
    assert stale.final_answer is None and stale.end_reason == "error"
    assert "stale weights ['2']" in stale.error and "'3'" in stale.error


@pytest.mark.parametrize("last_turn", ["<answer>  </answer>", "", "<think>\nhmm\n</think>\n\n"])
def test_an_empty_final_answer_is_no_answer(last_turn):
    traj = run_versioned([last_turn], ["1"])
    assert traj.end_reason == "answer" and traj.final_answer is None
    _, outcome = play(Adder(), [last_turn])
    assert outcome == 0.0


def test_worker_counter_deltas_sum_key_wise_and_keep_zeros():
    deltas = [{"requests": 3, "retries": 1, "failures": 0}, {"requests": 2, "stale_answers": 1}, {}]
    assert rollouts.sum_counters(deltas) == {"requests": 5, "retries": 1, "failures": 0,
                                             "stale_answers": 1}
    assert rollouts.sum_counters([]) == {}
