"""`load_policy` on a training run directory restores through the trainer's `Checkpointer` (a
corrupt newest step falls back to the previous one, named in one log line), and a TokenPolicy
closes its sampler through the `Sampler` interface."""

import asyncio
import logging

import chex
import pytest

from orchestrax import models, rl
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.eval.policy import TokenPolicy, load_policy
from orchestrax.rollout.base import Sampler
from orchestrax.train.checkpoint import Checkpointer
from orchestrax.train.setup import write_model_card


def _run_dir(tmp_path, steps):
    """A run dir like `orchestrax train` writes: model card + full TrainStates (params, AdamW
    moments, counters) at `steps`, step s holding the params of seed s."""
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    run = tmp_path / "run"
    write_model_card(run / "model", cfg, tok)
    ckpt = Checkpointer(run / "checkpoints", every=1)
    for s in steps:
        state = rl.init_state(models.init_params(cfg, s), rl.OptimizerConfig())
        ckpt.maybe_save(s, state, {"phase": "rl", "step": s}, force=True)
    ckpt.close()
    return run, cfg


def test_a_run_dir_restores_its_newest_step(tmp_path, caplog):
    run, cfg = _run_dir(tmp_path, (2, 3))
    with caplog.at_level(logging.WARNING, logger="orchestrax"):
        policy = load_policy(str(run), max_len=64, max_batch=2)
    assert policy.sampler.weight_version == "3"
    chex.assert_trees_all_equal(policy.sampler.params, models.init_params(cfg, 3))
    assert _our_warnings(caplog) == []
    asyncio.run(policy.aclose())


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
    chex.assert_trees_all_equal(policy.sampler.params, models.init_params(cfg, 2))
    (line,) = _our_warnings(caplog)
    assert line.startswith("checkpoint step 3 is corrupt (") and str(data) in line
    assert "truncated?" in line and "falling back to the previous step" in line
    assert step_dir.is_dir() and not (run / "checkpoints.corrupt").exists()
    asyncio.run(policy.aclose())


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
