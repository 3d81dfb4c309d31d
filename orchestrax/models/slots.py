"""A forward pass that appends tokens to rows of a slot KV cache, writing it in place.

Letters as in model.py, plus R cache rows (slots), P the positions a pass attends to (`span`).

The cache is one [R, K, S, H] buffer per layer for k and for v (a tuple of L), plus a bool
[R, S] mask of filled positions. Row b of a pass writes its T new tokens at positions
`index_B[b] ...` and attends to positions [0, span) of its row (causally, and only where the
mask is set), so rows of very different lengths and offsets share one pass.

Why a buffer per layer and a Python loop over the layers (not `lax.scan`): a scanned layer
reads its slice of a stacked [L, ...] cache through a dynamic index, and XLA:GPU does not hand
that slice to the attention matmuls as an address: it copies the layer's whole K and V out of
the carried cache every step (43% of the HBM bytes of an 8B decode step, from the HLO compiled
for an H200 by bench/gpu_compile.py), and likewise the stacked weights' slices. With a buffer
per layer, each layer scatters its new k/v into its own donated buffer in place and the
attention matmuls read the first `span` positions of it directly; a layer's weights are read
where they lie when the params are unstacked (`unstack_layers`, the sampler's copy). The
cost is a compile of L blocks instead of one. The kv-head axis comes before the positions
because the attention matmuls batch over it and XLA:GPU wants batch axes outermost.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from orchestrax.models import model
from orchestrax.models.configs import ModelConfig


class SlotCache(NamedTuple):
    k: tuple[jax.Array, ...]   # L x [R, K, S, H] compute dtype
    v: tuple[jax.Array, ...]
    mask_RS: jax.Array         # bool: the position holds a real token of the row


def init_slots(cfg: ModelConfig, slots: int, max_len: int) -> SlotCache:
    shape = (slots, cfg.num_kv_heads, max_len, cfg.head_dim)
    dt = jnp.dtype(cfg.dtype)
    # A fresh buffer per layer: each is donated on its own.
    layers = lambda: tuple(jnp.zeros(shape, dt) for _ in range(cfg.num_layers))  # noqa: E731
    return SlotCache(layers(), layers(), jnp.zeros((slots, max_len), jnp.bool_))


def unstack_layers(params: model.Params) -> model.Params:
    """`params` with "layers" as a tuple of L per-layer dicts instead of stacked [L, ...]
    arrays: the layout a sampler keeps its own copy in (`rollout.embedded.sampler_copy`), so
    `forward_slots` reads each layer's weights as they lie. Same bytes; jit it with the copy
    that makes it, or the stacked arrays and their slices are both alive for a moment."""
    layers = params["layers"]
    n = jax.tree.leaves(layers)[0].shape[0]
    return {**params, "layers": tuple(jax.tree.map(lambda a: a[i], layers) for i in range(n))}


def layer_params(params: model.Params, i: int) -> model.Params:
    """Layer `i`'s weights: the i-th entry of unstacked params, or a static slice of stacked
    ones (which XLA:GPU copies out for some matmuls: q/k/v, which it merges into one, and o)."""
    layers = params["layers"]
    return layers[i] if isinstance(layers, tuple) else jax.tree.map(lambda a: a[i], layers)


def forward_slots(cfg: ModelConfig, params: model.Params, ids_BT: jax.Array, valid_BT: jax.Array,
                  cache: SlotCache, index_B: jax.Array, *, span: int,
                  rows_B: jax.Array | None = None) -> tuple[jax.Array, SlotCache]:
    """Append row b's T tokens (real where `valid_BT`) to cache row rows_B[b] at positions
    index_B[b] ... and return float32 logits of each row's last position [B, V] and the updated
    cache. Without `rows_B`, row b is cache row b (B = R: a decode step feeds every slot); with
    it, B distinct rows of the cache (a prefill's slots), and a row of `rows_B` outside
    [0, R) writes nothing (padding a pass to its row bucket).

    Positions (RoPE) continue from the count of real tokens the row holds before index_B[b].
    The caller keeps index_B[b] + T <= span <= S. Masked positions inside [0, index) are never
    read, so a row may hold holes (left padding of a chunk, a cut-off stale suffix).

    Either way each layer writes its new k/v into its own cache buffer in place (a scatter of
    one position a row; with `rows_B`, one contiguous slab a row); with `rows_B`, its attention
    then reads a gathered copy of the B rows' first `span` positions, which lives for that
    layer only (no whole-cache copy, no copy held across layers)."""
    b, t = ids_BT.shape
    valid_BT = valid_BT.astype(jnp.bool_)
    pos_P = jnp.arange(span)
    if rows_B is None:
        rows_B1 = jnp.arange(b)[:, None]
        mask_of = lambda c: c[:, :span]  # noqa: E731
        kv_of = lambda c: c[:, :, :span]  # noqa: E731
    else:
        # Rows outside [0, R) see no key and write nothing.
        rows_B1 = rows_B[:, None]
        mask_of = lambda c: c.at[rows_B, :span].get(mode="fill", fill_value=False)  # noqa: E731
        kv_of = lambda c: c.at[rows_B, :, :span].get(mode="clip")  # noqa: E731
        in_range_B = (rows_B >= 0) & (rows_B < cache.mask_RS.shape[0])
    old_BP = mask_of(cache.mask_RS)
    seen_B = jnp.sum(old_BP & (pos_P[None] < index_B[:, None]), axis=1)
    positions_BT = seen_B[:, None] + jnp.maximum(jnp.cumsum(valid_BT, axis=1) - 1, 0)
    # This pass's tokens enter the mask at index_B + t: [B, P] from [B, T].
    offset_BP = pos_P[None] - index_B[:, None]
    ours_BP = (offset_BP >= 0) & (offset_BP < t)
    new_BP = jnp.take_along_axis(valid_BT, jnp.clip(offset_BP, 0, t - 1), axis=1)
    mask_BP = jnp.where(ours_BP, new_BP, old_BP)
    write_BT = index_B[:, None] + jnp.arange(t)[None]
    if rows_B is None:
        mask_RS = cache.mask_RS.at[:, :span].set(mask_BP)
        put = lambda c, x_BTKH: c.at[rows_B1, :, write_BT].set(x_BTKH.astype(c.dtype))  # noqa: E731
    else:
        mask_RS = cache.mask_RS.at[rows_B1, pos_P[None]].set(mask_BP, mode="drop")

        def put(c, x_BTKH):
            # Row by row, each row's T positions one contiguous slab written in place (a
            # scatter over rows and positions made XLA:GPU transpose the whole buffer); a row
            # out of range writes back what its clamped slab holds.
            x_BKTH = jnp.swapaxes(x_BTKH, 1, 2).astype(c.dtype)
            for r in range(b):
                at = (rows_B[r], 0, index_B[r], 0)
                old = jax.lax.dynamic_slice(c, at, (1,) + x_BKTH.shape[1:])
                c = jax.lax.dynamic_update_slice(
                    c, jnp.where(in_range_B[r], x_BKTH[r:r + 1], old), at)
            return c

    x = model._embed(cfg, params, ids_BT)
    ks, vs = list(cache.k), list(cache.v)
    for i in range(cfg.num_layers):
        def write_then_read(k_BTKH, v_BTKH, i=i):
            kc, vc = put(ks[i], k_BTKH), put(vs[i], v_BTKH)
            read = lambda c: jnp.swapaxes(kv_of(c), 1, 2)  # noqa: E731  -> [B, P, K, H]
            return read(kc), read(vc), index_B, (kc, vc)

        with jax.named_scope(f"block{i}"):
            x, (ks[i], vs[i]) = model._block(cfg, x, layer_params(params, i), positions_BT,
                                             mask_BP, write_then_read)
    h = model.rms_norm(x[:, -1:], params["final_norm"], cfg.rms_norm_eps)
    return model.lm_logits(cfg, params, h)[:, 0], SlotCache(tuple(ks), tuple(vs), mask_RS)
