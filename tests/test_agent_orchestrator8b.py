"""The released Orchestrator-8B protocol: its round prompt rendered as Qwen3's own template renders
it, its tool calls parsed as the official evaluation reads them, and whole eval episodes where
the `model` argument reaches the configured expert endpoints (OpenAI-compatible servers on
loopback; a BM25 index as the retriever; the real sandbox for code), on a scripted sampler and
on a random tiny Qwen3 through the embedded sampler."""

import asyncio
import dataclasses
import json
import shutil

import numpy as np

import pytest

from orchestrax import models, registry
from orchestrax.agent import chat
from orchestrax.agent.codec import Codec
from orchestrax.agent.orchestrator8b_protocol import (SLOTS, ContextBudget, RoundContext,
                                                      default_tools, load_tools, parse_choice,
                                                      round_messages)
from orchestrax.agent.orchestrator8b_experts import (ExpertPool, boxed, load_experts,
                                                     tool_retriever)
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.envs.qa import QAConfig
from orchestrax.eval.orchestrator8b_runner import Orchestrator8BOptions, run_orchestrator8b
from orchestrax.eval.policy import TokenPolicy
from orchestrax.eval.runners import EvalConfig
from orchestrax.eval.suite import EvalRun, run_eval
from orchestrax.agent.episode import EpisodeConfig
from orchestrax.rollout.sampler import SamplerConfig
from orchestrax.tools.local_search import LocalSearchTool
from orchestrax.tools.sandbox import SandboxConfig
from orchestrax.tools.search_index import SearchIndexConfig, build_index_async

from agent_fixtures import qwen3_chat_template
from loopback import ScriptedChatServer

QUESTION = "Which city is the capital of France?"


def _call(name, model):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"model": "{model}"}}}}\n</tool_call>'


def test_round_prompt_is_what_qwen3s_template_renders():
    tok = tiny_qwen3_tokenizer()
    tok.chat_template = qwen3_chat_template()
    context = RoundContext(docs=["Paris is the capital of France."])
    messages = round_messages(QUESTION, context.render(QUESTION, Codec(tok), ContextBudget()))
    assert messages[0] == {"role": "system", "content": "You are good at using tools."}
    assert messages[1]["content"] == (
        f"Problem: {QUESTION}\n\nDocuments:\nDoc 1: Paris is the capital of France. ...\n\n"
        "\n\nChoose an appropriate tool.")
    tools = default_tools()
    assert [t["function"]["name"] for t in tools] == ["enhance_reasoning", "answer", "search"]
    for t in tools:
        params = t["function"]["parameters"]
        assert list(params) == ["properties", "required", "title", "type"]
        assert params["required"] == ["model"]
        assert all(s in params["properties"]["model"]["description"]
                   for s in SLOTS[t["function"]["name"]])
    for thinking in (True, False):
        ours = chat.render_messages(messages, tools=tools, add_generation_prompt=True,
                                    enable_thinking=thinking)
        theirs = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                         tokenize=False, enable_thinking=thinking)
        assert ours == theirs


def test_context_cuts_by_tokens_from_the_front():
    codec = Codec(tiny_qwen3_tokenizer())
    ctx = RoundContext(docs=["d" * 2000], code=[("print(42)", "42\n")])
    text = ctx.render("q", codec, ContextBudget(doc_chars=5))
    assert text == ("Documents:\nDoc 1: ddddd ...\n\n\npython code and execution outputs:\n"
                    "```python\nprint(42)\n```\n\n```output\n42\n\n```\n\n")
    tight = ctx.render("q", codec, ContextBudget(total_tokens=12, code_tokens=8, doc_chars=5))
    code_ids = codec.encode(ctx.code_text())
    assert tight == "```\n" + codec.decode(code_ids[-8:])   # the code alone outgrew the room
    ctx.add_docs(["b", "a", "d" * 2000])   # best hit last; a repeat is not added again
    assert ctx.docs == ["d" * 2000, "a", "b"]


def test_parse_reads_the_first_usable_call_as_the_official_eval_does():
    c = parse_choice("<think>\nsearch first? " + _call("answer", "answer-1") + "\n</think>\n\n"
                     + _call("search", "search-2"))
    assert (c.tool, c.slot) == ("search", "search-2")     # calls inside <think> are thoughts
    c = parse_choice(_call("search", "search-9") + "\n" + _call("web", "x") + "\n"
                     + _call("answer", "answer-math-1") + "\n" + _call("search", "search-1"))
    assert (c.tool, c.slot) == ("answer", "answer-math-1")
    wrapped = ('<tool_call>\n{"name": "enhance_reasoning", "arguments": '
               '"{\\"model\\": \\"reasoner-3\\"}"}\n</tool_call>')
    assert parse_choice(wrapped).slot == "reasoner-3"     # arguments JSON-encoded twice
    why = parse_choice(_call("search", "search-9") + _call("web", "x") + "<tool_call>{")
    assert "search: model='search-9'; allowed: search-1, search-2, search-3" in why
    assert "unknown tool 'web'" in why and "never closed" in why
    assert parse_choice("Paris") == "no tool call"
    assert isinstance(parse_choice(_call("search", "search-1"), offered=("answer",)), str)


def test_tools_file_and_experts_file_are_checked(tmp_path):
    good = tmp_path / "tools.json"
    good.write_text(json.dumps(default_tools()))
    assert load_tools(good) == default_tools()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(default_tools()[:2]))
    with pytest.raises(ValueError, match="needs exactly the tools"):
        load_tools(bad)
    experts = tmp_path / "experts.json"
    experts.write_text(json.dumps({"search-9": {"base_url": "http://x", "model": "m"}}))
    with pytest.raises(ValueError, match="slot 'search-9'; allowed"):
        load_experts(experts)
    experts.write_text(json.dumps({"answer-1": {"base_url": "http://x", "model": "m",
                                                "answer_format": "latex"}}))
    with pytest.raises(ValueError, match="answer_format='latex'; allowed: tags, boxed"):
        load_experts(experts)
    assert boxed(r"so \boxed{\frac{1}{2}} and \boxed{x^{2}}") == "x^{2}"


@pytest.fixture(scope="module")
def qa_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("o8b")
    tasks = root / "capitals.jsonl"
    tasks.write_text(json.dumps({"id": 1, "question": QUESTION, "answer": "Paris"}) + "\n")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in (
        {"title": "Paris", "text": "Paris is the capital and largest city of France."},
        {"title": "Berlin", "text": "Berlin is the capital of Germany."},
        {"title": "Tokyo", "text": "Tokyo is the capital of Japan."})))
    index = asyncio.run(build_index_async(SearchIndexConfig(
        corpus_path=str(corpus), backend="bm25", cache_dir=str(root / "cache")), progress=False))
    return tasks, LocalSearchTool(index, default_k=1)


def _expert_reply(body):
    prompt = body["messages"][-1]["content"]
    if "<answer>" in prompt:
        return "<think>\nDoc 1 says so.\n</think>\n<answer>Paris</answer>"
    if "<query>" in prompt:
        return "<think>\nThe city is missing.\n</think>\n<query>capital city of France</query>"
    return "```python\nprint(len('Paris'))\n```"


def _env(tasks):
    env = registry.build_env(QAConfig(path=str(tasks), grader="exact"))
    (task,) = env.tasks("all")
    return env, task


def _sandbox_or_none():
    return SandboxConfig() if shutil.which("bwrap") else None


def test_an_eval_episode_routes_each_model_argument_to_its_expert(qa_set, tmp_path):
    tasks, search = qa_set
    tok = tiny_qwen3_tokenizer()
    codec = Codec(tok)
    turns = ["<think>\nNo documents yet.\n</think>\n\n" + _call("search", "search-2"),
             "I have a document.\n" + _call("enhance_reasoning", "reasoner-1"),
             _call("answer", "answer-1")]
    sandbox = _sandbox_or_none()

    async def go():
        async with ScriptedChatServer(_expert_reply, usage=(100, 10)) as searcher, \
                ScriptedChatServer(_expert_reply, usage=(100, 10)) as others:
            experts_file = tmp_path / "experts.json"
            experts_file.write_text(json.dumps({
                "search-2": {"base_url": searcher.base_url, "model": "qwen-searcher"},
                "default": {"base_url": others.base_url, "model": "big-expert"}}))
            pool = ExpertPool(load_experts(experts_file), codec, sandbox=sandbox,
                              retriever=tool_retriever(search))
            policy = TokenPolicy(ScriptedSampler(codec, turns), tok, name="scripted")
            cfg = EvalConfig(episode=EpisodeConfig(max_turns=5, enable_thinking=True),
                             seconds_per_token=0.0, agent_options=Orchestrator8BOptions(
                                 experts=pool, tokens=codec))
            record = await run_orchestrator8b(task, env, policy, [], cfg)
            # the same through the suite, as `orchestrax eval --agent orchestrator8b` runs it
            policy = TokenPolicy(ScriptedSampler(codec, turns), tok, name="scripted")
            payload = await run_eval(policy, EvalRun(task_sets=(str(tasks),), cfg=cfg,
                                                     turn_limits=(), runner="orchestrator8b",
                                                     progress=False))
            return record, payload, searcher.requests, others.requests

    env, task = _env(tasks)
    record, payload, to_searcher, to_others = asyncio.run(go())
    (row,) = payload["rows"]
    assert row["accuracy"] == 1.0 and row["errors"] == 0
    traj = record.trajectory
    record = record.to_json()
    assert record["outcome"] == 1.0 and record["final_answer"] == "Paris"
    assert record["end_reason"] == "answer" and record["turns"] == 3
    assert record["calls"] == {"search": 1, "enhance_reasoning": 1, "answer": 1}
    # search-2 went to its own endpoint; reasoner-1 and answer-1 to the default one
    assert [r["model"] for r in to_searcher] == ["qwen-searcher"] * 2
    assert QUESTION in to_searcher[0]["messages"][-1]["content"]
    assert [r["model"] for r in to_others] == ["big-expert"] * 4
    answer_prompt = to_others[1]["messages"][-1]["content"]
    assert "Doc 1: [1] Paris\nParis is the capital and largest city of France." in answer_prompt
    # billed at the released table: search-2 $0.25/$2, reasoner-1 and answer-1 $1.25/$10 per 1M
    want = (100 * 0.25 + 10 * 2 + 2 * (100 * 1.25 + 10 * 10)) / 1e6
    assert record["tool_cost_usd"] == pytest.approx(want, rel=1e-9)
    assert record["tool_latency_s"] >= 16 + 31 + 96      # the slots' latencies, plus the run's
    assert [c.arguments["model"] for c in traj.tool_calls] == ["search-2", "reasoner-1",
                                                                "answer-1"]
    rounds = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert rounds[0] == f"Problem: {QUESTION}\n\n\n\nChoose an appropriate tool."
    assert "Doc 1: [1] Paris" in rounds[1]
    if sandbox is not None:   # the code ran and its output joined the last round's context
        assert "```output\n5\n" in rounds[2]


def test_a_random_tiny_qwen3_plays_the_protocol_token_in_token_out(qa_set):
    tasks, search = qa_set
    tok = tiny_qwen3_tokenizer()
    codec = Codec(tok)
    cfg = models.tiny_config(vocab_size=len(tok))
    sampler = registry.build_sampler(SamplerConfig(backend="embedded", max_batch=1,
                                                   max_len=2048),
                                     cfg, models.init_params(cfg, 0))
    policy = TokenPolicy(sampler, tok, name="random")
    pool = ExpertPool({}, codec, retriever=tool_retriever(search))
    eval_cfg = EvalConfig(episode=EpisodeConfig(max_turns=2, max_new_tokens=8,
                                                context_tokens=2048),
                          agent_options=Orchestrator8BOptions(experts=pool))
    env, task = _env(tasks)

    async def go():
        try:
            return await run_orchestrator8b(task, env, policy, [], eval_cfg)
        finally:
            await policy.aclose()

    record = asyncio.run(go())
    assert record.outcome == 0.0 and record.end_reason == "max_turns"
    assert record.error is None and record.turns == 2
    traj = record.trajectory
    prompt = chat.render_messages(round_messages(QUESTION, ""), tools=default_tools(),
                                  add_generation_prompt=True)
    want = codec.encode(prompt)
    assert traj.token_ids[:traj.prompt_len] == want   # the round as rendered, tokenised once
    assert traj.loss_mask == [0] * len(want) + [1] * (len(traj.token_ids) - len(want))
    assert all(t.tokens_in == len(want) for t in traj.turns)   # no round saw an earlier one
    traj.check()


def test_rounds_without_a_usable_call_are_skipped_as_the_official_eval_skips_them(qa_set):
    """The released evaluation `continue`s past a round with no valid call and plays on to its
    round limit. Script: prose, an unknown tool, a bad slot, then an answer call: by default the
    episode answers in round 4 (3 format errors, 1 call, the expert asked once); with
    max_format_errors=3 it ends after round 3 with no answer; with only bad rounds it runs to
    max_rounds."""
    from orchestrax.agent.orchestrator8b_protocol import play_rounds, token_rounds
    from orchestrax.train.agent_config import AgentConfig
    tasks, search = qa_set
    tok = tiny_qwen3_tokenizer()
    codec = Codec(tok)
    env, task = _env(tasks)
    bad = ["I think it is Paris.", _call("web", "x"), _call("answer", "answer-9")]

    async def go(script, **kw):
        async with ScriptedChatServer(_expert_reply) as srv:
            pool = ExpertPool({"default": load_experts_row(srv.base_url)}, codec)
            rounds = token_rounds(ScriptedSampler(codec, script), codec, EpisodeConfig(),
                                  task.task_id)
            traj = await play_rounds(rounds, task, pool, codec, **kw)
            return traj, await env.verify(task, traj), len(srv.requests)

    traj, outcome, asked = asyncio.run(go(bad + [_call("answer", "answer-1")], max_rounds=6))
    assert (traj.end_reason, traj.final_answer, outcome, asked) == ("answer", "Paris", 1.0, 1)
    assert [t.format_error is not None for t in traj.turns] == [True, True, True, False]
    assert [c.name for c in traj.tool_calls] == ["answer"]
    assert "unknown tool 'web'" in traj.turns[1].format_error
    assert "answer: model='answer-9'" in traj.turns[2].format_error
    # each skipped round starts again from the same (empty) context
    assert len({m["content"] for m in traj.messages if m["role"] == "user"}) == 1
    traj, outcome, asked = asyncio.run(go(bad + [_call("answer", "answer-1")], max_rounds=6,
                                          max_format_errors=3))
    assert (traj.end_reason, traj.final_answer, outcome, asked) == ("format_errors", None, 0.0, 0)
    assert len(traj.turns) == 3
    traj, outcome, asked = asyncio.run(go(bad * 2, max_rounds=5))
    assert (traj.end_reason, len(traj.turns), outcome, asked) == ("max_turns", 5, 0.0, 0)
    # the eval runner and the trainer default to the released behaviour; bad values are named
    assert Orchestrator8BOptions(experts=None).max_format_errors is None
    assert AgentConfig().protocol_format_errors is None
    with pytest.raises(ValueError, match="protocol_format_errors=0; must be"):
        AgentConfig(protocol_format_errors=0)
    with pytest.raises(ValueError, match="max_format_errors=0; must be"):
        Orchestrator8BOptions(experts=None, max_format_errors=0)


def test_search_is_no_longer_offered_once_documents_are_found(qa_set):
    """As the released evaluation: after a search brought documents, the next round's tools
    block has no `search`, and a second search call there is a format error."""
    from orchestrax.agent.orchestrator8b_protocol import play_rounds, token_rounds
    tasks, search = qa_set
    tok = tiny_qwen3_tokenizer()
    codec = Codec(tok)
    env, task = _env(tasks)
    script = [_call("search", "search-1"), _call("search", "search-2"),
              _call("answer", "answer-1")]
    seen = []

    async def go():
        async with ScriptedChatServer(_expert_reply) as srv:
            pool = ExpertPool({"default": load_experts_row(srv.base_url)}, codec,
                              retriever=tool_retriever(search))
            inner = token_rounds(ScriptedSampler(codec, script), codec, EpisodeConfig(),
                                 task.task_id)

            async def rounds(messages, schemas, n):
                seen.append([t["function"]["name"] for t in schemas])
                return await inner(messages, schemas, n)

            return await play_rounds(rounds, task, pool, codec, max_rounds=5)

    traj = asyncio.run(go())
    assert seen == [["enhance_reasoning", "answer", "search"], ["enhance_reasoning", "answer"],
                    ["enhance_reasoning", "answer"]]
    assert "unknown tool 'search'" in traj.turns[1].format_error
    assert [c.name for c in traj.tool_calls] == ["search", "answer"]
    assert (traj.end_reason, traj.final_answer) == ("answer", "Paris")


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A random tiny Qwen3 saved as a Hugging Face checkpoint (the released one's layout)."""
    from orchestrax.train.setup import write_model_card
    root = tmp_path_factory.mktemp("hf")
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    write_model_card(root / "card", cfg, tok)
    models.save_hf(cfg, models.init_params(cfg, 1), root / "hf", tokenizer_dir=root / "card")
    return root / "hf"


def test_orchestrax_eval_selects_the_protocol_on_an_hf_dir(qa_set, tiny_hf, tmp_path, capsys):
    from orchestrax.cli import main as cli
    tasks, _ = qa_set
    base = ["eval", "--policy", str(tiny_hf), "--tasks", str(tasks), "--agent",
            "orchestrator8b", "--max-turns", "1", "--max-new-tokens", "4", "--context-tokens",
            "2048", "--no-progress", "--out", str(tmp_path / "out")]
    assert cli(base) == 2
    assert "EvalCommand.experts=None; --agent orchestrator8b needs --experts FILE" in (
        capsys.readouterr().err)
    experts = tmp_path / "experts.json"
    experts.write_text(json.dumps({"default": {"base_url": "http://127.0.0.1:9", "model": "m"}}))
    assert cli(base + ["--experts", str(experts)]) == 0
    out = json.loads((tmp_path / "out" / "eval.json").read_text())
    (record,) = out["records"]["capitals"]
    assert record["turns"] == 1 and record["error"] is None
    assert record["tool_names"] == ["enhance_reasoning", "answer", "search"]


def test_an_openai_policy_gets_the_rendered_tools_block_as_text(qa_set):
    """As vLLM renders the released checkpoint's chat: one system message holding the tools
    block, one user message; the reply's <tool_call> text is parsed as a token policy's is."""
    from orchestrax.eval.policy import ChatPolicy
    from orchestrax.tools.chat_client import ChatEndpoint
    tasks, search = qa_set
    codec = Codec(tiny_qwen3_tokenizer())
    replies = iter([_call("search", "search-3"), _call("answer", "answer-4")])

    async def go():
        async with ScriptedChatServer(lambda body: next(replies)) as orch, \
                ScriptedChatServer(_expert_reply) as expert:
            pool = ExpertPool({"default": load_experts_row(expert.base_url)}, codec,
                              retriever=tool_retriever(search))
            policy = ChatPolicy(ChatEndpoint(base_url=orch.base_url, model="orchestrator-8b"))
            cfg = EvalConfig(episode=EpisodeConfig(max_turns=3),
                             agent_options=Orchestrator8BOptions(experts=pool, tokens=codec))
            env, task = _env(tasks)
            try:
                return await run_orchestrator8b(task, env, policy, [], cfg), orch.requests
            finally:
                await policy.aclose()

    record, sent = asyncio.run(go())
    assert record.outcome == 1.0 and record.turns == 2
    system = chat.system_prompt("You are good at using tools.", default_tools())
    assert sent[0]["messages"][0]["content"] == system.removeprefix(
        "<|im_start|>system\n").removesuffix("<|im_end|>\n")
    assert sent[0]["messages"][1]["content"].startswith(f"Problem: {QUESTION}\n\n")
    assert "Doc 1: [1] Paris" in sent[1]["messages"][1]["content"]


def load_experts_row(base_url, model="expert"):
    from orchestrax.agent.orchestrator8b_experts import ExpertConfig
    from orchestrax.tools.chat_client import ChatEndpoint
    return ExpertConfig(endpoint=ChatEndpoint(base_url=base_url, model=model))


def test_every_round_is_a_row_with_its_rollouts_advantage(qa_set):
    """Two rollouts of one task: search then a right answer (2 rounds), a wrong answer at once
    (1 round). P weighs the outcome only, so R = (1, 0), A = (+a, -a), and each rollout's rounds
    are rows carrying its A, loss only on the ids the round sampled."""
    from orchestrax.agent.orchestrator8b_protocol import play_rounds, token_rounds
    from orchestrax.rl import GRPOConfig
    from orchestrax.train.orchestrator8b_rollouts import rounds_batch
    tasks, search = qa_set
    tok = tiny_qwen3_tokenizer()
    codec = Codec(tok)
    env, task = _env(tasks)
    task = dataclasses.replace(task, preference=(0.0, 0.0, 1.0, 0.0, 0.0))
    replies = {"right": "<answer>Paris</answer>", "wrong": "<answer>Lyon</answer>"}

    def expert(body):
        prompt = body["messages"][-1]["content"]
        return ("<query>capital of France</query>" if "<query>" in prompt
                else replies[body["model"]])

    async def go():
        async with ScriptedChatServer(expert, usage=(10, 2)) as srv:
            out = []
            for script, who in (([_call("search", "search-1"), _call("answer", "answer-1")],
                                 "right"), ([_call("answer", "answer-2")], "wrong")):
                pool = ExpertPool({"default": load_experts_row(srv.base_url, who)}, codec,
                                  retriever=tool_retriever(search))
                rounds = token_rounds(ScriptedSampler(codec, script), codec, EpisodeConfig(),
                                      task.task_id)
                traj = await play_rounds(rounds, task, pool, codec, max_rounds=4,
                                         max_format_errors=2)
                out.append((traj, await env.verify(task, traj)))
            return out

    played = asyncio.run(go())
    groups = [[t for t, _ in played]]
    outcome = np.array([[o for _, o in played]], np.float32)
    assert outcome.tolist() == [[1.0, 0.0]]
    batch, stats = rounds_batch([task], groups, outcome, GRPOConfig(), pad_id=0,
                                max_turn_tokens=4096, seconds_per_token=0.0)
    a = batch["advantages"]
    assert a.shape == (4,) and a[0] == a[1] > 0 and a[2] == -a[0] and a[3] == 0.0
    assert batch["sample_mask"].tolist() == [1, 1, 1, 0] and stats["flow/turn_samples"] == 3
    assert batch["rollout_ids"].tolist() == [0, 0, 1, -1]
    for row, sample in zip(range(3), [s for t in groups[0] for s in t.samples]):
        n, m = len(sample.prompt_ids), len(sample.output_ids)
        assert batch["tokens"][row, :n + m].tolist() == sample.prompt_ids + sample.output_ids
        assert batch["loss_mask"][row].sum() == m and batch["loss_mask"][row, :n].sum() == 0
    assert stats["tools/search/calls"] == 1 and stats["tools/answer/calls"] == 2


@pytest.mark.slow
def test_train_runs_the_protocol_from_an_hf_checkpoint(qa_set, tiny_hf, tmp_path):
    """`orchestrax train` with agent.mode='orchestrator8b' and hf_path: one GRPO step on a
    random tiny Qwen3 (its rounds are format errors, so nothing is kept; the rows are there,
    8 of them: 2 tasks x 4 rollouts x 1 round, a multiple of the 8 fake devices)."""
    from orchestrax.rl import GRPOConfig, OptimizerConfig
    from orchestrax.train.agent_config import AgentConfig
    from orchestrax.train.train_config import RolloutConfig, TrainConfig
    from orchestrax.train.loop import train
    tasks, _ = qa_set
    corpus = tasks.parent / "corpus.jsonl"
    tasks = tmp_path / "capitals.jsonl"
    tasks.write_text("".join(json.dumps({"id": i, "question": f"The capital of {c}?",
                                         "answer": a}) + "\n"
                             for i, (c, a) in enumerate((("France", "Paris"), ("Japan", "Tokyo"),
                                                         ("Germany", "Berlin"), ("Peru", "Lima"),
                                                         ("Chile", "Santiago")))))
    experts = tmp_path / "experts.json"
    experts.write_text(json.dumps({"default": {"base_url": "http://127.0.0.1:9", "model": "m"}}))
    cfg = TrainConfig(
        name="o8b", out_dir=str(tmp_path / "run"), hf_path=str(tiny_hf),
        grpo=GRPOConfig(num_minibatches=1), optim=OptimizerConfig(lr=1e-3, total_steps=10),
        rollout=RolloutConfig(group_size=4, tasks_per_step=2, max_new_tokens=4, max_turns=1,
                              context_tokens=2048),
        env=QAConfig(path=str(tasks), test_fraction=0.3),
        agent=AgentConfig(mode="orchestrator8b", experts=str(experts), sandbox=None,
                          search_corpus=str(corpus)),
        steps=1, checkpoint_every=1, eval_every=0)
    (row,) = [h for h in train(cfg) if h["phase"] == "rl"]
    # 8 rollouts, 1 round each
    assert row["flow/turn_samples"] == 8 and row["rollout/turns_mean"] == 1.0
    assert row["rollout/format_error_rate"] == 1.0
    with pytest.raises(ValueError, match="mode 'orchestrator8b' needs experts"):
        AgentConfig(mode="orchestrator8b")
