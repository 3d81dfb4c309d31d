"""Logit parity with transformers' Qwen3ForCausalLM (torch fp32, CPU), both directions."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from orchestrax import models

# (tied, heads, kv_heads, head_dim): kv ratios 1, 2, 4; head_dim != hidden/heads in three.
CASES = [
    dict(tie=True, heads=4, kv=4, head_dim=16),
    dict(tie=False, heads=4, kv=2, head_dim=32),
    dict(tie=True, heads=8, kv=2, head_dim=24),
    dict(tie=False, heads=4, kv=1, head_dim=8),
]
HIDDEN, VOCAB = 64, 320


def hf_model(case, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=case["heads"], num_key_value_heads=case["kv"],
        head_dim=case["head_dim"], tie_word_embeddings=case["tie"], rope_theta=10_000.0,
        max_position_embeddings=512, rms_norm_eps=1e-6)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # random norms too, so a misplaced norm weight cannot hide
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model


def batch(left_pad: bool):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(3, 11)).astype(np.int32)
    mask = np.ones_like(ids)
    if left_pad:
        mask[1, :4] = 0
        mask[2, :9] = 0
        ids[mask == 0] = 0
    return ids, mask


def hf_logits(model, ids, mask):
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    position_ids=torch.tensor(pos, dtype=torch.long))
    return out.logits.numpy()


def max_diff_on_real_tokens(a, b, mask):
    return float(np.max(np.abs(a - b)[mask.astype(bool)]))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"tie{int(c['tie'])}-n{c['heads']}k{c['kv']}h{c['head_dim']}")
@pytest.mark.parametrize("left_pad", [False, True], ids=["nopad", "leftpad"])
def test_hf_to_orchestrax(tmp_path, case, left_pad):
    model = hf_model(case)
    model.save_pretrained(tmp_path, safe_serialization=True)
    cfg, params = models.load_hf(tmp_path)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.tie_embeddings) == (case["kv"], case["head_dim"], case["tie"])
    ids, mask = batch(left_pad)
    ours = np.asarray(models.jit_forward(cfg, params, jnp.asarray(ids), jnp.asarray(mask)))
    assert max_diff_on_real_tokens(ours, hf_logits(model, ids, mask), mask) <= 1e-4


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"tie{int(c['tie'])}-n{c['heads']}k{c['kv']}h{c['head_dim']}")
def test_orchestrax_to_hf(tmp_path, case):
    cfg = models.tiny_config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96,
                             num_heads=case["heads"], num_kv_heads=case["kv"],
                             head_dim=case["head_dim"], tie_embeddings=case["tie"])
    params = models.init_params(cfg, seed=1)
    key = jax.random.key(2)
    params = jax.tree.map(  # random norms, as above
        lambda p: p + 0.3 * jax.random.normal(key, p.shape) if p.ndim <= 2 and p.shape[-1] in
        (HIDDEN, case["head_dim"]) and float(jnp.std(p)) == 0.0 else p, params)
    models.save_hf(cfg, params, tmp_path, max_shard_bytes=40_000)  # force several shards
    assert (tmp_path / "model.safetensors.index.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    for left_pad in (False, True):
        ids, mask = batch(left_pad)
        ours = np.asarray(models.jit_forward(cfg, params, jnp.asarray(ids), jnp.asarray(mask)))
        assert max_diff_on_real_tokens(ours, hf_logits(model, ids, mask), mask) <= 1e-4


def test_round_trip_is_exact(tmp_path):
    cfg = models.tiny_config(tie_embeddings=False)
    params = models.init_params(cfg, seed=3)
    models.save_hf(cfg, params, tmp_path)
    cfg2, params2 = models.load_hf(tmp_path)
    assert cfg2.replace(bos_token_id=None, eos_token_id=None, max_position_embeddings=1) == \
        cfg.replace(bos_token_id=None, eos_token_id=None, max_position_embeddings=1)
    chex.assert_trees_all_equal(params, params2)
