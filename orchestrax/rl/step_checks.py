"""The train step's checks of its input, outside jit, before a batch is placed: keys, shapes and
dtypes against the step's config (one-line errors naming the field), right padding where the
step was told it holds (`make_train_step(right_padded=True)`), and the batch's divisibility by
the mesh's data-parallel degree."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from orchestrax import parallel
from orchestrax.rl import contracts
from orchestrax.rl.batch import check_right_padded
from orchestrax.rl.grpo_config import GRPOConfig
from orchestrax.rl.state import Batch, data_parallel_degree

_ROW_KEYS = ("tokens", "attention_mask", "loss_mask", "old_logprobs", "sampler_logprobs",
             "ref_logprobs", "advantages", "sample_mask", "segment_ids", "positions",
             "rollout_ids")
_PACKED_KEYS = ("segment_ids", "positions")


def check_batch(batch: Batch, gcfg: GRPOConfig) -> None:
    for key in ("tokens", "attention_mask", "loss_mask") + (
            ("advantages",) if gcfg.objective == "grpo" else ()):
        if key not in batch:
            raise ValueError(f"batch is missing {key!r}; has {sorted(batch)}")
    unknown = set(batch) - set(_ROW_KEYS)
    if unknown:
        raise ValueError(f"batch has unknown keys {sorted(unknown)}; allowed: {_ROW_KEYS}")
    contracts.check_rank("train_step", "batch['tokens']", batch["tokens"], 2, "[B,T]")
    B, T = batch["tokens"].shape
    for k, v in batch.items():
        if k in ("advantages", "sample_mask", "rollout_ids"):
            contracts.check_shape("train_step", f"batch[{k!r}]", v, (B,), f"[B] = ({B},)")
        else:
            contracts.check_shape("train_step", f"batch[{k!r}]", v, (B, T),
                                  f"[B,T] = {(B, T)} like batch['tokens']")
        if k in ("tokens", "segment_ids", "positions", "rollout_ids"):
            contracts.check_integer("train_step", f"batch[{k!r}]", v)
    n = gcfg.num_minibatches * gcfg.num_microbatches
    if B % n:
        raise ValueError(f"batch size {B} is not divisible by num_minibatches × num_microbatches "
                         f"= {gcfg.num_minibatches} × {gcfg.num_microbatches}")
    if gcfg.kl_coef > 0 and "ref_logprobs" not in batch:
        raise ValueError("GRPOConfig.kl_coef > 0 needs batch['ref_logprobs']")
    _check_packed(batch, gcfg)


def _check_packed(batch: Batch, gcfg: GRPOConfig) -> None:
    packed = [k for k in _PACKED_KEYS if k in batch]
    if not packed:
        return
    if gcfg.objective != "sft":
        raise ValueError(f"batch has {packed}, packed rows; they are for objective='sft' only "
                         f"(got objective={gcfg.objective!r}: rollout rows are not packed)")
    if len(packed) != len(_PACKED_KEYS):
        raise ValueError(f"batch has {packed} without the rest of {_PACKED_KEYS}; packed rows "
                         "need both")
    if gcfg.agg != "token-mean":
        raise ValueError(f"packed rows need GRPOConfig.agg='token-mean'; agg={gcfg.agg!r} would "
                         "weigh each row of several sequences as one sequence")


def check_rows_right_padded(mask_BT) -> None:
    """`check_right_padded` on the rows this process holds: a host array, or a jax.Array's
    addressable shards (whole rows: batches are split by rows only)."""
    if isinstance(mask_BT, jax.core.Tracer):
        return
    parts = ([np.asarray(s.data) for s in mask_BT.addressable_shards]
             if isinstance(mask_BT, jax.Array) else [np.asarray(mask_BT)])
    for part in parts:
        if part.shape[1:] != np.shape(mask_BT)[1:]:
            raise ValueError(f"train_step: batch['attention_mask'] is split along T "
                             f"({part.shape} of {np.shape(mask_BT)}); right padding is checked "
                             "on whole rows")
        check_right_padded(part, "train_step batch")


def check_data_parallel(batch: Batch, mesh: Mesh, rules: parallel.Rules) -> None:
    n, axes = data_parallel_degree(mesh, rules)
    B = batch["tokens"].shape[0]
    if B % n:
        raise ValueError(f"batch size {B} is not divisible by the data-parallel degree {n} "
                         f"(mesh axes {axes} of {dict(mesh.shape)}); pad the batch with "
                         f"sample_mask = 0 rows")
