"""Group advantages (GRPO, Dr.GRPO, RLOO) and the sample filters."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrax import rl


def np_advantages(R, estimator, eps=1e-6, ddof=0, clip=None, mask=None):
    Q, G = R.shape
    mask = np.ones((Q, G), bool) if mask is None else mask
    A = np.zeros((Q, G))
    for q in range(Q):
        vals = [R[q, g] for g in range(G) if mask[q, g]]
        n = len(vals)
        mean = sum(vals) / n if n else 0.0
        var = sum((v - mean) ** 2 for v in vals) / (n - ddof) if n > ddof else 0.0
        std = math.sqrt(var)
        for g in range(G):
            if not mask[q, g]:
                continue
            if estimator == "grpo":
                a = (R[q, g] - mean) / (std + eps)
            elif estimator == "dr_grpo":
                a = R[q, g] - mean
            else:
                a = R[q, g] - (sum(vals) - R[q, g]) / (n - 1) if n > 1 else 0.0
            if clip is not None:
                a = min(max(a, -clip), clip)
            A[q, g] = a
    return A


def test_hand_worked():
    R = np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    # group 0: mean .5, population std .5 -> ±1; group 1 constant -> 0
    A = np.asarray(rl.group_advantages(R, eps=0.0 + 1e-6))
    np.testing.assert_allclose(A, [[1, -1, -1, 1], [0, 0, 0, 0]], atol=1e-5)
    # ddof=1: std = sqrt(1/3) -> ±0.5·sqrt(3)
    A1 = np.asarray(rl.group_advantages(R, eps=0.0, ddof=1)[0])
    np.testing.assert_allclose(A1, [0.8660254, -0.8660254, -0.8660254, 0.8660254], atol=1e-6)
    np.testing.assert_allclose(np.asarray(rl.dr_grpo_advantages(R)[0]), [.5, -.5, -.5, .5])
    # RLOO: 1 - (1/3), 0 - (2/3)
    np.testing.assert_allclose(np.asarray(rl.rloo_advantages(R)[0]),
                               [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=1e-6)
    # one winner among 8: A = (1 - 1/8) / sqrt(7/64) = sqrt(7) ≈ 2.6458; clip ±2 caps it
    R8 = np.zeros((1, 8))
    R8[0, 3] = 1.0
    A8 = np.asarray(rl.group_advantages(R8, eps=0.0))
    assert A8[0, 3] == pytest.approx(math.sqrt(7), rel=1e-6)
    assert np.asarray(rl.group_advantages(R8, clip=2.0))[0, 3] == pytest.approx(2.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(1, 1), (2, 4), (3, 8)]),
       st.sampled_from(["grpo", "dr_grpo", "rloo"]), st.sampled_from([0, 1]),
       st.sampled_from([None, 1.5]), st.booleans())
def test_matches_numpy_reference(seed, shape, estimator, ddof, clip, masked):
    rng = np.random.default_rng(seed)
    R = rng.integers(0, 5, size=shape) / 4.0   # ties included
    mask = rng.random(shape) > 0.25 if masked else None
    A = rl.compute_advantages(R, estimator, eps=1e-6, ddof=ddof, clip=clip, mask=mask)
    np.testing.assert_allclose(np.asarray(A), np_advantages(R, estimator, 1e-6, ddof, clip, mask),
                               atol=1e-6, rtol=1e-6)


def test_unknown_estimator_names_allowed():
    with pytest.raises(ValueError, match="estimator='ppo'; allowed: grpo, dr_grpo, rloo"):
        rl.compute_advantages(np.zeros((1, 2)), "ppo")
    with pytest.raises(ValueError, match="adv_estimator='gae'; allowed: "):
        rl.GRPOConfig(adv_estimator="gae")


def test_homogeneity_mask_hand_worked():
    R = np.array([[0.0, 0.0, 0.0, 0.0],      # std 0: drop
                  [0.0, 0.2, 0.0, 0.2],      # std 0.1: kept (threshold is strict <)
                  [0.0, 0.1, 0.0, 0.1],      # std 0.05: drop
                  [1.0, 0.0, 0.0, 0.0]])     # std .433: keep
    np.testing.assert_array_equal(np.asarray(rl.homogeneity_mask(R, min_std=0.1 - 1e-7)),
                                  [False, True, False, True])
    np.testing.assert_array_equal(np.asarray(rl.homogeneity_mask(R)), [False, True, False, True])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 0.5))
def test_homogeneity_matches_numpy(seed, min_std):
    rng = np.random.default_rng(seed)
    R = rng.integers(0, 4, size=(5, 6)) / 3.0
    mask = rng.random((5, 6)) > 0.3
    want = []
    for q in range(5):
        vals = R[q][mask[q]]
        want.append(len(vals) > 0 and float(np.sqrt(np.mean((vals - vals.mean()) ** 2)))
                    >= min_std - 1e-7)
    got = np.asarray(rl.homogeneity_mask(R, min_std, mask))
    # values exactly at the threshold may land on either side in float32; avoid them
    stds = [np.sqrt(np.mean((R[q][mask[q]] - R[q][mask[q]].mean()) ** 2)) if mask[q].any()
            else 0.0 for q in range(5)]
    clear = np.abs(np.array(stds) - min_std) > 1e-5
    np.testing.assert_array_equal(got[clear], np.array(want)[clear])


def test_sample_mask_and_counters():
    # task 0: mixed rewards, one format error, one without answer; task 1: homogeneous
    R = np.array([[1.0, 0.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]])
    format_errors = np.array([[0, 2, 0, 0], [0, 0, 0, 0]])
    has_answer = np.array([[1, 1, 0, 1], [1, 1, 1, 1]], bool)
    keep, c = rl.sample_mask(R, format_errors=format_errors, has_answer=has_answer, min_std=0.1)
    np.testing.assert_array_equal(np.asarray(keep), [[1, 0, 0, 1], [0, 0, 0, 0]])
    assert int(c["filter/format_dropped"]) == 1
    assert int(c["filter/invalid_dropped"]) == 1
    assert int(c["filter/homogeneous_groups"]) == 1
    assert int(c["filter/homogeneous_dropped"]) == 4
    assert int(c["filter/kept"]) == 2
    assert float(c["filter/kept_fraction"]) == pytest.approx(0.25)
    # a group whose valid members are homogeneous is dropped even if invalid ones differ
    keep2, _ = rl.sample_mask(np.array([[1.0, 1.0, 0.0]]), format_errors=np.array([[0, 0, 1]]))
    np.testing.assert_array_equal(np.asarray(keep2), [[0, 0, 0]])


def test_pipeline_masked_advantages_are_zero_where_dropped():
    counts = np.array([[[1], [0], [2], [1]]])
    outcome = np.array([[1, 0, 1, 1]])
    cost = np.array([[0.1, 0.2, 0.3, 0.0]])
    pref = np.array([[0.0, 1.0, 1.0, 0.0]])
    valid = rl.validity_mask(format_errors=np.array([[0, 0, 0, 1]]))
    R = rl.toolorchestra_reward(counts, outcome, cost, np.zeros((1, 4)), pref, valid=valid)
    keep, _ = rl.sample_mask(R, format_errors=np.array([[0, 0, 0, 1]]))
    A = np.asarray(rl.group_advantages(R, mask=keep))
    assert A[0, 3] == 0.0
    assert abs(A[0, :3].sum()) < 1e-5


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_broken_shapes_name_the_argument_at_trace_time(estimator):
    """The estimators are jitted; the contract fails when they are traced, naming R or mask."""
    with pytest.raises(ValueError, match=r"rank 1 \(shape \(4,\)\) but expected 2\. "
                                         r"\[advantages: R must be \[Q,G\] rewards\]"):
        rl.compute_advantages(np.zeros(4), estimator)
    with pytest.raises(ValueError, match=r"shape \(2, 3\) but expected \(2, 4\)\. "
                                         r"\[advantages: mask must be \[Q,G\] = \(2, 4\)"):
        rl.compute_advantages(np.zeros((2, 4)), estimator, mask=np.ones((2, 3), bool))


def test_sample_mask_names_a_misshapen_filter_input():
    with pytest.raises(ValueError, match=r"\[sample_mask: format_errors must be \[Q,G\]"):
        rl.sample_mask(np.zeros((2, 4)), format_errors=np.zeros((4, 2)))
