"""Episode concurrency of the asyncio rollout layer: N episodes x T tool-calling turns, each turn
calling 1-3 tools that take 20-100 ms (asyncio sleeps), against a scripted sampler that answers
instantly. Reports wall time against the critical-path lower bound, peak RSS, and the same
workload with at most 2 episodes in flight (the published ToolOrchestra code's setting), on a
subset because at 2 in flight the full run takes minutes.

    python bench/rollout_concurrency.py [--episodes 2000 --turns 5 --capped-episodes 100]

Lower bound with C episodes in flight: max(longest episode, sum of episode critical paths / C),
where an episode's critical path is the sum over turns of its slowest call (calls of one turn
run concurrently).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import peak_rss_mib, record
from orchestrax.agent import chat
from orchestrax.agent.episode import Codec, EpisodeConfig, run_episodes
from orchestrax.agent.executor import ExecutorConfig, ToolExecutor, ToolLimits
from orchestrax.agent.testing import scripted_logprob, tiny_qwen3_tokenizer
from orchestrax.envs.base import Task
from orchestrax.rollout.base import GenerateResult
from orchestrax.tools.base import Pricing, ToolResult, ToolSpec

TOOL_NAMES = ("search", "python", "llm")


class SleepForTool:
    """Sleeps the milliseconds the call asks for; costs $0.001 per call."""

    def __init__(self, name: str):
        self.spec = ToolSpec(name=name, description=f"{name} (simulated).",
                             parameters={"type": "object", "properties": {"ms": {"type": "integer"}},
                                         "required": ["ms"]},
                             pricing=Pricing(usd_per_call=0.001))

    async def __call__(self, arguments):
        await asyncio.sleep(arguments["ms"] / 1000)
        return ToolResult(observation=f"{self.spec.name} done in {arguments['ms']} ms", cost=0.001)


def make_plan(episodes: int, turns: int, seed: int) -> list[list[list[tuple[str, int]]]]:
    """plan[e][t] = the (tool, ms) calls of turn t of episode e."""
    rng = random.Random(seed)
    return [[[(rng.choice(TOOL_NAMES), rng.randint(20, 100)) for _ in range(rng.randint(1, 3))]
             for _ in range(turns)] for _ in range(episodes)]


class PlanSampler:
    """Replays each episode's plan as pre-tokenised assistant turns, with no model latency."""

    def __init__(self, tokenizer, plan):
        codec = Codec(tokenizer)
        self._turns = []
        for calls_per_turn in plan:
            texts = ["<think>\nCall tools.\n</think>\n\n"
                     + "\n".join(chat.render_tool_call(n, {"ms": ms}) for n, ms in calls)
                     for calls in calls_per_turn]
            texts.append("<think>\nDone.\n</think>\n\n<answer>ok</answer>")
            ids = [tuple(codec.encode(t)) + (codec.im_end,) for t in texts]
            self._turns.append([(i, tuple(scripted_logprob(k, t) for k, t in enumerate(i)))
                                for i in ids])

    async def generate(self, requests):
        out = []
        for r in requests:
            episode, turn = r.rid.rsplit("/", 1)
            ids, logprobs = self._turns[int(episode[1:])][int(turn)]
            out.append(GenerateResult(output_ids=ids, logprobs=logprobs, finish_reason="stop",
                                      prompt_tokens=len(r.input_ids), rid=r.rid))
        return out


def run(tokenizer, plan, in_flight: int) -> tuple[float, float, list]:
    """(wall s, CPU s of this process, trajectories); the sampler's script is built untimed."""
    task_msgs = ({"role": "system", "content": "You orchestrate tools."},
                 {"role": "user", "content": "Do the thing."})
    tools = [SleepForTool(n) for n in TOOL_NAMES]  # stateless, so shared by every episode

    sampler = PlanSampler(tokenizer, plan)

    async def main():
        executor = ToolExecutor(ExecutorConfig(default=ToolLimits(timeout_s=5.0),
                                               max_concurrency=None))
        jobs = ((Task(task_id=f"e{i}", messages=task_msgs), tools) for i in range(len(plan)))
        return await run_episodes(sampler, tokenizer, jobs,
                                  config=EpisodeConfig(), executor=executor,
                                  max_in_flight=in_flight)

    t0, c0 = time.perf_counter(), time.process_time()
    trajs = asyncio.run(main())
    return time.perf_counter() - t0, time.process_time() - c0, trajs


def lower_bound(plan, in_flight: int) -> float:
    paths = [sum(max(ms for _, ms in calls) for calls in turns) / 1000 for turns in plan]
    return max(max(paths), sum(paths) / in_flight)


def check(trajs, plan) -> None:
    for traj, turns in zip(trajs, plan):
        assert traj.end_reason == "answer", (traj.task_id, traj.end_reason, traj.error)
        assert [len(t.tool_calls) for t in traj.turns[:-1]] == [len(c) for c in turns]
        assert all(c.ok for c in traj.tool_calls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--capped-episodes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()

    tokenizer = tiny_qwen3_tokenizer()
    plan = make_plan(args.episodes, args.turns, args.seed)
    run(tokenizer, plan[:50], len(plan))  # warm up imports, caches and the tokenizer
    wall, cpu, trajs = run(tokenizer, plan, in_flight=len(plan))
    check(trajs, plan)
    bound = lower_bound(plan, len(plan))
    rss = peak_rss_mib()
    calls = sum(len(c) for turns in plan for c in turns)
    turns = sum(len(t.turns) for t in trajs)
    tokens = sum(len(t.token_ids) for t in trajs)
    del trajs

    # Where the single event loop turns CPU-bound: efficiency at smaller batches.
    sweep = []
    for n in (100, 250, 500):
        w, _, _ = run(tokenizer, plan[:n], in_flight=n)
        sweep.append(f"{n}: {lower_bound(plan[:n], n) / w:.2f}")

    sub = plan[:args.capped_episodes]
    wall_sub, _, _ = run(tokenizer, sub, in_flight=len(sub))
    wall_cap, _, trajs_cap = run(tokenizer, sub, in_flight=2)
    check(trajs_cap, sub)
    bound_sub, bound_cap = lower_bound(sub, len(sub)), lower_bound(sub, 2)
    line = (f"rollout_concurrency (CPU, asyncio, 1 event loop): {args.episodes} episodes x "
            f"{args.turns} turns, {calls} tool calls of 20-100 ms, {tokens:,} trajectory tokens: "
            f"wall {wall:.2f} s vs critical-path bound {bound:.2f} s, efficiency "
            f"{bound / wall:.2f} (process CPU {cpu:.2f} s = {cpu / turns * 1e6:.0f} us per "
            f"assistant turn incl. its tool calls; efficiency at {', '.join(sweep)} episodes); peak RSS {rss:,.0f} MiB; {len(sub)} episodes: "
            f"all in flight {wall_sub:.2f} s (bound {bound_sub:.2f}, efficiency "
            f"{bound_sub / wall_sub:.2f}) vs 2 in flight {wall_cap:.1f} s (bound {bound_cap:.1f}, "
            f"efficiency {bound_cap / wall_cap:.2f}), speedup {wall_cap / wall_sub:.0f}x; "
            f"throughput at {args.episodes} in flight {args.episodes / wall:.0f} episodes/s vs "
            f"{len(sub) / wall_cap:.1f} at 2 in flight, ratio "
            f"{args.episodes / wall / (len(sub) / wall_cap):.0f}x (python bench/rollout_concurrency.py)")
    if args.no_record:
        print(line)
    else:
        record(line)


if __name__ == "__main__":
    main()
