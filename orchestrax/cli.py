"""The `orchestrax` console script: parse a sub-command and dispatch; nothing else lives here."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from orchestrax.train.arg_types import at_least, tokenizer_dir


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="SGLang-compatible HTTP server backed by the embedded sampler")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF safetensors directory (Qwen3 / Llama), or a training "
                                      "run directory (its newest whole checkpoint)")
    src.add_argument("--tiny", action="store_true",
                     help="random tiny Qwen3 + tiny Qwen3-style tokenizer (tests, CPU demo)")
    p.add_argument("--tokenizer", type=tokenizer_dir, help="tokenizer directory (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=at_least(0), default=30000)
    p.add_argument("--max-batch", type=at_least(1), default=64)
    p.add_argument("--max-len", type=at_least(2), default=4096,
                   help="tokens per sequence, prompt and output together")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--param-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="weights are cast to this once at load (auto: bfloat16 on GPU/TPU, "
                        "float32 on CPU)")
    p.add_argument("--engine", default="continuous", choices=("static", "continuous"),
                   help="batcher: static batches, or continuous batching (requests join and "
                        "leave between decode steps)")
    p.add_argument("--seed", type=int, default=0, help="--tiny init seed and sampler seed")
    p.add_argument("--weight-version", default="default")
    p.add_argument("--served-model-name", default="orchestrax")
    p.add_argument("--api-key", default=os.environ.get("ORCHESTRAX_SERVE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route but /health "
                        "(default: $ORCHESTRAX_SERVE_API_KEY; unset means no check)")
    p.add_argument("--weight-root", action="append", default=[], metavar="DIR",
                   help="update_weights_from_disk loads only below DIR (repeatable; none: "
                        "weight updates are refused)")
    # Client limits; unset ones keep the defaults of orchestrax.rollout.validate.ServeLimits.
    p.add_argument("--max-n", type=int, help="copies of one prompt per request (64)")
    p.add_argument("--max-requests", type=int, help="prompts x n per call (1024)")
    p.add_argument("--max-body-bytes", type=int, help="request body size (32 MiB)")
    p.add_argument("--max-text-chars", type=int,
                   help="text of one request, checked before tokenising (1 Mi characters)")
    p.add_argument("--read-timeout", type=float,
                   help="seconds to receive a request body, and to keep an idle connection (60)")


def _train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="GRPO (and optional SFT warm start) from a Python config")
    p.add_argument("--config", required=True, help="configs/x.py or configs/x.py:function")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. rollout.group_size=4 (repeatable)")


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.eval.main import add_arguments
    add_arguments(sub.add_parser("eval", help="measure a policy on task sets (accuracy, cost, "
                                              "latency, calls per tool, preference adherence)"))


def _synth_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.synth.main import add_arguments
    add_arguments(sub.add_parser("synth", help="ToolScale pipeline: verified tasks (and domains) "
                                               "from an OpenAI-compatible generator"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrax")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _train_parser(sub)
    _eval_parser(sub)
    _synth_parser(sub)
    for p in sub.choices.values():
        p.add_argument("--debug", action="store_true",
                       help="show the traceback of a user error (bad config, path, flag)")
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a user can fix from the message alone: bad values, missing or busy files and ports.
    Anything else is a bug and keeps its traceback."""
    from orchestrax.train.run_info import OutDirLocked
    return ValueError, OSError, OutDirLocked


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except _user_errors() as e:
        if args.debug:
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"orchestrax {args.command}: error: {msg} (--debug shows the traceback)",
              file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "serve":
        from orchestrax.train.serve import serve
        return serve(args)
    if args.command == "train":
        from orchestrax.train.main import run
        return run(args.config, args.set)
    if args.command == "synth":
        from orchestrax.synth.main import run as run_synth
        return run_synth(args)
    from orchestrax.eval.main import run as run_eval
    return run_eval(args)


if __name__ == "__main__":
    sys.exit(main())
