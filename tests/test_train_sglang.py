"""The trainer's SGLang path end to end on CPU: two real `orchestrax serve` processes on
loopback stand in for the SGLang fleet. Rollouts go through the SGLang client (in the trainer,
or in episode worker processes), and after every step the new weights reach both servers through
`/update_weights_from_disk`, checked by their `/model_info` weight_version."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import urllib.request

import pytest

from orchestrax import models
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.train.loop import train
from test_train_loop import tiny_run

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def servers(tmp_path):
    """Two servers started on a checkpoint of the run's architecture (random weights: the
    trainer publishes its own before the first rollout)."""
    cfg = tiny_run(tmp_path, steps=0).model
    tok_dir, model_dir = tmp_path / "tok", tmp_path / "start"
    tiny_qwen3_tokenizer().save_pretrained(tok_dir)
    models.save_hf(cfg, models.init_params(cfg, 123), model_dir, tokenizer_dir=tok_dir)
    procs, urls = [], []
    try:
        for _ in range(2):
            port = _free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrax.cli", "serve", "--model", str(model_dir),
                 "--port", str(port), "--max-len", "1024", "--max-batch", "16",
                 "--weight-root", str(tmp_path)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(proc)
            line = proc.stdout.readline()
            assert "listening" in line, line
            urls.append(f"http://127.0.0.1:{port}")
        yield tuple(urls)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def _model_info(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/model_info", timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("workers", [0, 2])
def test_grpo_with_sglang_servers(tmp_path, servers, workers):
    base = tiny_run(tmp_path / "run", steps=2, sft_steps=0)
    cfg = dataclasses.replace(base, rollout=dataclasses.replace(
        base.rollout, backend="sglang", server_urls=servers, workers=workers,
        weight_sync_dir=str(tmp_path / "weights")))
    history = train(cfg)
    rl_rows = [h for h in history if h["phase"] == "rl"]
    assert [h["step"] for h in rl_rows] == [1, 2]
    assert all(h["rollout/tokens_mean"] > 500 and h["rollout/turns_mean"] >= 1 for h in rl_rows)
    if workers == 0:  # the trainer's own client reports its traffic per step
        assert all(h["sampler/requests"] >= 1 and h["sampler/retries"] == 0
                   and h["sampler/failures"] == 0 for h in rl_rows)
    # Published after each step: both servers serve the run's newest weights.
    assert [_model_info(u)["weight_version"] for u in servers] == ["2", "2"]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v1", "v2"]
