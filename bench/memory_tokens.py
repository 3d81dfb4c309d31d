"""Prompt tokens per query: Direct (the whole history replayed every turn) vs sub-agent mode's
structured memory (a fresh two-message prompt per orchestrator turn), as the number of steps
grows 1…20 — the measurement behind the paper's Appendix C.2 (its 43% reduction).

Same tasks, same scripted policy: each step searches the real Wikipedia-summaries corpus (BM25,
k=5, 600-character passages) for one article; Direct issues the search itself, sub-agent mode
dispatches it to the Web Searcher, which answers with the top passage's first sentence. With
"thinking", every policy turn carries the same 80-word reasoning trace (Direct keeps it in its
context, token-in/token-out; the memory prompt is rebuilt without it). Tokens: the test
tokenizer (`tiny_qwen3_tokenizer`, a 512-entry byte BPE, so absolute counts run ~3x a real
Qwen3 tokenizer's; the ratios are the comparison).

    python bench/memory_tokens.py [--corpus PATH] [--tasks 4] [--max-steps 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.common import peak_rss_mib, record  # noqa: E402
from orchestrax.agent.codec import Codec  # noqa: E402
from orchestrax.agent.episode import EpisodeConfig, run_episode  # noqa: E402
from orchestrax.agent.scripted import ScriptedSampler, tiny_qwen3_tokenizer  # noqa: E402
from orchestrax.agent.subagent import (OrchestratorConfig, SubAgentConfig,  # noqa: E402
                                       build_subagents, run_query)
from orchestrax.data.records import Task  # noqa: E402
from orchestrax.tools.local_search import LocalSearchTool  # noqa: E402
from orchestrax.tools.search_index import SearchIndexConfig, build_index  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "wiki_summaries_en.json"
THOUGHT = ("<think>\n" + " ".join(["I should check the next fact before answering, step by "
                                   "step, and keep the earlier results in mind."] * 5)
           + "\n</think>\n\n")


def call(name: str, **args) -> str:
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, json.dumps(args))


def make_tasks(titles: list[str], n_tasks: int, steps: int, seed: int
               ) -> list[tuple[Task, list[str]]]:
    rng = random.Random(f"{seed}/{steps}")
    out = []
    for k in range(n_tasks):
        chosen = rng.sample(titles, steps)
        question = "Answer using facts about: " + "; ".join(chosen) + "."
        out.append((Task(task_id=f"steps{steps}/{k}",
                         messages=({"role": "system", "content": "Answer in <answer></answer>."},
                                   {"role": "user", "content": question})), chosen))
    return out


async def direct_prompt_tokens(tok, task: Task, topics: list[str], tool, thinking: bool) -> int:
    think = THOUGHT if thinking else ""
    turns = [think + call("local_search", query=t) for t in topics] + [think + "<answer>x</answer>"]
    traj = await run_episode(ScriptedSampler(tok, turns), tok, task, [tool], config=EpisodeConfig(
        max_turns=len(turns), context_tokens=400_000, enable_thinking=thinking))
    assert traj.end_reason == "answer" and len(traj.tool_calls) == len(topics), traj.end_reason
    return sum(t.tokens_in for t in traj.turns)


async def memory_prompt_tokens(tok, task: Task, topics: list[str], tool, thinking: bool
                               ) -> tuple[int, int]:
    """(orchestrator prompt tokens, prompt tokens over every model call incl. sub-agents)."""
    think = THOUGHT if thinking else ""
    orch = [think + call("web_searcher", task=f"Find the key fact about {t}.") for t in topics]
    orch.append(think + "<answer>x</answer>")

    def searcher(n: int, ids) -> str:
        prompt = tok.decode(list(ids))
        if "<tool_response>" not in prompt:
            topic = prompt.rsplit("Find the key fact about ", 1)[1].split(".<|im_end|>")[0]
            return call("local_search", query=topic)
        top = prompt.split("<tool_response>\n", 1)[1].split("\n", 2)[1]
        return "<answer>" + top.split(". ")[0][:200] + "</answer>"

    codec = Codec(tok)
    agents = build_subagents([tool], ScriptedSampler(tok, script=searcher), codec,
                             SubAgentConfig(context_tokens=100_000, enable_thinking=False))
    rollout = await run_query(task, agents, ScriptedSampler(tok, orch), codec, OrchestratorConfig(
        max_turns=len(orch), turn_tokens=100_000, enable_thinking=thinking))
    assert rollout.end_reason == "answer"
    assert rollout.account.dispatches["web_searcher"] == len(topics)
    return rollout.account.tokens_by_role()["orchestrator"][0], rollout.account.prompt_tokens


async def measure(args, index) -> list[dict]:
    tok = tiny_qwen3_tokenizer(512)
    tool = LocalSearchTool(index, passage_chars=600)
    titles = sorted({p.title for p in index.passages if p.title})
    rows = []
    for steps in range(1, args.max_steps + 1):
        row = {"steps": steps}
        for thinking in (False, True):
            d, o, a = [], [], []
            for task, topics in make_tasks(titles, args.tasks, steps, args.seed):
                d.append(await direct_prompt_tokens(tok, task, topics, tool, thinking))
                orch, every = await memory_prompt_tokens(tok, task, topics, tool, thinking)
                o.append(orch)
                a.append(every)
            key = "think" if thinking else "plain"
            row[f"direct_{key}"] = sum(d) / len(d)
            row[f"memory_orch_{key}"] = sum(o) / len(o)
            row[f"memory_all_{key}"] = sum(a) / len(a)
        rows.append(row)
        print(f"steps {steps:2d}: direct {row['direct_plain']:9.0f} / think "
              f"{row['direct_think']:9.0f}"
              f" | memory orchestrator {row['memory_orch_plain']:8.0f} / think "
              f"{row['memory_orch_think']:8.0f} | memory all calls {row['memory_all_plain']:8.0f}"
              f" / think {row['memory_all_think']:8.0f}", flush=True)
    return rows


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["steps"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (("direct_plain", "Direct", "C0-"),
                              ("direct_think", "Direct + think", "C0--"),
                              ("memory_all_plain", "memory (all calls)", "C1-"),
                              ("memory_all_think", "memory + think (all calls)", "C1--"),
                              ("memory_orch_plain", "memory (orchestrator only)", "C2-")):
        ax.plot(x, [r[key] / 1000 for r in rows], style, label=label)
    ax.set_xlabel("steps (tool calls) per query")
    ax.set_ylabel("prompt tokens per query (thousands)")
    ax.set_xticks(x)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=pathlib.Path, default=CORPUS)
    p.add_argument("--tasks", type=int, default=4, help="tasks per step count")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "memory_tokens.png")
    args = p.parse_args()
    if not args.corpus.is_file():
        print(f"corpus {args.corpus} not found (the shared data folder); pass --corpus")
        return 2
    index = build_index(SearchIndexConfig(corpus_path=str(args.corpus), backend="bm25"),
                        progress=False)
    rows = asyncio.run(measure(args, index))
    print("\nsteps   direct  direct+think  memory(all)  memory+think(all)  memory(orch)  "
          "all/direct  all+think/direct+think")
    for r in rows:
        print(f"{r['steps']:5d} {r['direct_plain']:8.0f} {r['direct_think']:13.0f} "
              f"{r['memory_all_plain']:12.0f} {r['memory_all_think']:18.0f} "
              f"{r['memory_orch_plain']:13.0f} {r['memory_all_plain'] / r['direct_plain']:11.2f} "
              f"{r['memory_all_think'] / r['direct_think']:23.2f}")
    plot(rows, args.out)
    print(f"wrote {args.out}")
    by = {r["steps"]: r for r in rows}
    parts = []
    for s in (1, 5, 10, 20):
        if s in by:
            r = by[s]
            ratio = r["memory_all_plain"] / r["direct_plain"]
            ratio_think = r["memory_all_think"] / r["direct_think"]
            parts.append(f"{s} steps: Direct {r['direct_plain']:,.0f} (+think "
                         f"{r['direct_think']:,.0f}) vs memory {r['memory_all_plain']:,.0f} "
                         f"(+think {r['memory_all_think']:,.0f}; orchestrator alone "
                         f"{r['memory_orch_plain']:,.0f}), ratio {ratio:.2f} ({ratio_think:.2f} "
                         "with thinking)")
    record(f"memory_tokens (CPU; test tokenizer, BM25 over {len(index.passages)} wiki summaries, "
           f"{args.tasks} tasks per step count): prompt tokens per query summed over every model "
           "call incl. sub-agents; " + "; ".join(parts) + f"; peak RSS {peak_rss_mib():.0f} MiB "
           "(python bench/memory_tokens.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
