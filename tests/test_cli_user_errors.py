"""Bad input a user can act on: each case exits non-zero with one line that names the field,
flag or file and what to do, and no traceback unless --debug."""

import socket

import pytest

from orchestrax.cli import main as cli

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def one_line_error(capsys, argv, code=2) -> str:
    """Run the command in-process; argparse refusals exit through SystemExit."""
    try:
        rc = cli(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert "error:" in last
    return last


def test_config_error_is_one_line_naming_the_field(capsys):
    line = one_line_error(capsys, ["train", "--config", str(ROOT / "configs" / "demo.py"),
                                   "--set", "rollout.group_size=1"])
    assert "RolloutConfig.group_size=1" in line and ">= 2" in line


def test_debug_shows_the_traceback():
    with pytest.raises(ValueError, match="group_size"):
        cli(["train", "--config", str(ROOT / "configs" / "demo.py"), "--set",
             "rollout.group_size=1", "--debug"])


def test_missing_init_from_names_the_field(capsys, tmp_path):
    line = one_line_error(capsys, ["train", "--config", str(ROOT / "configs" / "demo.py"),
                                   "--set", f"out_dir={tmp_path / 'run'}",
                                   "--set", f"init_from={tmp_path / 'nope'}"])
    assert "TrainConfig.init_from=" in line and "no checkpoints/" in line


def test_tokenizer_dir_without_tokenizer_json_names_dir_and_file(capsys, tmp_path):
    line = one_line_error(capsys, ["eval", "--policy", "sglang:http://127.0.0.1:9",
                                   "--tokenizer", str(tmp_path), "--tasks", "routing"])
    assert str(tmp_path) in line and "tokenizer.json" in line and "--tokenizer" in line


def test_serve_on_a_run_dir_without_a_checkpoint_names_it(capsys, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "checkpoints").mkdir()
    line = one_line_error(capsys, ["serve", "--model", str(tmp_path), "--port", "0"])
    assert f"{tmp_path}/checkpoints holds no checkpoint" in line


def test_serve_max_len_zero_names_the_flag(capsys):
    line = one_line_error(capsys, ["serve", "--tiny", "--max-len", "0"])
    assert "--max-len" in line and ">= 2" in line


def test_a_busy_port_is_refused_before_the_model_loads(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # A directory with nothing in it: were the model loaded first, the error would name it.
        line = one_line_error(capsys, ["serve", "--model", "/nonexistent", "--port", str(port)])
    assert f"--port {port}" in line and "not free" in line


def test_serve_flags_are_shorthands_of_its_config_fields(tmp_path):
    """`--set` and `--config` configure serve as they do train; a flag is its field's shorthand,
    and giving a field twice is refused."""
    from orchestrax.cli import build_parser, command_config
    from orchestrax.rollout.validate import ServeLimits
    from orchestrax.train.serve import ServeConfig

    def cfg(*argv):
        return command_config(build_parser().parse_args(["serve", *argv]))
    flags = cfg("--tiny", "--max-len", "64", "--read-timeout", "5", "--weight-root", "/a",
                "--weight-root", "/b", "--max-n", "3", "--dispatch-reads", "512")
    sets = cfg("--set", "model=tiny", "--set", "max_len=64", "--set", "limits.read_timeout_s=5",
               "--set", "limits.idle_timeout_s=5", "--set", "weight_root=('/a', '/b')",
               "--set", "limits.max_n=3", "--set", "dispatch_reads=512")
    assert flags == sets == ServeConfig(max_len=64, weight_root=("/a", "/b"), limits=ServeLimits(
        read_timeout_s=5.0, idle_timeout_s=5.0, max_n=3), dispatch_reads=512)
    assert cfg("--tiny", "--set", "dispatch_reads=None").dispatch_reads is None
    with pytest.raises(ValueError, match=r"ServeConfig.dispatch_reads=0; must be >= 1"):
        cfg("--tiny", "--set", "dispatch_reads=0")
    (tmp_path / "serve.py").write_text(
        "from orchestrax.train.serve import ServeConfig\n"
        "def small():\n    return ServeConfig(model='tiny', max_batch=2)\n")
    assert cfg("--config", f"{tmp_path / 'serve.py'}:small", "--port", "0") == ServeConfig(
        max_batch=2, port=0)
    with pytest.raises(ValueError, match="max_len: also given by its flag"):
        cfg("--tiny", "--max-len", "64", "--set", "max_len=32")
    with pytest.raises(ValueError, match=r"ServeLimits.max_n=0; must be a number > 0"):
        cfg("--tiny", "--set", "limits.max_n=0")
    with pytest.raises(ValueError, match="needs --model DIR or --tiny"):
        cfg("--port", "0")


def test_eval_flags_are_shorthands_of_its_config_fields(capsys):
    from orchestrax.cli import build_parser, command_config
    from orchestrax.eval.eval_command import EvalCommand

    def cfg(*argv):
        return command_config(build_parser().parse_args(["eval", *argv]))
    flags = cfg("--policy", "runs/x", "--tasks", "routing", "frames", "--no-thinking",
                "--max-turns", "5", "--train-config", "configs/demo.py")
    sets = cfg("--set", "policy=runs/x", "--set", "tasks=('routing', 'frames')", "--set",
               "enable_thinking=False", "--set", "max_turns=5",
               "--set", "train_config=configs/demo.py")
    assert flags == sets == EvalCommand(policy="runs/x", tasks=("routing", "frames"),
                                        enable_thinking=False, max_turns=5,
                                        train_config="configs/demo.py")
    line = one_line_error(capsys, ["eval", "--tasks", "routing"])
    assert "EvalCommand: policy=''" in line and "--policy" in line
    line = one_line_error(capsys, ["eval", "--policy", "x", "--tasks", "routing", "--set",
                                   "max_error_rate=2"])
    assert "EvalCommand.max_error_rate=2; must be in [0, 1]" in line


def test_synth_flags_are_shorthands_of_its_config_fields(capsys):
    from orchestrax.cli import build_parser, command_config
    from orchestrax.synth.synth_command import SynthCommand

    def cfg(*argv):
        return command_config(build_parser().parse_args(["synth", *argv]))
    flags = cfg("--out", "runs/s", "--domain", "a", "--domain", "b", "--describe", "zoo=A zoo.",
                "--base-url", "http://h:1/v1", "--model", "m", "--no-evolve", "--no-progress",
                "--budget-usd", "5")
    sets = cfg("--set", "out=runs/s", "--set", "domains=('a', 'b')",
               "--set", "describe=(('zoo', 'A zoo.'),)", "--set", "base_url=http://h:1/v1",
               "--set", "model=m", "--set", "evolve=False", "--set", "progress=False",
               "--set", "budget_usd=5.0")
    assert flags == sets == SynthCommand(out="runs/s", domains=("a", "b"),
                                         describe=(("zoo", "A zoo."),), base_url="http://h:1/v1",
                                         model="m", evolve=False, progress=False, budget_usd=5.0)
    pipeline, generator = flags.parts()
    assert pipeline.domains == ("a", "b") and not pipeline.evolve
    assert generator.budget_usd == 5.0 and generator.endpoint.model == "m"
    line = one_line_error(capsys, ["synth", "--domain", "a", "--base-url", "http://h:1/v1",
                                   "--model", "m"])
    assert "SynthCommand.out=''; must be given (--out DIR)" in line
    line = one_line_error(capsys, ["synth", "--out", "x", "--set", "concurrency=many"])
    assert "concurrency='many'; expected an int" in line


def test_index_flags_are_shorthands_of_its_config_fields(capsys, tmp_path):
    """`orchestrax index` in the one dialect, then a real bm25 index over a 3-passage corpus
    (built, cached, queried) from the flags."""
    import json

    from orchestrax.cli import build_parser, command_config
    from orchestrax.tools.embed import EmbedderConfig
    from orchestrax.tools.index_command import IndexCommand

    def cfg(*argv):
        return command_config(build_parser().parse_args(["index", *argv]))
    flags = cfg("--corpus", "c.jsonl", "--embedder", "openai", "--base-url", "http://h:1",
                "--model", "m", "--batch-size", "8", "--cache-dir", "/tmp/x", "--query", "a",
                "--query", "b")
    sets = cfg("--set", "corpus=c.jsonl", "--set", "embedder.kind=openai",
               "--set", "embedder.base_url=http://h:1", "--set", "embedder.model=m",
               "--set", "embedder.batch_size=8", "--set", "cache_dir=/tmp/x",
               "--set", "queries=('a', 'b')")
    assert flags == sets == IndexCommand(
        corpus="c.jsonl", cache_dir="/tmp/x", queries=("a", "b"),
        embedder=EmbedderConfig(kind="openai", base_url="http://h:1", model="m", batch_size=8,
                                torch_threads=2))
    line = one_line_error(capsys, ["index", "--backend", "bm25"])
    assert "IndexCommand.corpus=''; must be given (--corpus FILE)" in line
    line = one_line_error(capsys, ["index", "--corpus", "c", "--set", "backend=faiss"])
    assert "IndexCommand.backend='faiss'; allowed: dense, bm25" in line

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in (
        {"title": "Volcano", "text": "A volcano erupts lava and ash."},
        {"title": "Glacier", "text": "A glacier is a slow river of ice."},
        {"title": "Desert", "text": "A desert gets little rain."})))
    assert cli(["index", "--corpus", str(corpus), "--backend", "bm25", "--cache-dir",
                str(tmp_path / "cache"), "--query", "river of ice"]) == 0
    out = capsys.readouterr().out
    assert "index ready: 3 passages" in out
    assert out.split("'river of ice':")[1].split()[1] == "Glacier"   # the top hit's title
