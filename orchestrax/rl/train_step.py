"""The pure GRPO/SFT update: `make_train_step(...) -> TrainStep(init, step, shardings)`, where
`step(state, batch) -> (state, metrics)` is jitted with explicit in/out shardings and a donated
state.

Letters: B sequences, T tokens, E epochs, M minibatches, K micro-batches, b = B // (M·K) rows each.
Batch (all [B,T] aligned with `tokens`, position t = token t predicted from tokens < t):
  tokens int32, attention_mask, loss_mask (1 on policy tokens), advantages [B],
  optional: sample_mask [B] (filters; 0 = no gradient), old_logprobs (absent: the first
  update's own logprobs under stop-gradient for its rows, so one update per call has no extra
  pass; the rows of later updates are scored with the current params before the first update,
  or every row when the rows are reshuffled or revisited), sampler_logprobs (gap metric, TIS),
  ref_logprobs (needed when kl_coef > 0), rollout_ids [B] (int, the rollout of each row when rows
  are turns: agg="rollout-turn-token-mean"); objective "sft" only: segment_ids + positions for
  packed rows (several sequences per row, each attending only to itself; models.hidden_states).
One call runs ppo_epochs × num_minibatches optimizer updates, each accumulating gradients over
num_microbatches micro-batches whose loss weights come from the whole minibatch, so accumulation
reproduces the big-batch gradient. Rows go to micro-batches in a fixed strided order, or in a
fresh order every epoch with GRPOConfig.shuffle_seed. A non-finite loss or gradient keeps the
old params/opt state, and so does a minibatch with no token left under the mask (all its samples
filtered): Adam's momentum would otherwise keep moving the params on a zero gradient.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orchestrax import models, parallel
from orchestrax.rl.grpo_config import GRPOConfig, OptimizerConfig
from orchestrax.rl.losses import policy_loss_weighted, sft_loss, token_weights
from orchestrax.rl.optim import lr_schedule, make_optimizer
from orchestrax.rl.state import (Batch, TrainState, batch_shardings, data_parallel_degree,
                                 init_state, state_shardings)
from orchestrax.rl.step_checks import check_batch, check_data_parallel, check_rows_right_padded

Metrics = dict[str, jax.Array]


class TrainStep(NamedTuple):
    """What `make_train_step` returns; `init` and `step` keep the state on `shardings`."""
    init: Callable[[Any], TrainState]             # params (donated) -> fresh TrainState
    step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]]
    shardings: TrainState | None                                # None without a mesh


# --- pieces of the step (inside jit) ------------------------------------------------------------
def _split(x: jax.Array, M: int, K: int, mesh: Mesh | None, rules: parallel.Rules) -> jax.Array:
    """[B, ...] -> [M, K, b, ...] with rows strided (row = i·M·K + m·K + k), so each micro-batch
    draws rows from every device's contiguous batch shard and stays split over the batch axes."""
    b = x.shape[0] // (M * K)
    y = jnp.moveaxis(x.reshape((b, M, K) + x.shape[1:]), 0, 2)
    if mesh is None:
        return y
    # Micro-batches smaller than the data-parallel degree cannot be split; leave them to XLA.
    if b % data_parallel_degree(mesh, rules)[0]:
        return y
    spec = parallel.logical_to_spec((None, None, "batch") + (None,) * (x.ndim - 1), rules, mesh)
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, spec))


def _minibatches(batch: Batch, gcfg: GRPOConfig, mesh, rules) -> tuple[Batch, jax.Array]:
    """The batch as [M, K, b, ...] minibatches with one combined float `mask` [M,K,b,T] (policy
    tokens of kept, unpadded rows), and keep_B (the sample mask as float)."""
    B = batch["tokens"].shape[0]
    f32 = jnp.float32
    keep_B = batch.get("sample_mask", jnp.ones((B,), f32)).astype(f32)
    mask_BT = (batch["loss_mask"].astype(f32) * batch["attention_mask"].astype(f32)
               * keep_B[:, None])
    data = {k: v for k, v in batch.items() if k not in ("loss_mask", "sample_mask")}
    data["mask"] = mask_BT
    M, K = gcfg.num_minibatches, gcfg.num_microbatches
    return jax.tree.map(lambda x: _split(x, M, K, mesh, rules), data), keep_B


def epoch_key(seed: int, step: jax.Array, epoch: jax.Array) -> jax.Array:
    """The key that orders epoch `epoch` of train_step call `step` (reproducible on resume)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), epoch)


def slot_permutation(key: jax.Array, n_slots: int, b: int) -> jax.Array:
    """int32 [n_slots, b]: for each of the b row positions, a permutation of the M·K slots."""
    return jnp.argsort(jax.random.uniform(key, (n_slots, b)), axis=0).astype(jnp.int32)


def _shuffled(mb: Batch, key: jax.Array) -> Batch:
    """Rows reassigned among the M·K micro-batch slots: new slot s at position i holds old slot
    perm[s, i]. Rows never leave their position i, so each stays on its device (see _split)."""
    M, K, b = mb["tokens"].shape[:3]
    perm = slot_permutation(key, M * K, b)

    def one(x):
        flat = x.reshape((M * K,) + x.shape[2:])                     # [M·K, b, ...]
        idx = perm.reshape(perm.shape + (1,) * (flat.ndim - 2))
        return jnp.take_along_axis(flat, idx, axis=0).reshape(x.shape)
    return jax.tree.map(one, mb)


def _logprobs(mcfg, gcfg: GRPOConfig, params, tokens, attn, segment_ids=None, positions=None, *,
              right_padded: bool):
    """(logp [.., T], entropy or None) of `tokens` under log_softmax(logits / temperature);
    packed rows with `segment_ids` and `positions`."""
    with jax.named_scope("token_logprobs"):
        out = models.token_logprobs(mcfg, params, tokens, attn, temperature=gcfg.temperature,
                                    return_entropy=gcfg.compute_entropy,
                                    chunk_size=gcfg.logprob_chunk, segment_ids_BT=segment_ids,
                                    positions_BT=positions, right_padded=right_padded)
    return out if gcfg.compute_entropy else (out, None)


def _old_logprobs(mcfg, gcfg: GRPOConfig, params, mb: Batch, right_padded: bool) -> jax.Array:
    """[M,K,b,T] logprobs under the params before the first update (the on-policy μ = 1
    shortcut), one micro-batch at a time so memory stays that of one micro-batch."""
    shape = mb["tokens"].shape
    flat = lambda x: x.reshape((-1,) + shape[2:])  # noqa: E731 - [M,K,b,T] -> [M·K,b,T]
    old = jax.lax.map(lambda ta: _logprobs(mcfg, gcfg, params, *ta,
                                           right_padded=right_padded)[0],
                      (flat(mb["tokens"]), flat(mb["attention_mask"])))
    return jax.lax.stop_gradient(old.reshape(shape))


def _with_old_logprobs(mcfg, gcfg: GRPOConfig, params, mb: Batch, right_padded: bool) -> Batch:
    """mb with the old logprobs of a call that makes several updates. With one epoch and no
    reshuffle the first minibatch is updated first, on these very params: its rows take their
    own logprobs under stop-gradient in the update (`old_is_current`) and only the later
    minibatches are scored here, (M-1)/M of a forward pass instead of a whole one."""
    if gcfg.ppo_epochs > 1 or gcfg.shuffle_seed is not None:
        return {**mb, "old_logprobs": _old_logprobs(mcfg, gcfg, params, mb, right_padded)}
    later = _old_logprobs(mcfg, gcfg, params, {k: mb[k][1:] for k in ("tokens", "attention_mask")},
                          right_padded)
    m, k = mb["tokens"].shape[:2]
    return {**mb, "old_logprobs": jnp.concatenate([jnp.zeros_like(later[:1]), later]),
            "old_is_current": jnp.broadcast_to((jnp.arange(m) == 0)[:, None], (m, k))}


def reference_logprobs(mcfg, gcfg: GRPOConfig, params, tokens_BT: jax.Array,
                       attention_mask_BT: jax.Array, rows: int,
                       right_padded: bool = False) -> jax.Array:
    """[B, T] logprobs of a batch scored `rows` rows at a time (a micro-batch's memory, not the
    batch's), each pass taking rows strided over the batch so a row-sharded batch keeps every
    device busy. Jit it with `rows` and `right_padded` static; `right_padded` (every row's
    real tokens first) is the caller's word for the mask, checked on the host
    (`check_right_padded`) before the call."""
    B, T = tokens_BT.shape
    if B % rows:
        raise ValueError(f"reference_logprobs: rows={rows} does not divide the batch of {B}")
    n = B // rows
    split = lambda x: jnp.swapaxes(x.reshape(rows, n, T), 0, 1)  # noqa: E731 - row i·n + j
    out = jax.lax.map(lambda ta: models.token_logprobs(
        mcfg, params, ta[0], ta[1], temperature=gcfg.temperature,
        chunk_size=gcfg.logprob_chunk, right_padded=right_padded),
        (split(tokens_BT), split(attention_mask_BT)))
    return jnp.swapaxes(out, 0, 1).reshape(B, T)


def _with_loss_weights(mb: Batch, gcfg: GRPOConfig) -> Batch:
    """Adds loss weights `w` (by gcfg.agg) and token-mean metric weights `mw`, both computed from
    each whole minibatch's mask so micro-batch losses sum to the minibatch loss."""
    mask_MKbT = mb["mask"]
    M = mask_MKbT.shape[0]
    flat_MNT = mask_MKbT.reshape((M, -1, mask_MKbT.shape[-1]))
    ids = mb.get("rollout_ids")
    flat_ids = (jnp.broadcast_to(jnp.arange(flat_MNT.shape[1]), flat_MNT.shape[:2]) if ids is None
                else ids.reshape((M, -1)))
    per_mb = lambda agg, n=None: jax.vmap(  # noqa: E731
        lambda m, r: token_weights(m, agg, n, r))(flat_MNT, flat_ids).reshape(mask_MKbT.shape)
    return {**mb, "w": per_mb(gcfg.agg, gcfg.norm_len), "mw": per_mb("token-mean")}


def _loss_of_logprobs(x: Batch, gcfg: GRPOConfig) -> Callable:
    """The micro-batch loss as a function of its logprobs (and entropy): (loss, metrics)."""
    def loss_fn(logp, ent):
        with jax.named_scope("loss"):
            if gcfg.objective == "sft":
                return sft_loss(logp, x["mask"], weights=x["w"])
            # The first update of a call differentiates the params that would have scored the
            # old logprobs, so for its rows those are this pass's values under stop-gradient.
            old = jax.lax.stop_gradient(logp)
            if "old_is_current" in x:
                old = jnp.where(x["old_is_current"], old, x["old_logprobs"])
            elif "old_logprobs" in x:
                old = x["old_logprobs"]
            return policy_loss_weighted(
                logp, old, x["advantages"], x["mask"], x["w"], x["mw"],
                clip_low=gcfg.clip_low, clip_high=gcfg.clip_high, dual_clip=gcfg.dual_clip,
                log_ratio_clamp=gcfg.log_ratio_clamp, ref_logprobs=x.get("ref_logprobs"),
                kl_coef=gcfg.kl_coef, kl=gcfg.kl, sampler_logprobs=x.get("sampler_logprobs"),
                tis_cap=gcfg.tis_cap, entropy=ent)
    return loss_fn


def _micro_loss(params, x: Batch, *, mcfg, gcfg: GRPOConfig, right_padded: bool):
    logp, ent = _logprobs(mcfg, gcfg, params, x["tokens"], x["attention_mask"],
                          x.get("segment_ids"), x.get("positions"), right_padded=right_padded)
    return _loss_of_logprobs(x, gcfg)(logp, ent)


def in_place_accumulation(mcfg) -> bool:
    """Gradients go straight into the accumulator layer by layer (models.value_and_grad_into)
    under remat "full", whose recomputation that path reproduces; other policies keep more
    activations to recompute less, so they take value_and_grad."""
    return mcfg.remat == "full"


def _add_micro_grads(acc, params, x: Batch, *, mcfg, gcfg: GRPOConfig, right_padded: bool):
    """(acc + this micro-batch's gradient, its metrics)."""
    if in_place_accumulation(mcfg):
        with jax.named_scope("token_logprobs"):
            acc, (_, met) = models.value_and_grad_into(
                mcfg, _loss_of_logprobs(x, gcfg), params, acc, x["tokens"],
                x["attention_mask"], temperature=gcfg.temperature,
                return_entropy=gcfg.compute_entropy, chunk_size=gcfg.logprob_chunk,
                segment_ids_BT=x.get("segment_ids"), positions_BT=x.get("positions"),
                right_padded=right_padded)
        return acc, met
    grad_fn = jax.value_and_grad(functools.partial(_micro_loss, mcfg=mcfg, gcfg=gcfg,
                                                   right_padded=right_padded), has_aux=True)
    (_, met), g = grad_fn(params, x)
    return jax.tree.map(jnp.add, acc, g), met


def _reduce(metrics: Metrics, axis: int = 0) -> Metrics:
    """Sum additive metrics over an axis (micro-batches); max for keys ending in '_max'."""
    return {k: (jnp.max(v, axis) if k.endswith("_max") else jnp.sum(v, axis))
            for k, v in metrics.items()}


def _accumulate(add_grads, params, mb_K: Batch) -> tuple[Any, Metrics]:
    """Gradients summed over the K micro-batches of one minibatch, and their summed metrics."""
    grads, met_K = jax.lax.scan(lambda acc, x: add_grads(acc, params, x),
                                jax.tree.map(jnp.zeros_like, params), mb_K)
    return grads, _reduce(met_K)


def _update_or_skip(opt: optax.GradientTransformation, params, opt_state, grads, loss,
                    has_tokens) -> tuple[Any, Any, jax.Array, jax.Array, jax.Array]:
    """(params, opt_state, applied, finite, grad_norm): the optimizer's update where the loss and
    gradient are finite and the minibatch has policy tokens, else the old params and state."""
    with jax.named_scope("optimizer"):
        gnorm = optax.global_norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        apply = finite & has_tokens
        updates, new_opt = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        pick = lambda new, old: jax.tree.map(  # noqa: E731
            lambda a, b: jnp.where(apply, a, b), new, old)
        return pick(new_params, params), pick(new_opt, opt_state), apply, finite, gnorm


def _summarise(met_EM: Metrics, keep_B: jax.Array) -> Metrics:
    """Per-update metrics [E, M] -> scalars: means (max for '*_max'), skip/empty counts, the first
    update's loss and log-ratio. With old logprobs recomputed that log-ratio is 0 only up to
    rounding in the compute dtype (<= 1e-6 in fp32, 2-3e-3 in bf16): the two passes are compiled
    separately and need not round alike."""
    met_U = jax.tree.map(lambda v: v.reshape((-1,) + v.shape[2:]), met_EM)
    metrics = {k: (jnp.max(v) if k.endswith("_max") else jnp.mean(v)) for k, v in met_U.items()}
    metrics["skipped"] = jnp.sum(met_U["skipped"])
    metrics["empty"] = jnp.sum(met_U["empty"])
    metrics["loss_first"] = met_U["loss"][0]
    if "log_ratio_absmax_max" in met_U:
        metrics["log_ratio_absmax_first"] = met_U["log_ratio_absmax_max"][0]
    metrics["dropped_samples"] = jnp.sum(keep_B == 0).astype(jnp.float32)
    return metrics


def _train_step(state: TrainState, batch: Batch, *, mcfg, gcfg: GRPOConfig,
                opt_cfg: OptimizerConfig, mesh: Mesh | None, rules: parallel.Rules,
                right_padded: bool):
    ctx = (parallel.activation_sharding(mesh, rules) if mesh is not None
           else contextlib.nullcontext())
    with ctx:
        return _train_step_body(state, batch, mcfg=mcfg, gcfg=gcfg, opt_cfg=opt_cfg, mesh=mesh,
                                rules=rules, right_padded=right_padded)


def _train_step_body(state: TrainState, batch: Batch, *, mcfg, gcfg: GRPOConfig,
                     opt_cfg: OptimizerConfig, mesh, rules,
                     right_padded: bool) -> tuple[TrainState, Metrics]:
    opt = make_optimizer(opt_cfg)
    mb, keep_B = _minibatches(batch, gcfg, mesh, rules)
    if (gcfg.objective == "grpo" and "old_logprobs" not in batch
            and gcfg.ppo_epochs * gcfg.num_minibatches > 1):
        mb = _with_old_logprobs(mcfg, gcfg, state.params, mb, right_padded)
    if gcfg.shuffle_seed is None:
        mb = _with_loss_weights(mb, gcfg)
    add_grads = functools.partial(_add_micro_grads, mcfg=mcfg, gcfg=gcfg,
                                  right_padded=right_padded)

    def update(carry, mb_K):                             # one optimizer update on a minibatch
        params, opt_state, n_up, n_skip = carry
        grads, met = _accumulate(add_grads, params, mb_K)
        empty = jnp.sum(mb_K["mask"]) == 0
        params, opt_state, applied, finite, gnorm = _update_or_skip(
            opt, params, opt_state, grads, met["loss"], ~empty)
        met |= {"grad_norm": gnorm, "skipped": (~finite).astype(jnp.float32),
                "empty": empty.astype(jnp.float32), "lr": lr_schedule(opt_cfg)(n_up)}
        return (params, opt_state, n_up + applied.astype(jnp.int32),
                n_skip + (~finite).astype(jnp.int32)), met

    def epoch(carry, e):
        if gcfg.shuffle_seed is None:
            return jax.lax.scan(update, carry, mb)
        # Loss weights come from each minibatch's mask, so they follow the new assignment.
        mb_e = _with_loss_weights(_shuffled(mb, epoch_key(gcfg.shuffle_seed, state.step, e)),
                                  gcfg)
        return jax.lax.scan(update, carry, mb_e)

    c = state.counters
    carry0 = (state.params, state.opt_state, c["updates"], c["skipped_updates"])
    (params, opt_state, n_up, n_skip), met_EM = jax.lax.scan(
        epoch, carry0, jnp.arange(gcfg.ppo_epochs, dtype=jnp.int32))
    metrics = _summarise(met_EM, keep_B)
    counters = {"train_steps": c["train_steps"] + 1, "updates": n_up, "skipped_updates": n_skip,
                "dropped_samples": c["dropped_samples"] + jnp.sum(keep_B == 0).astype(jnp.int32)}
    return TrainState(params, opt_state, state.step + 1, counters), metrics


def make_train_step(model_cfg: models.ModelConfig, grpo_cfg: GRPOConfig,
                    opt_cfg: OptimizerConfig, mesh: Mesh | None = None,
                    rules: parallel.Rules = parallel.DEFAULT_RULES, *,
                    right_padded: bool = False) -> TrainStep:
    """The jitted state initialiser and step. With a mesh: params/moments sharded by
    `models.param_shardings`, batch rows over the batch axes, metrics replicated; the state
    argument of `step` is donated either way. One compile per distinct set of batch keys and
    shapes.

    `right_padded`: every batch's rows hold their real tokens first (`rl.pack`'s rows), so the
    fused attention kernel runs with no run-time check of the layout (on XLA:GPU a host sync
    per check). `step` checks each batch's mask on the host (`check_right_padded`); a traced
    batch (an abstract lowering) has no values to check."""
    body = functools.partial(_train_step, mcfg=model_cfg, gcfg=grpo_cfg, opt_cfg=opt_cfg,
                             mesh=mesh, rules=rules, right_padded=right_padded)
    s_sh = state_shardings(model_cfg, opt_cfg, mesh, rules) if mesh is not None else None
    # Donated: the state takes over the params' buffers instead of holding a second copy.
    init = jax.jit(lambda params: init_state(params, opt_cfg), out_shardings=s_sh,
                   donate_argnums=0)
    cache: dict[tuple[str, ...], Callable] = {}

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        check_batch(batch, grpo_cfg)
        if right_padded:
            check_rows_right_padded(batch["attention_mask"])
        if mesh is not None:
            check_data_parallel(batch, mesh, rules)
        key = tuple(sorted(batch))
        if key not in cache:
            if mesh is None:
                cache[key] = jax.jit(body, donate_argnums=0)
            else:
                rep = NamedSharding(mesh, PartitionSpec())
                cache[key] = jax.jit(body, in_shardings=(s_sh, batch_shardings(batch, mesh, rules)),
                                     out_shardings=(s_sh, rep), donate_argnums=0)
        return cache[key](state, batch)

    return TrainStep(init=init, step=step, shardings=s_sh)
