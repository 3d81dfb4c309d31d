"""Every command line in README.md and BUILD.md code blocks is checked against the real code:
`orchestrax ...` lines are parsed by the real CLI parser; `python tools/...`, `python bench/...`
and `python -m` lines name a file or module that exists, and every `--flag` they pass appears in
that file's argument parser. The lines that can run here cheaply run as pasted (`RUN_HERE`, from
a scratch directory holding a tiny run where the line names one); the eval lines with a
placeholder policy or host run with it filled (`RUN_FILLED`: the tiny run, its export, a real
`orchestrax serve` of it) and a small budget appended; every other line is listed in `NOT_RUN`
with why, and a new line in the docs must join one of the three."""

import importlib.util
import json
import pathlib
import re
import shlex

import pytest

from orchestrax.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _commands() -> list[tuple[str, str]]:
    out = []
    for doc in ("README.md", "BUILD.md"):
        for block in re.findall(r"```[^\n]*\n(.*?)```", (ROOT / doc).read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for seg in line.split(";"):
                    # usage notation: [optional parts] dropped, "..." (more of the same) a value
                    seg = re.sub(r"\[[^\]]*\]", " ", seg)
                    seg = re.sub(r"(?<!\S)\.\.\.(?!\S)", "MORE", seg)
                    plain = [w for w in seg.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
                    if not plain or plain[0] not in ("orchestrax", "python"):
                        continue  # printed output, not a command (it may hold a lone quote)
                    words = shlex.split(seg, comments=True)
                    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # env assignments
                        words = words[1:]
                    if words and words[0] in ("orchestrax", "python"):
                        out.append((doc, shlex.join(words)))
    return out


COMMANDS = _commands()


def test_the_docs_have_commands():
    assert sum(c.startswith("orchestrax eval") for _, c in COMMANDS) >= 4
    assert any(c.startswith("orchestrax export") for _, c in COMMANDS)
    assert any(c.startswith("orchestrax index") for _, c in COMMANDS)


@pytest.mark.parametrize("doc,command", [c for c in COMMANDS if c[1].startswith("orchestrax")])
def test_orchestrax_lines_parse_with_the_real_cli(doc, command, capsys):
    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{doc}: `{command}` is refused: {capsys.readouterr().err.strip()}")


@pytest.mark.parametrize("doc,command", [c for c in COMMANDS if c[1].startswith("python")])
def test_python_lines_name_real_files_and_flags(doc, command):
    words = shlex.split(command)[1:]
    if words[0] == "-m":
        spec = importlib.util.find_spec(words[1])
        assert spec is not None and spec.origin, f"{doc}: no module {words[1]}"
        source, flags = pathlib.Path(spec.origin).read_text(), words[2:]
    else:
        path = ROOT / words[0]
        assert path.is_file(), f"{doc}: {words[0]} does not exist"
        source, flags = path.read_text(), words[1:]
    for flag in (w.split("=")[0] for w in flags if w.startswith("--")):
        assert f'"{flag}"' in source, f"{doc}: `{command}`: {flag} is not an argument there"


# Documented lines that do not run in the suite, and why.
_PLACEHOLDER = "names a directory, host or model the reader fills in (upper-case placeholder)"
NOT_RUN = {
    "orchestrax demo --out runs/demo2 --set grpo.steps=4":
        "the whole demo (warm start, GRPO, two evals: over ten minutes here); its parsing and "
        "its wiring up to the first Trainer run in test_train_demo",
    "orchestrax train --config configs/demo.py:config_warmstart --set sft_steps=50":
        "the demo's warm start: 3-6 minutes on this 2-core box (README, \"Time\")",
    "orchestrax serve --model runs/export --port 30000":
        "binds the fixed port 30000, which a parallel test or a developer's server may hold; "
        "serve on an export is run by test_train_export_hf and the serve tests on free ports",
    "orchestrax index --corpus ../shared/data/corpus/wiki_summaries_en.json":
        "embeds 10,033 passages with the dense default (minutes on 2 cores); the bm25 build of "
        "the same corpus runs in test_tools_search",
    "orchestrax rehearse": "the whole-recipe rehearsal takes 12-17 minutes; test_train_rehearsal "
                           "runs it with a trainer process killed after GRPO step 1 of 2 "
                           "(slow), its parts run in test_train_rehearse_parts",
    "python bench/forward.py": "a benchmark: measured minutes, never in the suite",
    "python bench/train_step.py": "a benchmark: measured minutes, never in the suite",
    "python bench/sampler.py": "a benchmark: measured minutes, never in the suite",
    "python bench/rollout_concurrency.py": "a benchmark: measured minutes, never in the suite",
    "python bench/tools.py": "a benchmark: measured minutes, never in the suite",
    "python bench/memory.py --quick": "a benchmark: compiles full-size presets (minutes)",
    "python bench/memory_tokens.py": "a benchmark: compiles full-size presets (minutes)",
    "python bench/soak.py --minutes 30": "a 30-minute soak by design",
    "python bench/engine.py": "a benchmark: measured minutes, never in the suite",
    "python bench/before_after.py --base 0d33131":
        "checks out and benchmarks an older commit (minutes)",
    "python bench/gpu.py": "needs a GPU",
    "orchestrax eval --policy runs/qwen3-8b --tasks frames tau2:retail --train-config "
    "configs/qwen3_8b_gpu.py --user-url http://H:30001/v1 --user-model M":
        "a Qwen3-8B run and a user-simulator host H (GPU scale); " + _PLACEHOLDER,
    "orchestrax eval --policy openai:https://api.example/v1 --model NAME --api-key-env KEY "
    "--tasks frames --train-config configs/qwen3_8b_gpu.py --policy-price gpt-5 --baseline "
    "runs/eval/eval.json --out runs/eval_gpt5": "a hosted model behind a key; " + _PLACEHOLDER,
    "orchestrax eval --policy runs/x --tasks musique aime --train-config CFG --agent "
    "direct,subagent --thinking none,subagents,orchestrator,all --ablate "
    "none,no_web_searcher,no_coder,no_file_inspector,no_memory --subagent-policy "
    "sglang:http://H:30001 --tokenizer HF_DIR --out runs/grid": _PLACEHOLDER,
    "orchestrax train --config CFG --set agent.mode=subagent --set agent.thinking=orchestrator "
    "--set agent.search_corpus=../shared/data/corpus/wiki_summaries_en.json": _PLACEHOLDER,
    "orchestrax eval --policy HF_DIR --tasks frames --agent orchestrator8b --experts "
    "EXPERTS_JSON --train-config CFG": "the released checkpoint and its experts' endpoints "
    "(its protocol runs on a tiny model in test_agent_orchestrator8b); " + _PLACEHOLDER,
    "orchestrax train --config CFG --set hf_path=HF_DIR --set agent.mode=orchestrator8b --set "
    "agent.experts=EXPERTS_JSON": "a GPU-scale run (one protocol step on a tiny model runs in "
    "test_agent_orchestrator8b); " + _PLACEHOLDER,
    "orchestrax synth --out runs/synth --domain ../shared/data/toolscale/bank --domain MORE "
    "--base-url http://HOST/v1 --model M --usd-per-m-input 0.15 --usd-per-m-output 0.6 "
    "--budget-usd 5 --concurrency 8": "an LLM endpoint HOST; " + _PLACEHOLDER,
}
# Run as pasted, in this order, from a scratch directory where runs/demo/grpo is a tiny run
# (random tiny Qwen3, its train_config.json with short episode budgets, 2 routing eval tasks).
RUN_HERE = ("orchestrax eval --policy runs/demo/grpo --tasks routing",
            "orchestrax export runs/demo/grpo runs/export --dtype bfloat16")


# Run with their placeholders filled (`_filled`) and a small budget appended (BUDGET), from the
# same scratch directory, against `orchestrax serve` of the tiny run's export on a free port.
RUN_FILLED = (
    "orchestrax eval --policy 'RUN_DIR|HF_DIR' --tasks routing tau2:retail frames",
    "orchestrax eval --policy sglang:URL --tokenizer HF_DIR --tasks routing frames",
    "orchestrax eval --policy openai:URL --model NAME --tasks routing frames",
    "orchestrax eval --policy RUN_DIR --tasks musique --agent direct,subagent --thinking "
    "none,subagents,orchestrator,all",
    "orchestrax eval --policy sglang:http://H:30000 --tokenizer HF_DIR --tasks aime musique",
)
# One task a set, one short turn; the context holds a tau2 retail prompt (10.6k tiny-tokenizer
# tokens), which a smaller one turns into an error (rightly: the task cannot be played).
BUDGET = ("--limit", "1", "--max-turns", "1", "--max-new-tokens", "8", "--context-tokens", "12288",
          "--no-progress")


def _filled(command: str, port: int) -> list[list[str]]:
    """`command` with each placeholder replaced by the scratch directory's stand-in, one
    command per alternative of an `A|B` policy."""
    fills = ((r"http://H:\d+", f"http://127.0.0.1:{port}"),
             (r"\bopenai:URL\b", f"openai:http://127.0.0.1:{port}/v1"),
             (r"\bsglang:URL\b", f"sglang:http://127.0.0.1:{port}"),
             (r"\bRUN_DIR\b", "runs/demo/grpo"), (r"\bHF_DIR\b", "runs/export"),
             (r"\bNAME\b", "default"))

    def fill(word: str) -> str:
        for old, new in fills:
            word = re.sub(old, new, word)
        assert not re.search(r"\b[A-Z][A-Z_]+\b", word), f"unfilled placeholder in {word}"
        return word

    words = shlex.split(command)[1:]
    at = words.index("--policy") + 1
    return [[*map(fill, words[:at]), fill(policy), *map(fill, words[at + 1:]), *BUDGET,
             "--out", f"runs/filled{i}"] for i, policy in enumerate(words[at].split("|"))]


def _tiny_scratch(tmp_path, monkeypatch) -> None:
    """tmp_path as the working directory, holding runs/demo/grpo: a random tiny Qwen3 run with
    its train_config.json (short episode budgets, 2 routing eval tasks)."""
    from agent_fixtures import write_tiny_run
    from orchestrax.envs.routing import RoutingConfig
    from orchestrax.train.train_config import RolloutConfig
    write_tiny_run(tmp_path / "runs" / "demo" / "grpo", name="grpo", seed=0,
                   env=RoutingConfig(num_train=4, num_eval=2),
                   rollout=RolloutConfig(max_turns=2, max_new_tokens=8, context_tokens=1024,
                                         enable_thinking=False))
    monkeypatch.chdir(tmp_path)


def test_every_documented_line_runs_here_or_says_why_not():
    documented = {c for _, c in COMMANDS}
    unclassified = documented - set(NOT_RUN) - set(RUN_HERE) - set(RUN_FILLED)
    assert not unclassified, f"add to RUN_HERE or NOT_RUN (with why): {sorted(unclassified)}"
    assert not (set(NOT_RUN) | set(RUN_HERE) | set(RUN_FILLED)) - documented, \
        "no longer in the docs: drop them"


def test_the_runnable_lines_run_as_pasted(tmp_path, monkeypatch, capsys):
    from orchestrax.cli import main as cli
    _tiny_scratch(tmp_path, monkeypatch)
    for command in RUN_HERE:
        code = cli(shlex.split(command)[1:])
        assert code == 0, f"`{command}` exited {code}: {capsys.readouterr().err[-2000:]}"
    printed = capsys.readouterr().out
    assert "eval settings: enable_thinking=False max_new_tokens=8 max_turns=2" in printed
    assert (tmp_path / "runs" / "eval" / "eval.json").is_file()
    assert (tmp_path / "runs" / "export" / "model.safetensors").is_file()


@pytest.mark.slow
def test_the_placeholder_lines_run_filled(tmp_path, monkeypatch, capsys):
    """Each eval line whose policy or host is a placeholder, filled with the tiny run, its
    export and a real `orchestrax serve` of that export: every form exits 0 and scores every
    task set it names with no failed episode."""
    import subprocess
    import sys

    from loopback import free_port
    from orchestrax.cli import main as cli
    _tiny_scratch(tmp_path, monkeypatch)
    monkeypatch.setenv("ORCHESTRAX_DATA", str(ROOT.parent / "shared" / "data"))
    assert cli(["export", "runs/demo/grpo", "runs/export"]) == 0
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "orchestrax.cli", "serve", "--model",
                               "runs/export", "--port", str(port), "--max-len", "4096"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "listening" in server.stdout.readline()
        capsys.readouterr()
        for command in RUN_FILLED:
            for argv in _filled(command, port):
                code = cli(argv)
                printed = capsys.readouterr()
                assert code == 0, f"`{shlex.join(argv)}` exited {code}: {printed.err[-2000:]}"
                run = tmp_path / argv[-1]
                path = run / "grid.json" if "--agent" in argv else run / "eval.json"
                rows = json.loads(path.read_text())["rows"]
                after = argv[argv.index("--tasks") + 1:]
                for task_set in after[:next(i for i, w in enumerate(after) if w[:2] == "--")]:
                    mine = [r for r in rows if r["task_set"] == task_set]
                    assert mine and all(r["errors"] == 0 for r in mine), (argv, mine)
    finally:
        server.terminate()
        server.wait(timeout=60)
