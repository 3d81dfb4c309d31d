"""The trainer as 2 JAX processes x 4 CPU devices joined by jax.distributed on loopback (gloo
collectives), against the same work in 1 process x 8 devices."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

WORKER = pathlib.Path(__file__).with_name("multiprocess_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(mode: str, out: pathlib.Path, processes: int,
           stdout: Callable[[int], Any]) -> list[subprocess.Popen]:
    """The worker as `processes` processes with 8 / processes CPU devices each; process i
    writes its output to `stdout(i)`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // processes}")
    port = _free_port()
    return [subprocess.Popen([sys.executable, str(WORKER), mode, str(out), str(i),
                              str(processes), str(port)], env=env, stdout=stdout(i),
                             stderr=subprocess.STDOUT, text=True) for i in range(processes)]


def _run(mode: str, out: pathlib.Path, processes: int) -> list[dict]:
    procs = _start(mode, out, processes, lambda i: subprocess.PIPE)
    try:
        logs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, text in zip(procs, logs):
        assert p.returncode == 0, text[-3000:]
    return [json.loads((out / f"result-{i}.json").read_text()) for i in range(processes)]


@pytest.mark.slow
def test_two_processes_give_the_one_process_sft_losses_and_rl_step(tmp_path):
    one, = _run("step", tmp_path / "one", 1)
    two = _run("step", tmp_path / "two", 2)
    assert one["processes"] == 1 and {r["processes"] for r in two} == {2}
    assert one["devices"] == two[0]["devices"] == 8
    for r in two:
        assert r["sft_losses"] == pytest.approx(one["sft_losses"], abs=1e-5)
        for key in ("loss", "pg_loss", "kl", "grad_norm", "policy_tokens", "dropped_samples"):
            assert r["metrics"][key] == pytest.approx(one["metrics"][key], abs=1e-5), key
        assert r["param_sum"] == pytest.approx(one["param_sum"], abs=1e-4)
    assert one["metrics"]["kl"] > 0  # the reference pass ran on the global batch


@pytest.mark.slow
def test_the_trainer_runs_as_two_processes(tmp_path):
    """Warm start, KL reference, weight publishing to each process's own sampler, checkpoints
    and one metrics writer, all through the real Trainer."""
    results = _run("train", tmp_path, 2)
    assert results[0]["history"] == results[1]["history"]  # one row for both processes
    phases = [(h["phase"], h["step"]) for h in results[0]["history"]]
    assert phases == [("sft", 4), ("eval", 0), ("rl", 1), ("eval", 1)]
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [(json.loads(r)["phase"], json.loads(r)["step"]) for r in rows] == phases
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [2, 4, 5]
    assert (tmp_path / "reference").is_dir()


@pytest.mark.slow
def test_a_failing_process_ends_the_job(tmp_path):
    """Process 1 raises in its first GRPO rollout: it logs the error and exits with 1 at once,
    without JAX's exit-time shutdown barrier, and process 0, whose update needs process 1,
    fails soon after, naming process 1 as the first failure. Unwinding normally, both waited
    on each other until killed (process 1 in the shutdown barrier, process 0 in a collective).
    300 s is a hang detector, far above the seconds this takes."""
    out = tmp_path / "run"
    out.mkdir()
    logs = [tmp_path / f"process-{i}.log" for i in range(2)]
    start = time.monotonic()
    procs = _start("fault", out, 2, lambda i: logs[i].open("w"))
    exited: dict[int, float] = {}
    while len(exited) < 2 and time.monotonic() - start < 300:
        for i, p in enumerate(procs):
            if i not in exited and p.poll() is not None:
                exited[i] = round(time.monotonic() - start, 1)
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = [log.read_text(errors="replace") for log in logs]
    print(f"seconds from start to exit, by process: {exited}")
    assert len(exited) == 2, f"still running after 300 s: {exited}\n{text[0][-3000:]}"
    assert procs[1].returncode == 1, text[1][-3000:]
    assert procs[0].returncode != 0, text[0][-3000:]
    assert "process 1 of 2 failed" in text[1] and "injected fault" in text[1], text[1][-3000:]
    assert ("first failure of the job: process 1 of 2: RuntimeError: injected fault"
            in text[0]), text[0][-3000:]
