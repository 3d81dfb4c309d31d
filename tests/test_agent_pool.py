"""EpisodePool: episodes played in spawned worker processes come back whole and in order; a
worker that dies is replaced and its share replayed; errors name the worker and carry its
traceback; bad settings are refused by name."""

from __future__ import annotations

import asyncio
import functools
import os
import pathlib

import pytest
from agent_fixtures import SleepTool

from orchestrax.agent.episode import EpisodeConfig, run_episode, run_episodes
from orchestrax.agent.pool import EpisodePool, WorkerError
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.data.records import Task

TURNS = ('<tool_call>\n{"name": "fast", "arguments": {}}\n</tool_call>',
         '<tool_call>\n{"name": "slow", "arguments": {}}\n</tool_call>\n'
         '<tool_call>\n{"name": "fast", "arguments": {}}\n</tool_call>',
         "<answer>done</answer>")
IM_START = tiny_qwen3_tokenizer().convert_tokens_to_ids("<|im_start|>")


def _by_turn(_, input_ids) -> str:
    """The turn's script from the conversation so far (one user message, then two
    `<|im_start|>` per finished turn), so concurrent episodes sharing a sampler stay in step."""
    return TURNS[(list(input_ids).count(IM_START) - 2) // 2]


def _sampler(tokenizer):
    return ScriptedSampler(tokenizer, script=_by_turn)


def _tools():
    return [SleepTool("fast", latency_s=0.01, cost=0.001), SleepTool("slow", latency_s=0.05, cost=0.01)]


def _task(i: int) -> Task:
    return Task(task_id=f"t{i}", messages=({"role": "user", "content": f"Job number {i}."},))


class ScriptPlayer:
    """Plays TURNS against sleeping tools; with `die_once_at`, the first worker to meet that
    task id kills its own process (a marker file makes it happen once across processes)."""

    def __init__(self, die_once_at: str | None = None, marker: str | None = None,
                 raise_at: str | None = None):
        self.tokenizer = tiny_qwen3_tokenizer()
        self.sampler = _sampler(self.tokenizer)
        self.die_once_at, self.marker, self.raise_at = die_once_at, marker, raise_at

    async def play(self, task: Task):
        if task.task_id == self.die_once_at and not os.path.exists(self.marker):
            pathlib.Path(self.marker).touch()
            await asyncio.sleep(0.05)  # let some episodes of this share finish first
            os._exit(3)
        if task.task_id == self.raise_at:
            raise RuntimeError(f"player broke on {task.task_id}")
        return await run_episode(self.sampler, self.tokenizer, task, _tools(),
                                 config=EpisodeConfig(sampler_attempts=1))


def _failing_build():
    raise OSError("no tokenizer here")


def _reference(n: int):
    tok = tiny_qwen3_tokenizer()
    return asyncio.run(run_episodes(_sampler(tok), tok,
                                    [(_task(i), _tools()) for i in range(n)]))


def test_pool_matches_in_process_and_survives_a_dead_worker(tmp_path):
    n = 24
    ref = _reference(n)
    build = functools.partial(ScriptPlayer, die_once_at="t5", marker=str(tmp_path / "died"))
    with EpisodePool(build, workers=2, max_in_flight=8) as pool:
        got = asyncio.run(pool.play([_task(i) for i in range(n)]))
        assert (tmp_path / "died").exists()          # worker 1 (odd tasks) really died once
        done = []   # reported on the caller's loop as results come back
        again = asyncio.run(pool.play([_task(i) for i in range(3)], done.append))
    assert [t.task_id for t in got] == [f"t{i}" for i in range(n)]
    for a, b in zip(got, ref):
        assert a.end_reason == b.end_reason == "answer"
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert a.logprobs == b.logprobs
        assert [c.name for c in a.tool_calls] == ["fast", "slow", "fast"]
        assert a.cost == pytest.approx(0.012)
    assert [t.token_ids for t in again] == [t.token_ids for t in ref[:3]]  # the replacement
    assert sum(done) == 3                                                  # serves on


def test_pool_errors_carry_the_worker_traceback():
    with EpisodePool(functools.partial(ScriptPlayer, raise_at="t2"), workers=1) as pool:
        with pytest.raises(WorkerError, match=r"(?s)worker 0 raised.*player broke on t2"):
            asyncio.run(pool.play([_task(i) for i in range(4)]))
        # The worker is still alive and serves the next batch.
        assert len(asyncio.run(pool.play([_task(0)]))) == 1
    with pytest.raises(WorkerError, match="(?s)failed to build.*no tokenizer here"):
        EpisodePool(_failing_build, workers=1)


@pytest.mark.parametrize("kwargs, field", [({"workers": 0}, "workers"),
                                           ({"workers": 1, "max_in_flight": 0}, "max_in_flight")])
def test_pool_settings_are_checked(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EpisodePool(ScriptPlayer, **kwargs)
