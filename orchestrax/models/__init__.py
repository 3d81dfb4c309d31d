"""Qwen3 (and Llama-family) decoders: params declared as a Flax NNX module, forward passes as
pure functions over its pure state, shardings from the params' annotations, HF checkpoint I/O."""

from orchestrax.models.accumulate import value_and_grad_into
from orchestrax.models.configs import ModelConfig, num_params, preset, tiny_config
from orchestrax.models.decoder import Decoder, abstract_decoder, init_params
from orchestrax.models.hf_io import config_from_hf, config_to_hf, load_hf, save_hf
from orchestrax.models.model import (compute_copy, forward, forward_with_cache, hidden_states, init_cache,
                                     jit_forward, jit_forward_with_cache, lm_logits,
                                     logprobs_from_hidden, positions_from_mask, token_logprobs)
from orchestrax.models.slots import SlotCache, forward_slots, init_slots, unstack_layers
from orchestrax.models.sharding import (cache_logical_axes, logical_axes, module_shardings,
                                        param_logical_axes, param_shardings, shard_params)

__all__ = [
    "Decoder", "ModelConfig", "SlotCache", "forward_slots", "init_slots", "abstract_decoder", "cache_logical_axes", "compute_copy", "config_from_hf",
    "config_to_hf", "forward", "forward_with_cache", "hidden_states", "init_cache", "init_params",
    "jit_forward", "jit_forward_with_cache", "lm_logits", "load_hf", "logical_axes",
    "logprobs_from_hidden", "value_and_grad_into",
    "module_shardings", "num_params", "param_logical_axes", "param_shardings",
    "positions_from_mask", "preset", "save_hf", "shard_params", "tiny_config", "token_logprobs",
    "unstack_layers",
]
