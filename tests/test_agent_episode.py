"""Token-in/token-out episodes with a scripted sampler and real async tools."""

import asyncio

import pytest
from agent_fixtures import SleepTool, qwen3_chat_template

from orchestrax.agent import chat
from orchestrax.agent.episode import (Codec, EpisodeConfig, UserReply, prompt_messages,
                                      run_episode, run_episodes)
from orchestrax.agent.executor import ExecutorConfig, ToolExecutor, ToolLimits
from orchestrax.agent.scripted import ScriptedSampler, scripted_logprob, tiny_qwen3_tokenizer
from orchestrax.data.records import Task
from orchestrax.rollout.sampler import GenerateResult

TOK = tiny_qwen3_tokenizer()
TASK = Task(task_id="t0", messages=({"role": "system", "content": "You are an orchestrator."},
                                    {"role": "user", "content": "What is 6 x 7?"}),
            preference_instruction="Prefer cheap tools; latency matters little.")
LIMITS = ToolLimits(timeout_s=0.1, max_attempts=2, backoff_s=0.01, backoff_max_s=0.01)


def call(name, args):
    return chat.render_tool_call(name, args)


def make_tools():
    return [SleepTool("slow", latency_s=0.05, cost=0.01),
            SleepTool("flaky", fail_first=1, cost=0.02),          # transient once, then fine
            SleepTool("hang", latency_s=30.0, cost=5.0),           # always times out
            SleepTool("broken", fail_first=99, transient=False)]   # permanent error


def run(sampler, tools, *, config=EpisodeConfig(), user=None, task=TASK):
    async def main():
        ex = ToolExecutor(ExecutorConfig(default=LIMITS))
        return await run_episode(sampler, TOK, task, tools, config=config, executor=ex, user=user)
    return asyncio.run(main())


THINK_SCRIPT = [
    "<think>\nSearch and compute.\n</think>\n\n" + call("slow", {"q": "six"}) + "\n"
    + call("flaky", {"q": "seven"}),
    "<think>\nTry the others.\n</think>\n\nChecking.\n" + call("hang", {"q": "x"}) + "\n"
    + call("broken", {}),
    "<think>\nDone.\n</think>\n\nIt is <answer>42</answer>.",
]


def assert_masks_and_logprobs(traj, sampler_outputs):
    traj.check()
    generated = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    assert generated == [t for out in sampler_outputs for t in out]
    for i, (t, m, lp) in enumerate(zip(traj.token_ids, traj.loss_mask, traj.logprobs)):
        assert lp == (scripted_logprob(i, t) if m else 0.0)


class Recording(ScriptedSampler):
    async def generate(self, requests):
        results = await super().generate(requests)
        self.outputs = getattr(self, "outputs", []) + [r.output_ids for r in results]
        self.seen = getattr(self, "seen", []) + list(requests)
        return results


def test_tool_episode_observations_costs_latencies_masks_and_end():
    sampler = Recording(TOK, THINK_SCRIPT)
    tools = make_tools()
    traj = run(sampler, tools)
    assert traj.end_reason == "answer" and traj.final_answer == "42" and len(traj.turns) == 3
    slow, flaky, hang, broken = traj.tool_calls
    assert slow.ok and slow.observation == "slow result for six" and slow.cost == 0.01
    assert slow.latency >= 0.05 - 1e-3
    assert flaky.ok and tools[1].calls == 2 and flaky.cost == 0.02 and flaky.latency >= 0.01 - 1e-3
    assert not hang.ok and hang.observation == "Error: tool 'hang' timed out after 0.1 s (2 attempts)."
    assert hang.cost == 0.0 and hang.latency >= 0.2 + 0.01 - 1e-3
    assert not broken.ok and broken.observation == "Error: tool 'broken' failed: broken is unavailable"
    assert traj.cost == pytest.approx(0.03)
    assert traj.latency == pytest.approx(max(slow.latency, flaky.latency) + hang.latency)
    assert traj.format_errors == 0
    assert [t.tokens_out for t in traj.turns] == [len(o) for o in sampler.outputs]
    assert traj.turns[1].tokens_in == traj.turns[0].tokens_in + traj.turns[0].tokens_out + len(
        TOK.encode(chat.tool_response_delta([slow.observation, flaky.observation])))
    assert_masks_and_logprobs(traj, sampler.outputs)
    stops = tuple(TOK.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    assert all(r.sampling.stop_token_ids == stops for r in sampler.seen)
    assert [r.rid for r in sampler.seen] == ["t0/0", "t0/1", "t0/2"]
    assert sampler.seen[2].input_ids == tuple(traj.token_ids[:traj.turns[2].tokens_in])


def _full_render_ids(traj, tools, *, training, thinking=True):
    ids = TOK.apply_chat_template(traj.messages, tools=[t.spec.to_openai() for t in tools],
                                  chat_template=qwen3_chat_template(training=training),
                                  tokenize=True, enable_thinking=thinking, return_dict=False)
    # The trajectory stops on the final <|im_end|>; the render adds the "\n" after it.
    assert TOK.decode(ids[-1:]) == "\n"
    return ids[:-1]


@pytest.mark.parametrize("training", [False, True], ids=["original", "training"])
def test_appended_ids_equal_full_render_thinking_on(training):
    sampler = Recording(TOK, THINK_SCRIPT)
    tools = make_tools()
    traj = run(sampler, tools)
    assert traj.token_ids == _full_render_ids(traj, tools, training=training)
    # Every assistant->tool boundary kept the "\n" after <|im_end|>.
    im_end, newline = TOK.convert_tokens_to_ids("<|im_end|>"), TOK.encode("\n")
    ends = [i for i, t in enumerate(traj.token_ids) if t == im_end and traj.loss_mask[i]]
    for i in ends[:-1]:
        assert traj.token_ids[i + 1:i + 1 + len(newline)] == newline
        assert traj.loss_mask[i + 1] == 0


def test_appended_ids_equal_prefix_preserving_render_thinking_off():
    script = [call("slow", {"q": "a"}), "Working.\n" + call("flaky", {"q": "b"}), "<answer>ok</answer>"]
    sampler = Recording(TOK, script)
    tools = make_tools()
    traj = run(sampler, tools, config=EpisodeConfig(enable_thinking=False))
    assert traj.end_reason == "answer" and traj.final_answer == "ok"
    # Every generation prompt carried the empty think block the model saw.
    text = TOK.decode(traj.token_ids)
    assert text.count("<|im_start|>assistant\n<think>\n\n</think>\n\n") == 3
    # The original template drops empty think blocks of earlier turns; trl's prefix-preserving
    # variant keeps them and reproduces the rollout exactly.
    assert traj.token_ids == _full_render_ids(traj, tools, training=True, thinking=False)
    assert traj.token_ids != _full_render_ids(traj, tools, training=False, thinking=False)
    assert_masks_and_logprobs(traj, sampler.outputs)


def test_preference_instruction_goes_into_system_turn():
    msgs = prompt_messages(TASK)
    assert msgs[0] == {"role": "system", "content": "You are an orchestrator.\n\n"
                                                    "Prefer cheap tools; latency matters little."}
    bare = Task(task_id="b", messages=({"role": "user", "content": "q"},), preference_instruction="P")
    assert prompt_messages(bare)[0] == {"role": "system", "content": "P"}
    traj = run(Recording(TOK, ["<answer>1</answer>"]), make_tools())
    prompt = TOK.decode(traj.token_ids[:traj.prompt_len])
    system = prompt.split("<|im_end|>")[0]
    assert "Prefer cheap tools" in system and "<tools>" in system


def test_max_turns():
    traj = run(ScriptedSampler(TOK, [call("slow", {"q": "again"})]), make_tools(),
               config=EpisodeConfig(max_turns=3))
    assert traj.end_reason == "max_turns" and len(traj.turns) == 3 and len(traj.tool_calls) == 3
    traj.check()


def test_repeated_format_errors_end_the_episode_and_are_readable():
    script = ['<tool_call>\n{"name": "slow", "arguments": {"q": \n</tool_call>',
              call("nope", {}), call("slow", {"q": 3})]
    traj = run(Recording(TOK, script), make_tools(), config=EpisodeConfig(max_format_errors=3))
    assert traj.end_reason == "format_errors" and traj.format_errors == 3
    errs = [c.observation for c in traj.tool_calls]
    assert "not valid JSON" in errs[0] and "unknown tool 'nope'" in errs[1]
    assert "arguments.q must be a string, got 3" in errs[2]
    text = TOK.decode(traj.token_ids)
    assert "<tool_response>\nError: the tool call is not valid JSON" in text   # the model read it


def test_format_error_streak_resets_on_a_good_turn():
    script = [call("nope", {}), call("slow", {"q": "x"}), call("nope", {}), "<answer>a</answer>"]
    traj = run(ScriptedSampler(TOK, script), make_tools(), config=EpisodeConfig(max_format_errors=2))
    assert traj.end_reason == "answer" and traj.format_errors == 2


def test_context_budget():
    traj = run(ScriptedSampler(TOK, [call("slow", {"q": "long " * 20})]), make_tools(),
               config=EpisodeConfig(context_tokens=900))
    assert traj.end_reason == "context" and len(traj.token_ids) <= 900
    traj.check()


def test_a_prompt_that_fills_the_context_is_an_error_not_a_zero():
    sampler = ScriptedSampler(TOK, ["<answer>a</answer>"])
    traj = run(sampler, make_tools(), config=EpisodeConfig(context_tokens=16))
    assert traj.end_reason == "error" and not traj.turns
    assert "context_tokens=16" in traj.error and "tokens) leaves no room" in traj.error


def test_truncated_turn_is_closed_and_reported():
    sampler = ScriptedSampler(TOK, ["<think>\n" + "very long thoughts " * 10, "b"])
    traj = run(sampler, make_tools(), config=EpisodeConfig(max_new_tokens=8))
    first = traj.turns[0]
    assert first.tokens_out == 8 and "cut off after 8 tokens" in first.format_error
    assert traj.end_reason == "answer" and traj.final_answer == "b"
    traj.check()


def test_user_responder_conversation():
    seen = []

    async def user(messages):
        seen.append(messages[-1]["content"])
        return UserReply(text="My order is #12.", stop=len(seen) >= 2)

    think = "<think>\nhm\n</think>\n\n"
    script = [think + "Which order?", think + call("slow", {"q": "#12"}),
              think + "Refunded. <answer>done</answer>"]
    traj = run(ScriptedSampler(TOK, script), make_tools(), user=user)
    assert traj.end_reason == "user_stop" and traj.final_answer == "done"
    assert seen == [think + "Which order?", think + "Refunded. <answer>done</answer>"]
    assert "<|im_start|>user\nMy order is #12.<|im_end|>" in TOK.decode(traj.token_ids)
    ids = TOK.apply_chat_template(traj.messages, tools=[t.spec.to_openai() for t in make_tools()],
                                  chat_template=qwen3_chat_template(training=True), tokenize=True,
                                  return_dict=False)
    assert traj.token_ids == ids[:-1]


def test_broken_user_responder_ends_only_that_episode():
    async def user(messages):
        raise RuntimeError("simulator crashed")
    traj = run(ScriptedSampler(TOK, ["Hello?"]), make_tools(), user=user)
    assert traj.end_reason == "error" and "RuntimeError: simulator crashed" in traj.error


class FlakySampler(ScriptedSampler):
    def __init__(self, *a, failures, **kw):
        super().__init__(*a, **kw)
        self.failures = failures

    async def generate(self, requests):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("server went away")
        return await super().generate(requests)


def test_sampler_failure_costs_a_retry_then_ends_the_episode_only():
    cfg = EpisodeConfig(sampler_attempts=2, sampler_backoff_s=0.0)
    ok = run(FlakySampler(TOK, ["<answer>x</answer>"], failures=1), make_tools(), config=cfg)
    assert ok.end_reason == "answer"
    dead = run(FlakySampler(TOK, ["<answer>x</answer>"], failures=5), make_tools(), config=cfg)
    assert dead.end_reason == "error" and "ConnectionError: server went away (2 attempts)" in dead.error
    assert dead.token_ids and not any(dead.loss_mask)


def test_abort_ends_with_error():
    class Aborting:
        async def generate(self, requests):
            return [GenerateResult(output_ids=(5,), logprobs=(-1.0,), finish_reason="abort",
                                   prompt_tokens=len(r.input_ids)) for r in requests]
    traj = run(Aborting(), make_tools())
    assert traj.end_reason == "error" and "aborted" in traj.error and traj.num_generated == 1


def test_many_episodes_bounded_in_flight_and_isolated_failures():
    in_flight = {"now": 0, "max": 0}

    class Counting(ScriptedSampler):
        async def generate(self, requests):
            if requests[0].rid.endswith("/0"):
                in_flight["now"] += 1
                in_flight["max"] = max(in_flight["max"], in_flight["now"])
            out = await super().generate(requests)
            text = TOK.decode(out[0].output_ids)
            if "<answer>" in text:
                in_flight["now"] -= 1
            return out

    script = [call("slow", {"q": "a"}) + "\n" + call("broken", {}), "<answer>z</answer>"]

    def script_fn(n, ids):
        return script[0] if TOK.decode(list(ids)).count("<tool_response>") == 0 else script[1]

    async def main():
        jobs = [(Task(task_id=f"e{i}", messages=TASK.messages), make_tools()) for i in range(40)]
        return await run_episodes(Counting(TOK, script=script_fn, delay_s=0.001), TOK, jobs,
                                  executor=ToolExecutor(ExecutorConfig(default=LIMITS)),
                                  max_in_flight=8)
    trajs = asyncio.run(main())
    assert [t.task_id for t in trajs] == [f"e{i}" for i in range(40)]
    assert all(t.end_reason == "answer" and t.final_answer == "z" for t in trajs)
    assert all(not t.tool_calls[1].ok for t in trajs)
    assert in_flight["max"] == 8


def test_config_and_tokenizer_validation():
    with pytest.raises(ValueError, match="EpisodeConfig.max_turns=0"):
        EpisodeConfig(max_turns=0)
    with pytest.raises(ValueError, match="EpisodeConfig.context_tokens"):
        EpisodeConfig(context_tokens=0)
    from tokenizers import Tokenizer, models
    with pytest.raises(ValueError, match="lacks Qwen3 special tokens"):
        Codec(Tokenizer(models.BPE()))
