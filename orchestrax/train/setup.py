"""Builders the loop calls once: tokenizer, params, environment, sampler, demos."""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import shutil
from typing import Any, Sequence

import jax
import numpy as np

from orchestrax import models, parallel
from orchestrax.agent.episode import Codec, EpisodeConfig, run_episode
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer
from orchestrax.models.hf_io import portable_tokenizer_config
from orchestrax.data.records import Task, Trajectory
from orchestrax.envs.base import Environment
from orchestrax.train.config import TrainConfig

log = logging.getLogger(__name__)


def configure_logging() -> None:
    """orchestrax at INFO, everything else (orbax, absl, jax) at WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s",
                        datefmt="%H:%M:%S", force=True)
    logging.getLogger("orchestrax").setLevel(logging.INFO)


def load_tokenizer(spec: str):
    if spec == "tiny":
        return tiny_qwen3_tokenizer(512)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(spec)


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
    (scripts/export_hf.py) and SGLang weight-sync directories get a tokenizer; the source
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
    if cfg.env != "mix":
        return _make_env(cfg, cfg.env, dict(cfg.env_kwargs), make_catalog(cfg))
    from orchestrax.envs.mixture import MixtureEnv
    catalog = make_catalog(cfg)  # one catalog (one search index) for every source
    return MixtureEnv([(name, weight, _make_env(cfg, env, dict(kwargs), catalog))
                       for name, weight, env, kwargs in dict(cfg.env_kwargs)["sources"]])


def task_stream(cfg: TrainConfig, env: Environment, num_tasks: int):
    """The RL steps' task indices for this process, as a grain MapDataset: the mixture's
    weighted draw for env="mix", else uniform without repeats within a step."""
    from orchestrax.data import tasks
    shard = dict(process_index=jax.process_index(), process_count=jax.process_count())
    if cfg.env == "mix":
        return tasks.mixture_stream(env.sizes(), env.weights, cfg.rollout.tasks_per_step,
                                    seed=cfg.seed, **shard)
    return tasks.task_stream(num_tasks, cfg.rollout.tasks_per_step, seed=cfg.seed, **shard)


def _make_env(cfg: TrainConfig, env: str, kwargs: dict[str, Any], catalog) -> Environment:
    if env == "routing":
        from orchestrax.envs.routing import RoutingConfig, RoutingEnv
        return RoutingEnv(RoutingConfig(seed=cfg.seed, **kwargs))
    if env == "tau2":
        from orchestrax.envs import tau2
        from orchestrax.tools.chat_client import ChatEndpoint
        domain = kwargs.pop("domain")
        user = kwargs.pop("user_url", None)
        endpoint = ChatEndpoint(base_url=user, model=kwargs.pop("user_model", "default"),
                                api_key_env=kwargs.pop("user_api_key_env", None)) if user else None
        return tau2.Tau2Env(domain, user_endpoint=endpoint, tools=catalog, **kwargs)
    if env == "toolscale":  # a tau2-format domain whose code runs in domain workers
        from orchestrax.envs.toolscale import ToolScaleEnv
        return ToolScaleEnv(kwargs.pop("domain"), tools=catalog, **kwargs)
    from orchestrax.envs import qa
    return qa.QAEnv(tools=catalog, **kwargs)


def make_catalog(cfg: TrainConfig):
    """The orchestrator's tools named by `cfg.tools` (issue 10), or None."""
    if cfg.tools is None:
        return None
    from orchestrax.tools.catalog import build_catalog
    return build_catalog(cfg.tools)


def make_sampler(cfg: TrainConfig, model_cfg: models.ModelConfig, params: Any):
    """This process's sampler: the embedded one on a copy of the params on this process's own
    devices, or an SGLang client for this process's share of `server_urls` (every
    process_count-th, from its process index)."""
    r = cfg.rollout
    if r.backend == "embedded":
        from orchestrax.rollout.embedded import make_embedded_sampler
        return make_embedded_sampler(r.engine, model_cfg, sampler_params(model_cfg, params),
                                     max_batch=r.sampler_max_batch, max_len=r.context_tokens,
                                     seed=cfg.seed)
    from orchestrax.rollout.sglang_client import SGLangClient, SGLangClientConfig
    return SGLangClient(SGLangClientConfig(urls=server_share(r.server_urls)))


def server_share(urls: Sequence[str]) -> tuple[str, ...]:
    """The rollout servers this process sends its episodes to and syncs weights on."""
    n, i = jax.process_count(), jax.process_index()
    if len(urls) < n:
        raise ValueError(f"rollout.server_urls has {len(urls)} servers for {n} trainer "
                         f"processes; give at least one server per process")
    return tuple(urls[i::n])


def sampler_params(model_cfg: models.ModelConfig, params: Any) -> Any:
    """`params` as this process's embedded sampler can use them. Multi-process: the training
    params span every process's devices, and a sampler runs on its own process alone, so the
    params are gathered (a collective: every process calls this at the same point) and put on a
    mesh of this process's local devices. Either way the sampler gets its own copy in the
    forward's dtypes (`models.compute_copy`: the same tokens and logprobs as the fp32 masters,
    half their memory and of the weight bytes each decode step reads)."""
    params = models.compute_copy(model_cfg, params)
    if jax.process_count() == 1:
        return params
    from jax.experimental import multihost_utils
    host = multihost_utils.process_allgather(params, tiled=True)
    local = parallel.make_mesh(parallel.MeshConfig(), jax.local_devices())
    return jax.device_put(host, models.param_shardings(model_cfg, local))


async def publish(sampler, cfg: TrainConfig, model_cfg: models.ModelConfig, params: Any,
                  version: str, out_dir: pathlib.Path) -> None:
    """Make the sampler serve `params`: in place for the embedded sampler; for SGLang servers an
    HF directory per version, `/update_weights_from_disk` on each, `weight_version` checked."""
    if hasattr(sampler, "set_params"):
        sampler.set_params(sampler_params(model_cfg, params), weight_version=version)
        return
    from orchestrax.rollout.weight_sync import sync_weights
    await sync_weights(sampler, model_cfg, params, cfg.rollout.weight_sync_dir, version,
                       tokenizer_dir=str(out_dir / "model"))


def demonstrations(env: Environment, tasks: Sequence[Task], tokenizer,
                   cfg: TrainConfig) -> list[Trajectory]:
    """Warm-start data made the way rollouts are: each demo episode is played by a scripted
    sampler through the real episode loop, so its ids and masks are exactly rollout-shaped."""
    rng = np.random.default_rng([cfg.seed, 3])
    scripts = [env.demonstration(task, rng) for task in tasks]
    if any(turns is None for turns in scripts):
        raise ValueError(f"TrainConfig.sft_steps={cfg.sft_steps} but env {cfg.env!r} has no "
                         "demonstrations; set sft_steps=0")
    episode_cfg = EpisodeConfig(max_turns=cfg.rollout.max_turns,
                                context_tokens=cfg.rollout.context_tokens,
                                max_new_tokens=cfg.rollout.max_new_tokens,
                                enable_thinking=cfg.rollout.enable_thinking)

    async def play(task: Task, turns: list[str]) -> Trajectory:
        sampler = ScriptedSampler(tokenizer, turns=turns)
        return await run_episode(sampler, tokenizer, task, env.tools(task), config=episode_cfg)

    async def play_all():
        return await asyncio.gather(*(play(t, s) for t, s in zip(tasks, scripts)))

    demos = asyncio.run(play_all())
    bad = [d for d in demos if d.end_reason != "answer"]
    if bad:
        raise RuntimeError(f"{len(bad)} demonstration episodes did not end with an answer "
                           f"(first: {bad[0].end_reason}); check the env's demonstration()")
    return demos

