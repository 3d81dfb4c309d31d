"""No reward from timing noise: 8 identical greedy requests, served by a real engine next to 8
other requests, are 8 identical trajectories; scored as correct under every training preference
pair they get identical rewards and zero advantages. Their measured sampler times differ (queue
position), but the latency feature is the deterministic clock (tokens x seconds per token plus
the tools' latency), and a spread below the latency quantum would count as none anyway."""

import asyncio

import numpy as np
import pytest

from orchestrax import models, rl
from orchestrax.agent.episode import sample_turn
from orchestrax.data.preferences import PAIRS_TRAIN
from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord
from orchestrax.rollout.sampler import SamplingParams
from orchestrax.rollout.embedded import make_embedded_sampler

CFG = models.tiny_config()
SPT = 0.03


def _serve_together():
    """(8 results of the same prompt, measured seconds of each) with 8 other prompts in flight,
    all submitted at once through the episode's own sampler call."""
    sampler = make_embedded_sampler(CFG, models.init_params(CFG, 0), max_batch=16, max_len=64)
    rng = np.random.default_rng(0)
    same = rng.integers(0, CFG.vocab_size, 12).tolist()
    others = [rng.integers(0, CFG.vocab_size, int(n)).tolist() for n in rng.integers(5, 20, 8)]
    prompts = [p for pair in zip([same] * 8, others) for p in pair]   # interleaved submissions
    greedy = SamplingParams(temperature=0.0)

    async def main():
        return await asyncio.gather(*(
            sample_turn(sampler, ids, greedy, (), turn=0, max_new_tokens=8, rid=f"r{i}",
                        attempts=1, backoff_s=0.0) for i, ids in enumerate(prompts)))
    played = asyncio.run(main())
    return [played[i] for i in range(0, 16, 2)]


def _trajectory(result, seconds) -> Trajectory:
    """One correct turn with one 2 s search call, as the episode records it."""
    return Trajectory(task_id="t", final_answer="42", turns=[TurnRecord(
        text="x", tokens_out=len(result.output_ids), generation_s=seconds,
        weight_version=result.weight_version, tool_calls=[ToolCallRecord(
            name="search", arguments={}, observation="", cost=0.001, latency=2.0)])])


def test_identical_trajectories_get_identical_rewards():
    served = _serve_together()
    assert len({tuple(r.output_ids) for r, _ in served}) == 1     # greedy: the same tokens
    group = [_trajectory(r, s) for r, s in served]
    walls = [t.generation_s for t in group]
    print("measured sampler seconds of the 8 identical requests", walls)
    latency_pairs = 0
    for pair in PAIRS_TRAIN:
        P = [pair.tool, pair.outcome, pair.compute, pair.latency]
        latency_pairs += pair.latency > 0
        # no resolution floor at all: the clock alone must make them equal
        for gcfg in (rl.GRPOConfig(), rl.GRPOConfig(latency_resolution=0.0, cost_resolution=0.0)):
            s = rl.score_groups([group], np.ones((1, 8)), [["search"]], [P], gcfg,
                                seconds_per_token=SPT)
            assert np.ptp(s.features.latency_QG) == 0.0
            assert np.all(s.reward_QG == s.reward_QG[0, 0]), (pair, s.reward_QG)
            assert np.all(s.advantages_QG == 0.0), (pair, s.advantages_QG)
            assert not s.keep_QG.any()            # a homogeneous group trains nothing
    assert latency_pairs == 6
    # The measured times, had they been the feature with no floor, would have ranked the
    # identical trajectories by queue position whenever two of them differ.
    if len(set(walls)) > 1:
        old = rl.toolorchestra_reward(
            np.ones((1, 8, 1)), np.ones((1, 8)), np.full((1, 8), 0.001),
            np.array([[2.0 + w for w in walls]]), np.array([[0.0, 1.0, 0.0, 1.0]]),
            resolution=rl.Resolution(latency_s=0.0))
        assert np.ptp(np.asarray(old)) == pytest.approx(1.0)
