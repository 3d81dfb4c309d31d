"""score_groups: the trainer's reward -> filters -> advantages composition on hand-worked groups."""

import numpy as np
import pytest

from orchestrax import rl
from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord

OUTCOME_ONLY = [0.0, 1.0, 0.0, 0.0]         # one tool, then (outcome, compute, latency)


def traj(answer, *, calls=(), format_error=None):
    turns = [TurnRecord(text="", tool_calls=[ToolCallRecord(name=n, arguments={}, observation="")
                                             for n in calls], format_error=format_error)]
    return Trajectory(task_id="t", final_answer=answer, turns=turns)


def test_empty_final_answer_is_no_answer():
    """Answers "A", "", None, "  \\n", "B"; only A is right. Valid: rows 0 and 4, so R = [1, 0]
    over them, mean .5, std .5, A = [+1, -1]; the empty and blank answers are dropped like None
    (counting "" as an answer made them group members: mean 1/4, A_0 = 1.73)."""
    group = [traj("A"), traj(""), traj(None), traj("  \n"), traj("B")]
    s = rl.score_groups([group], np.array([[1, 0, 0, 0, 0]]), [["search"]], [OUTCOME_ONLY],
                        rl.GRPOConfig(adv_clip=None))
    np.testing.assert_array_equal(s.valid_QG, [[True, False, False, False, True]])
    np.testing.assert_array_equal(s.keep_QG, [[True, False, False, False, True]])
    np.testing.assert_allclose(s.reward_QG, [[1, 0, 0, 0, 0]])
    np.testing.assert_allclose(s.advantages_QG, [[1, 0, 0, 0, -1]], atol=1e-5)
    assert s.counters["filter/invalid_dropped"] == 3
    assert s.counters["filter/kept"] == 2
    assert not rl.has_final_answer("") and not rl.has_final_answer(" \t")
    assert rl.has_final_answer("0") and not rl.has_final_answer(None)


def test_format_errors_homogeneous_groups_and_preferences():
    """Task 0: 3 correct answers with 0/1/2 search calls, P = (search 1, outcome 0): counts
    normalise to R = [0, .5, 1], std .408 >= .1, A = (R - .5) / .408. Task 1: one format error,
    the rest all wrong -> R = 0 everywhere, homogeneous, dropped."""
    g0 = [traj("x"), traj("x", calls=["search"]), traj("x", calls=["search", "search"])]
    g1 = [traj("x", format_error="bad json"), traj("y"), traj("y")]
    s = rl.score_groups([g0, g1], np.array([[1, 1, 1], [1, 0, 0]]), [["search"], ["search"]],
                        [[1.0, 0.0, 0.0, 0.0], OUTCOME_ONLY], rl.GRPOConfig(adv_clip=None))
    np.testing.assert_allclose(s.reward_QG, [[0, 0.5, 1], [0, 0, 0]], atol=1e-6)
    std = np.sqrt(((0.5 ** 2) * 2) / 3)
    np.testing.assert_allclose(s.advantages_QG[0], [-0.5 / std, 0, 0.5 / std], atol=1e-5)
    np.testing.assert_array_equal(s.format_errors_QG, [[0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(s.keep_QG, [[True] * 3, [False] * 3])
    assert s.counters["filter/format_dropped"] == 1
    assert s.counters["filter/homogeneous_groups"] == 1


def test_invalid_zero_keeps_malformed_rollouts_as_failures():
    """The group of test_empty_final_answer_is_no_answer plus a right answer whose turn was
    malformed. invalid="drop": valid rows 0 and 5 (R 1, 0), A = [+1, 0, 0, 0, 0, -1].
    invalid="zero": every row is a member with R = [1, 0, 0, 0, 0, 0] (the malformed right
    answer scores 0 too): mean 1/6, std sqrt(5)/6, A_0 = (5/6) / (sqrt(5)/6) = sqrt(5), the
    others -(1/6) / (sqrt(5)/6) = -1/sqrt(5); all six kept, nothing counted as dropped."""
    group = [traj("A"), traj(""), traj(None), traj("  \n"), traj("A", format_error="bad json"),
             traj("B")]
    outcome = np.array([[1, 0, 0, 0, 1, 0]])
    drop = rl.score_groups([group], outcome, [["search"]], [OUTCOME_ONLY],
                           rl.GRPOConfig(adv_clip=None))
    np.testing.assert_allclose(drop.advantages_QG, [[1, 0, 0, 0, 0, -1]], atol=1e-5)
    np.testing.assert_array_equal(drop.keep_QG, [[True, False, False, False, False, True]])
    zero = rl.score_groups([group], outcome, [["search"]], [OUTCOME_ONLY],
                           rl.GRPOConfig(adv_clip=None, invalid="zero"))
    np.testing.assert_allclose(zero.reward_QG, [[1, 0, 0, 0, 0, 0]])
    np.testing.assert_allclose(zero.advantages_QG,
                               [[np.sqrt(5)] + [-1 / np.sqrt(5)] * 5], atol=1e-5)
    np.testing.assert_array_equal(zero.keep_QG, [[True] * 6])
    assert zero.counters["filter/kept"] == 6 and zero.counters["filter/format_dropped"] == 0
    with pytest.raises(ValueError, match="invalid"):
        rl.GRPOConfig(invalid="penalise")


def test_bad_outcome_shape_is_named():
    with pytest.raises(ValueError, match=r"shape \(1, 3\) but expected \(1, 2\)\. \[score_groups: "
                                         r"outcome_QG must be \[Q,G\] = \(1, 2\)"):
        rl.score_groups([[traj("a"), traj("b")]], np.ones((1, 3)), [["s"]], [OUTCOME_ONLY],
                        rl.GRPOConfig())


def call(name, cost, latency):
    """A right answer after one call of `name`, charged `cost` dollars and `latency` seconds."""
    return Trajectory(task_id="t", final_answer="done", turns=[TurnRecord(text="", tool_calls=[
        ToolCallRecord(name=name, arguments={}, observation="", cost=cost, latency=latency)])])


def test_group_tasks_pools_two_tasks_that_differ_in_p():
    """Tools cheap ($0.001, 4 s) and fast ($0.02, 0.2 s), all answers right. Task 0 weighs cost
    (P = 0, 0, 1, 1, 0), task 1 latency (0, 0, 1, 0, 1). Task 0's two rollouts both call cheap,
    task 1's call cheap then fast.
    group_tasks=1: task 0's group is constant (cost spread 0) -> R = [0, 0], dropped; task 1:
    latency normalises to [0, 1], R = [0, 1], A = [-1, +1].
    group_tasks=2: one group of four [c0 cheap, c0 cheap, l1 cheap, l1 fast]; over it cost
    normalises to [1, 1, 1, 0], latency to [0, 0, 0, 1], outcome is constant (0): R = [1, 1, 0,
    1], mean .75, std sqrt(3)/4, A = [1/sqrt(3), 1/sqrt(3), -sqrt(3), 1/sqrt(3)]: the cost
    task's right choice now earns a positive advantage from the shared baseline."""
    cheap, fast = ("cheap", 0.001, 4.0), ("fast", 0.02, 0.2)
    groups = [[call(*cheap), call(*cheap)], [call(*cheap), call(*fast)]]
    names = [["cheap", "fast"]] * 2
    prefs = [[0, 0, 1, 1, 0], [0, 0, 1, 0, 1]]
    one = rl.score_groups(groups, np.ones((2, 2)), names, prefs, rl.GRPOConfig(adv_clip=None))
    np.testing.assert_allclose(one.reward_QG, [[0, 0], [0, 1]], atol=1e-6)
    np.testing.assert_allclose(one.advantages_QG[1], [-1, 1], atol=1e-5)
    np.testing.assert_array_equal(one.keep_QG, [[False, False], [True, True]])
    two = rl.score_groups(groups, np.ones((2, 2)), names, prefs,
                          rl.GRPOConfig(adv_clip=None, group_tasks=2))
    np.testing.assert_allclose(two.reward_QG, [[1, 1], [0, 1]], atol=1e-6)
    r3 = 1 / np.sqrt(3)
    np.testing.assert_allclose(two.advantages_QG, [[r3, r3], [-np.sqrt(3), r3]], atol=1e-5)
    assert two.keep_QG.all() and two.counters["filter/homogeneous_groups"] == 0
    with pytest.raises(ValueError, match="group_tasks=2 does not divide the step's 3 tasks"):
        rl.score_groups(groups + groups[:1], np.ones((3, 2)), names + names[:1],
                        prefs + prefs[:1], rl.GRPOConfig(group_tasks=2))
    with pytest.raises(ValueError, match="group_tasks"):
        rl.GRPOConfig(group_tasks=0)
