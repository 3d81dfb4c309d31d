"""tools/describe_llm_tool.py end to end against two loopback OpenAI-shaped servers (the tool
model and the describer), plus the outcome grader."""

import asyncio
import importlib.util
import json
import pathlib

import pytest
from loopback import ScriptedChatServer

from orchestrax.tools.describe import Attempt, contains_answer, describer_prompt, load_tasks
from orchestrax.tools.specs import spec_from_json

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "tools" / "describe_llm_tool.py"


def load_script():
    spec = importlib.util.spec_from_file_location("describe_llm_tool", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_describe_llm_tool_end_to_end(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    # the "tool model" solves even-numbered tasks and fails odd ones
    tasks.write_text("\n".join(json.dumps({"question": f"Task {i}: what is {i} squared?",
                                           "answer": str(i * i)}) for i in range(12)))

    def tool_model(body):
        i = int(body["messages"][-1]["content"].split()[1].rstrip(":"))
        return f"The answer is \\boxed{{{i * i if i % 2 == 0 else -1}}}."

    description = "Solves arithmetic reliably on even inputs; fails on odd ones."
    out_path = tmp_path / "out" / "math.json"

    async def scenario():
        async with ScriptedChatServer(tool_model, usage=(100, 20)) as tool_srv, \
                ScriptedChatServer(lambda _: description) as desc_srv:
            out = await asyncio.to_thread(load_script().main, [
                "--tasks", str(tasks), "--name", "math_72b", "--role", "math",
                "--tool-url", tool_srv.base_url, "--tool-model", "Qwen/Qwen2.5-Math-72B",
                "--price-model", "qwen2.5-math-72b", "--describer-url", desc_srv.base_url,
                "--describer-model", "gpt-5", "--out", str(out_path)])
            return out, tool_srv.requests, desc_srv.requests

    out, tool_seen, desc_seen = asyncio.run(scenario())
    assert len(tool_seen) == 10 and len(desc_seen) == 1
    prompt = desc_seen[0]["messages"][-1]["content"]
    attempts = out["attempts"]
    n_correct = sum(a["correct"] for a in attempts)
    assert prompt.count("### Attempt") == 10 and f"({n_correct}/10 correct)" in prompt
    for a in attempts:
        i = int(a["task"].split()[1].rstrip(":"))
        assert a["correct"] == (i % 2 == 0)
        assert a["cost"] == pytest.approx((100 * 1.20 + 20 * 1.20) / 1e6)
    spec = spec_from_json(json.loads(out_path.read_text())["spec"])
    assert spec.description == description and spec.category == "specialist"
    assert spec.pricing.usd_per_m_input == 1.20


def test_grader_and_task_loading(tmp_path, shared_data):
    assert contains_answer("so \\boxed{42}", "42") and not contains_answer("\\boxed{41} 42", "42")
    assert contains_answer("It was James Madison, in 1812.", "james madison")
    assert not contains_answer("nothing", "")
    tasks = load_tasks(shared_data / "qa" / "bamboogle_125.jsonl")
    assert len(tasks) == 125 and tasks[0][1] == "james madison"
    assert len(load_tasks(shared_data / "qa" / "aime_2024_2025.jsonl")) == 60
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_tasks(bad)
    prompt = describer_prompt("t", [Attempt(task="x", answer="y", output="z" * 2000, correct=False,
                                            cost=0.0, latency=0.0)])
    assert "Attempt 1: WRONG" in prompt and "z" * 800 + " ..." in prompt and "z" * 801 not in prompt


def test_describe_against_the_orchestrax_serve_command(tmp_path, shared_data):
    """The real `orchestrax serve --tiny` process plays both the tool model and the describer:
    a random tiny model writes nonsense, but every byte crosses real HTTP and the real CLI."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "orchestrax.cli", "serve", "--tiny",
                             "--port", "0", "--max-len", "4096", "--max-batch", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        for line in proc.stdout:  # the server prints this line once it is listening
            if "listening on" in line:
                url = line.split("listening on ")[1].strip()
                break
        assert url, "orchestrax serve did not start"
        out_path = tmp_path / "tiny.json"
        out = load_script().main([
            "--tasks", str(shared_data / "qa" / "aime_2024_2025.jsonl"), "--name", "tiny_math",
            "--role", "math", "--tool-url", url, "--tool-model", "orchestrax",
            "--price-model", "qwen2.5-math-72b", "--describer-url", url,
            "--describer-model", "orchestrax", "--max-tokens", "16", "--temperature", "1.0",
            "--n", "3", "--out", str(out_path)])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert len(out["attempts"]) == 3 and out["spec"]["description"]
    assert all(a["cost"] > 0 and not a["output"].startswith("[tool error]") for a in out["attempts"])
    assert spec_from_json(json.loads(out_path.read_text())["spec"]).name == "tiny_math"
