"""The demo's own numbers: the preferred tool's share per P kind from `orchestrax eval` records."""

import math

from orchestrax.envs.routing import RoutingConfig
from orchestrax.train import demo

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

