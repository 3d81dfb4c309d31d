"""What the loop builds once from its TrainConfig: params, the model card, the environment and
sampler configs it hands to `orchestrax.registry`, warm-start demonstrations."""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import shutil
from typing import Any, Sequence

import jax
import numpy as np

from orchestrax import models, registry
from orchestrax.agent.episode import Codec, EpisodeConfig, run_episode
from orchestrax.agent.fanout import fan_out
from orchestrax.agent.scripted import ScriptedSampler
from orchestrax.models.hf_io import portable_tokenizer_config
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.environment import Environment, play_task
from orchestrax.rollout.sampler import SamplerConfig
from orchestrax.train.train_config import TrainConfig

log = logging.getLogger(__name__)


def configure_logging() -> None:
    """orchestrax at INFO, everything else (orbax, absl, jax) at WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s",
                        datefmt="%H:%M:%S", force=True)
    logging.getLogger("orchestrax").setLevel(logging.INFO)


def pad_id(codec: Codec) -> int:
    return codec.stop_ids[-1]


def load_params(cfg: TrainConfig, mesh) -> tuple[models.ModelConfig, Any]:
    if cfg.hf_path is not None:
        # The model config comes from the HF config.json, which knows nothing of remat.
        model_cfg, params = models.load_hf(cfg.hf_path, dtype=cfg.dtype, mesh=mesh)
        return model_cfg.replace(remat=cfg.remat), params
    shardings = models.param_shardings(cfg.model, mesh)
    init = jax.jit(models.init_params, static_argnums=(0, 1), out_shardings=shardings)
    return cfg.model, init(cfg.model, cfg.seed)


def write_model_card(directory: pathlib.Path, model_cfg: models.ModelConfig, tokenizer,
                     source: str | None = None) -> None:
    """config.json and the tokenizer next to the checkpoints, so a run exports on its own
    (tools/export_hf.py) and SGLang weight-sync directories get a tokenizer; the source
    model's generation_config.json too, so exports keep its stop tokens and sampling."""
    directory.mkdir(parents=True, exist_ok=True)
    hf = models.config_to_hf(model_cfg, model_cfg.param_dtype)
    (directory / "config.json").write_text(json.dumps(hf, indent=2))
    tokenizer.save_pretrained(directory)
    conf = directory / "tokenizer_config.json"
    conf.write_text(json.dumps(portable_tokenizer_config(json.loads(conf.read_text())), indent=2))
    gen = pathlib.Path(source or "") / "generation_config.json"
    if source is not None and gen.is_file():
        shutil.copyfile(gen, directory / "generation_config.json")


def make_env(cfg: TrainConfig) -> Environment:
    """The run's environment, with the run's tool catalog for kinds that take one."""
    return registry.build_env(cfg.env, tools=registry.build_catalog(cfg.tools))


def task_stream(cfg: TrainConfig, env: Environment, num_tasks: int):
    """This process's RL steps of task indices, as the environment draws them (a grain
    MapDataset)."""
    return env.task_stream(num_tasks, cfg.rollout.tasks_per_step, seed=cfg.seed,
                           process_index=jax.process_index(),
                           process_count=jax.process_count())


def server_share(urls: Sequence[str]) -> tuple[str, ...]:
    """The rollout servers this process sends its episodes to and syncs weights on (every
    process_count-th, from its process index)."""
    n, i = jax.process_count(), jax.process_index()
    if len(urls) < n:
        raise ValueError(f"rollout.server_urls has {len(urls)} servers for {n} trainer "
                         f"processes; give at least one server per process")
    repeated = sorted({u for u in urls if urls.count(u) > 1})
    if n > 1 and repeated:
        # Each process posts every weight update to its own share: a URL in two shares (one
        # router for all) would get each update from every process.
        raise ValueError(f"rollout.server_urls repeats {repeated}; with {n} trainer processes "
                         "each URL must appear once (give the servers themselves, not one "
                         "router URL per process)")
    return tuple(urls[i::n])


def sampler_config(cfg: TrainConfig, out_dir: pathlib.Path | None = None) -> SamplerConfig:
    """This process's policy sampler: `rollout.backend` over the run's rollout settings and this
    process's share of `server_urls`; HTTP backends publish each version under
    `rollout.weight_sync_dir` with the run's tokenizer (`out_dir/model`)."""
    r = cfg.rollout
    return SamplerConfig(backend=r.backend,
                         urls=server_share(r.server_urls) if r.server_urls else (),
                         max_batch=r.sampler_max_batch, max_len=r.context_tokens,
                         seed=cfg.seed,
                         weight_sync_dir=r.weight_sync_dir,
                         tokenizer_dir=None if out_dir is None else str(out_dir / "model"))


def demonstrations(env: Environment, tasks: Sequence[Task], tokenizer,
                   cfg: TrainConfig) -> list[Trajectory]:
    """Warm-start data made the way rollouts are: each demo episode is played by a scripted
    sampler through the real episode loop, so its ids and masks are exactly rollout-shaped."""
    rng = np.random.default_rng([cfg.seed, 3])
    scripts = [env.demonstration(task, rng) for task in tasks]
    if any(turns is None for turns in scripts):
        raise ValueError(f"TrainConfig.sft_steps={cfg.sft_steps} but env "
                         f"{type(cfg.env).__name__} has no demonstrations; set sft_steps=0")
    episode_cfg = EpisodeConfig(max_turns=cfg.rollout.max_turns,
                                context_tokens=cfg.rollout.context_tokens,
                                max_new_tokens=cfg.rollout.max_new_tokens,
                                enable_thinking=cfg.rollout.enable_thinking)

    async def play(job: tuple[Task, list[str]]) -> Trajectory:
        task, turns = job

        async def run(start: Task, tools, user) -> Trajectory:
            return await run_episode(ScriptedSampler(tokenizer, turns=turns), tokenizer, start,
                                     tools, config=episode_cfg, user=user)

        return (await play_task(env, task, run))[0]

    demos = asyncio.run(fan_out(play, list(zip(tasks, scripts)),
                                max_in_flight=cfg.rollout.max_in_flight))
    bad = [d for d in demos if d.end_reason != "answer"]
    if bad:
        raise RuntimeError(f"{len(bad)} demonstration episodes did not end with an answer "
                           f"(first: {bad[0].end_reason}); check the env's demonstration()")
    return demos

