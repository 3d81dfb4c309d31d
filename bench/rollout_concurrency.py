"""Episode concurrency of the asyncio rollout layer: N episodes x T tool-calling turns, each turn
calling 1-3 tools that take 20-100 ms (asyncio sleeps), against a scripted sampler that answers
instantly. Reports wall time against the critical-path lower bound for one event loop in this
process and for an `EpisodePool` of worker processes (each its own event loop), peak RSS, and
the same workload with at most 2 episodes in flight (the published ToolOrchestra code's
setting), on a subset because at 2 in flight the full run takes minutes.

    python bench/rollout_concurrency.py [--episodes 2000 --turns 5 --workers N --capped-episodes 100]

Lower bound with C episodes in flight: max(longest episode, sum of episode critical paths / C),
where an episode's critical path is the sum over turns of its slowest call (calls of one turn
run concurrently).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import peak_rss_mib, record
from orchestrax.agent import chat
from orchestrax.agent.episode import Codec, EpisodeConfig, run_episode, run_episodes
from orchestrax.agent.executor import ExecutorConfig, ToolExecutor, ToolLimits
from orchestrax.agent.pool import EpisodePool
from orchestrax.agent.scripted import scripted_logprob, tiny_qwen3_tokenizer, tiny_tokenizer
from orchestrax.data.records import Task
from orchestrax.rollout.sampler import GenerateResult
from orchestrax.tools.tool import Pricing, ToolResult, ToolSpec

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


TASK_MESSAGES = ({"role": "system", "content": "You orchestrate tools."},
                 {"role": "user", "content": "Do the thing."})
EXECUTOR = ExecutorConfig(default=ToolLimits(timeout_s=5.0), max_concurrency=None)


def tasks_for(plan) -> list[Task]:
    return [Task(task_id=f"e{i}", messages=TASK_MESSAGES) for i in range(len(plan))]


def run(tokenizer, plan, in_flight: int) -> tuple[float, float, list]:
    """One event loop in this process: (wall s, CPU s of this process, trajectories); the
    sampler's script is built untimed."""
    tools = [SleepForTool(n) for n in TOOL_NAMES]  # stateless, so shared by every episode
    sampler = PlanSampler(tokenizer, plan)

    async def main():
        jobs = ((task, tools) for task in tasks_for(plan))
        return await run_episodes(sampler, tokenizer, jobs, config=EpisodeConfig(),
                                  executor=ToolExecutor(EXECUTOR), max_in_flight=in_flight)

    t0, c0 = time.perf_counter(), time.process_time()
    trajs = asyncio.run(main())
    return time.perf_counter() - t0, time.process_time() - c0, trajs


class PlanPlayer:
    """What each pool worker runs: the same sampler, tools and executor settings as `run`."""

    def __init__(self, plan, via_transformers: bool = False):
        # Training workers load the `tokenizers` library alone; the peer wraps the same
        # tokenizer in transformers (which imports torch), as workers did before.
        tokenizer = tiny_qwen3_tokenizer() if via_transformers else tiny_tokenizer()
        self.codec = Codec(tokenizer)
        self.sampler = PlanSampler(tokenizer, plan)
        self.tools = [SleepForTool(n) for n in TOOL_NAMES]
        self.executor = None

    async def play(self, task: Task):
        if self.executor is None:  # made inside the worker's event loop
            self.executor = ToolExecutor(EXECUTOR)
        return await run_episode(self.sampler, self.codec, task, self.tools,
                                 config=EpisodeConfig(), executor=self.executor)


def run_pool(pool: EpisodePool, plan) -> tuple[float, list]:
    t0 = time.perf_counter()
    trajs = asyncio.run(pool.play(tasks_for(plan)))
    return time.perf_counter() - t0, trajs


def lower_bound(plan, in_flight: int) -> float:
    paths = [sum(max(ms for _, ms in calls) for calls in turns) / 1000 for turns in plan]
    return max(max(paths), sum(paths) / in_flight)


def check(trajs, plan) -> None:
    for traj, turns in zip(trajs, plan):
        assert traj.end_reason == "answer", (traj.task_id, traj.end_reason, traj.error)
        assert [len(t.tool_calls) for t in traj.turns[:-1]] == [len(c) for c in turns]
        assert all(c.ok for c in traj.tool_calls)


def worker_stats(pool: EpisodePool) -> tuple[float, float]:
    """(CPU seconds so far, peak RSS MiB) summed over the pool's live worker processes."""
    cpu = rss = 0.0
    for pid in pool.pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/status") as f:
            rss += next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    return cpu, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count(),
                    help="EpisodePool worker processes (default: one per core)")
    ap.add_argument("--repeats", type=int, default=3, help="pool runs; the median is reported")
    ap.add_argument("--capped-episodes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()

    tokenizer = tiny_tokenizer()
    plan = make_plan(args.episodes, args.turns, args.seed)
    bound = lower_bound(plan, len(plan))
    calls = sum(len(c) for turns in plan for c in turns)

    # One event loop in this process.
    run(tokenizer, plan[:50], len(plan))  # warm up imports, caches and the tokenizer
    wall, cpu, trajs = run(tokenizer, plan, in_flight=len(plan))
    check(trajs, plan)
    rss = peak_rss_mib()
    turns = sum(len(t.turns) for t in trajs)
    tokens = sum(len(t.token_ids) for t in trajs)
    del trajs
    sweep = []  # where one event loop turns CPU-bound
    for n in (100, 250, 500):
        w, _, _ = run(tokenizer, plan[:n], in_flight=n)
        sweep.append(f"{n}: {lower_bound(plan[:n], n) / w:.2f}")

    # Pool start-up (seconds until every worker is ready) with a one-episode player, against
    # workers that import transformers (and torch) for the same tokenizer; alternated, best of 2.
    def ready_s(via_transformers: bool) -> float:
        t0 = time.perf_counter()
        with EpisodePool(functools.partial(PlanPlayer, plan[:1], via_transformers=via_transformers),
                         workers=args.workers):
            return time.perf_counter() - t0

    starts = [(ready_s(False), ready_s(True)) for _ in range(2)]
    started, started_peer = (min(s[k] for s in starts) for k in (0, 1))

    # The same episodes over a pool of worker processes (started once, as in training).
    with EpisodePool(functools.partial(PlanPlayer, plan), workers=args.workers) as pool:
        run_pool(pool, plan[:100])  # warm-up
        cpu0, _ = worker_stats(pool)
        walls = []
        for _ in range(args.repeats):
            w, trajs = run_pool(pool, plan)
            check(trajs, plan)
            walls.append(w)
            del trajs
        pool_cpu, pool_rss = worker_stats(pool)
        pool_cpu = (pool_cpu - cpu0) / args.repeats
    pool_wall = sorted(walls)[len(walls) // 2]

    sub = plan[:args.capped_episodes]
    wall_sub, _, _ = run(tokenizer, sub, in_flight=len(sub))
    wall_cap, _, trajs_cap = run(tokenizer, sub, in_flight=2)
    check(trajs_cap, sub)
    bound_sub, bound_cap = lower_bound(sub, len(sub)), lower_bound(sub, 2)
    line = (f"rollout_concurrency (CPU, {os.cpu_count()} cores): {args.episodes} episodes x "
            f"{args.turns} turns, {calls} tool calls of 20-100 ms, {tokens:,} trajectory tokens, "
            f"critical-path bound {bound:.2f} s: EpisodePool of {args.workers} worker processes "
            f"ready in {started:.1f} s (workers importing transformers: {started_peer:.1f} s, "
            f"{started_peer / started:.1f}x), wall "
            f"{pool_wall:.2f} s (median of {args.repeats}: "
            f"{', '.join(f'{w:.2f}' for w in walls)}), efficiency {bound / pool_wall:.2f}, worker "
            f"CPU {pool_cpu:.2f} s = {pool_cpu / turns * 1e6:.0f} us per assistant turn, worker "
            f"peak RSS {pool_rss:,.0f} MiB in all; one event loop "
            f"wall {wall:.2f} s, efficiency {bound / wall:.2f} (CPU {cpu / turns * 1e6:.0f} us "
            f"per turn; efficiency at {', '.join(sweep)} episodes), peak RSS {rss:,.0f} MiB; "
            f"{len(sub)} episodes on one loop: all in flight {wall_sub:.2f} s (bound "
            f"{bound_sub:.2f}, efficiency {bound_sub / wall_sub:.2f}) vs 2 in flight "
            f"{wall_cap:.1f} s (bound {bound_cap:.1f}, efficiency {bound_cap / wall_cap:.2f}), "
            f"speedup {wall_cap / wall_sub:.0f}x; throughput {args.episodes / pool_wall:.0f} "
            f"episodes/s with the pool vs {len(sub) / wall_cap:.1f} at 2 in flight, ratio "
            f"{args.episodes / pool_wall / (len(sub) / wall_cap):.0f}x "
            f"(python bench/rollout_concurrency.py)")
    if args.no_record:
        print(line)
    else:
        record(line)


if __name__ == "__main__":
    main()
