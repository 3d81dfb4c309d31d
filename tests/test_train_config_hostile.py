"""Configs that used to train to NaN or fail obscurely are refused in one line naming the field:
a model vocabulary smaller than the tokenizer's, non-positive rope_theta / rms_norm_eps /
max_position_embeddings, an unwritable out_dir, a context that cannot hold the prompt."""

import dataclasses

import pytest
from test_train_loop import tiny_run

from orchestrax import models
from orchestrax.train.train_config import RolloutConfig
from orchestrax.train.loop import Trainer


@pytest.mark.parametrize("field, value", [
    ("rope_theta", -1e4), ("rope_theta", 0.0), ("rope_theta", float("nan")),
    ("rms_norm_eps", -1.0), ("rms_norm_eps", 0.0), ("rms_norm_eps", float("inf")),
    ("max_position_embeddings", 0),
])
def test_positive_only_model_fields_are_named(field, value):
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}=.*must be a finite number > 0"):
        models.tiny_config(**{field: value})


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tmp_path):
    cfg = tiny_run(tmp_path, steps=1)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=300))
    with pytest.raises(ValueError, match=r"model.vocab_size gives vocab_size=300, smaller than "
                                         r"the 512 tokens of tokenizer='tiny'; must be >= 512"):
        Trainer(cfg)


@pytest.mark.parametrize("out_dir", ["/proc/orchestrax_x", "/dev/null/run"])
def test_an_unwritable_out_dir_is_one_line(out_dir):
    with pytest.raises(ValueError, match=rf"TrainConfig.out_dir='{out_dir}' is not a writable "
                                         "directory") as e:
        Trainer(tiny_run(out_dir, steps=1))
    assert "\n" not in str(e.value)


def test_a_context_that_cannot_hold_the_prompt_is_named(tmp_path):
    cfg = tiny_run(tmp_path, steps=1)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, context_tokens=8))
    assert isinstance(cfg.rollout, RolloutConfig)
    with pytest.raises(ValueError, match=r"rollout.context_tokens=8 cannot hold the prompt of "
                                         r"train task .* tokens before any reply; must be > "):
        Trainer(cfg)


def test_a_warm_start_batch_that_does_not_split_over_the_devices_is_named(tmp_path):
    # tiny_run's mesh shards the batch over all 8 fake devices; 12 rows would fail to place at
    # the first SFT step, after the model and sampler are built.
    cfg = dataclasses.replace(tiny_run(tmp_path, sft_steps=2, steps=0), sft_batch=12)
    with pytest.raises(ValueError, match=r"sft_batch=12 does not split over the 8 devices of the "
                                         r"mesh's batch axes; must be a multiple of 8 \(e.g. 8 "
                                         r"or 16\)") as e:
        Trainer(cfg)
    assert "\n" not in str(e.value)
