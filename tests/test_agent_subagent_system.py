"""Sub-agent mode with scripted models and real tools (BM25 local search, the bwrap Python
sandbox, the file reader): isolation of sub-agents, memory contents, the orchestrator's prompts,
failures as records, thinking placement, accounting."""

import asyncio
import json
import shutil

import pytest

from orchestrax.agent.codec import Codec
from orchestrax.agent.subagent import (FileReadTool, OrchestratorConfig, SubAgentConfig,
                                       build_subagents, run_query, thinking_flags)
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.data.records import Task
from orchestrax.tools.tool import Pricing
from orchestrax.tools.bm25 import BM25
from orchestrax.tools.local_search import LocalSearchTool
from orchestrax.tools.python_tool import PythonTool
from orchestrax.tools.sandbox import SandboxConfig
from orchestrax.tools.search_index import Passage, SearchIndex

NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def call(name, **args):
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, json.dumps(args))


class Recorder:
    """A ScriptedSampler whose script sees the decoded prompt; keeps every prompt it saw."""

    def __init__(self, tok, script):
        self.prompts: list[str] = []

        def wrapped(n, ids):
            text = tok.decode(list(ids))
            self.prompts.append(text)
            return script(len(self.prompts) - 1, text)

        self.sampler = ScriptedSampler(tok, script=wrapped)

    async def generate(self, requests):
        return await self.sampler.generate(requests)


def subagent_script(n, prompt):
    """Each role: first a tool call, then (once a tool response is in its prompt) an answer
    tagged with a marker that names the role."""
    done = "<tool_response>" in prompt
    if "You are a web searcher" in prompt:
        return "<answer>Y wrote X [RESULT-web]</answer>" if done else call(
            "local_search", query="author of X")
    if "You are a coder" in prompt:
        return "<answer>42 [RESULT-coder]</answer>" if done else call(
            "python", code="print('RAWCODE', 6 * 7)")
    if "You are a file inspector" in prompt:
        return "<answer>3 rows [RESULT-file]</answer>" if done else call(
            "read_file", path="table.csv")
    raise AssertionError(f"unexpected sub-agent prompt: {prompt[:200]}")


ORCH_TURNS = [
    "Plan: find the author, compute, then read the table.\n" + call("web_searcher",
                                                                    task="Find the author of X"),
    call("coder", task="Compute 6 times 7"),
    call("file_inspector", task="How many rows has table.csv?"),
    "<answer>Y, 42, 3</answer>",
]


@pytest.fixture()
def tok():
    return tiny_qwen3_tokenizer(512)


@pytest.fixture()
def tools(tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the Coder's sandbox)")
    passages = [Passage(pid="1", title="X (novel)", text="RAWPASSAGE X is a novel by Y."),
                Passage(pid="2", title="Z", text="Z is a river.")]
    index = SearchIndex(passages, bm25=BM25.build([p.text for p in passages]))
    (tmp_path / "table.csv").write_text("name,n\nRAWCSV,1\nb,2\nc,3\n")
    return [LocalSearchTool(index), PythonTool(SandboxConfig()),
            FileReadTool([tmp_path / "table.csv"])]


def run(tok, tools, orch_script, sub_script=subagent_script, *, thinking="none",
        orch_cfg=OrchestratorConfig(), sub_cfg=SubAgentConfig(), exclude=()):
    orch_think, sub_think = thinking_flags(thinking)
    codec = Codec(tok)
    orch = Recorder(tok, orch_script)
    sub = Recorder(tok, sub_script)
    agents = build_subagents(tools, sub, codec, SubAgentConfig(
        **{**sub_cfg.__dict__, "enable_thinking": sub_think}), exclude=exclude)
    task = Task(task_id="q/1", messages=({"role": "system", "content": "Answer in <answer>."},
                                         {"role": "user", "content": "Who wrote X? 6*7? Rows?"}))
    cfg = OrchestratorConfig(**{**orch_cfg.__dict__, "enable_thinking": orch_think})
    rollout = asyncio.run(run_query(task, agents, orch, codec, cfg))
    return rollout, orch.prompts, sub.prompts


def test_full_query_isolation_memory_and_prompts(tok, tools):
    rollout, orch_prompts, sub_prompts = run(tok, tools, lambda n, p: ORCH_TURNS[n])
    assert rollout.end_reason == "answer" and rollout.final_answer == "Y, 42, 3"
    assert len(rollout.samples) == len(orch_prompts) == 4

    # No message passes between sub-agents: a sub-agent's prompt holds its system prompt and
    # the orchestrator's sub-goal (plus its own tool responses), never another one's output.
    markers = {"web": "RESULT-web", "coder": "RESULT-coder", "file": "RESULT-file"}
    raws = ("RAWPASSAGE", "RAWCODE", "RAWCSV")
    assert len(sub_prompts) == 6
    for prompt in sub_prompts:
        assert not any(m in prompt for m in markers.values())
        assert prompt.count("You are a") == 1   # exactly one role's system prompt
    # Each sub-agent's raw tool output reached only that sub-agent.
    for raw, role in zip(raws, ("web searcher", "coder", "file inspector")):
        assert all(role in p for p in sub_prompts if raw in p)

    # Memory sections, as specified.
    m = rollout.memory
    assert m.query_analysis == "Plan: find the author, compute, then read the table."
    assert [(s.agent, s.sub_goal, s.ok) for s in m.steps] == [
        ("web_searcher", "Find the author of X", True), ("coder", "Compute 6 times 7", True),
        ("file_inspector", "How many rows has table.csv?", True)]
    assert [r.result for r in m.tool_results] == ["Y wrote X [RESULT-web]", "42 [RESULT-coder]",
                                                  "3 rows [RESULT-file]"]
    assert [g.status for g in m.sub_goals] == ["done"] * 3

    # The prompt at turn k is the fresh two-message prompt: the compact records of turns < k and
    # none of their raw tool outputs.
    order = list(markers.values())
    for k, prompt in enumerate(orch_prompts):
        assert prompt.count("<|im_start|>") == 3   # system, user, generation prompt
        for j, marker in enumerate(order):
            assert (marker in prompt) == (j < k), (k, marker)
        assert not any(raw in prompt for raw in raws)
        assert "Who wrote X? 6*7? Rows?" in prompt
    assert "Plan: find the author" in orch_prompts[1]   # the analysis, via memory
    assert rollout.samples[2].prompt_text == orch_prompts[2]

    # Accounting: every model call, tools per name, dispatches, turns.
    acc = rollout.account
    assert acc.turns == 4 and len(acc.model_calls) == 4 + 6
    assert dict(acc.dispatches) == {"web_searcher": 1, "coder": 1, "file_inspector": 1}
    assert acc.calls_per_tool() == {"local_search": 1, "python": 1, "read_file": 1}
    enc = lambda text: len(tok.encode(text, add_special_tokens=False))  # noqa: E731
    assert acc.tokens_by_role()["orchestrator"][0] == sum(enc(p) for p in orch_prompts)
    assert acc.prompt_tokens == sum(enc(p) for p in orch_prompts + sub_prompts)
    assert acc.completion_tokens == sum(len(s.output_ids) for s in rollout.samples) + sum(
        t.tokens_out for r in rollout.reports for t in r.trajectory.turns)
    assert acc.latency_s > 0
    # The verifier's view: the sub-agents' tool calls hang under the orchestrator turns.
    assert [len(t.tool_calls) for t in rollout.turns] == [1, 1, 1, 0]


def test_subagent_failures_become_records(tok, tools):
    def broken_sub(n, prompt):
        if "You are a web searcher" in prompt:
            raise ConnectionError("sub-agent server down")
        if "You are a coder" in prompt:   # never answers: runs out of steps
            return call("python", code="print(1)")
        return subagent_script(n, prompt)

    turns = [call("web_searcher", task="Find the author of X"),
             call("coder", task="Compute 6 times 7"), "<answer>unknown</answer>"]
    rollout, orch_prompts, _ = run(tok, tools, lambda n, p: turns[n], broken_sub,
                                   sub_cfg=SubAgentConfig(max_steps=2))
    assert rollout.end_reason == "answer"
    web, coder = rollout.reports
    assert not web.ok and "sub-agent failed" in web.result and "server down" in web.result
    assert not coder.ok and coder.result.startswith("no answer (max_turns)")
    assert "-> FAILED: sub-agent failed" in orch_prompts[1]
    assert "-> FAILED: no answer (max_turns)" in orch_prompts[2]
    assert [g.status for g in rollout.memory.sub_goals] == ["failed", "failed"]
    assert rollout.memory.tool_results == []


def test_malformed_dispatches_are_read_back_then_end_the_query(tok, tools):
    turns = [call("video_analysis", task="watch it"),
             call("coder", task="a") + call("coder", task="b"),
             call("coder", task="")]
    rollout, orch_prompts, sub_prompts = run(tok, tools, lambda n, p: turns[n])
    assert rollout.end_reason == "format_errors" and sub_prompts == []
    assert rollout.format_errors == 3
    assert "unknown tool 'video_analysis'" in orch_prompts[1]
    assert "2 calls in one turn" in orch_prompts[2]


@pytest.mark.parametrize("thinking", ["none", "subagents", "orchestrator", "all"])
def test_thinking_switch_changes_exactly_the_roles_it_names(tok, tools, thinking):
    _, orch_prompts, sub_prompts = run(tok, tools, lambda n, p: ORCH_TURNS[n], thinking=thinking)
    orch_thinks, sub_thinks = {"none": (False, False), "subagents": (False, True),
                               "orchestrator": (True, False), "all": (True, True)}[thinking]
    for p in orch_prompts:
        assert p.endswith(NO_THINK) != orch_thinks
        assert p.endswith("<|im_start|>assistant\n") == orch_thinks
    for p in sub_prompts:
        assert p.endswith(NO_THINK) != sub_thinks
        assert p.endswith("<|im_start|>assistant\n") == sub_thinks


def test_memory_ablation_replays_history_and_excluded_roles_are_not_offered(tok, tools):
    turns = [call("web_searcher", task="Find the author of X"), "<answer>Y</answer>"]
    rollout, orch_prompts, _ = run(tok, tools, lambda n, p: turns[n],
                                   orch_cfg=OrchestratorConfig(memory=False), exclude=("coder",))
    assert rollout.final_answer == "Y"
    assert "## Previous steps" not in orch_prompts[1]
    assert "<tool_response>\nY wrote X [RESULT-web]\n</tool_response>" in orch_prompts[1]
    assert '"name": "coder"' not in orch_prompts[0] and '"name": "web_searcher"' in orch_prompts[0]


def test_priced_subagents_cost_their_tokens(tok, tools):
    price = Pricing(kind="per_token", usd_per_m_input=1e6, usd_per_m_output=2e6)  # $1 / $2 per tok
    turns = [call("file_inspector", task="Rows?"), "<answer>3</answer>"]
    rollout, _, _ = run(tok, tools, lambda n, p: turns[n], sub_cfg=SubAgentConfig(pricing=price))
    p, c = rollout.account.tokens_by_role()["file_inspector"]
    assert rollout.cost == pytest.approx(1.0 * p + 2.0 * c)


def test_bad_configuration_names_the_field(tok, tools):
    with pytest.raises(ValueError, match="thinking='some'; allowed: none, subagents"):
        thinking_flags("some")
    with pytest.raises(ValueError, match=r"exclude=\['searcher'\]: unknown sub-agents"):
        build_subagents(tools, None, Codec(tok), exclude=("searcher",))
    with pytest.raises(ValueError, match="OrchestratorConfig.turn_tokens=0"):
        OrchestratorConfig(turn_tokens=0)


def test_tools_no_subagent_holds_are_left_out_or_refused(tools):
    import dataclasses

    from orchestrax.agent.subagent import assign_tools, holdable
    stranger = FileReadTool([])
    stranger.spec = dataclasses.replace(stranger.spec, name="llm_expert")
    assert holdable([*tools, stranger]) == tools
    assert {k: [t.spec.name for t in v] for k, v in assign_tools(tools).items()} == {
        "web_searcher": ["local_search"], "coder": ["python"], "file_inspector": ["read_file"]}
    with pytest.raises(ValueError, match="tool 'llm_expert' belongs to no sub-agent"):
        assign_tools([stranger])


def test_a_crashing_subagent_returns_a_failed_report(tok):
    from orchestrax.agent.subagent import ROLES, SubAgent
    agent = SubAgent(ROLES["coder"], ScriptedSampler(tok, ["x"]), codec=None, tools=[])
    report = asyncio.run(agent.run("Compute 1 + 1", rid="t"))
    assert not report.ok and report.result.startswith("sub-agent crashed: ")
    assert report.trajectory is None and report.model_calls == ()


class Unreliable(ScriptedSampler):
    """Raises for the first `failures` calls; with `short_logprobs`, answers one logprob short."""

    def __init__(self, tok, *, failures=0, short_logprobs=False):
        super().__init__(tok, ["<answer>4</answer>"])
        self.failures, self.short_logprobs, self.attempts = failures, short_logprobs, 0

    async def generate(self, requests):
        self.attempts += 1
        if self.attempts <= self.failures:
            raise ConnectionError("server went away")
        out = await super().generate(requests)
        if self.short_logprobs:
            import dataclasses
            out = [dataclasses.replace(r, logprobs=r.logprobs[:-1]) for r in out]
        return out


def test_orchestrator_sampler_failures_are_retried_then_end_the_query(tok):
    """The same per-turn sampling as a Direct episode (agent.episode.sample_turn): a failed call
    is retried, `sampler_attempts` failures or a sampler breaking the one-logprob-per-id
    contract end the query with an error and no training sample."""
    task = Task(task_id="q/2", messages=({"role": "user", "content": "2+2?"},))
    cfg = OrchestratorConfig(enable_thinking=False, sampler_attempts=2, sampler_backoff_s=0.0)

    def query(sampler):
        return asyncio.run(run_query(task, {}, sampler, Codec(tok), cfg)), sampler.attempts

    (ok, calls) = query(Unreliable(tok, failures=1))
    assert (ok.end_reason, ok.final_answer, calls, len(ok.samples)) == ("answer", "4", 2, 1)
    (dead, calls) = query(Unreliable(tok, failures=2))
    assert (dead.end_reason, calls, dead.samples) == ("error", 2, [])
    assert dead.trajectory.error == "sampler failed: ConnectionError: server went away (2 attempts)"
    (short, calls) = query(Unreliable(tok, short_logprobs=True))
    assert (short.end_reason, calls, short.samples) == ("error", 1, [])
    assert "output ids but" in short.trajectory.error
    with pytest.raises(ValueError, match="OrchestratorConfig.sampler_backoff_s=-1"):
        OrchestratorConfig(sampler_backoff_s=-1)


def test_query_tools_keep_the_tasks_own_then_shared_then_attachments(tmp_path):
    from orchestrax.agent.subagent import query_tools
    own_file = FileReadTool([tmp_path / "own.txt"])
    stranger = FileReadTool([], name="llm_expert")     # no sub-agent holds it
    search = LocalSearchTool(SearchIndex([Passage(pid="1", title="t", text="x")],
                                         bm25=BM25.build(["x"])))
    plain = Task(task_id="a", messages=({"role": "user", "content": "q"},))
    assert query_tools(plain, [own_file, stranger], [FileReadTool([]), search]) == [own_file,
                                                                                     search]
    attached = Task(task_id="b", messages=plain.messages,
                    metadata={"attachments": [str(tmp_path / "t.csv")]})
    got = query_tools(attached, [stranger], [search])
    assert got[0] is search and [t.spec.name for t in got] == ["local_search", "read_file"]
    assert list(got[1].files.values()) == [tmp_path / "t.csv"]


def test_a_first_prompt_that_fills_the_turn_budget_is_an_error_not_a_zero(tok):
    task = Task(task_id="q/3", messages=({"role": "user", "content": "2+2?"},))
    cfg = OrchestratorConfig(enable_thinking=False, turn_tokens=8)
    sampler = Unreliable(tok, failures=0)
    rollout = asyncio.run(run_query(task, {}, sampler, Codec(tok), cfg))
    assert (rollout.end_reason, rollout.samples, sampler.attempts) == ("error", [], 0)
    assert "leaves no room in turn_tokens=8" in rollout.trajectory.error
