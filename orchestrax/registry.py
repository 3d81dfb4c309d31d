"""The one place each kind of part is built from its own typed config: environments, samplers,
tokenizers and tool catalogs, for train, eval, serve and the episode workers alike.

A new environment is its module (an `EnvConfig` subclass next to an `Environment`) plus one line
in `ENVS`; a new sampler backend is its module (a `Sampler`) plus one line in `SAMPLERS`. Code
outside this module never constructs an environment or a sampler backend itself
(tests/test_layers.py checks it), so no caller branches on kinds or probes a sampler's type.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from orchestrax import models
from orchestrax.agent.codec import Codec
from orchestrax.envs.environment import EnvConfig, Environment
from orchestrax.envs.mixture import MixConfig
from orchestrax.envs.qa import QAConfig
from orchestrax.envs.routing import RoutingConfig
from orchestrax.envs.tau2.env import Tau2Config
from orchestrax.envs.toolscale import ToolScaleConfig
from orchestrax.rollout.sampler import Sampler, SamplerConfig
from orchestrax.tools.tool import Tool
from orchestrax.tools.catalog import CatalogConfig

Catalog = Mapping[str, Tool]
EnvBuilder = Callable[[Any, "Catalog | None"], Environment]
SamplerBuilder = Callable[[SamplerConfig, "models.ModelConfig | None", Any], Sampler]


def _routing(cfg: RoutingConfig, tools: Catalog | None) -> Environment:
    from orchestrax.envs.routing import RoutingEnv
    return RoutingEnv(cfg)


def _tau2(cfg: Tau2Config, tools: Catalog | None) -> Environment:
    from orchestrax.envs.tau2.env import Tau2Env
    return Tau2Env(cfg.domain, user_endpoint=cfg.user, completeness=cfg.completeness,
                   tools=tools)


def _toolscale(cfg: ToolScaleConfig, tools: Catalog | None) -> Environment:
    from orchestrax.envs.toolscale import ToolScaleEnv
    return ToolScaleEnv(cfg.domain, tasks=cfg.tasks, user_endpoint=cfg.user,
                        completeness=cfg.completeness, tools=tools, worker=cfg.worker)


def _mix(cfg: MixConfig, tools: Catalog | None) -> Environment:
    """Every source gets the one catalog (one search index), if its kind takes one."""
    from orchestrax.envs.mixture import MixtureEnv
    return MixtureEnv([(s.name, s.weight,
                        build_env(s.env, tools=tools if s.env.takes_catalog else None))
                       for s in cfg.sources])


def _qa(cfg: QAConfig, tools: Catalog | None) -> Environment:
    from orchestrax.envs.qa import QAEnv
    return QAEnv(cfg, tools=tools)


def _embedded(cfg: SamplerConfig, model: models.ModelConfig | None, params: Any) -> Sampler:
    from orchestrax.rollout.embedded import make_embedded_sampler
    if model is None or params is None:
        raise ValueError("SamplerConfig.backend='embedded' needs the model config and params")
    return make_embedded_sampler(model, params, max_batch=cfg.max_batch,
                                 max_len=cfg.max_len, seed=cfg.seed,
                                 weight_version=cfg.weight_version,
                                 dispatch_reads=cfg.dispatch_reads)


def _sglang(cfg: SamplerConfig, model: models.ModelConfig | None, params: Any) -> Sampler:
    from orchestrax.rollout.sglang_client import SGLangClient, SGLangClientConfig
    from orchestrax.rollout.weight_sync import WeightSync
    sync = None
    if cfg.weight_sync_dir is not None:
        if model is None:
            raise ValueError("SamplerConfig.weight_sync_dir is set: publishing weights to SGLang "
                             "needs the model config")
        sync = WeightSync(model=model, root=cfg.weight_sync_dir, tokenizer_dir=cfg.tokenizer_dir)
    return SGLangClient(SGLangClientConfig(urls=tuple(cfg.urls)), weight_sync=sync)


# One line per kind of part.
ENVS: dict[type[EnvConfig], EnvBuilder] = {
    RoutingConfig: _routing,
    Tau2Config: _tau2,
    ToolScaleConfig: _toolscale,
    QAConfig: _qa,
    MixConfig: _mix,
}
SAMPLERS: dict[str, SamplerBuilder] = {
    "embedded": _embedded,
    "sglang": _sglang,
}


def build_env(cfg: EnvConfig, *, tools: Catalog | None = None) -> Environment:
    """The environment `cfg` describes; `tools`: the orchestrator's catalog, offered next to the
    environment's own tools (refused by kinds that bring all of theirs)."""
    builder = ENVS.get(type(cfg))
    if builder is None:
        raise ValueError(f"env config {type(cfg).__name__}; registered: "
                         f"{sorted(c.__name__ for c in ENVS)}")
    if tools and not cfg.takes_catalog:
        raise ValueError(f"{type(cfg).__name__} brings its own tools; a tool catalog is for "
                         f"{sorted(c.__name__ for c in ENVS if c.takes_catalog)}")
    return builder(cfg, tools)


def build_sampler(cfg: SamplerConfig, model: models.ModelConfig | None = None,
                  params: Any = None) -> Sampler:
    """The sampler backend `cfg.backend` names; an in-process backend samples `params` of
    `model`, an HTTP one reaches `cfg.urls`."""
    check_backend(cfg.backend, "SamplerConfig.backend")
    return SAMPLERS[cfg.backend](cfg, model, params)


def check_backend(name: str, field: str) -> None:
    if name not in SAMPLERS:
        raise ValueError(f"{field}={name!r}; allowed: {tuple(SAMPLERS)}")


def build_tokenizer(spec: str):
    """A transformers tokenizer: "tiny" (the test tokenizer, 512 ids) or a local HF directory."""
    if spec == "tiny":
        from orchestrax.agent.scripted import tiny_qwen3_tokenizer
        return tiny_qwen3_tokenizer(512)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(spec)


def build_codec(spec: str) -> Codec:
    """The same tokenizer as a `Codec` without importing transformers (nor torch through it),
    for the episode workers: "tiny", or a directory holding a `tokenizer.json`."""
    from orchestrax.agent.scripted import load_codec
    return load_codec(spec)


def build_catalog(cfg: CatalogConfig | None) -> dict[str, Tool] | None:
    """The orchestrator's tools `cfg` names (call outside a running event loop), or None."""
    if cfg is None:
        return None
    from orchestrax.tools.catalog import build_catalog as build
    return build(cfg)
