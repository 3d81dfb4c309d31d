"""The eval grid: `--agent direct,subagent --thinking ... --ablate ...` over a QA file with one
scripted token-in/token-out policy that plays orchestrator, sub-agents and the Direct agent."""

import asyncio
import json
import shutil

import pytest

from orchestrax.agent.episode import EpisodeConfig
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.eval.grid import GridPoint, grid_points, grid_table, run_grid, write_grid
from orchestrax.eval.policy import TokenPolicy
from orchestrax.eval.runners import EvalConfig
from orchestrax.eval.subagent_runner import SubagentOptions
from orchestrax.eval.suite import EvalRun
from orchestrax.eval.tasksets import TaskSetOptions
from orchestrax.tools.python_tool import PythonTool
from orchestrax.tools.sandbox import SandboxConfig

NO_THINK = "<think>\n\n</think>\n\n"


def call(name, **args):
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, json.dumps(args))


def scripted_policy(tok, seen):
    def script(n, ids):
        prompt = tok.decode(list(ids))
        seen.append(prompt)
        if "orchestrator of a team" in prompt:
            fresh = ("## Previous steps\n(none)" in prompt if "## Previous steps" in prompt
                     else "<tool_response>" not in prompt)   # memory, or the no-memory replay
            if fresh:
                return "Need arithmetic.\n" + call("coder", task="Compute 6 times 7")
            return "<answer>42</answer>"
        done = "<tool_response>" in prompt   # Direct agent or the Coder
        return "<answer>42</answer>" if done else call("python", code="print(6 * 7)")
    return TokenPolicy(ScriptedSampler(tok, script=script), tok, name="scripted")


def test_grid_points_and_flag_errors():
    pts = grid_points("direct,subagent", "none,subagents,orchestrator,all", "none,no_coder")
    assert [p.label for p in pts] == [
        "direct/none", "direct/orchestrator", "subagent/none", "subagent/none/no_coder",
        "subagent/subagents", "subagent/subagents/no_coder", "subagent/orchestrator",
        "subagent/orchestrator/no_coder", "subagent/all", "subagent/all/no_coder"]
    with pytest.raises(ValueError, match=r"--thinking='some'; allowed: comma-separated none"):
        grid_points("subagent", "some")
    with pytest.raises(ValueError, match=r"--agent='solo'; allowed: comma-separated direct"):
        grid_points("solo", "none")
    with pytest.raises(ValueError, match=r"--ablate='no_planner'"):
        grid_points("subagent", "none", "no_planner")
    with pytest.raises(ValueError, match=r"SubagentOptions.ablation='x'"):
        SubagentOptions().with_ablation("x")


def test_grid_runs_every_point_and_writes_table_and_plots(tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the Coder's sandbox)")
    tok = tiny_qwen3_tokenizer(512)
    data = tmp_path / "arith.jsonl"
    data.write_text(json.dumps({"id": 1, "question": "What is 6 times 7?", "answer": "42"}) + "\n")
    seen: list[str] = []
    policy = scripted_policy(tok, seen)
    run = EvalRun(task_sets=(str(data),), turn_limits=(), progress=False,
                  cfg=EvalConfig(episode=EpisodeConfig(max_turns=4, max_new_tokens=256,
                                                       context_tokens=4096),
                                 seconds_per_token=0.01),
                  options=TaskSetOptions(tools={"python": PythonTool(SandboxConfig())},
                                         preferences=False))
    points = [GridPoint("direct", "none"), GridPoint("subagent", "orchestrator"),
              GridPoint("subagent", "orchestrator", "no_coder"),
              GridPoint("subagent", "orchestrator", "no_memory")]
    payload = asyncio.run(run_grid(policy, run, points))
    rows = {r["point"]: r for r in payload["rows"]}
    assert list(rows) == ["direct/none", "subagent/orchestrator",
                          "subagent/orchestrator/no_coder", "subagent/orchestrator/no_memory"]
    for label in ("direct/none", "subagent/orchestrator", "subagent/orchestrator/no_memory"):
        assert rows[label]["accuracy"] == 1.0, label
    assert rows["direct/none"]["calls_per_task"] == {"python": 1.0}
    assert rows["subagent/orchestrator"]["calls_per_task"] == {"dispatch:coder": 1.0,
                                                               "python": 1.0}
    # Without the Coder the orchestrator's dispatch is refused; python is never called.
    assert "python" not in rows["subagent/orchestrator/no_coder"]["calls_per_task"]
    # Sub-agent mode counts the orchestrator's 2 calls and the Coder's 2; Direct its 2 turns.
    assert rows["subagent/orchestrator"]["turns"] == 2 and rows["direct/none"]["turns"] == 2
    sub_record = payload["records"][f"subagent/orchestrator:{data.stem}"][0]
    # latency: the Coder's sandbox time plus seconds_per_token on every generated token
    assert sub_record["completion_tokens"] > 0 and sub_record["tool_latency_s"] > 0
    assert sub_record["latency_s"] == pytest.approx(
        sub_record["tool_latency_s"] + 0.01 * sub_record["completion_tokens"], rel=1e-6)

    # Thinking placement reached the prompts: Direct "none" closed the think block; the
    # sub-agent-mode orchestrator ("orchestrator") left it open; its Coder closed it.
    direct = [p for p in seen if "orchestrator of a team" not in p and "You are a coder" not in p]
    orch = [p for p in seen if "orchestrator of a team" in p]
    coder = [p for p in seen if "You are a coder" in p]
    assert direct and all(p.endswith(NO_THINK) for p in direct)
    assert orch and not any(p.endswith(NO_THINK) for p in orch)
    assert coder and all(p.endswith(NO_THINK) for p in coder)

    text = grid_table(payload["rows"])
    assert "subagent/orchestrator/no_memory" in text and "dispatch:coder" in text
    written = write_grid(payload, tmp_path / "out")
    assert {p.name for p in written} == {"grid.json", "grid.csv", "grid_accuracy.png",
                                         "grid_tokens.png", "grid_calls.png"}
    assert all(p.stat().st_size > 0 for p in written)
    header, *lines = (tmp_path / "out" / "grid.csv").read_text().splitlines()
    assert len(lines) == 4
    assert header.split(",")[:5] == ["agent", "thinking", "ablation", "task_set", "tasks"]
    calls = [c for c in header.split(",") if c.startswith("calls_")]
    assert header.split(",")[-len(calls) - 1:] == ["total_tokens", *sorted(calls)] and calls


@pytest.mark.slow
def test_cli_grid_on_an_hf_policy(tmp_path, capsys):
    """`orchestrax eval --agent direct,subagent --thinking none,orchestrator` end to end on a
    random tiny Qwen3 (HF directory, embedded sampler): one row per point, grid files written."""
    from orchestrax import models
    from orchestrax.cli import main as cli
    from orchestrax.train.setup import write_model_card

    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    write_model_card(tmp_path / "card", cfg, tok)
    models.save_hf(cfg, models.init_params(cfg, 3), tmp_path / "hf",
                   tokenizer_dir=tmp_path / "card")
    data = tmp_path / "arith.jsonl"
    data.write_text(json.dumps({"id": 1, "question": "1 + 1?", "answer": "2"}) + "\n")
    out = tmp_path / "grid"
    assert cli(["eval", "--policy", str(tmp_path / "hf"), "--tasks", str(data), "--max-turns", "2",
                "--max-new-tokens", "12", "--context-tokens", "2048", "--no-progress",
                "--agent", "direct,subagent", "--thinking", "none,orchestrator",
                "--ablate", "none,no_memory", "--out", str(out)]) == 0
    payload = json.loads((out / "grid.json").read_text())
    assert payload["grid"] == ["direct/none", "direct/orchestrator", "subagent/none",
                               "subagent/none/no_memory", "subagent/orchestrator",
                               "subagent/orchestrator/no_memory"]
    assert [r["tasks"] for r in payload["rows"]] == [1] * 6
    assert all(r["prompt_tokens"] > 0 for r in payload["rows"])
    for name in ("grid.csv", "grid_accuracy.png", "grid_tokens.png"):
        assert (out / name).stat().st_size > 0
    assert "subagent/orchestrator/no_memory" in capsys.readouterr().out


def test_train_and_eval_settings_become_the_system_configs_in_one_place():
    from orchestrax.agent.subagent import OrchestratorConfig, SubAgentConfig
    from orchestrax.train.agent_config import AgentConfig

    budget = dict(max_turns=4, max_new_tokens=64, context_tokens=512)
    train = AgentConfig(mode="subagent", thinking="subagents", subagent_steps=2,
                        subagent_new_tokens=32).with_ablation("no_memory")
    evaluate = SubagentOptions(thinking="subagents", subagent_steps=2,
                               subagent_new_tokens=32).with_ablation("no_memory")
    assert train.configs(**budget) == evaluate.configs(**budget) == (
        OrchestratorConfig(max_turns=4, max_new_tokens=64, turn_tokens=512,
                           enable_thinking=False, memory=False),
        SubAgentConfig(max_steps=2, max_new_tokens=32, context_tokens=512,
                       enable_thinking=True))
    assert SubagentOptions().with_ablation("no_coder").exclude == ("coder",)
