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
    A 24k-slot bf16 KV cache row is 3.5 GB; the engine splits its cache's 8 kv heads over the 8
    GPUs (0.41 GiB a slot a GPU): 64 slots compile to 28.8 GiB a GPU for a prefill chunk and
    29.1 for a decode step, +13.4 held = 42.4 of 75.7 (56%; bench/gpu_compile.py). 128, a slot
    for each of a step's episodes, would be 69.6 (92%), past a 90% margin. The trainer frees
    the cache before its step (drop_params), so the GRPO step's 39.8 + 1.9 does not share the
    GPU with it."""
    import dataclasses
    c = config()
    # 128 rows / 4 minibatches / 4 micro-batches = 8 rows a micro-step, one a GPU (fewer rows
    # than devices makes XLA compute each row twice: "involuntary full rematerialization").
    return c.replace(grpo=dataclasses.replace(c.grpo, num_microbatches=4),
                     rollout=dataclasses.replace(c.rollout, backend="embedded", server_urls=(),
                                                 sampler_max_batch=64))
