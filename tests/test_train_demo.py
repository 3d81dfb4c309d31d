"""The demo's own numbers: the preferred tool's share per P kind from `orchestrax eval` records."""

import math
import runpy
from pathlib import Path

from orchestrax.envs.routing import RoutingConfig
from orchestrax.train import demo

ROOT = Path(__file__).resolve().parents[1]

COST, LATENCY = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 1.0]


def test_preferred_shares_count_calls_per_kind():
    records = [
        {"preference": COST, "calls": {"lookup_cheap": 2, "lookup_fast": 1}},
        {"preference": COST, "calls": {"lookup_premium": 1}},
        {"preference": LATENCY, "calls": {"lookup_fast": 1}},
        {"preference": LATENCY, "calls": {}},                       # no call: no share
        {"preference": [0.0, 0.0, 0.0, 1.0, 0.5, 0.5], "calls": {"lookup_cheap": 5}},  # neither
    ]
    shares = demo.preferred_shares(records, RoutingConfig())
    assert shares == {"cost": 2 / 4, "latency": 1.0}
    assert math.isnan(demo.preferred_shares(records[:2], RoutingConfig())["latency"])


def test_table_prints_a_dash_for_a_share_of_no_calls():
    """A policy that called no tool on a kind's tasks has no share there: '-' and a footnote,
    not 'nan'; the other cells keep their numbers."""
    cfg = runpy.run_path(str(ROOT / "configs" / "demo.py"))["config"]()
    row = {"env/preferred_share_cost": 0.5, "env/preferred_share_latency": 0.25,
           "rollout/accuracy": 0.75}
    ev = {"adherence": None, "accuracy": 0.0, "share": {"cost": float("nan"), "latency": 1.0}}
    out = demo.table([("before RL (warm start)", row, ev)], cfg)
    assert "nan" not in out and "no tool call" in out
    line = out.splitlines()[-2]
    assert line.split()[-7:] == ["0.50", "0.25", "0.75", "-", "1.00", "0.00", "-"]
