"""The `orchestrax` console script: parse a sub-command and dispatch; nothing else lives here."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from orchestrax.train.arg_types import at_least, tokenizer_dir
from orchestrax.train.compile_cache import FLAG_HELP
from orchestrax.train.overrides import add_arguments as add_config_arguments


class _Fields(argparse.Action):
    """One flag that sets several config fields to its value."""

    def __call__(self, parser, namespace, values, option_string=None):
        for field in self.const:
            setattr(namespace, field, values)


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    # Flags are shorthands of ServeConfig fields (dest = the field); one not given is absent.
    p = sub.add_parser("serve", argument_default=argparse.SUPPRESS,
                       help="SGLang-compatible HTTP server backed by the embedded sampler")
    add_config_arguments(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="HF safetensors directory (Qwen3 / Llama), or a training "
                                     "run directory (its newest whole checkpoint)")
    src.add_argument("--tiny", dest="model", action="store_const", const="tiny",
                     help="random tiny Qwen3 + tiny Qwen3-style tokenizer (tests, CPU demo)")
    p.add_argument("--tokenizer", type=tokenizer_dir, help="tokenizer directory (default: --model)")
    p.add_argument("--host", help="127.0.0.1")
    p.add_argument("--port", type=at_least(0), help="30000")
    p.add_argument("--max-batch", type=at_least(1), help="64")
    p.add_argument("--max-len", type=at_least(2),
                   help="tokens per sequence, prompt and output together (4096)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype (float32)")
    p.add_argument("--param-dtype", choices=("auto", "float32", "bfloat16"),
                   help="weights are cast to this once at load (auto, the default: bfloat16 on "
                        "GPU/TPU, float32 on CPU)")
    p.add_argument("--dispatch-reads", type=at_least(1),
                   help="continuous engine: cache positions one decode dispatch reads per row "
                        "(steps x span; 2048): fewer decode steps a dispatch at long spans, so "
                        "a new request waits less for the rows in flight")
    p.add_argument("--seed", type=int, help="--tiny init seed and sampler seed (0)")
    p.add_argument("--compile-cache-dir", help=FLAG_HELP)
    p.add_argument("--warm", action="store_true",
                   help="compile every program the engine can dispatch before listening, and "
                        "log how many and how long (off: each when a request first needs it)")
    p.add_argument("--weight-version", help="default")
    p.add_argument("--served-model-name", help="orchestrax")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every route but "
                                     "/health (default: $ORCHESTRAX_SERVE_API_KEY; unset means "
                                     "no check)")
    p.add_argument("--weight-root", action="append", metavar="DIR",
                   help="update_weights_from_disk loads only below DIR (repeatable; none: "
                        "weight updates are refused)")
    # Client limits (ServeConfig.limits, an orchestrax.rollout.validate.ServeLimits).
    p.add_argument("--max-n", dest="limits.max_n", type=int,
                   help="copies of one prompt per request (64)")
    p.add_argument("--max-requests", dest="limits.max_requests", type=int,
                   help="prompts x n per call (1024)")
    p.add_argument("--max-body-bytes", dest="limits.max_body_bytes", type=int,
                   help="request body size (32 MiB)")
    p.add_argument("--max-text-chars", dest="limits.max_text_chars", type=int,
                   help="text of one request, checked before tokenising (1 Mi characters)")
    p.add_argument("--read-timeout", type=float, action=_Fields,
                   const=("limits.read_timeout_s", "limits.idle_timeout_s"),
                   help="seconds to receive a request body, and to keep an idle connection (60)")


def _train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="GRPO (and optional SFT warm start) from a Python config")
    add_config_arguments(p, required=True)


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.eval.eval_command import add_arguments
    add_arguments(sub.add_parser("eval", argument_default=argparse.SUPPRESS,
                                 help="measure a policy on task sets (accuracy, cost, latency, "
                                      "calls per tool, preference adherence)"))


def _dialect_parser(sub: argparse._SubParsersAction, name: str, help: str,
                    add_arguments: Any) -> None:
    """A command in the one config dialect: --config, --set, then its field shorthands."""
    p = sub.add_parser(name, argument_default=argparse.SUPPRESS, help=help)
    add_config_arguments(p)
    add_arguments(p)


def _synth_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.synth.synth_command import add_arguments
    _dialect_parser(sub, "synth", "ToolScale pipeline: verified tasks (and domains) from an "
                    "OpenAI-compatible generator", add_arguments)


def _export_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.train.export import add_arguments
    _dialect_parser(sub, "export", "a training run's checkpoint as a Hugging Face directory",
                    add_arguments)


def _index_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.tools.index_command import add_arguments
    _dialect_parser(sub, "index", "build (or find cached) the local-search index over a corpus",
                    add_arguments)


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.train.demo import add_arguments
    _dialect_parser(sub, "demo", "the CPU demo: warm start, then GRPO of one policy that routes "
                    "by each task's preference; `orchestrax eval` of both (`make demo`)",
                    add_arguments)


def _rehearse_parser(sub: argparse._SubParsersAction) -> None:
    from orchestrax.rehearsal.rehearse import add_arguments
    add_arguments(sub.add_parser("rehearse", help="the whole recipe in miniature on this "
                                 "machine: servers, 2 JAX trainer processes, export, eval"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrax")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _train_parser(sub)
    _eval_parser(sub)
    _synth_parser(sub)
    _export_parser(sub)
    _index_parser(sub)
    _demo_parser(sub)
    _rehearse_parser(sub)
    for p in sub.choices.values():
        p.add_argument("--debug", action="store_true", default=False,
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


def command_config(args: argparse.Namespace) -> Any:
    """The config a parsed `serve`, `eval`, `synth`, `export`, `index` or `demo` command line
    says: --config's function (the demo's: its file's two functions; else the command's
    defaults), then --set and the shorthand flags given."""
    from orchestrax.train import overrides, serve
    if args.command == "export":
        from orchestrax.train import export
        return overrides.from_args(args, export.ExportCommand, export.config)
    if args.command == "index":
        from orchestrax.tools import index_command
        return overrides.from_args(args, index_command.IndexCommand, index_command.config)
    if args.command == "demo":
        from orchestrax.train import demo
        return overrides.from_args(args, demo.DemoCommand, demo.config, load=demo.config)
    if args.command == "synth":
        from orchestrax.synth import synth_command as synth_main
        return overrides.from_args(args, synth_main.SynthCommand, synth_main.config)
    if args.command == "eval":
        from orchestrax.eval import eval_command as eval_main
        return overrides.from_args(args, eval_main.EvalCommand, eval_main.config)
    if args.command == "serve":
        if not (args.config or "model" in vars(args)
                or any(s.startswith("model=") for s in args.set)):
            raise ValueError("orchestrax serve needs --model DIR or --tiny (or a --config "
                             "function naming its model)")
        return overrides.from_args(args, serve.ServeConfig, serve.config)
    raise ValueError(f"orchestrax {args.command} has no command config")


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "serve":
        from orchestrax.train import serve
        return serve.serve(command_config(args))
    if args.command == "train":
        from orchestrax.train.train_command import run
        return run(args.config, args.set)
    if args.command == "rehearse":
        from orchestrax.rehearsal.rehearse import run as run_rehearsal
        return run_rehearsal(args)
    if args.command == "synth":
        from orchestrax.synth.synth_command import run as run_synth
        return run_synth(command_config(args))
    if args.command == "export":
        from orchestrax.train.export import run as run_export
        return run_export(command_config(args))
    if args.command == "index":
        from orchestrax.tools.index_command import run as run_index
        return run_index(command_config(args))
    if args.command == "demo":
        from orchestrax.train.demo import run as run_demo
        return run_demo(command_config(args))
    from orchestrax.eval.eval_command import run as run_eval
    return run_eval(command_config(args))


if __name__ == "__main__":
    sys.exit(main())
