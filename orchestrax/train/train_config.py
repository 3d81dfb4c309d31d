"""The whole training run as one frozen config, composed from the parts' own configs.

Configs are built by Python functions in `configs/` that start from one another and change what
differs (`dataclasses.replace`); nothing is read from YAML.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from typing import Any

import jax
from etils import epath

from orchestrax import registry
from orchestrax.agent import chat
from orchestrax.agent.episode import prompt_messages
from orchestrax.envs.environment import EnvConfig
from orchestrax.envs.routing import RoutingConfig
from orchestrax.models import ModelConfig
from orchestrax.models.configs import REMAT_POLICIES
from orchestrax.parallel import MeshConfig
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax.train.agent_config import AgentConfig
from orchestrax.train.metrics_log import WandbConfig
from orchestrax.data.instances import InstanceConfig
from orchestrax.tools.catalog import CatalogConfig
from orchestrax.train import compile_cache, run_info
from orchestrax.checks import at_least, check_fields, one_of

DTYPES = ("float32", "bfloat16")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    backend: str = "embedded"               # a registry.SAMPLERS key; "sglang": server_urls
    server_urls: tuple[str, ...] = ()
    group_size: int = 8                     # G rollouts per task
    tasks_per_step: int = 8                 # Q tasks per step
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 2048              # per assistant turn
    max_turns: int = 50
    context_tokens: int = 24_000
    enable_thinking: bool = True
    max_in_flight: int = 1024               # episodes alive at once (over all workers)
    workers: int = 0                        # 0: episodes on the trainer's event loop; N: an
                                            # EpisodePool of N processes (see train/rollouts.py)
    sampler_max_batch: int = 64             # embedded sampler: slots of its continuous engine
    # embedded sampler: compile every program its engine can dispatch before the first rollout
    # (ContinuousEngine.programs), instead of when a request first needs one
    warm_sampler: bool = False
    weight_sync_dir: str = "/tmp/orchestrax_weights"  # sglang: HF dirs written here per step
    # The policy's generation speed in the reward's latency feature: the clock charges this per
    # generated token (deterministic; measured sampler time is a metric only). 0.03 s: Qwen3-8B
    # bf16 on one H200, 64 requests at once, 2,127 tok/s in all (DESIGN.md, measured).
    seconds_per_token: float = 0.03

    def __post_init__(self):
        check_fields(self, prefix="RolloutConfig.")
        registry.check_backend(self.backend, "RolloutConfig.backend")
        if self.backend == "sglang" and not self.server_urls:
            raise ValueError("RolloutConfig.server_urls is empty; backend='sglang' needs at least "
                             "one SGLang server (or one sglang-router) URL")
        at_least(self, 1, "group_size", "tasks_per_step", "max_new_tokens", "max_turns",
                 "context_tokens", "max_in_flight", "sampler_max_batch")
        at_least(self, 0, "seconds_per_token")
        if self.workers < 0:
            raise ValueError(f"RolloutConfig.workers={self.workers}; must be >= 0 (0 runs "
                             "episodes in the trainer process)")
        if self.group_size < 2:
            raise ValueError(f"RolloutConfig.group_size={self.group_size}; GRPO needs >= 2")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    name: str
    model: ModelConfig | None = None        # random init from this config when hf_path is None
    hf_path: str | None = None              # a HF Qwen3 checkpoint directory to start from
    dtype: str = "float32"                  # compute dtype when loading hf_path
    remat: str = "none"                     # jax.checkpoint policy of the hf_path model
                                            # (a `model` config carries its own)
    tokenizer: str = "tiny"                 # "tiny" (the test tokenizer) or a HF tokenizer dir
    mesh: MeshConfig = MeshConfig()
    grpo: GRPOConfig = GRPOConfig()
    optim: OptimizerConfig = OptimizerConfig()
    sft_optim: OptimizerConfig | None = None  # warm-start optimizer (defaults to optim)
    rollout: RolloutConfig = RolloutConfig()
    env: EnvConfig = RoutingConfig()        # any config registry.ENVS builds
    sft_steps: int = 0                      # supervised warm-start steps before RL
    sft_batch: int = 64
    # JSONL files of trajectories for the warm start (orchestrax/data/sft.py says the format);
    # () uses the environment's demonstrations. sft_workers: grain prefetch processes.
    sft_data: tuple[str, ...] = ()
    sft_workers: int = 0
    steps: int = 100                        # RL steps
    seed: int = 0
    out_dir: str = "runs/default"           # checkpoints, metrics.jsonl, exported HF dirs
    checkpoint_every: int = 10
    eval_every: int = 10
    eval_samples: int = 1                   # episodes per eval task
    eval_temperature: float = 0.0           # 0: greedy
    eval_tasks: int | None = None           # at most this many, spread over the eval split
    resume: bool = True
    # Start from another run's newest checkpoint (e.g. a warm-start run) instead of `model` or
    # `hf_path` weights; its params are taken, its optimizer state is not. Ignored on resume.
    init_from: str | None = None
    # "direct" episodes, or the orchestrator + sub-agents trained with Flow-GRPO (train/flow.py)
    agent: AgentConfig = AgentConfig()
    # The orchestrator's tools for env kinds that take a catalog (basic tools, LLM tools, pricing
    # sheet), built by the registry for training and `orchestrax eval --config` alike; None: none.
    tools: CatalogConfig | None = None
    # Per training instance: a tool subset and training sheet (instances.randomize) and P with
    # its instruction from Pairs_train for tasks that have none.
    instances: InstanceConfig = InstanceConfig()
    # Weights & Biases next to TensorBoard (off by default; offline when on): train/metrics_log.py
    wandb: WandbConfig = WandbConfig()
    # JAX's persistent compilation cache (train/compile_cache.py); None: off
    compile_cache_dir: str | None = compile_cache.DEFAULT_DIR

    def __post_init__(self):
        if type(self.env) not in registry.ENVS:
            raise ValueError(f"TrainConfig.env={self.env!r}; allowed: a config of "
                             f"{sorted(c.__name__ for c in registry.ENVS)}")
        check_fields(self)  # types first: the range checks below assume them
        if self.tools is not None and not self.env.takes_catalog:
            raise ValueError(f"TrainConfig.tools is set but env {type(self.env).__name__} brings "
                             "its own tools; tools are for "
                             f"{sorted(c.__name__ for c in registry.ENVS if c.takes_catalog)}")
        if self.tools is not None:
            from orchestrax.tools.sheets import load_sheet
            if load_sheet(self.tools.sheet).split != "train":
                raise ValueError(f"TrainConfig.tools.sheet={self.tools.sheet!r} is a held-out "
                                 "evaluation sheet; train on a training sheet")
        if (self.model is None) == (self.hf_path is None):
            raise ValueError("TrainConfig: set exactly one of model (random init) or hf_path "
                             f"(model={'set' if self.model else None}, hf_path={self.hf_path!r})")
        if self.grpo.temperature != self.rollout.temperature:
            raise ValueError(f"TrainConfig: grpo.temperature={self.grpo.temperature} differs from "
                             f"rollout.temperature={self.rollout.temperature}; the trainer must "
                             "score tokens at the temperature the sampler drew them at")
        at_least(self, 0, "sft_steps", "steps", "checkpoint_every", "eval_every", "sft_workers")
        compile_cache.check_dir(self)
        at_least(self, 1, "sft_batch", "eval_samples")
        if self.eval_tasks is not None and self.eval_tasks < 1:
            raise ValueError(f"TrainConfig.eval_tasks={self.eval_tasks}; must be >= 1 or None "
                             "(the whole eval split)")
        if self.eval_temperature < 0:
            raise ValueError(f"TrainConfig.eval_temperature={self.eval_temperature}; must be >= 0 "
                             "(0 is greedy)")
        one_of(self, "dtype", self.dtype, DTYPES)
        one_of(self, "remat", self.remat, REMAT_POLICIES)
        if self.remat != "none" and self.model is not None:
            raise ValueError(f"TrainConfig.remat={self.remat!r} is for hf_path runs; with a "
                             f"model config set model.remat (now {self.model.remat!r})")
        trains = self.steps > 0 or self.sft_steps > 0
        if trains and self.model is not None and self.model.param_dtype != "float32":
            raise ValueError(
                f"model.param_dtype={self.model.param_dtype!r}; training needs float32 master "
                "weights: an AdamW step at lr 1e-6 on a weight of ~0.02 is below bfloat16's "
                "rounding step there, so the weights would not move. Keep param_dtype='float32' "
                "and set model.dtype='bfloat16' for bf16 compute")
        if self.steps > 0 and (self.rollout.top_p != 1.0 or self.rollout.top_k > 0):
            field, value = (("top_p", self.rollout.top_p) if self.rollout.top_p != 1.0
                            else ("top_k", self.rollout.top_k))
            raise ValueError(
                f"rollout.{field}={value}; training rollouts must sample the full softmax "
                "(top_p=1.0, top_k=-1): the trainer scores tokens under the untruncated "
                "distribution, so truncated sampling biases every ratio")
        k = self.grpo.group_tasks
        if self.rollout.tasks_per_step % k:
            raise ValueError(f"rollout.tasks_per_step={self.rollout.tasks_per_step} is not a "
                             f"multiple of grpo.group_tasks={k} (tasks per group); allowed: "
                             f"{k}, {2 * k}, {3 * k}, ...")
        if self.agent.mode != "direct" and self.rollout.workers:
            raise ValueError(f"rollout.workers={self.rollout.workers} with agent.mode="
                             f"{self.agent.mode!r}; its rollouts run on the trainer's event loop "
                             "(workers=0)")

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


def check_paths(cfg: TrainConfig) -> None:
    """The local inputs a run reads exist (checked before any compute; there is no model hub at
    run time, so a missing directory would otherwise surface as a hub lookup error)."""
    cfg.wandb.check_installed()
    tok = pathlib.Path(cfg.tokenizer)
    if cfg.tokenizer != "tiny" and not any((tok / f).is_file() for f in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"TrainConfig.tokenizer={cfg.tokenizer!r}: not a tokenizer directory (no "
            "tokenizer.json or tokenizer_config.json there); give 'tiny' or a local HF "
            "tokenizer directory")
    missing = [p for p in cfg.sft_data if not pathlib.Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"TrainConfig.sft_data: {missing} do not exist; give JSONL files "
                                "of trajectories")
    if cfg.hf_path is not None and not (pathlib.Path(cfg.hf_path) / "config.json").is_file():
        raise FileNotFoundError(f"TrainConfig.hf_path={cfg.hf_path!r}: no config.json there; "
                                "give a local Hugging Face checkpoint directory")
    if cfg.init_from is not None and not (pathlib.Path(cfg.init_from) / "checkpoints").is_dir():
        hint = (" (it is a Hugging Face checkpoint: start from it with hf_path instead, "
                "model unset)"
                if (pathlib.Path(cfg.init_from) / "config.json").is_file() else "")
        raise FileNotFoundError(f"TrainConfig.init_from={cfg.init_from!r}: no checkpoints/ there; "
                                f"give the out_dir of an earlier orchestrax train run{hint}")


def check_out_dir(cfg: TrainConfig) -> epath.Path:
    """`out_dir` as the path checkpoints go to (`run_info.out_path`); its local directory
    (`run_info.local_dir`: `out_dir` itself unless it is a URI) created and proved writable,
    in one line naming the field when it is not. A URI is not contacted here: Orbax reports
    an unwritable bucket at the first save."""
    out = run_info.local_dir(cfg.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a probe of its own per process: the trainer processes of one run share out_dir, and
        # one's unlink of a common name raced another's
        fd, probe = tempfile.mkstemp(prefix=".orchestrax_write_probe.", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"TrainConfig.out_dir={cfg.out_dir!r} is not a writable directory "
                         f"({e.strerror or e}); give a directory this process can write") from None
    return run_info.out_path(cfg.out_dir)


def check_vocab(cfg: TrainConfig, tokenizer: Any) -> None:
    """The model's embedding covers every id the tokenizer emits (a smaller vocabulary indexes
    past the embedding table: NaN or garbage, no error). Before any weights are loaded."""
    n = len(tokenizer)
    if cfg.hf_path is not None:
        hf = json.loads((pathlib.Path(cfg.hf_path) / "config.json").read_text())
        vocab = hf.get("vocab_size", hf.get("text_config", {}).get("vocab_size"))
        source = f"hf_path={cfg.hf_path!r} (config.json)"
    else:
        vocab, source = cfg.model.vocab_size, "model.vocab_size"
    if isinstance(vocab, int) and vocab < n:
        raise ValueError(f"{source} gives vocab_size={vocab}, smaller than the {n} tokens of "
                         f"tokenizer={cfg.tokenizer!r}; must be >= {n}")


def check_context(cfg: TrainConfig, env: Any, codec: Any, train_tasks: Any,
                  eval_tasks: Any = ()) -> None:
    """`rollout.context_tokens` holds the longest prompt the run can build and leaves room to
    generate (else that episode ends before its first turn): every train task with the largest
    tool set and the longest preference instruction an instance can be given, and every eval
    instance (`eval_tasks`, prepared: the whole catalog, its own instruction). One line naming
    the field and the sizes when it does not."""
    measured = [("train", longest_prompt(cfg, env, codec, train_tasks, "train")),
                ("eval", longest_prompt(cfg, env, codec, eval_tasks, "eval"))]
    split, (tokens, task_id) = max(measured, key=lambda m: m[1][0])
    if tokens >= cfg.rollout.context_tokens:
        sizes = ", ".join(f"{s} {n}" for s, (n, _) in measured if n)
        raise ValueError(f"rollout.context_tokens={cfg.rollout.context_tokens} cannot hold the "
                         f"prompt of {split} task {task_id!r}, {tokens} tokens before any reply; "
                         f"must be > {tokens} (longest prompts: {sizes})")


def longest_prompt(cfg: TrainConfig, env: Any, codec: Any, tasks: Any, pool: str
                   ) -> tuple[int, str]:
    """(tokens, task id) of the longest prompt of `tasks` (0 and "" for none). `pool` "train":
    raw tasks, measured as their longest instance (`largest_offer`, and the longest instruction
    of Pairs_train naming any of their tools); "eval": prepared instances, measured as they are
    (their tools and instruction; the longest of Pairs_eval where they have none)."""
    from orchestrax.data import preferences
    longest: dict[tuple[str, ...], str] = {}
    best = (0, "")
    for task in tasks:
        tools = env.tools(task)
        specs = ([t.spec for t in tools] if pool == "eval"
                 else largest_offer(tools, env.catalog, cfg.instances.randomize, codec))
        if cfg.instances.preferences and task.preference is None:
            nameable = tuple(t.spec.name for t in tools if t.spec.category != "domain")
            if nameable not in longest:
                longest[nameable] = max(preferences.instructions(pool, nameable),
                                        key=lambda text: len(codec.encode(text)))
            task = dataclasses.replace(task, preference_instruction=longest[nameable])
        tokens = len(codec.encode_prompt(chat.prompt_parts(
            prompt_messages(task), tools=specs, enable_thinking=cfg.rollout.enable_thinking)))
        best = max(best, (tokens, task.task_id))
    return best


def largest_offer(tools: Any, catalog: Any, randomize: Any, codec: Any) -> list[Any]:
    """The specs of the longest tool list a training instance can show: the env's own tools,
    then at most `randomize.max_tools` of the catalog's (its `always` ones and the longest
    schemas of the rest); every tool where instances are not randomised or not capped."""
    specs = [t.spec for t in tools]
    if randomize is None or randomize.max_tools is None:
        return specs
    drawn = [s for s in specs if s.name in catalog and s.name not in randomize.always]
    room = randomize.max_tools - sum(s.name in catalog for s in specs) + len(drawn)
    if room >= len(drawn):
        return specs
    size = {s.name: len(codec.encode(json.dumps(s.to_openai()))) for s in drawn}
    kept = {s.name for s in sorted(drawn, key=lambda s: -size[s.name])[:room]}
    return [s for s in specs if s.name not in size or s.name in kept]


def check_env_fits(cfg: TrainConfig, num_train: int, num_eval: int, processes: int = 1) -> None:
    """The environment has enough tasks for one step (no task twice in a step), and for an eval
    on each of `processes` (each evaluates its share; an empty share would log NaN accuracy)."""
    if cfg.steps > 0 and cfg.rollout.tasks_per_step > num_train:
        raise ValueError(f"rollout.tasks_per_step={cfg.rollout.tasks_per_step}; the "
                         f"{type(cfg.env).__name__} env has {num_train} train tasks, and a "
                         f"step takes each task at most once: allowed 1..{num_train}")
    # steps=0 still evaluates once (the warm start's final eval).
    if cfg.eval_every and num_eval < processes:
        has = "no eval tasks" if num_eval == 0 else f"{num_eval} eval task(s)"
        raise ValueError(f"TrainConfig.eval_every={cfg.eval_every} but the "
                         f"{type(cfg.env).__name__} env has {has}"
                         + (f" for {processes} processes (each evaluates its share)"
                            if processes > 1 else "")
                         + "; set eval_every=0 or give the env more eval tasks")


def check_batch_split(cfg: TrainConfig, data_parallel: int) -> None:
    """The warm start's rows split evenly over the devices the batch is sharded across (else
    the first SFT step fails to place its batch, minutes into the run)."""
    if cfg.sft_steps > 0 and cfg.sft_batch % data_parallel:
        lo = data_parallel * max(1, cfg.sft_batch // data_parallel)
        raise ValueError(f"sft_batch={cfg.sft_batch} does not split over the {data_parallel} "
                         f"devices of the mesh's batch axes; must be a multiple of "
                         f"{data_parallel} (e.g. {lo} or {lo + data_parallel})")


def check_master_weights(cfg: TrainConfig, params: Any) -> None:
    """Refuse to train non-float32 parameters (see TrainConfig's model.param_dtype check); this
    catches weights loaded from hf_path, whose dtype the config alone does not show."""
    if cfg.steps == 0 and cfg.sft_steps == 0:
        return
    dtypes = sorted({str(leaf.dtype) for leaf in jax.tree.leaves(params)} - {"float32"})
    if dtypes:
        source = (f"hf_path={cfg.hf_path!r} with dtype={cfg.dtype!r}" if cfg.hf_path
                  else f"model.param_dtype={cfg.model.param_dtype!r}")
        raise ValueError(f"{source} gives {'/'.join(dtypes)} parameters; training needs float32 "
                         "master weights (an AdamW step at lr 1e-6 is below bfloat16's rounding "
                         "step); bfloat16 is a compute and weight-sync dtype only")
