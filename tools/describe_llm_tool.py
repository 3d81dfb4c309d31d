"""Write an LLM tool's capability description the way ToolOrchestra does: sample 10 tasks, run the
tool model on them, and ask a describer model to describe the tool from the attempts and outcomes.

  python tools/describe_llm_tool.py --tasks ../shared/data/qa/aime_2024_2025.jsonl \
      --tool-url http://127.0.0.1:30001 --tool-model Qwen/Qwen2.5-Math-72B --role math \
      --describer-url https://api.openai.com --describer-model gpt-5 \
      --describer-key-env OPENAI_API_KEY --name math_72b --out specs/math_72b.json

Writes {"spec": the tool's spec in the JSON form of orchestrax/tools/specs.py with the new
description, "attempts": [...]} so the description can be audited; feed spec["description"] to
LLMToolConfig(description=...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib

from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.describe import attempts_to_json, describe_tool, load_tasks
from orchestrax.tools.llm_tool import ROLES, LLMTool, LLMToolConfig
from orchestrax.tools.sheets import load_sheet
from orchestrax.tools.specs import spec_to_json


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", required=True, help="QA JSONL with problem|question and answer")
    ap.add_argument("--name", required=True, help="the tool's name in the catalog")
    ap.add_argument("--role", choices=sorted(ROLES), default="generalist")
    ap.add_argument("--tool-url", required=True)
    ap.add_argument("--tool-model", required=True)
    ap.add_argument("--tool-key-env", default=None)
    ap.add_argument("--price-model", default=None, help="pricing-sheet key (default: --tool-model)")
    ap.add_argument("--sheet", default="train_list")
    ap.add_argument("--describer-url", required=True)
    ap.add_argument("--describer-model", required=True)
    ap.add_argument("--describer-key-env", default=None)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--temperature", type=float, default=0.0, help="both models")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    config = LLMToolConfig(
        name=args.name, role=args.role, price_model=args.price_model,
        chat=ChatEndpoint(base_url=args.tool_url, model=args.tool_model, api_key_env=args.tool_key_env,
                        max_tokens=args.max_tokens, temperature=args.temperature,
                        seed=args.seed))
    tool = LLMTool(config, load_sheet(args.sheet).model_pricing(config.pricing_key))
    describer = ChatEndpoint(base_url=args.describer_url, model=args.describer_model,
                           api_key_env=args.describer_key_env, max_tokens=512,
                           temperature=args.temperature, seed=args.seed)
    description, attempts = asyncio.run(
        describe_tool(tool, describer, load_tasks(args.tasks), n=args.n, seed=args.seed))
    out = {"spec": {**spec_to_json(tool.spec), "description": description},
           "attempts": attempts_to_json(attempts)}
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"{args.name}: {sum(a.correct for a in attempts)}/{len(attempts)} correct\n{description}")
    return out


if __name__ == "__main__":
    main()
