"""Keeps bench/rollout_concurrency.py honest: its workload runs and every episode checks out."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import rollout_concurrency as rc  # noqa: E402


def test_bench_workload_small():
    tok = rc.tiny_tokenizer()
    plan = rc.make_plan(12, 3, seed=1)
    wall, cpu, trajs = rc.run(tok, plan, in_flight=4)
    rc.check(trajs, plan)
    assert wall >= rc.lower_bound(plan, 4) - 1e-3   # a lower bound is never beaten
    assert all(abs(t.cost - 0.001 * len(t.tool_calls)) < 1e-12 for t in trajs)
