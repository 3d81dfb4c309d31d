"""Checkpoints: asynchronous saves that survive SIGKILL, corrupt steps named and skipped, the data
stream's position restored exactly."""

import json
import logging
import pathlib
import signal
import subprocess
import sys
import textwrap

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestrax.data.tasks import task_stream
from orchestrax.train.checkpoint import MANIFEST, Checkpointer

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _state(value: float, n: int = 64):
    return {"w": jnp.full((n, n), value, jnp.float32), "b": jnp.arange(n, dtype=jnp.float32)}


def _saved_steps(ckpt_dir, values=(1.0, 2.0, 3.0)):
    ck = Checkpointer(ckpt_dir, every=1)
    for step, v in enumerate(values, start=1):
        ck.maybe_save(step, _state(v), {"step": step})
    ck.close()


def test_async_save_survives_donation_of_the_saved_state(tmp_path):
    """maybe_save returns before the write; the loop then donates the state to the next update.
    The checkpoint must hold the values as they were at the call."""
    bump = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
    ck = Checkpointer(tmp_path, every=1)
    state = _state(0.0, n=512)
    for step in (1, 2, 3):
        state = bump(state)
        assert ck.maybe_save(step, state, {"step": step, "rows": 10 * step})
    state = bump(state)  # donates step 3's buffers while its save may still be writing
    ck.close()
    ck = Checkpointer(tmp_path, every=1)
    for step in (3, 2):
        restored, meta = ck.restore(_state(0.0, n=512), step=step)
        assert meta == {"step": step, "rows": 10 * step}
        np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((512, 512), step))
    assert (tmp_path / "3" / MANIFEST).is_file()
    assert not ck.maybe_save(3, state, {}, force=True)  # that step exists already
    ck.close()


@pytest.mark.parametrize("victim", ["data", "_METADATA", "meta"])
def test_corrupt_newest_step_falls_back_with_one_named_line(tmp_path, caplog, victim):
    _saved_steps(tmp_path)
    step_dir = tmp_path / "3"
    if victim == "data":  # the largest array file, cut in half
        path = max((p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"),
                   key=lambda p: p.stat().st_size)
    elif victim == "_METADATA":
        path = step_dir / "state" / "_METADATA"
    else:
        path = step_dir / "meta" / "metadata"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    if victim == "meta":  # no manifest (a step killed before it was written): JSON is checked
        (step_dir / MANIFEST).unlink()
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        ck = Checkpointer(tmp_path, every=1)
        state, meta = ck.restore(_state(0.0))
    assert meta == {"step": 2} and float(state["w"][0, 0]) == 2.0
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("checkpoint step 3 is corrupt (") and str(path.name) in line
    assert "falling back to the previous step" in line
    # Moved aside, out of the manager's view: step 3 can be saved again.
    assert (tmp_path.with_name(tmp_path.name + ".corrupt") / "3").is_dir()
    assert ck.latest_step == 2
    assert ck.maybe_save(3, _state(33.0), {"step": 3})
    ck.close()
    assert float(Checkpointer(tmp_path, every=1).restore(_state(0.0))[0]["w"][0, 0]) == 33.0


def test_every_step_corrupt_is_an_error_naming_the_directory(tmp_path):
    _saved_steps(tmp_path, values=(1.0, 2.0))
    for step in ("1", "2"):
        (tmp_path / step / "state" / "_METADATA").write_text("{")
    with pytest.raises(FileNotFoundError, match=r"steps \[2, 1\] are all corrupt \(newest: "
                                                r"checkpoint step 2 is corrupt: .*_METADATA"):
        Checkpointer(tmp_path, every=1).restore(_state(0.0))


def test_a_changed_model_is_an_error_not_a_corrupt_checkpoint(tmp_path):
    _saved_steps(tmp_path)
    with pytest.raises(ValueError):  # every step fails the same way: nothing is moved aside
        Checkpointer(tmp_path, every=1).restore(_state(0.0, n=32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "3"]
    assert not tmp_path.with_name(tmp_path.name + ".corrupt").exists()


def test_partial_restore_reads_the_named_leaves_and_training_goes_on(tmp_path):
    """On a training (writing) Checkpointer: `partial` gives back exactly the named subtree of
    the newest step; the full restore and the next save of the same instance still work."""
    _saved_steps(tmp_path, values=(1.0, 2.0))
    ck = Checkpointer(tmp_path, every=1)
    sub, meta = ck.restore({"w": _state(0.0)["w"]}, partial=True)
    assert ck.restored_step == 2 and meta == {"step": 2}
    assert jax.tree.structure(sub) == jax.tree.structure({"w": 0})
    np.testing.assert_array_equal(sub["w"], np.full((64, 64), 2.0, np.float32))
    full, _ = ck.restore(_state(0.0))
    np.testing.assert_array_equal(full["b"], np.arange(64, dtype=np.float32))
    assert ck.maybe_save(3, _state(3.0), {"step": 3})
    ck.close()
    assert float(Checkpointer(tmp_path, every=1).restore(
        {"w": _state(0.0)["w"]}, partial=True)[0]["w"][0, 0]) == 3.0


def test_a_partial_target_naming_an_unsaved_leaf_is_an_error(tmp_path):
    """Orbax would hand the unknown leaf back unread; every step fails alike, so nothing is
    judged corrupt or moved."""
    _saved_steps(tmp_path, values=(1.0, 2.0))
    with pytest.raises(ValueError, match=r"partial restore target names leaves checkpoint step "
                                         r"2 does not hold: \[\"\['x'\]\"\]"):
        Checkpointer(tmp_path, every=1).restore({"x": _state(0.0)["w"]}, partial=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


KILL_MID_SAVE = textwrap.dedent("""
    import os, signal, sys, time
    import jax.numpy as jnp
    from orchestrax.train.checkpoint import Checkpointer
    ck = Checkpointer(sys.argv[1], every=1)
    ck.maybe_save(1, {"w": jnp.full((8, 8), 1.0)}, {"step": 1})
    ck.close()
    ck = Checkpointer(sys.argv[1], every=1)
    big = {"w": jnp.full((4096, 4096), 2.0), "v": jnp.full((4096, 4096), 3.0)}  # 128 MB
    ck.maybe_save(2, big, {"step": 2})
    # The background writer may not have made step 2's temporary directory yet when
    # maybe_save returns; kill once it has, so the kill lands mid-write.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        names = os.listdir(sys.argv[1])
        if "2" in names or any("tmp" in n for n in names):
            break
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)  # while step 2 is being written in the background
""")


def test_sigkill_during_async_save_resumes_from_last_complete_step(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILL_MID_SAVE, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "1"]
    assert leftovers and all("tmp" in name for name in leftovers), leftovers  # a half step
    ck = Checkpointer(tmp_path, every=1)
    assert ck.latest_step == 1
    state, meta = ck.restore({"w": jnp.zeros((8, 8))})
    assert meta == {"step": 1} and float(state["w"][0, 0]) == 1.0
    assert ck.maybe_save(2, {"w": jnp.full((8, 8), 5.0)}, {"step": 2})  # and saving goes on
    ck.close()


def test_task_stream_position_is_restored_exactly(tmp_path):
    def stream():
        return iter(task_stream(13, 4, seed=7).to_iter_dataset(
            grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))

    straight = stream()
    expected = [next(straight).tolist() for _ in range(9)]
    it = stream()
    ck = Checkpointer(tmp_path, every=1)
    seen = [next(it).tolist() for _ in range(5)]
    ck.maybe_save(5, _state(1.0), {"step": 5}, data=it)
    next(it)  # moves on while the save is in flight: the saved position is still 5
    ck.close()
    resumed = stream()
    _, meta = Checkpointer(tmp_path, every=1).restore(_state(0.0), data=resumed)
    assert seen + [next(resumed).tolist() for _ in range(4)] == expected
    assert json.loads((tmp_path / "5" / "data" / "process_0-of-1.json").read_text()) == {
        "next_index": 5}
