"""Checkpoints verified by content: bytes flipped in place (same size), an edited metadata step
or an edited stream position make the step corrupt, named and skipped for the previous good
one; a whole but broken (non-finite) state stops the run at its first step, saving nothing."""

import json
import logging

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestrax.data.tasks import task_stream
from orchestrax.train import checkpoint
from orchestrax.train.checkpoint import MANIFEST, Checkpointer


def _state(value: float, n: int = 64):
    return {"w": jnp.full((n, n), value, jnp.float32), "b": jnp.arange(n, dtype=jnp.float32)}


def _stream():
    return iter(task_stream(13, 4, seed=7).to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


def _saved(tmp_path, steps=3):
    """Steps 1..steps, each with meta {"step": s} and the task stream `s` batches in."""
    ck, it = Checkpointer(tmp_path, every=1), _stream()
    for s in range(1, steps + 1):
        next(it)
        ck.maybe_save(s, _state(float(s)), {"step": s}, data=it)
    ck.close()


def _largest_array_file(step_dir):
    return max((p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"),
               key=lambda p: p.stat().st_size)


def _check(step, meta):
    if meta.get("step") != step:
        return f"metadata says step {meta.get('step')}, which is not checkpoint step {step}"
    return None


def _restore(tmp_path, caplog, **kw):
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        ck = Checkpointer(tmp_path, every=1)
        it = _stream()
        state, meta = ck.restore(_state(0.0), data=it, **kw)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return ck, state, meta, it, lines


def test_the_manifest_holds_a_checksum_per_file(tmp_path):
    _saved(tmp_path, steps=1)
    files = json.loads((tmp_path / "1" / MANIFEST).read_text())["files"]
    path = _largest_array_file(tmp_path / "1")
    entry = files[str(path.relative_to(tmp_path / "1"))]
    import hashlib
    assert entry == {"size": path.stat().st_size,
                     "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert any(k.startswith("data/") for k in files) and any(k.startswith("meta/") for k in files)


def test_flipped_bytes_of_the_same_size_are_named_and_the_previous_step_restored(tmp_path,
                                                                                  caplog):
    _saved(tmp_path)
    path = _largest_array_file(tmp_path / "3")
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(b ^ 0xFF for b in raw[mid:mid + 64])
    path.write_bytes(bytes(raw))
    ck, state, meta, it, lines = _restore(tmp_path, caplog)
    assert meta == {"step": 2} and float(state["w"][0, 0]) == 2.0 and ck.restored_step == 2
    (line,) = lines
    assert line.startswith("checkpoint step 3 is corrupt (") and path.name in line
    assert "SHA-256" in line
    assert it.get_state() == {"next_index": 2}
    assert (tmp_path.with_name(tmp_path.name + ".corrupt") / "3").is_dir()   # kept, not lost
    ck.close()


@pytest.mark.parametrize("with_manifest", [True, False])
def test_an_edited_meta_step_falls_back_instead_of_crashing_every_restart(tmp_path, caplog,
                                                                          with_manifest):
    _saved(tmp_path)
    meta_file = tmp_path / "3" / "meta" / "metadata"
    meta_file.write_text(json.dumps({"step": 1}))
    if not with_manifest:   # a step killed before its manifest: the caller's check judges it
        (tmp_path / "3" / MANIFEST).unlink()
    ck, state, meta, it, lines = _restore(tmp_path, caplog, check=_check)
    assert meta == {"step": 2} and float(state["w"][0, 0]) == 2.0
    (line,) = lines
    assert "checkpoint step 3 is corrupt" in line
    assert ("SHA-256" if with_manifest else "metadata says step 1") in line
    # The run saves step 3 again (it used to raise StepAlreadyExistsError at every restart).
    assert ck.maybe_save(3, _state(33.0), {"step": 3}, data=it)
    ck.close()


def test_an_edited_stream_position_is_caught(tmp_path, caplog):
    _saved(tmp_path)
    pos = tmp_path / "3" / "data" / "process_0-of-1.json"
    pos.write_text(json.dumps({"next_index": 7}))
    ck, state, meta, it, lines = _restore(tmp_path, caplog)
    assert meta == {"step": 2} and it.get_state() == {"next_index": 2}
    assert "process_0-of-1.json" in lines[0]
    ck.close()


def test_a_stream_position_the_check_refuses_falls_back(tmp_path, caplog):
    """Without a manifest the position is judged against the step by the caller's check."""
    _saved(tmp_path)
    pos = tmp_path / "3" / "data" / "process_0-of-1.json"
    pos.write_text(json.dumps({"next_index": 1}))
    (tmp_path / "3" / MANIFEST).unlink()
    streams = []

    def check(step, meta):
        position = streams[-1].get_state()["next_index"]
        return None if position == step else f"task stream at batch {position}, step {step}"

    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        ck = Checkpointer(tmp_path, every=1)
        streams.append(_stream())
        _, meta = ck.restore(_state(0.0), data=streams[-1], check=check)
    assert meta == {"step": 2} and streams[-1].get_state() == {"next_index": 2}
    assert any("task stream at batch 1, step 3" in r.getMessage() for r in caplog.records)
    ck.close()


def test_nonfinite_after_restore_names_the_step_and_the_values():
    assert checkpoint.nonfinite_after_restore({"loss": 0.5, "grad_norm": 2.0}, 6) is None
    assert checkpoint.nonfinite_after_restore({"loss": float("nan")}, None) is None
    why = checkpoint.nonfinite_after_restore({"loss": float("nan"),
                                              "grad_norm": float("inf")}, 6)
    assert "checkpoint step 6" in why and "loss=nan" in why and "grad_norm=inf" in why
    assert "nothing was saved" in why


@pytest.mark.slow
def test_a_broken_restored_state_stops_the_run_without_saving(tmp_path):
    """A whole checkpoint (its checksums fine) holding NaN params: the first step after the
    restore has a NaN loss; the run stops naming the step, and the newest step stays the
    restored one (it used to train on and save a NaN step as the newest)."""
    from test_train_loop import tiny_run

    from orchestrax.train.loop import Trainer
    cfg = tiny_run(tmp_path, steps=1, sft_steps=3)
    first = Trainer(cfg)
    first.step = 1
    first.state = first.state._replace(params=jax.tree.map(
        lambda x: jnp.full_like(x, jnp.nan), first.state.params))
    first._save(force=True)
    first.ckpt.close()
    first.metrics.close()
    first._lock.close()   # the out_dir lock, as the process's end would release it

    second = Trainer(cfg)
    assert second.ckpt.restored_step == 1 and second.phase == "sft" and second.step == 1
    assert second._check_meta(1, {"phase": "sft", "step": 1}) is None
    assert "not checkpoint step 6" in second._check_meta(6, {"phase": "rl", "step": 1})
    with pytest.raises(RuntimeError, match=r"first step after restoring checkpoint step 1 has "
                                           r"loss=nan"):
        second.run()
    second.ckpt.close()
    steps = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert steps == ["1"]
