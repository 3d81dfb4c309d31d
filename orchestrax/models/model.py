"""The Qwen3 / Llama decoder as pure functions over a params pytree.

Letters: B batch, T query length, S key/cache length, D hidden, N query heads, K kv heads,
G = N / K query heads per kv head, H head dim, F MLP width, V vocab, L layers.

Layers are stacked on a leading L axis and run under `lax.scan`, so a 36-layer model compiles
one block. Parameters are stored in `cfg.param_dtype`; matmuls run in `cfg.dtype`; RMSNorm,
softmax and logits are computed in float32. Attention (attention.py) never materialises the
[T, S] scores, so memory grows linearly with the sequence.

Packed rows (several sequences one after another, as SFT batches come): pass `segment_ids_BT`
(1, 2, ... per sequence, 0 on padding) and `positions_BT` (restarting at 0 in each sequence), and
every sequence is computed exactly as if it were alone in its row.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from orchestrax.models.attention import attention
from orchestrax.models.configs import ModelConfig
from orchestrax.parallel import constrain

Params = dict[str, Any]
Cache = dict[str, jax.Array]


# --- building blocks --------------------------------------------------------------------------
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rope(x_BTNH: jax.Array, positions_BT: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, half-split layout (rotate_half), as Qwen3/Llama checkpoints expect."""
    h = x_BTNH.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    angles_BTh = positions_BT[..., None].astype(jnp.float32) * inv_freq
    cos, sin = jnp.cos(angles_BTh)[:, :, None, :], jnp.sin(angles_BTh)[:, :, None, :]
    x = x_BTNH.astype(jnp.float32)
    x1, x2 = x[..., : h // 2], x[..., h // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTNH.dtype)


def _block(cfg: ModelConfig, x_BTD, lp, positions_BT, kv_valid_BS, kv=None, index=None,
           segment_ids_BT=None, right_padded=False):
    """One decoder block. Without `kv`, query t sees keys s <= t; with `kv` (this layer's cache
    k, v), new keys/values are written at `index` and query t sees cache slots <= index + t.
    Either way only keys with `kv_valid_BS` count, and with `segment_ids_BT` only keys of the
    query's own segment. `right_padded` as in `attention`. Returns (x, (k, v))."""
    w = jax.tree.map(lambda p: p.astype(jnp.dtype(cfg.dtype)), lp)
    with jax.named_scope("attention"):
        attn_BTD, new_kv = _self_attention(cfg, x_BTD, lp, w, positions_BT, kv_valid_BS, kv, index,
                                           segment_ids_BT, right_padded)
    x_BTD = constrain(x_BTD + attn_BTD, ("batch", "seq", "act_embed"))
    with jax.named_scope("mlp"):
        h_BTD = rms_norm(x_BTD, lp["mlp_norm"], cfg.rms_norm_eps)
        gate = jnp.einsum("BTD,DF->BTF", h_BTD, w["gate"])
        up = jnp.einsum("BTD,DF->BTF", h_BTD, w["up"])
        act_BTF = constrain(jax.nn.silu(gate) * up, ("batch", "seq", "act_mlp"))
        x_BTD = x_BTD + jnp.einsum("BTF,FD->BTD", act_BTF, w["down"])
    return constrain(x_BTD, ("batch", "seq", "act_embed")), new_kv


def _self_attention(cfg: ModelConfig, x_BTD, lp, w, positions_BT, kv_valid_BS, kv, index,
                    segment_ids_BT, right_padded):
    dt = jnp.dtype(cfg.dtype)
    h_BTD = rms_norm(x_BTD, lp["attn_norm"], cfg.rms_norm_eps)
    q = jnp.einsum("BTD,DNH->BTNH", h_BTD, w["q"])
    k = jnp.einsum("BTD,DKH->BTKH", h_BTD, w["k"])
    v = jnp.einsum("BTD,DKH->BTKH", h_BTD, w["v"])
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    q = constrain(rope(q, positions_BT, cfg.rope_theta), ("batch", "seq", "act_heads", None))
    k = rope(k, positions_BT, cfg.rope_theta)
    q_offset, new_kv = 0, (k, v)
    if callable(kv):     # a slot cache's write-then-read (models/slots.py)
        k, v, q_offset, new_kv = kv(k, v)
    elif kv is not None:
        k = jax.lax.dynamic_update_slice_in_dim(kv[0], k.astype(kv[0].dtype), index, axis=1)
        v = jax.lax.dynamic_update_slice_in_dim(kv[1], v.astype(kv[1].dtype), index, axis=1)
        q_offset, new_kv = index, (k, v)
    attn_BTNH = attention(q, k.astype(dt), v.astype(dt), kv_valid_BS, q_offset,
                          segment_ids_BT=segment_ids_BT, fused=_FUSED[cfg.attention],
                          right_padded=right_padded)
    return jnp.einsum("BTNH,NHD->BTD", attn_BTNH, w["o"]), new_kv


_FUSED = {"auto": "auto", "cudnn": "cudnn", "chunked": None}   # ModelConfig.attention
_REMAT = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _layers(cfg: ModelConfig, params: Params, x_BTD, positions_BT, kv_valid_BS, cache=None,
            segment_ids_BT=None, right_padded=False):
    """Scan the stacked layers; threads the cache through the scan when given."""
    def body(x, xs):
        lp, kv = xs
        with jax.named_scope("block"):
            x, new_kv = _block(cfg, x, lp, positions_BT, kv_valid_BS, kv,
                               None if cache is None else cache["index"], segment_ids_BT,
                               right_padded)
        return x, (new_kv if cache is not None else None)

    if cfg.remat != "none":
        body = jax.checkpoint(body, policy=_REMAT[cfg.remat], prevent_cse=False)
    if isinstance(params["layers"], tuple) and cache is None:
        # A sampler's copy, its layers unstacked (slots.unstack_layers): one block per layer
        # (the sampler's prompt scoring reads it).
        for lp in params["layers"]:
            x_BTD, _ = body(x_BTD, (lp, None))
        return x_BTD, None
    kv = None if cache is None else (cache["k"], cache["v"])
    return jax.lax.scan(body, x_BTD, (params["layers"], kv))


def _embed(cfg: ModelConfig, params: Params, input_ids_BT) -> jax.Array:
    # Gather the table's embed dimension first (FSDP's all-gather, made explicit): a lookup
    # into the fsdp-sharded table would need its batch-sharded cotangent re-laid out along
    # embed in the backward pass, which XLA's partitioner can only do by replicating it.
    table = constrain(params["embed"], ("vocab", "act_embed"))
    x = jnp.take(table, input_ids_BT, axis=0).astype(jnp.dtype(cfg.dtype))
    return constrain(x, ("batch", "seq", "act_embed"))


def positions_from_mask(attention_mask_BT: jax.Array) -> jax.Array:
    """0, 1, 2, ... over real tokens; left padding gets position 0 (it is masked anyway)."""
    m = attention_mask_BT.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(m, axis=1) - 1, 0)


def segment_starts(segment_ids_BT: jax.Array) -> jax.Array:
    """bool [B, T]: True where a token's segment differs from the previous token's (and at 0)."""
    first_B1 = jnp.ones_like(segment_ids_BT[:, :1], jnp.bool_)
    return jnp.concatenate([first_B1, segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1)


def _check_packing(input_ids_BT, segment_ids_BT, positions_BT) -> None:
    shape = tuple(input_ids_BT.shape)
    for name, x in (("segment_ids_BT", segment_ids_BT), ("positions_BT", positions_BT)):
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; it must match input_ids "
                             f"{shape}")
    if segment_ids_BT is not None and positions_BT is None:
        raise ValueError("segment_ids_BT needs positions_BT: each segment's own positions, "
                         "restarting at 0 (data.sft batches carry them)")


def _valid_and_positions(input_ids_BT, attention_mask_BT, segment_ids_BT, positions_BT):
    """(bool key/query validity [B, T], positions [B, T]) of a training forward's arguments."""
    b, t = input_ids_BT.shape
    _check_packing(input_ids_BT, segment_ids_BT, positions_BT)
    if attention_mask_BT is None:
        attention_mask_BT = (jnp.ones((b, t), jnp.bool_) if segment_ids_BT is None
                             else segment_ids_BT > 0)
    valid_BT = attention_mask_BT.astype(jnp.bool_)
    if positions_BT is None:
        positions_BT = positions_from_mask(valid_BT)
    return valid_BT, positions_BT


# --- public forward passes --------------------------------------------------------------------
def hidden_states(cfg: ModelConfig, params: Params, input_ids_BT: jax.Array,
                  attention_mask_BT: jax.Array | None = None, *,
                  segment_ids_BT: jax.Array | None = None,
                  positions_BT: jax.Array | None = None,
                  right_padded: bool = False) -> jax.Array:
    """Final-normed hidden states [B, T, D] in the compute dtype.

    Packed rows: `segment_ids_BT` (int, 0 = padding) keeps each token's attention inside its
    own segment and needs `positions_BT`; the attention mask then defaults to segment_ids > 0.
    `positions_BT` alone overrides the positions counted from the attention mask.
    `right_padded`: every row's real tokens come first (`attention`'s static claim; a false
    one gives wrong attention, so check the mask on the host: `rl.check_right_padded`)."""
    valid_BT, positions_BT = _valid_and_positions(input_ids_BT, attention_mask_BT,
                                                  segment_ids_BT, positions_BT)
    x_BTD = _embed(cfg, params, input_ids_BT)
    x, _ = _layers(cfg, params, x_BTD, positions_BT, valid_BT, segment_ids_BT=segment_ids_BT,
                   right_padded=right_padded)
    return rms_norm(x, params["final_norm"], cfg.rms_norm_eps)


@jax.custom_vjp
def _head(h_BTD: jax.Array, w_DV: jax.Array) -> jax.Array:
    """float32 logits h·w with w cast to h's (compute) dtype."""
    return jnp.einsum("BTD,DV->BTV", h_BTD, w_DV.astype(h_BTD.dtype),
                      preferred_element_type=jnp.float32)


def _head_fwd(h_BTD, w_DV):
    return _head(h_BTD, w_DV), (h_BTD, w_DV)


def _head_bwd(res, g_BTV):
    # Autodiff would multiply the float32 logits cotangent by the weights in float32: at a
    # 151,936-token vocabulary the two largest matmuls of the step. Both run in the compute
    # dtype with float32 accumulation instead; dw reaches fp32 masters without a bf16 rounding.
    h_BTD, w_DV = res

    def grads(dtype):
        g, h, w = g_BTV.astype(dtype), h_BTD.astype(dtype), w_DV.astype(dtype)
        dh = jnp.einsum("BTV,DV->BTD", g, w, preferred_element_type=jnp.float32)
        dw = jnp.einsum("BTD,BTV->DV", h, g, preferred_element_type=jnp.float32)
        return dh.astype(h_BTD.dtype), dw.astype(w_DV.dtype)

    # XLA:CPU has no bf16 x bf16 -> f32 dot kernel ("Unsupported element type for DotThunk"), so
    # the CPU lowering keeps float32 operands; a compile for a GPU target takes the bf16 branch.
    return jax.lax.platform_dependent(cpu=lambda: grads(jnp.float32),
                                      default=lambda: grads(h_BTD.dtype))


_head.defvjp(_head_fwd, _head_bwd)


def lm_logits(cfg: ModelConfig, params: Params, h_BTD: jax.Array) -> jax.Array:
    """float32 logits [B, T, V] from hidden states; forward and backward matmuls in the compute
    dtype with float32 accumulation."""
    with jax.named_scope("lm_head"):
        w_DV = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
        return constrain(_head(h_BTD, w_DV), ("batch", "seq", "act_vocab"))


def forward(cfg: ModelConfig, params: Params, input_ids: jax.Array,
            attention_mask: jax.Array | None = None, *, segment_ids_BT: jax.Array | None = None,
            positions_BT: jax.Array | None = None) -> jax.Array:
    """int32 [B, T] -> float32 logits [B, T, V]. Left padding: pass the 0/1 attention mask;
    packed rows: segment ids and positions, as in `hidden_states`."""
    return lm_logits(cfg, params, hidden_states(cfg, params, input_ids, attention_mask,
                                                segment_ids_BT=segment_ids_BT,
                                                positions_BT=positions_BT))


def token_logprobs(cfg: ModelConfig, params: Params, tokens_BT: jax.Array,
                   attention_mask_BT: jax.Array | None = None, temperature: float = 1.0,
                   return_entropy: bool = False, chunk_size: int | None = None, *,
                   segment_ids_BT: jax.Array | None = None,
                   positions_BT: jax.Array | None = None, right_padded: bool = False):
    """logp[:, t] = log p(tokens[t] | tokens[:t]) under log_softmax(logits / temperature);
    logp[:, 0] = 0. With `return_entropy`, also the entropy of that distribution at t.

    Packed rows (`segment_ids_BT`, `positions_BT`, as in `hidden_states`): tokens[:t] means the
    earlier tokens of t's own segment, and a segment's first token gets 0 like a row's first,
    so each sequence's values equal those of the sequence alone in a row. `right_padded` as in
    `hidden_states`.

    `chunk_size` bounds memory: the [B, T, V] float32 logits (58 GB for 4 x 24k tokens at
    Qwen3's 151,936-token vocabulary) are made `chunk_size` positions at a time under a scan,
    and remade chunk by chunk in the backward pass instead of being kept. Same values."""
    h_BTD = hidden_states(cfg, params, tokens_BT, attention_mask_BT,
                          segment_ids_BT=segment_ids_BT, positions_BT=positions_BT,
                          right_padded=right_padded)
    return logprobs_from_hidden(cfg, params, h_BTD, tokens_BT, temperature, return_entropy,
                                chunk_size, segment_ids_BT=segment_ids_BT)


def logprobs_from_hidden(cfg: ModelConfig, params: Params, h_BTD: jax.Array,
                         tokens_BT: jax.Array, temperature: float = 1.0,
                         return_entropy: bool = False, chunk_size: int | None = None, *,
                         segment_ids_BT: jax.Array | None = None):
    """`token_logprobs` from the final-normed hidden states [B, T, D] of `tokens_BT` (the LM
    head and scoring half of it)."""
    h_BTD = h_BTD[:, :-1]
    targets_BT = tokens_BT[:, 1:]
    t = targets_BT.shape[1]

    def score(h, targets):  # [B, C, D], [B, C] -> logp [B, C], entropy [B, C] or None
        logits = lm_logits(cfg, params, h) / temperature
        logz = jax.nn.logsumexp(logits, axis=-1)
        target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        if not return_entropy:
            return target - logz, None
        probs = jnp.exp(logits - logz[..., None])
        return target - logz, logz - jnp.sum(probs * logits, axis=-1)

    if chunk_size is None or t <= chunk_size:
        logp, entropy = score(h_BTD, targets_BT)
    else:
        n = -(-t // chunk_size)
        pad = n * chunk_size - t
        h = jnp.pad(h_BTD, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets_BT, ((0, 0), (0, pad)))
        # [B, n·C, ...] -> [n, B, C, ...]: the scan runs over chunks of positions.
        h = jnp.moveaxis(h.reshape(h.shape[0], n, chunk_size, -1), 1, 0)
        targets = jnp.moveaxis(targets.reshape(targets.shape[0], n, chunk_size), 1, 0)
        step = jax.checkpoint(lambda carry, xs: (carry, score(*xs)), prevent_cse=False)
        _, (logp, entropy) = jax.lax.scan(step, None, (h, targets))
        unchunk = lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1)[:, :t]
        logp = unchunk(logp)
        entropy = None if entropy is None else unchunk(entropy)
    first = jnp.zeros_like(logp[:, :1])
    logp = jnp.concatenate([first, logp], axis=1)
    if return_entropy:
        entropy = jnp.concatenate([first, entropy], axis=1)
    if segment_ids_BT is not None:
        # A segment's first token would be scored from the previous segment's last state.
        starts_BT = segment_starts(segment_ids_BT)
        logp = jnp.where(starts_BT, 0.0, logp)
        entropy = None if entropy is None else jnp.where(starts_BT, 0.0, entropy)
    return (logp, entropy) if return_entropy else logp


def compute_copy(cfg: ModelConfig, params: Params) -> Params:
    """The params as the forward passes read them: weight matrices in the compute dtype, norm
    weights as stored (rms_norm reads them in float32). Every forward pass gives bitwise the
    values it gives on `params`, from half the memory of fp32 masters under bf16 compute: for a
    frozen reference or a sampler's copy."""
    dt = jnp.dtype(cfg.dtype)
    return jax.tree_util.tree_map_with_path(   # fresh buffers: the masters may be donated
        lambda path, p: jnp.array(p, copy=True, dtype=p.dtype if str(
            getattr(path[-1], "key", "")).endswith("norm") else dt), params)


# --- KV cache ---------------------------------------------------------------------------------
def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: str | None = None) -> Cache:
    """Empty cache of `max_len` slots. `mask[b, s]` marks slots holding a real token."""
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    dt = jnp.dtype(dtype or cfg.dtype)
    return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt),
            "mask": jnp.zeros((batch, max_len), jnp.bool_), "index": jnp.zeros((), jnp.int32)}


def forward_with_cache(cfg: ModelConfig, params: Params, input_ids_BT: jax.Array,
                       attention_mask_BT: jax.Array, cache: Cache, *,
                       last_only: bool = False) -> tuple[jax.Array, Cache]:
    """Append T tokens at slot `cache["index"]` (prefill: T = prompt length, left padded;
    decode: T = 1) and return their logits and the updated cache. `last_only` returns logits
    for the last position only ([B, 1, V]): a long prefill then never materialises [B, T, V]."""
    b, t = input_ids_BT.shape
    s = cache["mask"].shape[1]
    index = cache["index"]
    new_valid_BT = attention_mask_BT.astype(jnp.bool_)
    slot_S = jnp.arange(s)
    # Positions continue from the number of real tokens already in the cache.
    seen_B = jnp.sum(cache["mask"] & (slot_S < index)[None], axis=1)
    positions_BT = seen_B[:, None] + jnp.maximum(jnp.cumsum(new_valid_BT, axis=1) - 1, 0)
    kv_mask_BS = jax.lax.dynamic_update_slice_in_dim(cache["mask"], new_valid_BT, index, axis=1)
    x, (k, v) = _layers(cfg, params, _embed(cfg, params, input_ids_BT), positions_BT, kv_mask_BS,
                        cache)
    if last_only:
        x = x[:, -1:]
    logits = lm_logits(cfg, params, rms_norm(x, params["final_norm"], cfg.rms_norm_eps))
    return logits, {"k": k, "v": v, "mask": kv_mask_BS, "index": index + t}


jit_forward = jax.jit(forward, static_argnums=0)
jit_forward_with_cache = jax.jit(forward_with_cache, static_argnums=0, donate_argnums=4,
                                 static_argnames="last_only")
__all__ = ["compute_copy", "forward", "hidden_states", "lm_logits", "token_logprobs", "logprobs_from_hidden",
           "init_cache",
           "forward_with_cache", "positions_from_mask", "segment_starts", "jit_forward",
           "jit_forward_with_cache", "rms_norm", "rope"]
