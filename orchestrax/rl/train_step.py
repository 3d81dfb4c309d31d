"""The pure GRPO/SFT update: `train_step(state, batch) -> (state, metrics)`, jitted with explicit
in/out shardings and a donated state.

Letters: B sequences, T tokens, M minibatches, K micro-batches, b = B // (M·K) rows each.
Batch (all [B,T] aligned with `tokens`, position t = token t predicted from tokens < t):
  tokens int32, attention_mask, loss_mask (1 on policy tokens), advantages [B],
  optional: sample_mask [B] (filters; 0 = no gradient), old_logprobs (absent: recomputed with the
  current params before the first update), sampler_logprobs (gap metric, truncated IS),
  ref_logprobs (needed when kl_coef > 0).
One call runs ppo_epochs × num_minibatches optimizer updates, each accumulating gradients over
num_microbatches micro-batches whose loss weights come from the whole minibatch, so accumulation
reproduces the big-batch gradient. A non-finite loss or gradient keeps the old params/opt state,
and so does a minibatch with no token left under the mask (all its samples filtered): Adam's
momentum would otherwise keep moving the params on a zero gradient.
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
from orchestrax.rl.config import GRPOConfig, OptimizerConfig
from orchestrax.rl.losses import policy_loss_weighted, sft_loss, token_weights
from orchestrax.rl.optim import lr_schedule, make_optimizer

Batch = dict[str, jax.Array]
COUNTERS = ("train_steps", "updates", "skipped_updates", "dropped_samples")
_ROW_KEYS = ("tokens", "attention_mask", "loss_mask", "old_logprobs", "sampler_logprobs",
             "ref_logprobs", "advantages", "sample_mask")


class TrainState(NamedTuple):
    params: Any
    opt_state: Any
    step: jax.Array                     # int32: train_step calls so far
    counters: dict[str, jax.Array]      # int32 scalars, see COUNTERS


def init_state(params: Any, opt_cfg: OptimizerConfig) -> TrainState:
    zero = lambda: jnp.zeros((), jnp.int32)  # noqa: E731 - distinct buffers, the state is donated
    return TrainState(params=params, opt_state=make_optimizer(opt_cfg).init(params), step=zero(),
                      counters={k: zero() for k in COUNTERS})


def state_shardings(model_cfg: models.ModelConfig, opt_cfg: OptimizerConfig, mesh: Mesh,
                    rules: parallel.Rules = parallel.DEFAULT_RULES) -> TrainState:
    """Params and their optimizer moments by `models.param_shardings`; scalars replicated."""
    p_sh = models.param_shardings(model_cfg, mesh, rules)
    rep = NamedSharding(mesh, PartitionSpec())
    opt = make_optimizer(opt_cfg)
    p_shapes = jax.eval_shape(lambda: models.init_params(model_cfg, seed=0))
    o_shapes = jax.eval_shape(opt.init, p_shapes)
    o_sh = optax.tree_map_params(opt, lambda _, s: s, o_shapes, p_sh,
                                 transform_non_params=lambda _: rep)
    return TrainState(params=p_sh, opt_state=o_sh, step=rep, counters={k: rep for k in COUNTERS})


def batch_shardings(batch: Batch, mesh: Mesh, rules: parallel.Rules = parallel.DEFAULT_RULES
                    ) -> dict[str, NamedSharding]:
    """Every batch array split along its leading (batch) dim over the rules' batch axes."""
    def one(x):
        spec = parallel.logical_to_spec(("batch",) + (None,) * (jnp.ndim(x) - 1), rules, mesh)
        return NamedSharding(mesh, spec)
    return {k: one(v) for k, v in batch.items()}


def _check_batch(batch: Batch, gcfg: GRPOConfig) -> None:
    for key in ("tokens", "attention_mask", "loss_mask") + (
            ("advantages",) if gcfg.objective == "grpo" else ()):
        if key not in batch:
            raise ValueError(f"batch is missing {key!r}; has {sorted(batch)}")
    unknown = set(batch) - set(_ROW_KEYS)
    if unknown:
        raise ValueError(f"batch has unknown keys {sorted(unknown)}; allowed: {_ROW_KEYS}")
    B, T = batch["tokens"].shape
    for k, v in batch.items():
        want = (B,) if k in ("advantages", "sample_mask") else (B, T)
        if tuple(v.shape) != want:
            raise ValueError(f"batch[{k!r}] has shape {tuple(v.shape)}; expected {want}")
    n = gcfg.num_minibatches * gcfg.num_microbatches
    if B % n:
        raise ValueError(f"batch size {B} is not divisible by num_minibatches × num_microbatches "
                         f"= {gcfg.num_minibatches} × {gcfg.num_microbatches}")
    if gcfg.kl_coef > 0 and "ref_logprobs" not in batch:
        raise ValueError("GRPOConfig.kl_coef > 0 needs batch['ref_logprobs']")


def _check_data_parallel(batch: Batch, gcfg: GRPOConfig, mesh: Mesh, rules) -> None:
    spec = parallel.logical_to_spec(("batch",), rules, mesh)[0]
    axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    n = 1
    for a in axes:
        n *= mesh.shape[a]
    B = batch["tokens"].shape[0]
    if B % n:
        raise ValueError(f"batch size {B} is not divisible by the data-parallel degree {n} "
                         f"(mesh axes {axes} of {dict(mesh.shape)}); pad the batch with "
                         f"sample_mask = 0 rows")


def _split(x: jax.Array, M: int, K: int, mesh: Mesh | None, rules: parallel.Rules) -> jax.Array:
    """[B, ...] -> [M, K, b, ...] with rows strided (row = i·M·K + m·K + k), so each micro-batch
    draws rows from every device's contiguous batch shard and stays split over the batch axes."""
    b = x.shape[0] // (M * K)
    y = jnp.moveaxis(x.reshape((b, M, K) + x.shape[1:]), 0, 2)
    if mesh is None:
        return y
    spec = parallel.logical_to_spec((None, None, "batch") + (None,) * (x.ndim - 1), rules, mesh)
    n = 1
    for axes in spec:
        for a in (axes,) if isinstance(axes, str) else axes or ():
            n *= mesh.shape[a]
    # Micro-batches smaller than the data-parallel degree cannot be split; leave them to XLA.
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, spec)) if b % n == 0 else y


def _logprobs(mcfg, gcfg, params, tokens, attn):
    out = models.token_logprobs(mcfg, params, tokens, attn, temperature=gcfg.temperature,
                                return_entropy=gcfg.compute_entropy,
                                chunk_size=gcfg.logprob_chunk)
    return out if gcfg.compute_entropy else (out, None)


def _micro_loss(params, x, *, mcfg, gcfg):
    logp, ent = _logprobs(mcfg, gcfg, params, x["tokens"], x["attention_mask"])
    if gcfg.objective == "sft":
        return sft_loss(logp, x["mask"], weights=x["w"])
    return policy_loss_weighted(
        logp, x["old_logprobs"], x["advantages"], x["mask"], x["w"], x["mw"],
        clip_low=gcfg.clip_low, clip_high=gcfg.clip_high, dual_clip=gcfg.dual_clip,
        log_ratio_clamp=gcfg.log_ratio_clamp, ref_logprobs=x.get("ref_logprobs"),
        kl_coef=gcfg.kl_coef, kl=gcfg.kl, sampler_logprobs=x.get("sampler_logprobs"),
        tis_cap=gcfg.tis_cap, entropy=ent)


def _reduce(metrics: dict[str, jax.Array], axis: int = 0) -> dict[str, jax.Array]:
    """Sum additive metrics over an axis (micro-batches); max for keys ending in '_max'."""
    return {k: (jnp.max(v, axis) if k.endswith("_max") else jnp.sum(v, axis))
            for k, v in metrics.items()}


def _train_step(state: TrainState, batch: Batch, *, mcfg, gcfg: GRPOConfig,
                opt_cfg: OptimizerConfig, mesh: Mesh | None, rules: parallel.Rules):
    ctx = (parallel.activation_sharding(mesh, rules) if mesh is not None
           else contextlib.nullcontext())
    with ctx:
        return _train_step_body(state, batch, mcfg=mcfg, gcfg=gcfg, opt_cfg=opt_cfg, mesh=mesh,
                                rules=rules)


def _train_step_body(state, batch, *, mcfg, gcfg, opt_cfg, mesh, rules):
    opt = make_optimizer(opt_cfg)
    M, K, E = gcfg.num_minibatches, gcfg.num_microbatches, gcfg.ppo_epochs
    B = batch["tokens"].shape[0]
    f32 = jnp.float32
    attn = batch["attention_mask"]
    keep_B = batch.get("sample_mask", jnp.ones((B,), f32)).astype(f32)
    mask = batch["loss_mask"].astype(f32) * attn.astype(f32) * keep_B[:, None]
    data = {k: v for k, v in batch.items() if k not in ("loss_mask", "sample_mask")}
    data["mask"] = mask
    split = jax.tree.map(lambda x: _split(x, M, K, mesh, rules), data)  # [M, K, b, ...]
    if gcfg.objective == "grpo" and "old_logprobs" not in batch:
        # On-policy μ = 1 shortcut: old logprobs from the params before the first update.
        flat_tok = split["tokens"].reshape((M * K,) + split["tokens"].shape[2:])
        flat_att = split["attention_mask"].reshape(flat_tok.shape)
        old = jax.lax.map(lambda ta: _logprobs(mcfg, gcfg, state.params, *ta)[0],
                          (flat_tok, flat_att))
        split["old_logprobs"] = jax.lax.stop_gradient(old.reshape(split["tokens"].shape))
    # Loss and metric weights from each whole minibatch's mask (see losses.token_weights).
    mask_MKbT = split["mask"]
    flat = mask_MKbT.reshape((M, -1, mask_MKbT.shape[-1]))
    split["w"] = jax.vmap(lambda m: token_weights(m, gcfg.agg, gcfg.norm_len))(flat).reshape(
        mask_MKbT.shape)
    split["mw"] = jax.vmap(lambda m: token_weights(m, "token-mean"))(flat).reshape(
        mask_MKbT.shape)
    grad_fn = jax.value_and_grad(functools.partial(_micro_loss, mcfg=mcfg, gcfg=gcfg),
                                 has_aux=True)

    def update(carry, mb):                               # one optimizer update on a minibatch
        params, opt_state, n_up, n_skip = carry

        def micro(g_acc, x):
            (_, met), g = grad_fn(params, x)
            return jax.tree.map(jnp.add, g_acc, g), met

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, met_K = jax.lax.scan(micro, zeros, mb)
        met = _reduce(met_K)
        gnorm = optax.global_norm(grads)
        finite = jnp.isfinite(met["loss"]) & jnp.isfinite(gnorm)
        empty = jnp.sum(mb["mask"]) == 0
        apply = finite & ~empty
        updates, new_opt = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        pick = lambda new, old: jax.tree.map(  # noqa: E731
            lambda a, b: jnp.where(apply, a, b), new, old)
        met |= {"grad_norm": gnorm, "skipped": (~finite).astype(f32), "empty": empty.astype(f32),
                "lr": lr_schedule(opt_cfg)(n_up)}
        carry = (pick(new_params, params), pick(new_opt, opt_state),
                 n_up + apply.astype(jnp.int32), n_skip + (~finite).astype(jnp.int32))
        return carry, met

    def epoch(carry, _):
        return jax.lax.scan(update, carry, split)

    c = state.counters
    carry0 = (state.params, state.opt_state, c["updates"], c["skipped_updates"])
    (params, opt_state, n_up, n_skip), met_EM = jax.lax.scan(epoch, carry0, None, length=E)
    met_U = jax.tree.map(lambda v: v.reshape((E * M,) + v.shape[2:]), met_EM)
    metrics = {k: (jnp.max(v) if k.endswith("_max") else jnp.mean(v)) for k, v in met_U.items()}
    metrics["skipped"] = jnp.sum(met_U["skipped"])
    metrics["empty"] = jnp.sum(met_U["empty"])
    metrics["loss_first"] = met_U["loss"][0]
    if "log_ratio_absmax_max" in met_U:
        metrics["log_ratio_absmax_first"] = met_U["log_ratio_absmax_max"][0]
    dropped = jnp.sum(keep_B == 0).astype(jnp.int32)
    metrics["dropped_samples"] = dropped.astype(f32)
    counters = {"train_steps": c["train_steps"] + 1, "updates": n_up, "skipped_updates": n_skip,
                "dropped_samples": c["dropped_samples"] + dropped}
    return TrainState(params, opt_state, state.step + 1, counters), metrics


def make_train_step(model_cfg: models.ModelConfig, grpo_cfg: GRPOConfig,
                    opt_cfg: OptimizerConfig, mesh: Mesh | None = None,
                    rules: parallel.Rules = parallel.DEFAULT_RULES
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """The jitted step. With a mesh: params/moments sharded by `models.param_shardings`, batch
    rows over the batch axes, metrics replicated; the state argument is donated either way.
    One compile per distinct set of batch keys and shapes."""
    body = functools.partial(_train_step, mcfg=model_cfg, gcfg=grpo_cfg, opt_cfg=opt_cfg,
                             mesh=mesh, rules=rules)
    s_sh = state_shardings(model_cfg, opt_cfg, mesh, rules) if mesh is not None else None
    cache: dict[tuple, Callable] = {}

    def step(state: TrainState, batch: Batch):
        _check_batch(batch, grpo_cfg)
        if mesh is not None:
            _check_data_parallel(batch, grpo_cfg, mesh, rules)
        key = tuple(sorted(batch))
        if key not in cache:
            if mesh is None:
                cache[key] = jax.jit(body, donate_argnums=0)
            else:
                rep = NamedSharding(mesh, PartitionSpec())
                cache[key] = jax.jit(body, in_shardings=(s_sh, batch_shardings(batch, mesh, rules)),
                                     out_shardings=(s_sh, rep), donate_argnums=0)
        return cache[key](state, batch)

    step.state_shardings = s_sh  # type: ignore[attr-defined]
    return step
