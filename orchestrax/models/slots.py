"""A forward pass that appends tokens to rows of a slot KV cache, writing it in place.

Letters as in model.py, plus R cache rows (slots), P the positions a pass attends to (`span`).

The cache is [L, R, K, S, H] for k and for v, plus a bool [R, S] mask of filled positions. Row b
of a pass writes its T new tokens at positions `index_B[b] ...` and attends to positions
[0, span) of its row (causally, and only where the mask is set), so rows of very different
lengths and offsets share one pass.

Why this shape of loop: the whole cache is the layer scan's carry, and each layer scatters its
new k/v into it at (layer, slot, position). A carried buffer that the caller donates is updated
where it lies, so a decode step writes R x K x H values per layer and reads only the attended
positions: no copy of the cache or of a layer's slice (the alternative, scanning the cache as
per-layer inputs and outputs, makes XLA build a new stacked cache every call). Tests check this
from the HLO compiled for an H200. The kv-head axis comes before the positions because the
attention matmuls batch over it: XLA:GPU wants batch axes outermost, and with [.., S, K, H] it
lays the carried cache out K-major by transposing the whole cache into and out of the loop.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from orchestrax.models import model
from orchestrax.models.configs import ModelConfig


class SlotCache(NamedTuple):
    k: jax.Array        # [L, R, K, S, H] compute dtype
    v: jax.Array
    mask_RS: jax.Array  # bool: the position holds a real token of the row


def init_slots(cfg: ModelConfig, slots: int, max_len: int) -> SlotCache:
    shape = (cfg.num_layers, slots, cfg.num_kv_heads, max_len, cfg.head_dim)
    dt = jnp.dtype(cfg.dtype)
    return SlotCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt),
                     jnp.zeros((slots, max_len), jnp.bool_))


def forward_slots(cfg: ModelConfig, params: model.Params, ids_BT: jax.Array, valid_BT: jax.Array,
                  cache: SlotCache, index_B: jax.Array, *, span: int
                  ) -> tuple[jax.Array, SlotCache]:
    """Append row b's T tokens (real where `valid_BT`) to cache row b at positions index_B[b]
    ... and return float32 logits of each row's last position [B, V] and the updated cache
    (B = R: a decode step feeds every slot; a prefill passes the one row it fills).

    Positions (RoPE) continue from the count of real tokens the row holds before index_B[b].
    The caller keeps index_B[b] + T <= span <= S. Masked positions inside [0, index) are never
    read, so a row may hold holes (left padding of a chunk, a cut-off stale suffix)."""
    b, t = ids_BT.shape
    valid_BT = valid_BT.astype(jnp.bool_)
    pos_P = jnp.arange(span)
    old_BP = cache.mask_RS[:, :span]
    seen_B = jnp.sum(old_BP & (pos_P[None] < index_B[:, None]), axis=1)
    positions_BT = seen_B[:, None] + jnp.maximum(jnp.cumsum(valid_BT, axis=1) - 1, 0)
    # This pass's tokens enter the mask at index_B + t: [B, P] from [B, T].
    offset_BP = pos_P[None] - index_B[:, None]
    ours_BP = (offset_BP >= 0) & (offset_BP < t)
    new_BP = jnp.take_along_axis(valid_BT, jnp.clip(offset_BP, 0, t - 1), axis=1)
    mask_BP = jnp.where(ours_BP, new_BP, old_BP)
    mask_RS = cache.mask_RS.at[:, :span].set(mask_BP)
    write_BT = index_B[:, None] + jnp.arange(t)[None]
    rows_B1 = jnp.arange(b)[:, None]

    def body(carry, xs):
        x, k_c, v_c = carry
        lp, layer = xs

        def write_then_read(k_BTKH, v_BTKH):
            kc = k_c.at[layer, rows_B1, :, write_BT].set(k_BTKH.astype(k_c.dtype))
            vc = v_c.at[layer, rows_B1, :, write_BT].set(v_BTKH.astype(v_c.dtype))
            read = lambda c: jnp.swapaxes(  # noqa: E731  [B, K, P, H] -> [B, P, K, H]
                jax.lax.dynamic_index_in_dim(c, layer, 0, keepdims=False)[:, :, :span], 1, 2)
            return read(kc), read(vc), index_B, (kc, vc)

        with jax.named_scope("block"):
            x, (k_c, v_c) = model._block(cfg, x, lp, positions_BT, mask_BP, write_then_read)
        return (x, k_c, v_c), None

    x_BTD = model._embed(cfg, params, ids_BT)
    layers = jnp.arange(cfg.num_layers)
    (x, k, v), _ = jax.lax.scan(body, (x_BTD, cache.k, cache.v), (params["layers"], layers))
    h = model.rms_norm(x[:, -1:], params["final_norm"], cfg.rms_norm_eps)
    return model.lm_logits(cfg, params, h)[:, 0], SlotCache(k, v, mask_RS)
