"""`orchestrax serve`: build the sampler, tokenizer and server state from parsed CLI arguments and
run the server. An entry point, so it lives with the others in train/ (it needs agent/ for the
`--tiny` tokenizer, which rollout/ must not import)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import jax

from orchestrax import models
from orchestrax.rollout.embedded import make_embedded_sampler
from orchestrax.rollout.server import ServerState, bound_port, start
from orchestrax.rollout.validate import ServeLimits

log = logging.getLogger("orchestrax.serve")


def limits(args: argparse.Namespace) -> ServeLimits:
    given = {"max_n": args.max_n, "max_requests": args.max_requests,
             "max_body_bytes": args.max_body_bytes, "max_text_chars": args.max_text_chars,
             "read_timeout_s": args.read_timeout, "idle_timeout_s": args.read_timeout}
    return ServeLimits(**{k: v for k, v in given.items() if v is not None})


def param_dtype(name: str, backend: str | None = None) -> str:
    """`--param-dtype`: "auto" is bfloat16 on an accelerator (a server does not train, so fp32
    master weights would only double its weight memory and the bytes read per decode step) and
    float32 on CPU (bf16 matmuls are slow there)."""
    if name != "auto":
        return name
    return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"


def build_state(args: argparse.Namespace) -> ServerState:
    pdt = param_dtype(args.param_dtype)
    if args.tiny:
        from orchestrax.agent.scripted import tiny_qwen3_tokenizer
        tokenizer, template = tiny_qwen3_tokenizer(), None  # it carries its own chat template
        cfg = models.tiny_config(vocab_size=len(tokenizer), dtype=args.dtype)
        params = models.init_params(cfg, seed=args.seed)
        # fp32 init then one cast, as load_hf casts a checkpoint's tensors once.
        cfg, params = cfg.replace(param_dtype=pdt), jax.tree.map(lambda x: x.astype(pdt), params)
        model_path, tok_path = "tiny", None
    else:
        from transformers import AutoTokenizer
        cfg, params = models.load_hf(args.model, dtype=args.dtype, param_dtype=pdt)
        tok_path = args.tokenizer or args.model
        tokenizer = AutoTokenizer.from_pretrained(tok_path)
        model_path, template = args.model, None
    sampler = make_embedded_sampler(args.engine, cfg, params, max_batch=args.max_batch,
                                    max_len=args.max_len, weight_version=args.weight_version,
                                    seed=args.seed)
    # Weight updates load in the served dtype: the server refuses a tree whose dtypes differ.
    return ServerState(sampler=sampler, model_path=model_path, tokenizer=tokenizer,
                       tokenizer_path=tok_path, chat_template=template,
                       served_model_name=args.served_model_name, limits=limits(args),
                       api_key=args.api_key or None, weight_roots=tuple(args.weight_root),
                       load_weights=lambda path: models.load_hf(path, dtype=args.dtype,
                                                                param_dtype=pdt))


async def _run(args: argparse.Namespace) -> None:
    runner = await start(build_state(args), host=args.host, port=args.port)
    # The line tests and launch scripts wait for; flush so a pipe sees it at once.
    print(f"orchestrax serve: listening on http://{args.host}:{bound_port(runner)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_run(args))
    return 0
