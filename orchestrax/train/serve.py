"""`orchestrax serve`: build the sampler, tokenizer and server state from a `ServeConfig` and run
the server. An entry point, so it lives with the others in train/ (it builds through the
registry, which rollout/ must not import). Configured like every command: `--config` (a function
returning a ServeConfig), `--set field=value`, and flags that are shorthands of its fields."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import re
import signal
from typing import Any

import jax

from orchestrax import models, registry
from orchestrax.checks import at_least, at_least_or_none, one_of
from orchestrax.rollout.embedded import sampler_layout
from orchestrax.rollout.sampler import SamplerConfig
from orchestrax.rollout.server import ServerState, bound_port, start
from orchestrax.rollout.validate import ServeLimits
from orchestrax.train import checkpoint, compile_cache, setup

log = logging.getLogger("orchestrax.serve")


PARAM_DTYPES = ("auto", "float32", "bfloat16")
API_KEY_ENV = "ORCHESTRAX_SERVE_API_KEY"
TINY = "tiny"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """What `orchestrax serve` serves and how; each field has a flag of the same name."""
    model: str = TINY                 # HF directory, a training run dir (newest checkpoint),
                                      # or TINY: random tiny Qwen3 + tiny tokenizer (tests, demo)
    tokenizer: str | None = None      # default: the model's
    host: str = "127.0.0.1"
    port: int = 30000
    max_batch: int = 64
    max_len: int = 4096               # tokens per sequence, prompt and output together
    dtype: str = "float32"            # compute dtype
    param_dtype: str = "auto"         # see `param_dtype`
    # continuous engine: cache positions one decode dispatch reads per row (steps x span), so a
    # request that arrives while long rows decode waits for one short dispatch; None: 8 steps
    # a dispatch at every span
    dispatch_reads: int | None = 2048
    seed: int = 0                     # --tiny init seed and sampler seed
    weight_version: str = "default"
    served_model_name: str = "orchestrax"
    api_key: str | None = None        # None: $ORCHESTRAX_SERVE_API_KEY, if set
    weight_root: tuple[str, ...] = ()  # update_weights_from_disk loads only below these
    limits: ServeLimits = dataclasses.field(default_factory=ServeLimits)
    compile_cache_dir: str | None = compile_cache.DEFAULT_DIR  # None: no persistent cache
    # Compile every program the engine can dispatch before listening (off: each is compiled
    # when a request first needs it; the whole set is O(100) programs, minutes each for an 8B
    # model on a GPU with an empty cache, seconds from a populated one).
    warm: bool = False

    def __post_init__(self):
        if not self.model:
            raise ValueError("ServeConfig.model=''; give a directory or 'tiny'")
        for name, allowed in (("dtype", ("float32", "bfloat16")), ("param_dtype", PARAM_DTYPES)):
            one_of(self, name, getattr(self, name), allowed)
        at_least(self, 1, "max_batch")
        at_least(self, 2, "max_len")
        at_least_or_none(self, 1, "dispatch_reads")
        at_least(self, 0, "port")
        compile_cache.check_dir(self)
        if not isinstance(self.warm, bool):
            raise ValueError(f"ServeConfig.warm={self.warm!r}; must be True or False")


def config() -> ServeConfig:
    """What `orchestrax serve` starts from without --config (its flags then say what to serve)."""
    return ServeConfig()


def param_dtype(name: str, backend: str | None = None) -> str:
    """`--param-dtype`: "auto" is bfloat16 on an accelerator (a server does not train, so fp32
    master weights would only double its weight memory and the bytes read per decode step) and
    float32 on CPU (bf16 matmuls are slow there)."""
    if name != "auto":
        return name
    return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"


def start_error(args: ServeConfig) -> str | None:
    """Why this config cannot start a server (one line naming the flag), or None."""
    if args.api_key is not None and not args.api_key.strip():
        return (f"--api-key (or ${API_KEY_ENV}) is empty: that would turn the bearer check off; "
                "give a key, or unset it to serve without one")
    for root in args.weight_root:
        if not os.path.isdir(root):
            return f"--weight-root {root!r} is not a directory"
    host = args.host
    if re.fullmatch(r"[0-9.]+", host) or ":" in host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"--host {host!r} is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1)"
    elif not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", host):
        return f"--host {host!r} is not a host name or IP address"
    if args.port > 65535:
        return f"--port {args.port}; must be in [0, 65535]"
    return None


def build_state(args: ServeConfig) -> ServerState:
    pdt = param_dtype(args.param_dtype)
    if args.model == TINY:
        tokenizer, template = registry.build_tokenizer("tiny"), None  # carries its own template
        cfg = models.tiny_config(vocab_size=len(tokenizer), dtype=args.dtype)
        params = models.init_params(cfg, seed=args.seed)
        # fp32 init then one cast, as load_hf casts a checkpoint's tensors once.
        cfg, params = cfg.replace(param_dtype=pdt), jax.tree.map(lambda x: x.astype(pdt), params)
        model_path, tok_path = "tiny", None
    else:  # an HF directory, or a run directory's newest whole checkpoint (trainer's reader)
        model = checkpoint.load_model(args.model, dtype=args.dtype, param_dtype=pdt,
                                      field="--model")
        cfg, params = model.cfg, model.params
        tok_path = args.tokenizer or str(model.tokenizer_dir)
        tokenizer = registry.build_tokenizer(tok_path)
        model_path, template = args.model, None
    params = sampler_layout(params)
    sampler = registry.build_sampler(SamplerConfig(
        backend="embedded", max_batch=args.max_batch, max_len=args.max_len,
        weight_version=args.weight_version, seed=args.seed,
        dispatch_reads=args.dispatch_reads), cfg, params)
    # Weight updates load in the served dtype: the server refuses a tree whose dtypes differ.
    return ServerState(sampler=sampler, model_path=model_path, tokenizer=tokenizer,
                       tokenizer_path=tok_path, chat_template=template,
                       served_model_name=args.served_model_name, limits=args.limits,
                       api_key=args.api_key, weight_roots=tuple(args.weight_root),
                       load_weights=lambda path: _loaded(path, args.dtype, pdt))


def _loaded(path: str, dtype: str, pdt: str) -> tuple[models.ModelConfig, Any]:
    cfg, params = models.load_hf(path, dtype=dtype, param_dtype=pdt)
    return cfg, sampler_layout(params)


async def _run(args: ServeConfig) -> None:
    state = build_state(args)
    if args.warm:
        state.sampler.warm()
    try:
        runner = await start(state, host=args.host, port=args.port)
    except OSError as e:  # address in use, not an address of this host, unresolvable name
        raise SystemExit(f"orchestrax serve: cannot listen on {args.host}:{args.port}: "
                         f"{e.strerror or e}") from None
    # The line tests and launch scripts wait for; flush so a pipe sees it at once.
    print(f"orchestrax serve: listening on http://{args.host}:{bound_port(runner)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def check_port_free(host: str, port: int) -> None:
    """Before the model loads (seconds to minutes): a busy port is refused at once."""
    import socket
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise OSError(f"--port {port} on {host} is not free ({e.strerror}); stop what "
                          "listens there or pick another --port") from None


def serve(args: ServeConfig) -> int:
    if args.api_key is None and os.environ.get(API_KEY_ENV) is not None:
        args = dataclasses.replace(args, api_key=os.environ[API_KEY_ENV])
    why = start_error(args)
    if why is not None:
        raise SystemExit(f"orchestrax serve: {why}")
    setup.configure_logging()   # a root handler some import adds made basicConfig a no-op
    check_port_free(args.host, args.port)
    compile_cache.use_compile_cache(args.compile_cache_dir)
    asyncio.run(_run(args))
    return 0
