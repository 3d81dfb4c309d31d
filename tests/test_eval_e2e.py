"""`orchestrax eval` end to end: an OpenAI-compatible policy on a loopback server (numbers by
hand), and the CLI against a real `orchestrax serve --tiny` process through both its SGLang and
its OpenAI-compatible APIs, and on a training run's Orbax checkpoint."""

import asyncio
import json
import socket
import subprocess
import sys

import pytest

from orchestrax.agent.episode import EpisodeConfig
from orchestrax.cli import main as cli
from orchestrax.envs.routing import RoutingConfig
from loopback import ScriptedChatServer
from orchestrax.eval.core import evaluate
from orchestrax.eval.scores import summarize
from orchestrax.eval.policy import ChatPolicy
from orchestrax.eval.runners import EvalConfig
from orchestrax.eval.tasksets import TaskSetOptions, load_task_set
from orchestrax.tools.tool import Pricing
from orchestrax.tools.chat_client import ChatEndpoint

CHEAP = '<tool_call>\n{"name": "lookup_cheap", "arguments": {}}\n</tool_call>'
ANSWER = "<answer>done</answer>"


def test_chat_policy_by_hand():
    """ScriptedChatServer bills len(reply) // 4 completion tokens; the policy's own tokens are
    priced at $1 per completion token, so its cost is exactly that count in dollars."""
    def respond(body):
        last = body["messages"][-1]["content"]
        return ANSWER if "<tool_response>" in last else CHEAP

    async def go():
        async with ScriptedChatServer(respond) as srv:
            policy = ChatPolicy(ChatEndpoint(base_url=srv.base_url, model="m"))
            ts = load_task_set("routing", TaskSetOptions(routing=RoutingConfig(num_eval=2)))
            cfg = EvalConfig(episode=EpisodeConfig(enable_thinking=False), seconds_per_token=1.0,
                             policy_pricing=Pricing(kind="per_token", usd_per_m_output=1e6))
            try:
                return await evaluate(ts, policy, cfg, progress=False), srv.requests
            finally:
                await policy.aclose()

    recs, requests = asyncio.run(go())
    s = summarize(recs)
    out_tokens = len(CHEAP) // 4 + len(ANSWER) // 4
    assert s["accuracy"] == 1.0 and s["turns"] == 2 and s["completion_tokens"] == out_tokens
    assert s["calls_per_task"] == {"lookup_cheap": 1.0}
    assert s["cents_per_task"] == pytest.approx(100 * (0.001 + out_tokens))
    assert s["minutes_per_task"] == pytest.approx((4.0 + out_tokens) / 60)
    assert len(requests) == 4
    first = requests[0]["messages"]
    assert first[0]["role"] == "system" and "# Tools" in first[0]["content"]
    assert '"name": "lookup_fast"' in first[0]["content"]
    assert "Preference: low" in first[1]["content"]
    second = [r for r in requests if len(r["messages"]) == 4][0]["messages"]
    assert second[2] == {"role": "assistant", "content": CHEAP}
    assert second[3]["role"] == "user" and second[3]["content"].startswith("<tool_response>\nDone:")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrax.cli", "serve", "--tiny", "--port",
                             str(port), "--max-len", "2048", "--max-batch", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening" in line, line
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _check_payload(out, tasks=2):
    payload = json.loads((out / "eval.json").read_text())
    rows = {r["turn_limit"]: r for r in payload["rows"]}
    assert sorted(rows) == [1, 2] and all(r["tasks"] == tasks for r in rows.values())
    recs = payload["records"]["routing"]
    assert len(recs) == tasks
    for r in recs:
        assert 1 <= r["turns"] <= 2 and r["prompt_tokens"] > 0
        assert 1 <= r["completion_tokens"] <= 2 * 16
        assert r["latency_s"] == pytest.approx(r["tool_latency_s"] + r["policy_latency_s"])
        assert r["policy_latency_s"] > 0
    assert rows[1]["turns"] <= rows[2]["turns"]
    assert rows[2]["accuracy"] == sum(r["outcome"] for r in recs) / tasks
    for name in ("eval.csv", "accuracy_vs_cost.png", "calls_per_tool.png"):
        assert (out / name).stat().st_size > 0
    return payload


COMMON = ["--tasks", "routing", "--limit", "2", "--max-turns", "2", "--turn-sweep", "1",
          "--max-new-tokens", "16", "--context-tokens", "2048", "--no-progress", "--no-thinking"]


@pytest.mark.slow
def test_cli_against_orchestrax_serve_tiny(tiny_server, tmp_path, capsys):
    assert cli(["eval", "--policy", f"sglang:{tiny_server}", "--tokenizer", "tiny",
                "--out", str(tmp_path / "sglang"), *COMMON]) == 0
    _check_payload(tmp_path / "sglang")
    assert cli(["eval", "--policy", f"openai:{tiny_server}/v1", "--model", "orchestrax",
                "--out", str(tmp_path / "openai"), *COMMON]) == 0
    payload = _check_payload(tmp_path / "openai")
    assert payload["policy"] == "orchestrax"
    printed = capsys.readouterr().out
    assert "routing" in printed and "cents/task" in printed


@pytest.mark.slow
def test_cli_on_a_run_checkpoint_and_its_hf_export(tmp_path):
    """A training run dir (model/config.json + Orbax checkpoints/) and an HF export of the same
    params give the same greedy episodes on the embedded sampler."""
    from orchestrax import models
    from orchestrax.agent.scripted import tiny_qwen3_tokenizer
    from orchestrax.train.checkpoint import Checkpointer
    from orchestrax.train.setup import write_model_card

    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    params = models.init_params(cfg, 7)
    run = tmp_path / "run"
    write_model_card(run / "model", cfg, tok)
    ckpt = Checkpointer(run / "checkpoints", every=1)
    ckpt.maybe_save(3, {"params": params}, {"phase": "rl", "step": 3}, force=True)
    ckpt.close()
    models.save_hf(cfg, params, tmp_path / "hf", tokenizer_dir=run / "model")
    outs = []
    for name, policy in (("run", run), ("hf", tmp_path / "hf")):
        assert cli(["eval", "--policy", str(policy), "--out", str(tmp_path / f"out_{name}"),
                    *COMMON]) == 0
        outs.append(_check_payload(tmp_path / f"out_{name}"))
    keys = ("task_id", "outcome", "turns", "completion_tokens", "prompt_tokens", "calls")
    assert ([{k: r[k] for k in keys} for r in outs[0]["records"]["routing"]]
            == [{k: r[k] for k in keys} for r in outs[1]["records"]["routing"]])
    # Params held in bf16 (cast as read): the same run evaluates end to end.
    assert cli(["eval", "--policy", str(run), "--param-dtype", "bfloat16",
                "--out", str(tmp_path / "out_bf16"), *COMMON]) == 0
    _check_payload(tmp_path / "out_bf16")


def test_cli_refuses_an_ambiguous_url(capsys):
    args = ["eval", "--policy", "http://x", "--tasks", "routing", "--no-progress"]
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert "sglang:http://x" in err and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(ValueError, match="sglang:http://x"):
        cli(args + ["--debug"])


def test_failed_requests_are_errors_and_fail_the_command(tmp_path, capsys):
    """A dead server: every episode an error, counted per task set; exit 1 past
    --max-error-rate (default 0), 0 when the user allows them."""
    dead = f"sglang:http://127.0.0.1:{_free_port()}"
    args = ["eval", "--policy", dead, "--tokenizer", "tiny", "--tasks", "routing", "--limit", "2",
            "--no-progress", "--out", str(tmp_path)]
    assert cli(args) == 1
    out, err = capsys.readouterr()
    assert "routing had 100% failed episodes" in err and "Cannot connect" in err
    lines = out.splitlines()
    head = next(x for x in lines if x.startswith("task set"))
    routing = next(x for x in lines if x.startswith("routing "))
    assert head.split()[-1] == "errors" and routing.split()[-1] == "2"
    assert "eval defaults (the policy carries no train_config.json)" in out
    assert cli(args + ["--max-error-rate", "1"]) == 0


@pytest.mark.slow
def test_cli_takes_its_settings_from_the_run_and_says_so(tmp_path, capsys):
    from agent_fixtures import write_tiny_run
    from orchestrax.train.train_config import RolloutConfig

    run = tmp_path / "run"
    write_tiny_run(run, name="t", env=RoutingConfig(num_eval=2),
                   rollout=RolloutConfig(max_new_tokens=12, max_turns=1, context_tokens=1024,
                                         enable_thinking=False))
    assert cli(["eval", "--policy", str(run), "--tasks", "routing", "--no-progress",
                "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert (f"eval settings: enable_thinking=False max_new_tokens=12 max_turns=1 "
            f"context_tokens=1024 temperature=0.0 samples=1 seed=0 seconds_per_token=0.03 "
            f"(from {run / 'train_config.json'}, flags override)") in out
    assert "eval seeds: the run's eval at checkpoint step 1 (seed 0, 1 sample(s)" in out
    payload = json.loads((tmp_path / "a" / "eval.json").read_text())
    assert payload["main_turn_limit"] == 1 and [r["turn_limit"] for r in payload["rows"]] == [1]
    recs = payload["records"]["routing"]
    assert len(recs) == 2 and all(r["turns"] == 1 and r["completion_tokens"] <= 12 for r in recs)
    assert cli(["eval", "--policy", str(run), "--tasks", "routing", "--no-progress",
                "--max-turns", "2", "--out", str(tmp_path / "b")]) == 0
    assert "warning: --max-turns 2 differs from training (1)" in capsys.readouterr().out


def test_an_embedded_policy_gets_no_more_slots_than_episodes_in_flight(tmp_path, monkeypatch):
    """The continuous engine holds context_tokens positions a slot: eval asks for the run's
    sampler_max_batch slots, fewer under a smaller --max-in-flight."""
    from agent_fixtures import write_tiny_run
    from orchestrax.eval import eval_command
    from orchestrax.train.train_config import RolloutConfig

    asked = []

    class Stop(Exception):
        """Ends the command before any episode runs."""

    def load_policy(spec, **kw):
        asked.append((kw["max_batch"], kw["max_len"]))
        raise Stop

    monkeypatch.setattr(eval_command, "load_policy", load_policy)
    run = tmp_path / "run"
    write_tiny_run(run, name="t", env=RoutingConfig(num_eval=2),
                   rollout=RolloutConfig(context_tokens=1024, sampler_max_batch=16))
    for extra in ([], ["--max-in-flight", "4"], ["--max-in-flight", "100"]):
        with pytest.raises(Stop):
            cli(["eval", "--policy", str(run), "--tasks", "routing", "--no-progress",
                 "--out", str(tmp_path / "out"), *extra])
    assert asked == [(16, 1024), (4, 1024), (16, 1024)]


@pytest.fixture
def chat_servers():
    """Two loopback OpenAI-compatible servers on a background event loop (the CLI runs its
    own): `expert` (an LLM tool) and `policy` (a scripted orchestrator)."""
    import threading

    def expert(body):
        return "Paris"

    def policy(body):
        last = body["messages"][-1]["content"]
        if last.startswith("<tool_response>\nParis"):
            return "<answer>Paris</answer>"
        return ('<tool_call>\n{"name": "expert", "arguments": {"query": "Capital of France?"}}'
                "\n</tool_call>")

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = [ScriptedChatServer(expert), ScriptedChatServer(policy)]
    for s in servers:
        asyncio.run_coroutine_threadsafe(s.__aenter__(), loop).result(30)
    try:
        yield servers
    finally:
        for s in servers:
            asyncio.run_coroutine_threadsafe(s.__aexit__(None, None, None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_cli_prices_llm_tool_tokens_by_the_config_sheet(tmp_path, chat_servers):
    """A QA run whose tool set comes from a TrainConfig: one LLM tool (priced as gpt-5-mini).
    The fixture server bills (prompt chars // 4) input and (reply chars // 4) output tokens."""
    from orchestrax.tools.llm_tool import ROLES
    from orchestrax.tools.sheets import load_sheet

    expert, policy = chat_servers
    qa = tmp_path / "capitals.jsonl"
    qa.write_text('{"id": 1, "question": "Capital of France?", "answer": "Paris"}\n'
                  '{"id": 2, "question": "Where is the Louvre?", "answer": "Paris"}\n')
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f'''
from orchestrax import models
from orchestrax.envs.qa import QAConfig
from orchestrax.tools.catalog import CatalogConfig
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.llm_tool import LLMToolConfig
from orchestrax.train.train_config import TrainConfig

def config():
    expert = LLMToolConfig(name="expert", role="generalist",
                           chat=ChatEndpoint(base_url="{expert.base_url}", model="gpt-5-mini"))
    return TrainConfig(name="t", model=models.tiny_config(), env=QAConfig(path="{qa}"),
                       tools=CatalogConfig(python=None, web=None, llms=(expert,)))
''')
    tokens_in = (len(ROLES["generalist"].system) + len("Capital of France?")) // 4
    tokens_out = len("Paris") // 4
    for sheet in ("train_list", "eval_heldout"):
        out = tmp_path / sheet
        assert cli(["eval", "--policy", f"openai:{policy.base_url}", "--model", "m", "--tasks",
                    str(qa), "--train-config", str(cfg), "--sheet", sheet, "--turn-sweep", "",
                    "--seconds-per-token", "0", "--no-progress", "--out", str(out)]) == 0
        (row,) = json.loads((out / "eval.json").read_text())["rows"]
        price = load_sheet(sheet).models["gpt-5-mini"]
        usd = (price.usd_per_m_input * tokens_in + price.usd_per_m_output * tokens_out) / 1e6
        assert row["accuracy"] == 1.0 and row["calls_per_task"] == {"expert": 1.0}
        assert row["cents_per_task"] == pytest.approx(100 * usd, rel=1e-6)
        assert row["tool_input_tokens"] == tokens_in and row["tool_output_tokens"] == tokens_out
        # The expert's latency is its sheet figure (5 s a call: the sheet gives no per-token
        # speed), never its measured loopback time; generation is free at --seconds-per-token 0.
        assert row["minutes_per_task"] == pytest.approx(5 / 60)
        recs = json.loads((out / "eval.json").read_text())["records"]["capitals"]
        assert all(len(r["preference"]) == 1 + 3 for r in recs)
    assert len(expert.requests) == 4


def test_eval_takes_the_runs_eval_sampling_and_says_so(tmp_path):
    """A run that evaluated 3 samples per task at T=0.7 with seed 5 over 2 of its eval tasks (the
    demo's kind of settings): eval follows all of it; a flag overrides with a warning. The run
    is one from before the one embedded engine (its config names the static batcher): that
    record is ignored, its policy runs on the continuous engine."""
    from agent_fixtures import write_tiny_run
    from orchestrax.eval.eval_command import EvalCommand, resolve_settings
    from orchestrax.train.train_config import RolloutConfig

    run = tmp_path / "run"
    write_tiny_run(run, name="t", env=RoutingConfig(num_eval=4),
                   rollout=RolloutConfig(seconds_per_token=0.05),
                   eval_samples=3, eval_temperature=0.7, eval_tasks=2)
    saved = json.loads((run / "train_config.json").read_text())   # the fixture's seed is the
    saved["rollout"]["engine"] = "static"
    (run / "train_config.json").write_text(json.dumps(saved | {"seed": 5}))  # model's: set the run's
    used, notes = resolve_settings(EvalCommand(policy=str(run), tasks=("routing",)))
    assert {k: used[k] for k in ("temperature", "samples", "seed", "eval_tasks",
                                 "seconds_per_token")} == {
        "temperature": 0.7, "samples": 3, "seed": 5, "eval_tasks": 2, "seconds_per_token": 0.05}
    assert "engine" not in used
    assert notes[0].startswith("eval settings: enable_thinking=True max_new_tokens=2048 "
                               "max_turns=50 context_tokens=24000 temperature=0.7 samples=3 "
                               "seed=5 seconds_per_token=0.05 eval_tasks=2 ")
    assert len(notes) == 1
    used, notes = resolve_settings(EvalCommand(policy=str(run), tasks=("routing",), samples=1,
                                               seed=0))
    assert used["samples"] == 1 and used["seed"] == 0
    assert "warning: --samples 1 differs from training (3)" in notes
    assert "warning: --seed 0 differs from training (5)" in notes


@pytest.mark.slow
def test_eval_of_a_runs_checkpoint_scores_its_last_eval_row(tmp_path, capsys):
    """A real training run (one GRPO step from a random tiny Qwen3 that stops early at random;
    eval rows at steps 0 and 1 of 3 of its 4 routing eval tasks x 2 samples at T=0.7), then
    `orchestrax eval` on its out_dir with no flags: accuracy, cost, latency and the env's stats
    equal the last eval row. Episode lengths differ with every sampled token, so the latency
    (0.03 s a generated token) holds only if every episode drew the run's own seeds."""
    from agent_fixtures import write_tiny_run
    from orchestrax.rl import GRPOConfig
    from orchestrax.train.train_config import RolloutConfig, TrainConfig
    from orchestrax.train.loop import train

    rollout = RolloutConfig(group_size=2, tasks_per_step=4, max_new_tokens=32, max_turns=2,
                            context_tokens=1024, enable_thinking=False, temperature=0.7)
    model = write_tiny_run(tmp_path / "init", name="init", seed=0, stop_scale=12.0,
                           env=RoutingConfig(num_train=4, num_eval=4),
                           rollout=RolloutConfig())
    run = tmp_path / "run"
    cfg = TrainConfig(name="t", out_dir=str(run), model=model, init_from=str(tmp_path / "init"),
                      grpo=GRPOConfig(num_minibatches=1, temperature=0.7), rollout=rollout,
                      env=RoutingConfig(num_train=8, num_eval=4), steps=1, eval_every=1,
                      eval_samples=2, eval_temperature=0.7, eval_tasks=3, seed=3)
    rows = [r for r in train(cfg) if r["phase"] == "eval"]
    assert [r["step"] for r in rows] == [0, 1]
    last = rows[-1]
    assert cli(["eval", "--policy", str(run), "--tasks", "routing", "--no-progress",
                "--out", str(tmp_path / "eval")]) == 0
    out = capsys.readouterr().out
    assert "eval seeds: the run's eval at checkpoint step 1 (seed 3, 2 sample(s) per task)" in out
    payload = json.loads((tmp_path / "eval" / "eval.json").read_text())
    (row,) = payload["rows"]
    lengths = [r["completion_tokens"] for r in payload["records"]["routing"]]
    assert (row["tasks"], row["episodes"]) == (3, 3 * 2)
    assert len(set(lengths)) > 2   # the lengths do vary
    assert row["accuracy"] == pytest.approx(last["rollout/accuracy"], abs=1e-7)
    assert row["cents_per_task"] / 100 == pytest.approx(last["rollout/cost_mean"], rel=1e-9)
    assert row["minutes_per_task"] * 60 == pytest.approx(last["rollout/latency_mean"], rel=1e-9)
    assert row["env"] == {k[4:]: v for k, v in last.items() if k.startswith("env/")}
    # The step-0 row drew other seeds: its latency is not what this checkpoint scores.
    assert rows[0]["rollout/latency_mean"] != pytest.approx(last["rollout/latency_mean"])
