"""Hugging Face checkpoint directories <-> our params, streamed tensor by tensor.

Loading builds every parameter with `jax.make_array_from_callback`: each device shard is cut
from the memory-mapped safetensors one layer at a time, so no host ever holds a full copy of the
model per device. Saving pulls one layer slice at a time to the host and writes sharded
safetensors plus an index that `transformers.AutoModelForCausalLM.from_pretrained` reads.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any, Callable

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from orchestrax.models.configs import ModelConfig
from orchestrax.models.decoder import init_params
from orchestrax.models.sharding import param_shardings

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_ARCH_BY_MODEL_TYPE = {"qwen3": ("qwen3", "Qwen3ForCausalLM"), "llama": ("llama", "LlamaForCausalLM")}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


# --- config.json ------------------------------------------------------------------------------
def config_from_hf(hf: dict[str, Any], dtype: str = "float32",
                   param_dtype: str = "float32") -> ModelConfig:
    """Read config.json in transformers 4.x (`rope_theta`, `torch_dtype`) or 5.x
    (`rope_parameters`, `dtype`) shape. `dtype` is the compute dtype; the checkpoint's own
    `torch_dtype` is not used: params are `param_dtype` (float32 master weights by default)."""
    model_type = hf.get("model_type")
    if model_type not in _ARCH_BY_MODEL_TYPE:
        raise ValueError(f"config.json model_type={model_type!r} is not supported; "
                         f"allowed: {sorted(_ARCH_BY_MODEL_TYPE)}")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"config.json rope type {rope_type!r} is not supported; allowed: 'default'")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
        if key not in hf:
            raise ValueError(f"config.json is missing the field {key!r}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError("config.json attention_bias/mlp_bias=true is not supported")
    heads = hf["num_attention_heads"]
    return ModelConfig(
        arch=_ARCH_BY_MODEL_TYPE[model_type][0], vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), rope_theta=float(theta),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 40_960)),
        dtype=dtype, param_dtype=param_dtype,
        bos_token_id=hf.get("bos_token_id"), eos_token_id=_first(hf.get("eos_token_id")))


def _first(x):
    return x[0] if isinstance(x, list) else x


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    model_type, arch = _ARCH_BY_MODEL_TYPE[cfg.arch]
    out = {
        "architectures": [arch], "model_type": model_type, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        # Both shapes, so transformers 4.x and 5.x read the same file.
        "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "torch_dtype": dtype, "dtype": dtype,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }
    if cfg.arch == "qwen3":
        out |= {"use_sliding_window": False, "sliding_window": None,
                "max_window_layers": cfg.num_layers}
    else:
        out |= {"mlp_bias": False, "pretraining_tp": 1}
    return out


# --- name and layout mapping ------------------------------------------------------------------
# Our leaf -> (HF name template, to_ours, to_hf). torch Linear stores [out, in]; we store [in, out]
# with heads split out.
def _leaf_map(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[str, Callable, Callable]]:
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ident = (lambda a: a, lambda a: a)
    p = "model.layers.{}."
    m = {
        ("embed",): ("model.embed_tokens.weight", *ident),
        ("final_norm",): ("model.norm.weight", *ident),
        ("layers", "attn_norm"): (p + "input_layernorm.weight", *ident),
        ("layers", "mlp_norm"): (p + "post_attention_layernorm.weight", *ident),
        ("layers", "q"): (p + "self_attn.q_proj.weight", lambda a: a.T.reshape(d, n, h),
                          lambda a: a.reshape(d, n * h).T),
        ("layers", "k"): (p + "self_attn.k_proj.weight", lambda a: a.T.reshape(d, k, h),
                          lambda a: a.reshape(d, k * h).T),
        ("layers", "v"): (p + "self_attn.v_proj.weight", lambda a: a.T.reshape(d, k, h),
                          lambda a: a.reshape(d, k * h).T),
        ("layers", "o"): (p + "self_attn.o_proj.weight", lambda a: a.T.reshape(n, h, d),
                          lambda a: a.reshape(n * h, d).T),
        ("layers", "gate"): (p + "mlp.gate_proj.weight", lambda a: a.T, lambda a: a.T),
        ("layers", "up"): (p + "mlp.up_proj.weight", lambda a: a.T, lambda a: a.T),
        ("layers", "down"): (p + "mlp.down_proj.weight", lambda a: a.T, lambda a: a.T),
    }
    if cfg.qk_norm:
        m[("layers", "q_norm")] = (p + "self_attn.q_norm.weight", *ident)
        m[("layers", "k_norm")] = (p + "self_attn.k_norm.weight", *ident)
    if not cfg.tie_embeddings:
        m[("lm_head",)] = ("lm_head.weight", lambda a: a.T, lambda a: a.T)
    return m


def _path_keys(path) -> tuple[str, ...]:
    return tuple(getattr(e, "key", str(e)) for e in path)


# --- loading ----------------------------------------------------------------------------------
class _TensorSource:
    """Name -> memory-mapped tensor across the files of one checkpoint directory."""

    def __init__(self, path: pathlib.Path):
        index = path / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (path / "model.safetensors").exists():
            with safe_open(path / "model.safetensors", framework="numpy") as f:
                weight_map = {name: "model.safetensors" for name in f.keys()}
        else:
            raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
        self.path, self.weight_map, self._files = path, weight_map, {}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        return self._file(name).get_tensor(name)

    def _file(self, name: str):
        if name not in self.weight_map:
            raise ValueError(f"{self.path}: checkpoint is missing tensor {name!r}")
        fname = self.weight_map[name]
        if fname not in self._files:
            self._files[fname] = safe_open(self.path / fname, framework="numpy")
        return self._files[fname]


def load_hf(path: str | os.PathLike, dtype: str = "float32", mesh: Mesh | None = None,
            rules=None, *, param_dtype: str = "float32") -> tuple[ModelConfig, Any]:
    """Read a HF Qwen3/Llama directory into (cfg, params), sharded on `mesh` when given.

    `dtype` is the compute dtype. Params are float32 whatever the compute dtype or the file's
    dtype: a trained model needs fp32 master weights (at lr 1e-6 an AdamW step on a weight of
    ~0.02 is below bfloat16's rounding step there). `param_dtype="bfloat16"` is for a
    serve-only copy that never trains."""
    path = pathlib.Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists() and (path / "model" / "config.json").is_file() and \
            (path / "checkpoints").is_dir():
        raise FileNotFoundError(
            f"{path} is a training run dir, not a Hugging Face directory; export it first "
            f"(python tools/export_hf.py {path} OUT_DIR) and load OUT_DIR")
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path}: no config.json there; give a Hugging Face model "
                                "directory (config.json + safetensors)")
    cfg = config_from_hf(json.loads(cfg_file.read_text()), dtype=dtype, param_dtype=param_dtype)
    src = _TensorSource(path)
    shapes = jax.eval_shape(lambda: init_params(cfg))
    if mesh is None:
        shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), shapes)
    else:
        shardings = param_shardings(cfg, mesh, *(() if rules is None else (rules,)))
    leaf_map, np_dtype = _leaf_map(cfg), _NP_DTYPES[param_dtype]

    def build(path_, shape_struct, sharding):
        keys = _path_keys(path_)
        template, to_ours, to_hf = leaf_map[keys]
        stacked = keys[0] == "layers"
        per_layer = shape_struct.shape[1:] if stacked else shape_struct.shape
        want = to_hf(np.empty(per_layer, np.uint8)).shape
        names = [template.format(i) for i in range(cfg.num_layers)] if stacked else [template]
        for name in names:  # validate every tensor before reading any
            if src.shape(name) != tuple(want):
                raise ValueError(f"tensor {name!r} has shape {src.shape(name)}; the config "
                                 f"expects {tuple(want)}")

        def shard(index):
            if not stacked:
                return np.ascontiguousarray(to_ours(src.get(names[0]))[index]).astype(np_dtype)
            layers = range(cfg.num_layers)[index[0]]
            return np.stack([to_ours(src.get(names[i]))[index[1:]].astype(np_dtype)
                             for i in layers])

        return jax.make_array_from_callback(shape_struct.shape, sharding, shard)

    params = jax.tree_util.tree_map_with_path(build, shapes, shardings)
    return cfg, params


# --- saving -----------------------------------------------------------------------------------
def _host_tensors(cfg: ModelConfig, params: Any, np_dtype):
    """Yield (hf_name, host array) one tensor at a time, gathering across hosts if needed."""
    from jax.experimental import multihost_utils

    def to_host(x):
        if not x.is_fully_addressable:
            x = multihost_utils.process_allgather(x, tiled=True)
        return np.asarray(jax.device_get(x)).astype(np_dtype)

    leaf_map = _leaf_map(cfg)
    for path_, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = _path_keys(path_)
        if keys not in leaf_map:
            raise ValueError(f"params has an unexpected leaf {'/'.join(keys)}")
        template, _, to_hf = leaf_map[keys]
        if keys[0] == "layers":
            for i in range(cfg.num_layers):
                yield template.format(i), np.ascontiguousarray(to_hf(to_host(leaf[i])))
        else:
            yield template, np.ascontiguousarray(to_hf(to_host(leaf)))


def save_hf(cfg: ModelConfig, params: Any, out_dir: str | os.PathLike, *,
            tokenizer_dir: str | os.PathLike | None = None, dtype: str | None = None,
            max_shard_bytes: int = 4 << 30) -> pathlib.Path:
    """Write a transformers-loadable directory: sharded safetensors + index, config.json,
    generation_config.json and (when given) the tokenizer files. Only process 0 writes.

    `dtype` defaults to the compute dtype `cfg.dtype`, the one a sampler runs in: a weight sync
    of fp32 master weights with bf16 compute writes bf16 (16 GB for Qwen3-8B, not 32)."""
    dtype = dtype or cfg.dtype
    if dtype not in _NP_DTYPES:
        raise ValueError(f"save_hf dtype={dtype!r}; allowed: {sorted(_NP_DTYPES)}")
    out = pathlib.Path(out_dir)
    writer = jax.process_index() == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
    parts: list[list[str]] = []          # tensor names per shard file, in order
    current: dict[str, np.ndarray] = {}
    size = total = 0

    def flush():
        if writer:
            save_file(current, out / f"part-{len(parts) + 1:05d}.tmp", metadata={"format": "pt"})
        parts.append(list(current))
        current.clear()

    for name, arr in _host_tensors(cfg, params, _NP_DTYPES[dtype]):
        if current and size + arr.nbytes > max_shard_bytes:
            flush()
            size = 0
        current[name] = arr
        size += arr.nbytes
        total += arr.nbytes
    flush()
    if not writer:
        return out
    n = len(parts)
    for i in range(1, n + 1):  # the final names need the shard count, known only now
        os.replace(out / f"part-{i:05d}.tmp", out / _shard_name(i, n))
    if n > 1:
        weight_map = {name: _shard_name(i, n) for i, names in enumerate(parts, 1) for name in names}
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    tok_dir = None if tokenizer_dir is None else pathlib.Path(tokenizer_dir)
    specials = special_token_ids(tok_dir) if tok_dir is not None else {}
    hf = config_to_hf(cfg, dtype)
    if hf["eos_token_id"] is None:
        hf["eos_token_id"] = specials.get("eos")
    if hf["bos_token_id"] is None:
        hf["bos_token_id"] = specials.get("bos")
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    own = tok_dir / "generation_config.json" if tok_dir is not None else None
    if own is not None and own.is_file():
        (out / "generation_config.json").write_text(own.read_text())
    else:
        (out / "generation_config.json").write_text(
            json.dumps(generation_config(cfg.arch, hf, specials), indent=2))
    if tok_dir is not None:
        copy_tokenizer(tok_dir, out)
    for f in out.iterdir():  # safetensors writes 0600; a server under another user must read it
        if f.is_file():
            f.chmod(_FILE_MODE)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _token_id(added: dict[str, int], token: Any) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    return added.get(token) if isinstance(token, str) else None


def special_token_ids(tokenizer_dir: pathlib.Path) -> dict[str, int]:
    """eos / bos / pad / endoftext ids named by a saved tokenizer, read from its
    tokenizer.json and tokenizer_config.json (no transformers import). Missing ones are left out."""
    tj, tc = tokenizer_dir / "tokenizer.json", tokenizer_dir / "tokenizer_config.json"
    if not tj.is_file():
        return {}
    added = {t["content"]: t["id"] for t in json.loads(tj.read_text()).get("added_tokens", [])}
    conf = json.loads(tc.read_text()) if tc.is_file() else {}
    ids = {"eos": _token_id(added, conf.get("eos_token")),
           "pad": _token_id(added, conf.get("pad_token")),
           "bos": _token_id(added, conf.get("bos_token")),
           "endoftext": added.get("<|endoftext|>")}
    if ids["bos"] is None:  # Qwen3 names no bos token but its config.json says <|endoftext|>
        ids["bos"] = ids["endoftext"]
    return {k: v for k, v in ids.items() if v is not None}


def generation_config(arch: str, hf: dict[str, Any], specials: dict[str, int]) -> dict[str, Any]:
    """generation_config.json for a model whose source had none: Qwen3's own layout (stop at
    the chat turn's end and at <|endoftext|>, its recommended thinking-mode sampling)."""
    eos = [i for i in (hf["eos_token_id"], specials.get("endoftext")) if i is not None]
    gen: dict[str, Any] = {"bos_token_id": hf["bos_token_id"],
                           "eos_token_id": list(dict.fromkeys(eos)) or None,
                           "pad_token_id": specials.get("pad", specials.get("endoftext"))}
    if arch == "qwen3":
        gen |= {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    return gen


# transformers 5 names the generic fast tokenizer TokenizersBackend and writes extra special
# tokens as a list; transformers 4.x (which the project supports) knows neither.
_PORTABLE_CLASS = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def portable_tokenizer_config(conf: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json that transformers 4.51 and 5.x both load."""
    conf = dict(conf)
    cls = conf.get("tokenizer_class")
    conf["tokenizer_class"] = _PORTABLE_CLASS.get(cls, cls)
    conf.pop("backend", None)
    extra = conf.get("extra_special_tokens")
    if isinstance(extra, list):
        conf.pop("extra_special_tokens")
        if extra:
            conf["additional_special_tokens"] = extra
    return conf


def copy_tokenizer(src: pathlib.Path, out: pathlib.Path) -> None:
    """The tokenizer files of `src` into `out`, tokenizer_config.json made portable."""
    for fname in TOKENIZER_FILES:
        f = src / fname
        if not f.exists():
            continue
        if fname == "tokenizer_config.json":
            conf = portable_tokenizer_config(json.loads(f.read_text()))
            (out / fname).write_text(json.dumps(conf, indent=2))
        else:
            shutil.copyfile(f, out / fname)


def _shard_name(i: int, n: int) -> str:
    return "model.safetensors" if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"

