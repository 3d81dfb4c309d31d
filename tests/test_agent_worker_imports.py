"""A spawned episode worker built the way the trainer builds it (`EpisodePlayer` from the run's
config) imports neither torch nor transformers: those imports took most of a worker's start-up
(58 s for 8 workers on a 16-core host). This module's own imports stay light on purpose: the
spawned worker imports it to unpickle `HeavyModules`."""

from __future__ import annotations

import functools
import sys

from orchestrax.agent.pool import EpisodePool

HEAVY = ("torch", "transformers", "trl")


class HeavyModules:
    """Builds the trainer's real `EpisodePlayer`; `play` answers which heavy modules the worker
    process has loaded."""

    def __init__(self, tokenizer: str, tokenizer_dir: str | None):
        from orchestrax import models
        from orchestrax.train.train_config import TrainConfig
        from orchestrax.train.rollouts import EpisodePlayer

        cfg = TrainConfig(name="imports", out_dir="/tmp/unused", model=models.tiny_config(),
                          tokenizer=tokenizer_dir or tokenizer)
        self.player = EpisodePlayer(cfg, ("http://127.0.0.1:9",))

    async def play(self, job):
        return sorted(m for m in HEAVY if m in sys.modules), self.player.codec.encode(job)

    async def aclose(self):
        await self.player.aclose()


def test_spawned_worker_imports_neither_torch_nor_transformers(tmp_path):
    from orchestrax.agent.scripted import tiny_qwen3_tokenizer

    tiny_qwen3_tokenizer().save_pretrained(tmp_path)  # a Hugging Face tokenizer directory
    text = "<|im_start|>user\nParis é<|im_end|>"
    expected = tiny_qwen3_tokenizer().encode(text, add_special_tokens=False)
    for spec, directory in (("tiny", None), ("dir", str(tmp_path))):
        with EpisodePool(functools.partial(HeavyModules, spec, directory), workers=1) as pool:
            ((heavy, ids),) = pool_play(pool, [text])
        assert heavy == [], f"worker with tokenizer={spec!r} imported {heavy}"
        assert ids == expected


def pool_play(pool, jobs):
    import asyncio
    return asyncio.run(pool.play(jobs))
