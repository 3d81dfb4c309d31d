"""Every launch script's --dry-run prints the commands a real run executes: the config function,
the --set values and the configured ports; the SGLang server and router flags parse with their
own argument parsers."""

import os
import pathlib
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _dry(script: str, *args: str, **env) -> list[str]:
    full = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT), **env)
    out = subprocess.run(["bash", str(ROOT / "launch" / script), "--dry-run", *args], cwd=ROOT,
                         env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _commands(lines: list[str]) -> list[list[str]]:
    return [shlex.split(line[2:].removesuffix(" &")) for line in lines
            if line.startswith("+ ") and not line.startswith("+ wait for ")]


def _train_args(cmd: list[str]) -> list[str]:
    return cmd[cmd.index("--config"):]


SETS = ("--set", "steps=7", "--set", "rollout.server_urls=('http://127.0.0.1:31000','http://127.0.0.1:31001')")


@pytest.mark.parametrize("fn", ["config", "config_multinode", "config_one_h200"])
def test_gpu_single_node_starts_the_configured_servers_and_passes_function_and_sets(fn):
    spec = f"configs/toolorchestra.py:{fn}"
    lines = _dry("gpu_single_node.sh", spec, *SETS)
    cmds = _commands(lines)
    assert _train_args(cmds[-1]) == ["--config", spec, *SETS]
    servers = [c for c in cmds if "sglang.launch_server" in c]
    if fn == "config_one_h200":  # embedded sampler: no servers, nothing to wait for
        assert servers == [] and not any("wait for" in x for x in lines)
        return
    assert [c[c.index("--port") + 1] for c in servers] == ["31000", "31001"]  # the --set URLs
    assert [c[1] for c in servers] == ["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1"]
    assert "+ wait for http://127.0.0.1:31001/health" in lines
    assert not any("30002" in x for x in lines)


def test_gpu_single_node_refuses_more_servers_than_gpus():
    out = subprocess.run(["bash", "launch/gpu_single_node.sh", "--dry-run", "configs/qwen3_8b_gpu.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT),
                                  ROLLOUT_GPUS="0,1"))
    assert out.returncode == 2 and "names 4 servers but ROLLOUT_GPUS=0,1" in out.stderr


def test_slurm_waits_for_the_configured_fleet_and_passes_function_and_sets():
    spec = "configs/toolorchestra.py:config_multinode"
    lines = _dry("slurm_multinode.sbatch", spec, "--set", "steps=3")
    waits = [x for x in lines if x.startswith("+ wait for ")]
    assert len(waits) == 16 and "+ wait for http://rollout-1:30007/health" in waits
    (cmd,) = _commands(lines)
    assert cmd[:2] == ["srun", "--kill-on-bad-exit=1"]
    assert _train_args(cmd) == ["--config", spec, "--set", "steps=3"]


def test_tpu_pod_keeps_the_remote_home_and_passes_function_and_sets():
    spec = "configs/toolorchestra.py:config_tpu"
    (cmd,) = _commands(_dry("tpu_pod.sh", "tpu1", "zone1", spec, "--set", "steps=9"))
    remote = cmd[cmd.index("--command") + 1]
    assert remote.startswith("cd ~/orchestrax &&")  # expanded on the worker, not here
    assert _train_args(shlex.split(remote)) == ["--config", spec, "--set", "steps=9"]


def test_fleet_flags_parse_with_sglangs_own_parsers():
    lines = _dry("sglang_fleet.sh", "/models/Qwen3-8B", "2", "0,1,2,3", "30010,30020", "29999")
    cmds = _commands(lines)
    servers = [c[c.index("sglang.launch_server") + 1:] for c in cmds if "sglang.launch_server" in c]
    assert [s[s.index("--port") + 1] for s in servers] == ["30010", "30020"]
    (router,) = [c[c.index("sglang_router.launch_router") + 1:] for c in cmds
                 if "sglang_router.launch_router" in c]
    from sglang_router.launch_router import parse_router_args
    args = parse_router_args(router)
    assert args.port == 29999 and args.worker_urls == ["http://127.0.0.1:30010",
                                                       "http://127.0.0.1:30020"]
    server_args = pytest.importorskip(
        "sglang.srt.server_args", reason="sglang is a GPU-node install (its parser needs "
        "triton, pyzmq, IPython next to sglang itself)")
    import argparse
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    for s in servers:
        parsed = parser.parse_args(s)
        assert parsed.tp_size == 2 and parsed.model_path == "/models/Qwen3-8B"
