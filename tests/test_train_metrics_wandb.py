"""Weights & Biases next to TensorBoard in the one metrics writer: every number of every row
reaches an offline W&B run as `<phase>/<key>` at the global step, with the run's config, and a
resumed run continues the same W&B run id. Read back from the run's own transaction log (the
`.wandb` file `wandb sync` uploads), whose records are W&B's protobuf messages.

The project's venv does not install wandb (0.31 brings 14 packages, OpenTelemetry among them);
there the first test is skipped and the second shows the one-line error a user gets. With the
package (`pip install -e '.[wandb]'`) the first runs and the second is skipped."""

import importlib.util
import json
import struct

import pytest

from orchestrax.train.metrics_log import MetricsLog, WandbConfig


def _records(path):
    """The protobuf records of a W&B transaction log: a 7-byte header, then LevelDB-log
    framing (32 KiB blocks; each chunk: crc32c, length, type 1 full / 2 first / 3 middle /
    4 last)."""
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks = 7, 32768, []
    while pos + 7 <= len(data):
        if block - pos % block < 7:   # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks.append(data[pos + 7:pos + 7 + n])
        pos += 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def _history(run_dir):
    """{step: {key: value}} and the config of every offline run of `run_dir`."""
    steps, config, ids = {}, {}, set()
    for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for rec in _records(log):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                       for i in rec.history.item}
                steps.setdefault(rec.history.step.num, {}).update(
                    {k: v for k, v in row.items() if not k.startswith("_")})
            elif kind == "run":
                ids.add(rec.run.run_id)
                config |= {i.key: json.loads(i.value_json) for i in rec.run.config.update}
    return steps, config, ids


def test_rows_reach_an_offline_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = WandbConfig(enabled=True, project="unit")
    log = MetricsLog(tmp_path, keep_rows=0, resume_step=None, wandb=cfg, run_name="t",
                     run_config={"name": "t", "optim": {"lr": 0.001}})
    log.write({"phase": "rl", "step": 1, "loss": 0.5, "accuracy": 1.0, "note": "text"}, 1)
    log.write({"phase": "eval", "step": 1, "accuracy": 0.25}, 1)
    log.write({"phase": "rl", "step": 2, "loss": 0.125, "filter/kept": 3}, 2)
    log.close()
    run_id = (tmp_path / "wandb_id").read_text().strip()
    steps, config, ids = _history(tmp_path)
    assert steps == {1: {"rl/loss": 0.5, "rl/accuracy": 1.0, "eval/accuracy": 0.25},
                     2: {"rl/loss": 0.125, "rl/filter/kept": 3}}
    assert config["optim"] == {"lr": 0.001} and ids == {run_id}
    # A resumed run (from step 2's checkpoint) goes on in the same W&B run. Its offline files
    # land in a directory named by the start second, so a second start within the same second
    # would share the first one's: the resumed run gets its own out_dir holding the id file.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    for name in ("wandb_id", "metrics.jsonl"):
        (resumed / name).write_bytes((tmp_path / name).read_bytes())
    again = MetricsLog(resumed, keep_rows=3, resume_step=2, wandb=cfg, run_name="t")
    again.write({"phase": "rl", "step": 3, "loss": 0.0625}, 3)
    again.close()
    assert _history(resumed)[0] == {3: {"rl/loss": 0.0625}}
    assert _history(resumed)[2] == {run_id}
    assert len(again.read()) == 4   # metrics.jsonl stays the record of truth


def test_wandb_asked_for_but_not_installed_is_one_line(tmp_path):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    with pytest.raises(ModuleNotFoundError, match=r"TrainConfig.wandb.enabled=True but the "
                       r"wandb package is not installed; pip install -e '.\[wandb\]'"):
        WandbConfig(enabled=True).check_installed()
    with pytest.raises(ValueError, match="WandbConfig.mode='cloud'; allowed: offline, online"):
        WandbConfig(mode="cloud")
