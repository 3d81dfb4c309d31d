"""Qwen3-8B on a TPU pod slice (e.g. v5p-32): FSDP over all chips with the embedded sampler
(SGLang does not run on TPU). Launch with launch/tpu_pod.sh.

Sized by bench/memory.py for v5p's 95 GB per chip: the train step at T=24k needs ~56 GiB per
device on 8 devices (less on more), and 128 cache rows of 3.5 GB spread over v5p-32's 16 chips
add 28 GB each; 256 rows would not fit next to the step."""

import dataclasses

from configs.qwen3_8b_gpu import config as gpu_config
from orchestrax.parallel import MeshConfig


def config():
    c = gpu_config()
    return c.replace(
        name="qwen3-8b-tpu",
        hf_path="/mnt/models/Qwen3-8B", tokenizer="/mnt/models/Qwen3-8B",
        mesh=MeshConfig(axes=(("data", 1), ("fsdp", -1), ("tensor", 1))),
        rollout=dataclasses.replace(c.rollout, backend="embedded", server_urls=(),
                                    sampler_max_batch=128),
        out_dir="gs://YOUR_BUCKET/orchestrax/qwen3-8b")
