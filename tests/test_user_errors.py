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
