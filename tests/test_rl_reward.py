"""ToolOrchestra reward: hand-worked numbers, an independent NumPy reference, and its properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrax import rl
from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord


def np_reward(counts, outcome, cost, latency, pref, scope="group", valid=None,
              floors=(1.0, 1.0, 1e-4, 1.0)):
    """Loop-by-loop reading of paper Eq. 2 with M = [counts, outcome, -cost, -latency]; a spread
    below its floor (calls, outcome, cost, latency) counts as none."""
    Q, G, N = counts.shape
    valid = np.ones((Q, G), bool) if valid is None else valid
    M = np.zeros((Q, G, N + 3))
    for q in range(Q):
        for g in range(G):
            M[q, g] = list(counts[q, g]) + [outcome[q, g], -cost[q, g], -latency[q, g]]
    R = np.zeros((Q, G))
    for q in range(Q):
        members = [(q, g) for g in range(G)] if scope == "group" else \
            [(a, b) for a in range(Q) for b in range(G)]
        members = [ij for ij in members if valid[ij]]
        for g in range(G):
            if outcome[q, g] != 1 or not valid[q, g]:
                continue
            total = 0.0
            for k in range(N + 3):
                vals = [M[i, j, k] for i, j in members]
                lo, hi = min(vals), max(vals)
                floor = floors[0] if k < N else floors[k - N + 1]
                x = 0.0 if hi - lo < floor or hi == lo else (M[q, g, k] - lo) / (hi - lo)
                total += x * pref[q, k]
            R[q, g] = total
    return R


def test_hand_worked_group():
    counts = np.array([[[0, 1, 0], [1, 1, 0], [2, 0, 1], [1, 0, 0]]])
    outcome = np.array([[1, 1, 0, 1]])
    cost = np.array([[0.10, 0.30, 0.20, 0.30]])
    latency = np.array([[5.0, 10.0, 1.0, 10.0]])
    pref = np.array([[0.0, 1.0, 0.5, 1.0, 1.0, 0.0]])
    # tool0 [0,1,2,1]/2; tool1 [1,1,0,0]; tool2 [0,0,1,0]; outcome [1,1,0,1]; -cost [1,0,.5,0]
    # R0 = 1 (tool1) + 0 + 1 (outcome) + 1 (cost) = 3; R1 = 1 + 1 + 0 = 2; R2 = 0 (wrong);
    # R3 = 0 + 1 + 0 = 1.
    R = rl.toolorchestra_reward(counts, outcome, cost, latency, pref)
    np.testing.assert_allclose(np.asarray(R), [[3.0, 2.0, 0.0, 1.0]], atol=1e-6)


def test_appendix_f_preference_vector():
    # Tools: web_search, local_search, qwen3-235b, llama-3.3-70b, gpt-5, gpt-5-mini.
    # P = [0,1,1,1,0,0, 0,0,0]: reward local search and open models only.
    pref = np.array([[0, 1, 1, 1, 0, 0, 0, 0, 0]], float)
    counts = np.array([[[2, 0, 0, 0, 1, 0],     # web + GPT-5: correct but none preferred
                        [0, 2, 1, 0, 0, 0],     # local search ×2 + qwen
                        [0, 1, 0, 2, 0, 0],     # local search + llama ×2
                        [0, 2, 1, 2, 0, 0]]])   # all preferred tools, but wrong
    outcome = np.array([[1, 1, 1, 0]])
    cost = np.array([[0.05, 0.01, 0.02, 0.03]])
    latency = np.array([[30.0, 12.0, 20.0, 40.0]])
    # local [0,2,1,2]/2 -> [0,1,.5,1]; qwen [0,1,0,1]; llama [0,0,1,1]
    R = rl.toolorchestra_reward(counts, outcome, cost, latency, pref)
    np.testing.assert_allclose(np.asarray(R), [[0.0, 2.0, 1.5, 0.0]], atol=1e-6)


def test_batch_scope_uses_all_tasks():
    counts = np.zeros((2, 2, 1))
    outcome = np.ones((2, 2))
    cost = np.array([[1.0, 2.0], [3.0, 5.0]])
    latency = np.zeros((2, 2))
    pref = np.array([[0, 0, 1, 0], [0, 0, 1, 0]], float)
    # -cost over the batch: min -5, max -1 -> (5 - c) / 4
    R = rl.toolorchestra_reward(counts, outcome, cost, latency, pref, scope="batch")
    np.testing.assert_allclose(np.asarray(R), [[1.0, 0.75], [0.5, 0.0]], atol=1e-6)
    Rg = rl.toolorchestra_reward(counts, outcome, cost, latency, pref, scope="group")
    np.testing.assert_allclose(np.asarray(Rg), [[1.0, 0.0], [1.0, 0.0]], atol=1e-6)


def test_valid_mask_excludes_from_range_and_zeroes():
    counts = np.zeros((1, 3, 1))
    outcome = np.ones((1, 3))
    cost = np.array([[1.0, 2.0, 100.0]])
    pref = np.array([[0, 0, 1, 0]], float)
    valid = np.array([[True, True, False]])
    R = rl.toolorchestra_reward(counts, outcome, cost, np.zeros((1, 3)), pref, valid=valid)
    np.testing.assert_allclose(np.asarray(R), [[1.0, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(R), np_reward(counts, outcome, cost, np.zeros((1, 3)),
                                                        pref, valid=valid), atol=1e-6)


@st.composite
def reward_inputs(draw):
    # Few distinct shapes: each new shape costs an XLA compile on a slow shared CPU.
    Q = draw(st.sampled_from([1, 3]))
    G = draw(st.sampled_from([1, 2, 5]))
    N = draw(st.sampled_from([1, 3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    counts = rng.integers(0, 4, size=(Q, G, N))
    outcome = rng.integers(0, 2, size=(Q, G))
    # Coarse grids make ties (constant features) common, which is the interesting case.
    cost = rng.integers(0, 4, size=(Q, G)) * 0.25
    latency = rng.integers(0, 5, size=(Q, G)) * 3.0
    pref = rng.integers(0, 5, size=(Q, N + 3)) / 4.0
    valid = rng.random((Q, G)) > 0.2
    return counts, outcome, cost, latency, pref, valid


@settings(max_examples=40, deadline=None)
@given(reward_inputs(), st.sampled_from(["group", "batch"]), st.booleans())
def test_matches_numpy_reference(inputs, scope, use_valid):
    counts, outcome, cost, latency, pref, valid = inputs
    valid = valid if use_valid else None
    R = rl.toolorchestra_reward(counts, outcome, cost, latency, pref, scope=scope, valid=valid)
    np.testing.assert_allclose(np.asarray(R),
                               np_reward(counts, outcome, cost, latency, pref, scope, valid),
                               atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(reward_inputs(), st.integers(0, 5), st.integers(0, 5), st.floats(0.01, 1.0),
       st.floats(0.01, 5.0))
def test_cheaper_correct_never_below_dearer(inputs, i, j, p_compute, extra):
    counts, outcome, cost, latency, pref, _ = inputs
    G = counts.shape[1]
    if G < 2:
        return
    i, j = i % G, j % G
    if i == j:
        j = (i + 1) % G
    # Make i and j identical and correct except that j costs `extra` dollars more.
    counts[:, j] = counts[:, i]
    latency[:, j] = latency[:, i]
    outcome[:, i] = outcome[:, j] = 1
    cost[:, j] = cost[:, i] + extra
    pref[:, -2] = p_compute
    for scope in ("group", "batch"):
        R = np.asarray(rl.toolorchestra_reward(counts, outcome, cost, latency, pref, scope=scope))
        assert np.all(R[:, i] >= R[:, j] - 1e-6)
        # and strictly above, since cost differs and p_compute > 0
        assert np.all(R[:, i] > R[:, j])


@settings(max_examples=40, deadline=None)
@given(reward_inputs())
def test_incorrect_always_zero_and_permutation_equivariant(inputs):
    counts, outcome, cost, latency, pref, _ = inputs
    R = np.asarray(rl.toolorchestra_reward(counts, outcome, cost, latency, pref))
    assert np.all(R[outcome == 0] == 0.0)
    perm = np.random.default_rng(0).permutation(counts.shape[1])
    Rp = np.asarray(rl.toolorchestra_reward(counts[:, perm], outcome[:, perm], cost[:, perm],
                                            latency[:, perm], pref))
    np.testing.assert_allclose(Rp, R[:, perm], atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(reward_inputs(), st.floats(0.0, 1.0), st.floats(0.0, 50.0))
def test_constant_feature_never_changes_R(inputs, new_weight, const):
    counts, outcome, cost, latency, pref, _ = inputs
    base = np.asarray(rl.toolorchestra_reward(counts, outcome, cost, latency, pref))
    # Make latency constant within every group: its weight must then be irrelevant.
    lat_c = np.full_like(latency, const)
    a = np.asarray(rl.toolorchestra_reward(counts, outcome, cost, lat_c, pref))
    pref2 = pref.copy()
    pref2[:, -1] = new_weight
    b = np.asarray(rl.toolorchestra_reward(counts, outcome, cost, lat_c, pref2))
    np.testing.assert_allclose(a, b, atol=1e-6)
    # Adding a constant extra tool (never called) with any preference changes nothing either.
    counts2 = np.concatenate([counts, np.zeros(counts.shape[:2] + (1,), int)], axis=-1)
    pref3 = np.concatenate([pref[:, :-3], np.full((pref.shape[0], 1), 0.7), pref[:, -3:]], -1)
    c = np.asarray(rl.toolorchestra_reward(counts2, outcome, cost, latency, pref3))
    np.testing.assert_allclose(c, base, atol=1e-6)


def test_outcome_reward():
    np.testing.assert_array_equal(np.asarray(rl.outcome_reward(np.array([[1, 0, 1]]))),
                                  [[1.0, 0.0, 1.0]])
    np.testing.assert_array_equal(
        np.asarray(rl.outcome_reward(np.array([[1, 0, 1]]), valid=np.array([[1, 1, 0]]))),
        [[1.0, 0.0, 0.0]])


def test_bad_inputs_name_the_field():
    c, o, z = np.zeros((1, 2, 2)), np.ones((1, 2)), np.zeros((1, 2))
    with pytest.raises(ValueError, match="scope.*allowed: group, batch"):
        rl.toolorchestra_reward(c, o, z, z, np.zeros((1, 5)), scope="global")
    with pytest.raises(ValueError, match=r"shape \(1, 4\) but expected \(1, 5\)\. "
                                         r"\[toolorchestra_reward: preference must be \[Q,N\+3\]"):
        rl.toolorchestra_reward(c, o, z, z, np.zeros((1, 4)))
    with pytest.raises(ValueError, match="preference values"):
        rl.toolorchestra_reward(c, o, z, z, np.full((1, 5), 2.0))
    with pytest.raises(ValueError, match="outcome values"):
        rl.toolorchestra_reward(c, np.full((1, 2), 0.5), z, z, np.zeros((1, 5)))
    with pytest.raises(ValueError, match=r"shape \(2, 2\) but expected \(1, 2\)\. "
                                         r"\[toolorchestra_reward: cost must be \[Q,G\]"):
        rl.toolorchestra_reward(c, o, np.zeros((2, 2)), z, np.zeros((1, 5)))
    with pytest.raises(ValueError, match=r"rank 2 \(shape \(2, 2\)\) but expected 3\. "
                                         r"\[toolorchestra_reward: tool_counts must be \[Q,G,N\]"):
        rl.toolorchestra_reward(c[0], o, z, z, np.zeros((1, 5)))
    with pytest.raises(ValueError, match=r"\[toolorchestra_reward: valid must be \[Q,G\]"):
        rl.toolorchestra_reward(c, o, z, z, np.zeros((1, 5)), valid=np.ones((2, 1), bool))


def test_features_from_trajectories():
    def call(name, cost, lat):
        return ToolCallRecord(name=name, arguments={}, observation="", cost=cost, latency=lat)

    t0 = Trajectory(task_id="a", turns=[
        TurnRecord(text="", tool_calls=[call("search", 0.01, 2.0), call("gpt5", 0.5, 9.0)],
                   tokens_out=20, generation_s=0.5),
        TurnRecord(text="", tool_calls=[call("search", 0.01, 1.0), call("bogus", 0.0, 0.0)],
                   tokens_out=5, generation_s=0.25)])
    t1 = Trajectory(task_id="a", turns=[TurnRecord(text="answer", tokens_out=30,
                                                   generation_s=3.0)])
    counts, cost, lat = rl.features_from_trajectories([t0, t1], ["search", "gpt5"], 0.1)
    np.testing.assert_array_equal(counts, [[2, 1], [0, 0]])
    np.testing.assert_allclose(cost, [0.52, 0.0], rtol=1e-6)
    # A turn's tools cost their slowest call (9 s, 1 s); the orchestrator's generation counts
    # at 0.1 s per token (25 and 30 tokens), never its measured wall time (generation_s).
    np.testing.assert_allclose(lat, [12.5, 3.0], rtol=1e-6)


def test_latency_preference_sees_the_orchestrators_own_time():
    """Two correct answers with the same 2 s tool call; one generated 10 tokens, the other 90,
    at 0.1 s per token. Latency [3, 11] -> -latency normalised [1, 0]; with P = latency only,
    R = [1, 0]. The measured sampler time (queueing: the short one waited longer here) plays
    no part."""
    def t(tokens, wall_s):
        return Trajectory(task_id="t", final_answer="x", turns=[TurnRecord(
            text="", tokens_out=tokens, generation_s=wall_s, tool_calls=[ToolCallRecord(
                name="search", arguments={}, observation="", latency=2.0)])])
    s = rl.score_groups([[t(10, 50.0), t(90, 1.0)]], np.ones((1, 2)), [["search"]],
                        [[0.0, 0.0, 0.0, 1.0]], rl.GRPOConfig(), seconds_per_token=0.1)
    np.testing.assert_allclose(s.features.latency_QG, [[3.0, 11.0]], rtol=1e-6)
    np.testing.assert_allclose(s.reward_QG, [[1.0, 0.0]], atol=1e-6)


def traj(*names, answer="42", cost=0.0):
    """A trajectory with one turn per tool call in `names`, each call costing `cost`."""
    return Trajectory(task_id="t", final_answer=answer, turns=[
        TurnRecord(text="", tool_calls=[ToolCallRecord(name=n, arguments={}, observation="",
                                                       cost=cost)]) for n in names])


def test_batch_scope_aligns_tool_counts_by_name():
    """Task A offers (search, llm), task B only (llm): column 0 must be `search` in every row.
    By name: search calls [2, 0 | 0, 0] -> [1, 0 | 0, 0]; llm calls [0, 1 | 4, 0] -> [0, .25 |
    1, 0]. A prefers search, B prefers llm: R = [[1, 0], [1, 0]]. Padding by position put B's
    llm counts in A's search column: A's 2 searches were scaled by B's 4 llm calls, R_A0 = 0.5."""
    groups = [[traj("search", "search"), traj("llm")], [traj(*["llm"] * 4), traj()]]
    names = [["search", "llm"], ["llm"]]
    prefs = [[1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    f = rl.group_features(groups, names, prefs)
    assert f.tool_names == ("search", "llm")
    np.testing.assert_array_equal(f.counts_QGN, [[[2, 0], [0, 1]], [[0, 4], [0, 0]]])
    np.testing.assert_array_equal(f.preference_QF, [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0]])
    outcome = np.ones((2, 2))
    R = rl.toolorchestra_reward(f.counts_QGN, outcome, f.cost_QG, f.latency_QG, f.preference_QF,
                                scope="batch")
    np.testing.assert_allclose(np.asarray(R), [[1.0, 0.0], [1.0, 0.0]], atol=1e-6)
    by_position = rl.toolorchestra_reward(np.array([[[2, 0], [0, 1]], [[4, 0], [0, 0]]]),
                                          outcome, f.cost_QG, f.latency_QG,
                                          np.array([[1, 0, 0, 0, 0], [1, 0, 0, 0, 0]], float),
                                          scope="batch")
    np.testing.assert_allclose(np.asarray(by_position), [[0.5, 0.0], [1.0, 0.0]], atol=1e-6)
    # The order a task lists its tools in is irrelevant once columns are names.
    g = rl.group_features(groups, [["llm", "search"], ["llm"]],
                          [[0.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    R2 = rl.toolorchestra_reward(g.counts_QGN, outcome, g.cost_QG, g.latency_QG,
                                 g.preference_QF, scope="batch")
    np.testing.assert_allclose(np.asarray(R2), np.asarray(R), atol=1e-6)


def test_group_features_outcome_cost_and_bad_inputs():
    f = rl.group_features([[traj("a", cost=0.5), traj("a", "b", cost=0.25)]], [["a", "b"]],
                          [[0.0, 0.0, 1.0, 0.5, 0.0]])
    np.testing.assert_allclose(f.cost_QG, [[0.5, 0.5]])
    np.testing.assert_array_equal(f.counts_QGN, [[[1, 0], [1, 1]]])
    with pytest.raises(ValueError, match=r"preferences\[0\] has 4 entries; task 0 has 2 tools, "
                                         r"so it needs 5"):
        rl.group_features([[traj()]], [["a", "b"]], [[0.0, 1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"preferences\[1\] is None"):
        rl.group_features([[traj()], [traj()]], [["a"], ["a"]], [[0.0, 1.0, 0.0, 0.0], None])
    with pytest.raises(ValueError, match="every group must hold G=2"):
        rl.group_features([[traj(), traj()], [traj()]], [[], []], [[1.0, 0, 0], [1.0, 0, 0]])
    with pytest.raises(ValueError, match="tool_names has duplicates"):
        rl.group_features([[traj()]], [["a", "a"]], [[0.0] * 5])


def test_spread_below_resolution_counts_as_constant():
    """Hand-worked: latencies 10.0 / 10.4 / 10.9 s spread 0.9 s < the 1 s quantum, so latency
    is constant (0) and R is 0 everywhere; 10.0 / 10.4 / 11.0 spread 1 s and -latency min-maxes
    to 1, 0.6, 0. Cost the same way: 1.00 / 1.005 / 1.009 cents spread below a hundredth of a
    cent (1e-4 $); 1.00 / 1.02 cents do not: 1 and 0."""
    counts, outcome = np.zeros((1, 3, 1)), np.ones((1, 3))
    lat_pref = np.array([[0, 0, 0, 1.0]])
    R = rl.toolorchestra_reward(counts, outcome, np.zeros((1, 3)),
                                np.array([[10.0, 10.4, 10.9]]), lat_pref)
    np.testing.assert_array_equal(np.asarray(R), [[0.0, 0.0, 0.0]])
    R = rl.toolorchestra_reward(counts, outcome, np.zeros((1, 3)),
                                np.array([[10.0, 10.4, 11.0]]), lat_pref)
    np.testing.assert_allclose(np.asarray(R), [[1.0, 0.6, 0.0]], atol=1e-5)
    cost_pref = np.array([[0, 0, 1.0, 0]])
    R = rl.toolorchestra_reward(counts, outcome, np.array([[0.0100, 0.01005, 0.01009]]),
                                np.zeros((1, 3)), cost_pref)
    np.testing.assert_array_equal(np.asarray(R), [[0.0, 0.0, 0.0]])
    R = rl.toolorchestra_reward(counts[:, :2], outcome[:, :2], np.array([[0.0100, 0.0102]]),
                                np.zeros((1, 2)), cost_pref)
    np.testing.assert_allclose(np.asarray(R), [[1.0, 0.0]], atol=1e-5)
    # a custom quantum: 0.1 s makes the 0.9 s spread a difference again
    R = rl.toolorchestra_reward(counts, outcome, np.zeros((1, 3)),
                                np.array([[10.0, 10.4, 10.9]]), lat_pref,
                                resolution=rl.Resolution(latency_s=0.1))
    np.testing.assert_allclose(np.asarray(R), [[1.0, 0.5 / 0.9, 0.0]], atol=1e-5)
    with pytest.raises(ValueError, match=r"Resolution.latency_s=-1; must be a number >= 0"):
        rl.toolorchestra_reward(counts, outcome, np.zeros((1, 3)), np.zeros((1, 3)), lat_pref,
                                resolution=rl.Resolution(latency_s=-1))
