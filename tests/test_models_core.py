"""Presets, parameter counts, KV-cache decoding, sharded forward and malformed checkpoints."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from orchestrax import models, parallel

# Published config.json values of the Qwen3 dense checkpoints.
PUBLISHED = {
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, True),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, True),
    "qwen3-4b": (2560, 9728, 36, 32, 8, True),
    "qwen3-8b": (4096, 12288, 36, 32, 8, False),
    "qwen3-14b": (5120, 17408, 40, 40, 8, False),
    "qwen3-32b": (5120, 25600, 64, 64, 8, False),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_match_published_configs(name):
    cfg = models.preset(name)
    d, f, layers, heads, kv, tied = PUBLISHED[name]
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
            cfg.num_kv_heads, cfg.tie_embeddings) == (d, f, layers, heads, kv, tied)
    assert (cfg.vocab_size, cfg.head_dim, cfg.rope_theta, cfg.rms_norm_eps,
            cfg.max_position_embeddings) == (151_936, 128, 1_000_000.0, 1e-6, 40_960)
    shapes = jax.eval_shape(lambda: models.init_params(cfg))
    assert sum(x.size for x in jax.tree.leaves(shapes)) == models.num_params(cfg)


def test_qwen3_8b_has_8_190_735_360_parameters():
    shapes = jax.eval_shape(lambda: models.init_params(models.preset("qwen3-8b")))
    total = sum(x.size for x in jax.tree.leaves(shapes))
    # Worked by hand: embed and lm_head 151936*4096 each; per layer q,o 4096*32*128 each,
    # k,v 4096*8*128 each, q/k norm 128 each, MLP 3*4096*12288, two norms 4096 each; final norm.
    embed = 151_936 * 4096
    layer = 2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 2 * 128 + 3 * 4096 * 12288 + 2 * 4096
    assert total == 2 * embed + 36 * layer + 4096 == 8_190_735_360


def test_unknown_preset_and_bad_field_are_named():
    with pytest.raises(ValueError, match="qwen3-7b.*allowed"):
        models.preset("qwen3-7b")
    with pytest.raises(ValueError, match="remat"):
        models.tiny_config(remat="sometimes")


def test_kv_cache_decoding_matches_full_forward():
    cfg = models.tiny_config()
    params = models.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, cfg.vocab_size, size=(2, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # left padding in the prompt
    full = np.asarray(models.forward(cfg, params, jnp.asarray(ids), jnp.asarray(mask)))
    prompt = 5
    cache = models.init_cache(cfg, batch=2, max_len=16)
    logits, cache = models.jit_forward_with_cache(cfg, params, jnp.asarray(ids[:, :prompt]),
                                                  jnp.asarray(mask[:, :prompt]), cache)
    steps = [np.asarray(logits)]
    last, _ = models.jit_forward_with_cache(cfg, params, jnp.asarray(ids[:, :prompt]),
                                            jnp.asarray(mask[:, :prompt]),
                                            models.init_cache(cfg, batch=2, max_len=16),
                                            last_only=True)
    np.testing.assert_allclose(np.asarray(last)[:, 0], steps[0][:, -1], atol=1e-6, rtol=0)
    for t in range(prompt, ids.shape[1]):
        logits, cache = models.jit_forward_with_cache(cfg, params, jnp.asarray(ids[:, t:t + 1]),
                                                      jnp.ones((2, 1), jnp.int32), cache)
        steps.append(np.asarray(logits))
    cached = np.concatenate(steps, axis=1)
    real = mask.astype(bool)
    np.testing.assert_allclose(cached[real], full[real], atol=1e-5, rtol=0)


def test_sharded_forward_equals_single_device():
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    cfg = models.tiny_config(num_heads=8, num_kv_heads=4, head_dim=16, tie_embeddings=False)
    params = models.init_params(cfg, seed=0)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (4, 10)), jnp.int32)
    mask = jnp.ones_like(ids).at[1, :4].set(0)
    single = np.asarray(models.jit_forward(cfg, params, ids, mask))

    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 2), ("tensor", 4))))
    sharded = models.shard_params(cfg, params, mesh)
    assert sharded["layers"]["q"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert sharded["embed"].sharding.spec == P("tensor", "fsdp")
    assert len(sharded["layers"]["gate"].addressable_shards) == 8
    assert sharded["layers"]["gate"].addressable_shards[0].data.shape == (2, 32, 32)
    batch_sharding = jax.sharding.NamedSharding(mesh, parallel.logical_to_spec(("batch", "seq"), mesh=mesh))
    ids_s, mask_s = jax.device_put((ids, mask), batch_sharding)

    def fwd(p, i, m):
        with parallel.activation_sharding(mesh):
            return models.forward(cfg, p, i, m)

    out = jax.jit(fwd)(sharded, ids_s, mask_s)
    np.testing.assert_allclose(np.asarray(out), single, atol=1e-5, rtol=0)


def test_bad_mesh_fails_before_compiling():
    with pytest.raises(ValueError, match="multiply to 6"):
        parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 2), ("tensor", 3))))
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
        parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", -1), ("tensor", 3))))
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 2), ("tensor", 4))))
    cfg = models.tiny_config(num_heads=6, num_kv_heads=2)  # kv_heads 2 over tensor 4
    with pytest.raises(ValueError, match=r"\['layers'\]\['k'\].*size 2.*\('tensor',\).*4"):
        models.param_shardings(cfg, mesh)


def _write_ckpt(tmp_path, cfg, params, **config_edits):
    models.save_hf(cfg, params, tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    conf.update(config_edits)
    (tmp_path / "config.json").write_text(json.dumps(conf))


def test_malformed_checkpoints_name_the_problem(tmp_path):
    from safetensors.numpy import load_file, save_file
    cfg = models.tiny_config()
    params = models.init_params(cfg)

    bad_arch = tmp_path / "arch"
    _write_ckpt(bad_arch, cfg, params, model_type="mamba")
    with pytest.raises(ValueError, match="model_type='mamba'"):
        models.load_hf(bad_arch)

    missing = tmp_path / "missing"
    _write_ckpt(missing, cfg, params)
    tensors = load_file(missing / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, missing / "model.safetensors")
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        models.load_hf(missing)

    shape = tmp_path / "shape"
    _write_ckpt(shape, cfg, params)
    tensors = load_file(shape / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((3, 64), np.float32)
    save_file(tensors, shape / "model.safetensors")
    with pytest.raises(ValueError, match="k_proj.weight.*\\(3, 64\\)"):
        models.load_hf(shape)

    rope = tmp_path / "rope"
    _write_ckpt(rope, cfg, params, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6})
    with pytest.raises(ValueError, match="yarn"):
        models.load_hf(rope)


def test_reads_transformers_4x_config_shape(tmp_path):
    cfg = models.tiny_config()
    params = models.init_params(cfg)
    _write_ckpt(tmp_path, cfg, params, torch_dtype="bfloat16", rope_theta=12345.0)
    conf = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "dtype"):
        conf.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(conf))
    assert models.load_hf(tmp_path)[0].rope_theta == 12345.0


def test_load_onto_mesh_shards_directly(tmp_path):
    cfg = models.tiny_config(num_heads=8, num_kv_heads=4, head_dim=16)
    params = models.init_params(cfg, seed=4)
    models.save_hf(cfg, params, tmp_path, dtype="bfloat16")
    mesh = parallel.make_mesh(parallel.MeshConfig(axes=(("fsdp", 2), ("tensor", 4))))
    cfg2, loaded = models.load_hf(tmp_path, mesh=mesh)
    assert loaded["layers"]["k"].sharding.spec == P(None, "fsdp", "tensor", None)
    want = np.asarray(params["layers"]["k"].astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(loaded["layers"]["k"]), want)
