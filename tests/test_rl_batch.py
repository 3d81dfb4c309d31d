"""rl.batch: the packed [B, T] batch of a Direct step and of a Flow-GRPO step, on hand-worked
groups (every number below is worked out in the test's docstring)."""

from types import SimpleNamespace

import numpy as np
import pytest

from orchestrax import rl
from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord

PAD = 7


def traj(answer, *, ids, prompt, calls=(), cost=0.0, format_error=None, end_reason="answer"):
    n = len(ids)
    turns = [TurnRecord(text="", generation_s=0.5, format_error=format_error,
                        tool_calls=[ToolCallRecord(name=c, arguments={}, observation="",
                                                   cost=cost) for c in calls])]
    return Trajectory(task_id="t", prompt_len=prompt, token_ids=list(ids),
                      loss_mask=[0] * prompt + [1] * (n - prompt),
                      logprobs=[0.0] * prompt + [-0.5] * (n - prompt), turns=turns,
                      final_answer=answer, end_reason=end_reason)


def test_pack_pads_right_buckets_and_truncates():
    """Lengths 3 and 70: bucketed to 128, capped at max_len 100; with max_len 2 the tails are
    cut (and carry no loss)."""
    a = traj("x", ids=[1, 2, 3], prompt=1)
    b = traj("x", ids=list(range(10, 80)), prompt=60)
    out = rl.pack([a, b], pad_id=PAD, max_len=100)
    assert out["tokens"].shape == (2, 100) and out["tokens"].dtype == np.int32
    np.testing.assert_array_equal(out["tokens"][0, :5], [1, 2, 3, PAD, PAD])
    np.testing.assert_array_equal(out["attention_mask"].sum(1), [3, 70])
    np.testing.assert_array_equal(out["loss_mask"][0, :4], [0, 1, 1, 0])
    assert out["loss_mask"][1].sum() == 10
    np.testing.assert_allclose(out["sampler_logprobs"][0, :4], [0, -0.5, -0.5, 0])
    assert rl.pack([a], pad_id=PAD, max_len=4096)["tokens"].shape == (1, 64)
    cut = rl.pack([a, b], pad_id=PAD, max_len=2)
    np.testing.assert_array_equal(cut["tokens"], [[1, 2], [10, 11]])
    np.testing.assert_array_equal(cut["loss_mask"], [[0, 1], [0, 0]])


def test_packed_rows_are_right_padded_and_the_check_refuses_others():
    """The train step tells attention its rows are right-padded (the fused kernel with no
    run-time check); `pack` makes them so, truncated or short, and the padding rows of a
    Flow-GRPO batch too. A left-padded row is refused, the batch and row named."""
    a = traj("x", ids=[1, 2, 3], prompt=1)
    b = traj("x", ids=list(range(10, 80)), prompt=60)
    for max_len in (100, 2):
        rl.check_right_padded(rl.pack([a, b], pad_id=PAD, max_len=max_len)["attention_mask"],
                              "packed")
    flow, _ = rl.turn_batch([[rollout({}, [([1, 2], [3])])]], np.ones((1, 1)), np.ones((1, 1)),
                            pad_id=PAD, max_turn_tokens=6, row_multiple=4)
    rl.check_right_padded(flow["attention_mask"], "flow")
    left = np.array([[1, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1], [1, 0, 1, 0]])
    with pytest.raises(ValueError, match=r"^the batch: 2 of 4 rows are not right-padded "
                                         r"\(row 2 has padding before a real token\)"):
        rl.check_right_padded(left, "the batch")


def test_direct_batch_by_hand():
    """One task, tools (search,), P = (search 1, outcome 1, compute 0, latency 0), G = 4:
    t0 right with 1 call, t1 wrong with 0, t2 right with 2, t3 right with 4 calls but a format
    error (invalid). Over the valid t0..t2: calls [1, 0, 2] min-max to [.5, 0, 1], outcome
    [1, 0, 1], so R = [1.5, 0, 2, 0] (0 where wrong or invalid). Advantages over the valid:
    mean 7/6, population std sqrt(13/18); t3 gets 0 and sample mask 0."""
    group = [traj("a", ids=[1, 2, 3], prompt=2, calls=["search"], cost=0.25),
             traj("b", ids=[1, 2, 3, 4], prompt=2),
             traj("c", ids=[1, 2], prompt=1, calls=["search", "search"], cost=0.5),
             traj("d", ids=[1, 2, 3], prompt=2, calls=["search"] * 4, format_error="bad",
                  end_reason="error")]
    outcome = np.array([[1, 0, 1, 1]], np.float32)
    batch, stats = rl.direct_batch([group], outcome, [["search"]], [[1.0, 1.0, 0.0, 0.0]],
                                   rl.GRPOConfig(adv_clip=None, cost_resolution=10.0),
                                   pad_id=PAD, max_len=4096)
    std = np.sqrt(13 / 18)
    want = [(1.5 - 7 / 6) / (std + 1e-6), (0 - 7 / 6) / (std + 1e-6),
            (2 - 7 / 6) / (std + 1e-6), 0.0]
    np.testing.assert_allclose(batch["advantages"], want, atol=1e-5)
    np.testing.assert_array_equal(batch["sample_mask"], [1, 1, 1, 0])
    assert batch["tokens"].shape == (4, 64)
    np.testing.assert_array_equal(batch["loss_mask"][:, :4], [[0, 0, 1, 0], [0, 0, 1, 1],
                                                              [0, 1, 0, 0], [0, 0, 1, 0]])
    assert stats["rollout/reward_mean"] == pytest.approx(3.5 / 4)
    assert stats["rollout/accuracy"] == 0.75
    assert stats["rollout/format_error_rate"] == 0.25
    assert stats["rollout/tokens_mean"] == 3.0 and stats["rollout/turns_mean"] == 1.0
    assert stats["rollout/generation_wall_s_mean"] == 0.5
    assert stats["rollout/episodes"] == 4 and stats["rollout/episodes_failed"] == 1
    assert stats["rollout/cost_mean"] == pytest.approx((0.25 + 1.0) / 4)   # t3 costs nothing
    assert stats["tools/search/calls"] == 7 and stats["tools/search/cost_usd"] == 1.25
    assert stats["filter/kept"] == 3


def rollout(dispatches, samples, *, answer="done", format_errors=0):
    turns = [SimpleNamespace(prompt_ids=p, output_ids=o, logprobs=[-1.0] * len(o))
             for p, o in samples]
    account = SimpleNamespace(dispatches=dispatches, turns=len(samples), prompt_tokens=10,
                              completion_tokens=4, tool_calls=["x"] * 3)
    return SimpleNamespace(samples=turns, account=account, cost=0.0, latency=2.0,
                           clock_s=lambda spt, sub: 0.0, format_errors=format_errors,
                           final_answer=answer)


def test_flow_batch_by_hand():
    """One task, sub-agents (coder,), P = (coder 1, outcome 0, 0, 0), G = 2, both right:
    dispatches [1, 2] min-max to R = [0, 1], mean .5, std .5, A = [-1, +1]. r0 has two turns,
    the second (5 + 2 tokens) over the budget of 6 and dropped after the advantages; r1 one
    turn. Rows padded to row_multiple 4, T = 6 (bucket 64 capped at the budget)."""
    groups = [[rollout({"coder": 1}, [([1, 2], [3]), ([1, 2, 3, 4, 5], [6, 7])]),
               rollout({"coder": 2}, [([4], [5, 6])])]]
    batch, stats = rl.flow_batch(groups, np.ones((1, 2), np.float32), ["coder"],
                                 np.array([[1.0, 0.0, 0.0, 0.0]]), rl.GRPOConfig(),
                                 pad_id=PAD, max_turn_tokens=6, row_multiple=4)
    np.testing.assert_array_equal(batch["tokens"], [[1, 2, 3, PAD, PAD, PAD],
                                                    [4, 5, 6, PAD, PAD, PAD]] + [[PAD] * 6] * 2)
    np.testing.assert_array_equal(batch["loss_mask"][:2], [[0, 0, 1, 0, 0, 0],
                                                           [0, 1, 1, 0, 0, 0]])
    np.testing.assert_allclose(batch["sampler_logprobs"][1, :3], [0, -1, -1])
    np.testing.assert_allclose(batch["advantages"], [-0.5 / (0.5 + 1e-6), 0.5 / (0.5 + 1e-6), 0, 0],
                               atol=1e-5)
    np.testing.assert_array_equal(batch["sample_mask"], [1, 1, 0, 0])
    np.testing.assert_array_equal(batch["rollout_ids"], [0, 1, -1, -1])
    assert stats["flow/turn_samples"] == 2 and stats["flow/dropped_over_budget"] == 1
    assert stats["dispatches/coder"] == 1.5
    assert stats["rollout/reward_mean"] == 0.5 and stats["rollout/turns_mean"] == 1.5
    assert stats["rollout/latency_wall_mean"] == 2.0 and stats["rollout/tool_calls_mean"] == 3.0
