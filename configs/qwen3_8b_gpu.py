"""Qwen3-8B orchestrator on GPUs: the ToolOrchestra recipe of configs/toolorchestra.py (the one
recipe; this file only names its GPU scales). Loads from any working directory."""

import pathlib
import runpy

_recipe = runpy.run_path(str(pathlib.Path(__file__).with_name("toolorchestra.py")))

config = _recipe["config"]                   # one 8-GPU node, SGLang on 4 of the GPUs
config_one_h200 = _recipe["config_one_h200"]
config_multinode = _recipe["config_multinode"]


def config_embedded():
    """One 8-GPU node with the built-in JAX sampler instead of SGLang (one process, all 8 GPUs).
    A 24k-slot bf16 KV cache row is 3.5 GB; 16 rows, because a prefill chunk into one slot of
    a slot axis split over the GPUs gathers the cache (bench/gpu_compile.py: 32 rows compile
    to 76.1 GiB a GPU with 13.4 held, past the 75.7 usable)."""
    import dataclasses
    c = config()
    # 128 rows / 4 minibatches / 4 micro-batches = 8 rows a micro-step, one a GPU (fewer rows
    # than devices makes XLA compute each row twice: "involuntary full rematerialization").
    return c.replace(grpo=dataclasses.replace(c.grpo, num_microbatches=4),
                     rollout=dataclasses.replace(c.rollout, backend="embedded", server_urls=(),
                                                 sampler_max_batch=16))
