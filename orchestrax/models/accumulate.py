"""Gradients added into an accumulator layer by layer, for gradient accumulation without a
second params-sized buffer.

`jax.value_and_grad` of a scanned decoder returns the whole gradient at once, so a micro-batch
loop holds the running sum *and* that micro-batch's gradient (2 x 30.5 GiB in fp32 for
Qwen3-8B). Here the backward pass over the layers is written out: the forward keeps each
layer's input (what remat "full" keeps), and the backward recomputes one layer at a time under
`jax.vjp` and adds its parameter gradient into that layer's slice of the accumulator, a carry
XLA updates in place. Only one layer's gradient exists at a time. The numbers are those of
`value_and_grad` with remat "full" (same recomputation, same per-layer vjp).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from orchestrax.models.configs import ModelConfig
from orchestrax.models.model import (_block, _embed, _valid_and_positions, logprobs_from_hidden,
                                     rms_norm)

Params = dict[str, Any]


def value_and_grad_into(cfg: ModelConfig, loss_fn: Callable, params: Params, acc: Params,
                        tokens_BT: jax.Array, attention_mask_BT: jax.Array | None = None, *,
                        temperature: float = 1.0, return_entropy: bool = False,
                        chunk_size: int | None = None, segment_ids_BT: jax.Array | None = None,
                        positions_BT: jax.Array | None = None,
                        right_padded: bool = False) -> tuple[Params, tuple]:
    """(acc + d loss / d params, (loss, aux)) where `loss, aux = loss_fn(logp, entropy)` and
    logp, entropy (None without `return_entropy`) are `token_logprobs` of the same arguments.
    `acc` has the params' structure (any float dtype per leaf) and should be donated or carried."""
    valid_BT, positions_BT = _valid_and_positions(tokens_BT, attention_mask_BT, segment_ids_BT,
                                                  positions_BT)
    layers = params["layers"]
    rest = {k: v for k, v in params.items() if k != "layers"}

    def block(x, lp):
        return _block(cfg, x, lp, positions_BT, valid_BT, None, None, segment_ids_BT,
                      right_padded)[0]

    def head(x_BTD, r):
        h = rms_norm(x_BTD, r["final_norm"], cfg.rms_norm_eps)
        out = logprobs_from_hidden(cfg, r, h, tokens_BT, temperature, return_entropy,
                                   chunk_size, segment_ids_BT=segment_ids_BT)
        logp, entropy = out if return_entropy else (out, None)
        return loss_fn(logp, entropy)

    x0, embed_vjp = jax.vjp(lambda r: _embed(cfg, r, tokens_BT), rest)
    with jax.named_scope("layers_forward"):
        x_last, x_in_L = jax.lax.scan(lambda x, lp: (block(x, lp), x), x0, layers)
    loss, head_vjp, aux = jax.vjp(head, x_last, rest, has_aux=True)
    g_x, g_head = head_vjp(jnp.ones_like(loss))

    def backward(carry, ys):
        g_x, acc_layers = carry
        i, x_in = ys
        lp = jax.tree.map(lambda p: jax.lax.dynamic_index_in_dim(p, i, keepdims=False), layers)
        _, block_vjp = jax.vjp(block, x_in, lp)
        g_x, g_lp = block_vjp(g_x)
        acc_layers = jax.tree.map(
            lambda a, g: jax.lax.dynamic_update_index_in_dim(
                a, jax.lax.dynamic_index_in_dim(a, i, keepdims=False) + g.astype(a.dtype), i, 0),
            acc_layers, g_lp)
        return (g_x, acc_layers), None

    n_layers = jax.tree.leaves(layers)[0].shape[0]
    with jax.named_scope("layers_backward"):
        (g_x0, acc_layers), _ = jax.lax.scan(backward, (g_x, acc["layers"]),
                                             (jnp.arange(n_layers), x_in_L), reverse=True)
    (g_embed,) = embed_vjp(g_x0)
    # Summed before adding, as value_and_grad sums a tied embedding's two uses.
    acc_rest = jax.tree.map(lambda a, g1, g2: a + (g1 + g2).astype(a.dtype),
                            {k: acc[k] for k in rest}, g_head, g_embed)
    return {**acc_rest, "layers": acc_layers}, (loss, aux)
