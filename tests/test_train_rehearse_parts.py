"""`orchestrax rehearse`'s parts: the endpoints it would serve, its warm-start conversations, its
refusals, its end when a trainer process dies, and its LLM tools' replies from a real
`orchestrax serve --tiny` expert."""

import argparse
import asyncio
import dataclasses
import json
import pathlib
import sys
import time

import pytest
from loopback import free_port, start_tiny_server

from orchestrax.rehearsal import rehearse
from orchestrax.rehearsal.children import Fleet
from orchestrax.train.overrides import load_config

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "toolorchestra.py"


def test_endpoints_and_warm_start_conversations(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRAX_REHEARSAL_PORT", "40000")
    cfg = load_config(f"{CONFIG}:config_rehearsal")
    bases = {e.base_url for e in rehearse._endpoints(cfg)}
    assert bases == {"http://127.0.0.1:40010/v1", "http://127.0.0.1:40011/v1"}
    assert len(set(cfg.rollout.server_urls)) == 2
    # The warm start through the real sandbox and local search (the LLM tools need the
    # rehearsal's expert servers): every tool called, its real observation in the record.
    from orchestrax import registry
    tools = registry.build_catalog(dataclasses.replace(cfg.tools, llms=()))
    path = tmp_path / "sft.jsonl"
    counts = rehearse.write_sft_data(cfg, path, tools, limit=6, tools_per_task=2)
    from orchestrax.agent import chat
    from orchestrax.train import setup
    from orchestrax.train.warmstart import ConversationRenderer
    env = setup.make_env(cfg)
    catalog, env_system = env.catalog, env.tasks("train")[0].messages[0]["content"]
    codec = registry.build_codec(cfg.tokenizer)
    render = ConversationRenderer(codec)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert counts == {"local_search": 6, "python": 6} and len(records) == 12
    # Each question with both tools: the called name follows the offered tools, not the question.
    called: dict[str, set[str]] = {}
    for r in records:
        call = json.loads(r["messages"][-3]["content"].split("\n")[1])
        called.setdefault(r["messages"][1]["content"], set()).add(call["name"])
    assert len(called) == 6 and all(names == {"python", "local_search"}
                                    for names in called.values())
    # Spread over the train tasks: every source of the mixture has conversations.
    asked = {r["messages"][1]["content"] for r in records}
    sources = {t.task_id.split("/")[0] for t in env.tasks("train")
               if t.messages[-1]["content"] in asked}
    assert sources == {s.name.removeprefix("qa_") for s in cfg.env.sources}
    for r in records:
        roles = [m["role"] for m in r["messages"]]
        assert roles[-3:] == ["assistant", "tool", "assistant"]
        call = r["messages"][-3]["content"]
        assert call.startswith("<tool_call>\n") and call.endswith("\n</tool_call>")
        name = json.loads(call[len("<tool_call>\n"):-len("\n</tool_call>")])["name"]
        seen = r["messages"][-2]["content"]
        # BM25 over the rehearsal's 200 passages finds nothing for some questions' words.
        assert (seen.strip() == "42" if name == "python"
                else seen.startswith("[1] ") or seen == "No results.")
        assert r["messages"][-1]["content"].startswith("<answer>")
        # The prompt is an RL instance's: its tool subset (offering the called tool) and its
        # preference instruction after the task's system prompt, rendered as a rollout's.
        offered = [t["function"]["name"] for t in r["tools"]]
        assert name in offered and set(offered) <= set(catalog)
        system = r["messages"][0]["content"]
        assert system.startswith(env_system) and len(system) > len(env_system)
        ids, mask = render(r["messages"], r["tools"])
        prompt = chat.render_messages(r["messages"][:-3], tools=r["tools"],
                                      add_generation_prompt=True, enable_thinking=False)
        assert codec.decode(ids[:mask.index(1)]) == prompt
        # The ids SFT trains after are the ids a rollout's sampler continues (not only the
        # same text), and the labels are the two assistant bodies whole, from <tool_call> on.
        start = mask.index(1)
        assert ids[:start] == codec.encode_prompt(chat.prompt_parts(
            r["messages"][:-3], tools=r["tools"], enable_thinking=False))
        assert ids[start] == codec.encode("<tool_call>")[0]
        labelled = codec.decode([t for t, m in zip(ids, mask) if m])
        assert labelled == f"{call}<|im_end|>{r['messages'][-1]['content']}<|im_end|>"
    assert len({tuple(t["function"]["name"] for t in r["tools"]) for r in records}) > 1


def test_bad_rehearsal_configs_are_named(tmp_path):
    args = argparse.Namespace(config=f"{CONFIG}:config_one_h200", set=[], out=str(tmp_path),
                              processes=2, kill_after_step=None, timeout=10)
    with pytest.raises(ValueError, match="rollout.backend='embedded'"):
        rehearse.run(args)
    args = argparse.Namespace(config=f"{CONFIG}:config_rehearsal",
                              set=['rollout.server_urls=("http://127.0.0.1:1",)'],
                              out=str(tmp_path), processes=2, kill_after_step=None, timeout=10)
    with pytest.raises(ValueError, match="1 distinct servers for 2 trainer processes"):
        rehearse.run(args)
    with pytest.raises(ValueError, match="not a loopback URL"):
        rehearse.url_port("http://10.0.0.1:30000")


def test_a_dead_trainer_process_ends_the_rehearsal(tmp_path, monkeypatch):
    """Trainer process 1 exits with 3 while process 0 runs on: the train phase fails naming
    trainer-1 and its log, well before its deadline (a TimeoutError), and the fleet's close
    stops process 0."""
    script = ("import os, sys, time\n"
              "if os.environ['PROCESS_ID'] == '1':\n"
              "    print('process 1 failed: injected')\n"
              "    sys.exit(3)\n"
              "time.sleep(600)\n")
    monkeypatch.setattr(rehearse, "_trainer_argv", lambda spec, sets: [sys.executable, "-c",
                                                                      script])
    fleet = Fleet(tmp_path / "logs")
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="(?s)trainer-1 exited with 3.*process 1 failed"):
            rehearse.train(None, "unused", [], tmp_path, fleet, 2, None, start + 120)
        survivor = fleet.children[0]
    finally:
        fleet.close()
    assert survivor.name == "trainer-0" and survivor.proc.returncode is not None


@pytest.mark.slow  # the server's start and first compile: ~1-2 min on two shared cores
def test_the_llm_tools_get_words_from_a_tiny_expert(monkeypatch):
    """The rehearsal's generalist LLM tools against a real `orchestrax serve --tiny` on their
    port: every reply has text (a greedy random model repeats the header's "\n", which strips
    to nothing), is billed by its tokens, and is the same when asked again (seeded)."""
    from orchestrax import registry

    port = free_port()
    monkeypatch.setenv("ORCHESTRAX_REHEARSAL_PORT", str(port - 10))  # generalists: base + 10
    cfg = load_config(f"{CONFIG}:config_rehearsal")
    served = [t for t in cfg.tools.llms if t.chat.base_url == f"http://127.0.0.1:{port}/v1"]
    assert {t.role for t in served} == {"generalist"} and len(served) == 4
    tools = registry.build_catalog(dataclasses.replace(cfg.tools, llms=tuple(served)))
    query = {"query": "What is 6 times 7?"}

    async def main():
        proc = await start_tiny_server(port)
        try:
            return [[await tools[t.name](query) for t in served] for _ in range(2)]
        finally:
            proc.kill()
            await proc.wait()

    first, again = asyncio.run(main())
    for result, repeat in zip(first, again):
        assert result.observation.strip() and result.observation != "[empty reply]"
        assert result.output_tokens > 0 and result.cost > 0
        assert repeat.observation == result.observation


def test_the_held_out_evals_prompts_are_checked_against_its_context(monkeypatch, shared_data):
    """The eval offers the whole catalog, so its prompts are longer than any training prompt:
    the rehearsal checks them against the context it evaluates at before starting anything."""
    monkeypatch.setenv("ORCHESTRAX_REHEARSAL_PORT", "40000")
    monkeypatch.setenv("ORCHESTRAX_DATA", str(shared_data))
    cfg = load_config(f"{CONFIG}:config_rehearsal")
    longest = rehearse.check_eval_context(cfg)
    assert cfg.rollout.context_tokens < longest < rehearse.EVAL_CONTEXT_TOKENS
    with pytest.raises(ValueError, match=rf"^rehearsal: EVAL_CONTEXT_TOKENS={longest} cannot hold "
                                         rf"the prompt of eval task '.*', {longest} tokens before "
                                         rf"any reply; must be > {longest}$"):
        rehearse.check_eval_context(cfg, context_tokens=longest)


def test_the_train_polls_timeline_parses_each_metrics_line_once(tmp_path, monkeypatch):
    # The train poll reads metrics.jsonl every 0.5 s for the timeline and the kill check: one
    # read, each line parsed once, a line still being written left for the next poll.
    path = tmp_path / "metrics.jsonl"
    parsed = []
    loads = json.loads
    monkeypatch.setattr(rehearse.json, "loads", lambda s: parsed.append(s) or loads(s))
    timeline = rehearse._Timeline()
    assert timeline.rows(path) == []
    a, b = '{"phase": "sft", "step": 10}', '{"phase": "rl", "step": 1}'
    path.write_text(a + "\n" + b[:9])
    assert timeline.rows(path) == [{"phase": "sft", "step": 10}]
    path.write_text(a + "\n" + b + "\n")
    assert timeline.rows(path) == [{"phase": "sft", "step": 10}, {"phase": "rl", "step": 1}]
    assert timeline.rows(path)[-1] == {"phase": "rl", "step": 1}
    assert parsed == [a, b]
    assert list(timeline.seconds) == ["sft 10 logged", "rl 1 logged"]
    timeline.mark("killed and restarted")
    path.write_text(a + "\n" + b.replace("}", ', "again": 1}') + "\n")
    timeline.rows(path)
    assert list(timeline.seconds)[-1] == "rl 1 logged again"
