"""`load_policy` on a training run directory restores only the params of the trainer's
checkpoint through its `Checkpointer` (a corrupt newest step falls back to the previous one, named
in one log line; the optimizer moments are never read), and a TokenPolicy closes its sampler
through the `Sampler` interface."""

import asyncio
import hashlib
import json
import logging
import os
import pathlib
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import pytest
import tensorstore as ts

from orchestrax import models, rl
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.eval.policy import TokenPolicy, load_policy
from orchestrax.rollout.sampler import Sampler
from orchestrax.train import checkpoint
from orchestrax.train.checkpoint import Checkpointer
from orchestrax.train.setup import write_model_card


def _state(cfg, seed):
    """A TrainState after one AdamW update (gradient = params), so the moments are not zeros
    (Orbax stores an all-zero chunk inline in its index, not in a data file)."""
    params = models.init_params(cfg, seed)
    opt_cfg = rl.OptimizerConfig()
    state = rl.init_state(params, opt_cfg)
    _, opt_state = rl.make_optimizer(opt_cfg).update(params, state.opt_state, params)
    return state._replace(opt_state=opt_state)


def _run_dir(tmp_path, steps):
    """A run dir like `orchestrax train` writes: model card + full TrainStates (params, AdamW
    moments, counters) at `steps`, step s holding the params of seed s."""
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    run = tmp_path / "run"
    write_model_card(run / "model", cfg, tok)
    ckpt = Checkpointer(run / "checkpoints", every=1)
    for s in steps:
        ckpt.maybe_save(s, _state(cfg, s), {"phase": "rl", "step": s}, force=True)
    ckpt.close()
    return run, cfg


def _zero_chunks(state_dir, prefix: bytes) -> list[str]:
    """Overwrite with zeros, in place and at the same size, the stored bytes of every array chunk
    of the saved state whose key starts with `prefix` (e.g. b"opt_state."), and return the keys.
    File sizes still match the step's manifest, but reading such a chunk fails (zeros are no zstd
    frame). Where each chunk lies comes from the OCDBT index, read by tensorstore."""
    kv = ts.KvStore.open(f"file://{state_dir}/").result()
    (version,) = ts.ocdbt.dump(kv).result()["versions"]
    assert version["root_height"] == 0     # one index node holds every key of a tiny state
    hit = []
    for entry in ts.ocdbt.dump(kv, version["root"]["location"]).result()["entries"]:
        if entry["key"].startswith(prefix) and "indirect_value" in entry:
            # "value:<base>/:d/<file>:<offset>:<length>", relative to the state directory
            base, file, offset, length = entry["indirect_value"].removeprefix("value:").split(":")
            with open(state_dir / base / file, "r+b") as f:
                f.seek(int(offset))
                f.write(bytes(int(length)))
            hit.append(entry["key"].decode())
    return hit


def test_a_run_dir_restores_its_newest_step(tmp_path, caplog):
    run, cfg = _run_dir(tmp_path, (2, 3))
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        policy = load_policy(str(run), max_len=64, max_batch=2)
    assert policy.sampler.weight_version == "3"
    chex.assert_trees_all_equal(policy.sampler.params, _as_sampled(cfg, 3))
    assert _our_warnings(caplog) == []
    asyncio.run(policy.aclose())


def _as_sampled(cfg, seed: int):
    """The run's params at `seed` as the sampler holds them: layers unstacked."""
    return models.unstack_layers(models.init_params(cfg, seed))


def _our_warnings(caplog) -> list[str]:
    """Ours only: Orbax notes a read-only manager at warning level."""
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("orchestrax")]


def test_a_truncated_newest_step_falls_back_to_the_previous_one(tmp_path, caplog):
    """As when training resumes: the newest step's largest array file cut in half -> eval loads
    step 2 and logs one line naming step 3 and the file; unlike training it moves nothing (eval
    may read a live run)."""
    run, cfg = _run_dir(tmp_path, (2, 3))
    step_dir = run / "checkpoints" / "3"
    data = max((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
               key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        policy = load_policy(str(run), max_len=64, max_batch=2)
    assert policy.sampler.weight_version == "2"
    chex.assert_trees_all_equal(policy.sampler.params, _as_sampled(cfg, 2))
    (line,) = _our_warnings(caplog)
    assert line.startswith("checkpoint step 3 is corrupt (") and str(data) in line
    assert "truncated?" in line and "falling back to the previous step" in line
    assert step_dir.is_dir() and not (run / "checkpoints.corrupt").exists()
    asyncio.run(policy.aclose())


def _rewrite_manifest(step_dir: pathlib.Path) -> None:
    """Recompute every file's size and SHA-256 in the step's manifest from what is on disk."""
    manifest = step_dir / checkpoint.MANIFEST
    files = json.loads(manifest.read_text())
    for rel in files["files"]:
        data = (step_dir / rel).read_bytes()
        files["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest.write_text(json.dumps(files))


def test_eval_reads_the_params_and_never_the_optimizer_moments(tmp_path, caplog):
    """Step 3's AdamW moments (mu, nu) zeroed on disk at their saved sizes: training's whole-state
    restore of the run falls back to step 2, eval loads step 3's params exactly and logs nothing,
    because it never opens those chunks."""
    run, cfg = _run_dir(tmp_path, (2, 3))
    hit = _zero_chunks(run / "checkpoints" / "3" / "state", b"opt_state.")
    # mu and nu of the 8 matrices; the norms' few bytes sit inline in the index, not in a file
    assert {k.split(".")[3] for k in hit} == {"mu", "nu"} and len(hit) == 16
    # Damage done before the step's manifest was written (the manifest vouches for it), so only
    # reading the chunks can find it: eval must not read them.
    _rewrite_manifest(run / "checkpoints" / "3")
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        policy = load_policy(str(run), max_len=64, max_batch=2)
    assert policy.sampler.weight_version == "3" and _our_warnings(caplog) == []
    chex.assert_trees_all_equal(policy.sampler.params, _as_sampled(cfg, 3))
    asyncio.run(policy.aclose())

    trainer = Checkpointer(run / "checkpoints", every=0, read_only=True)
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        state, _ = trainer.restore(jax.eval_shape(lambda: _state(cfg, 0)))
    trainer.close()
    assert trainer.restored_step == 2
    chex.assert_trees_all_equal(state, _state(cfg, 2))
    assert _our_warnings(caplog)[-1].startswith("checkpoint step 3 is corrupt (")


def test_corrupt_params_still_fall_back(tmp_path, caplog):
    """The same same-size damage to one params chunk of step 3 is read by eval: step 2 loads,
    one line names step 3."""
    run, cfg = _run_dir(tmp_path, (2, 3))
    (hit,) = _zero_chunks(run / "checkpoints" / "3" / "state", b"params.embed/")
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        policy = load_policy(str(run), max_len=64, max_batch=2)
    assert policy.sampler.weight_version == "2"
    chex.assert_trees_all_equal(policy.sampler.params, _as_sampled(cfg, 2))
    (line,) = _our_warnings(caplog)
    assert line.startswith("checkpoint step 3 is corrupt (") and "falling back" in line
    asyncio.run(policy.aclose())


def test_param_dtype_casts_the_params_as_they_are_read(tmp_path):
    run, cfg = _run_dir(tmp_path, (3,))
    policy = load_policy(str(run), max_len=64, max_batch=2, param_dtype="bfloat16")
    assert policy.sampler.cfg.param_dtype == "bfloat16"
    # Held as the sampler reads them fastest: layers unstacked, as serve and training hold them.
    assert isinstance(policy.sampler.params["layers"], tuple)
    chex.assert_trees_all_equal(policy.sampler.params, models.unstack_layers(jax.tree.map(
        lambda x: x.astype(jnp.bfloat16), models.init_params(cfg, 3))))
    asyncio.run(policy.aclose())
    with pytest.raises(ValueError, match=r"param_dtype='float16'; allowed: \('float32', "
                                         r"'bfloat16'\)"):
        load_policy(str(run), param_dtype="float16")


def test_a_run_dir_without_a_checkpoint_is_named(tmp_path):
    run, _ = _run_dir(tmp_path, ())
    with pytest.raises(FileNotFoundError, match=r"run/checkpoints holds no checkpoint"):
        load_policy(str(run))


def test_token_policy_closes_its_sampler_through_the_interface():
    """`aclose` is part of `Sampler`: one that holds something closes it, one that holds nothing
    inherits the no-op."""
    tok = tiny_qwen3_tokenizer()

    class Holding(ScriptedSampler):
        closed = 0

        async def aclose(self):
            self.closed += 1

    holding = Holding(tok, turns=["<answer>1</answer>"])
    asyncio.run(TokenPolicy(holding, tok, name="h").aclose())
    assert holding.closed == 1
    plain = ScriptedSampler(tok, turns=["<answer>1</answer>"])
    assert type(plain).aclose is Sampler.aclose
    asyncio.run(TokenPolicy(plain, tok, name="p").aclose())   # the base's no-op


def test_a_run_trained_over_8_devices_is_evaluated_on_one(tmp_path):
    """The checkpoint holds params sharded over a mesh of 8 (fake CPU) devices; eval in a
    process that has one device restores them there, equal to the saved values."""
    from orchestrax import parallel
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 4), ("tensor", 2))))
    state = _state(cfg, 5)
    state = state._replace(params=models.shard_params(cfg, state.params, mesh))
    assert len(jax.tree.leaves(state.params)[0].sharding.device_set) > 1
    run = tmp_path / "run"
    write_model_card(run / "model", cfg, tok)
    ckpt = Checkpointer(run / "checkpoints", every=1)
    ckpt.maybe_save(5, state, {"phase": "rl", "step": 5}, force=True)
    ckpt.close()
    code = ("import jax, numpy as np, sys\n"
            "from orchestrax import models\n"
            "from orchestrax.eval.policy import load_policy\n"
            "assert jax.device_count() == 1\n"
            "p = load_policy(sys.argv[1], max_len=64, max_batch=2)\n"
            "want = models.unstack_layers(models.init_params(\n"
            "    models.tiny_config(vocab_size=int(sys.argv[2])), 5))\n"
            "assert p.sampler.weight_version == '5'\n"
            "jax.tree.map(np.testing.assert_array_equal, p.sampler.params, want)\n"
            "print('ok')\n")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code, str(run), str(len(tok))], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_serve_and_export_read_a_run_as_eval_does(tmp_path, caplog):
    """One reader: `orchestrax serve --model RUN_DIR` and tools/export_hf.py take the run's
    newest whole checkpoint's params, and fall back past a corrupt newest step as eval does."""
    import runpy
    from orchestrax.train.serve import ServeConfig, build_state
    run, cfg = _run_dir(tmp_path, (2, 3))
    _zero_chunks(run / "checkpoints" / "3" / "state", b"params.embed/")
    state = build_state(ServeConfig(model=str(run), max_len=64, max_batch=2))
    chex.assert_trees_all_equal(state.sampler.params,
                                models.unstack_layers(models.init_params(cfg, 2)))
    asyncio.run(state.sampler.aclose())
    root = pathlib.Path(__file__).resolve().parents[1]
    export = runpy.run_path(str(root / "tools" / "export_hf.py"))["export"]
    _, params = models.load_hf(export(str(run), str(tmp_path / "hf")))
    chex.assert_trees_all_equal(params, models.init_params(cfg, 2))
    _, params = models.load_hf(export(str(run), str(tmp_path / "hf3"), step=2))
    chex.assert_trees_all_equal(params, models.init_params(cfg, 2))
