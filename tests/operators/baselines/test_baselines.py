"""Baselines of Dong-Luo-Yi Sec. III-A and VII: the advanced-composition budget and its
static per-step mechanisms, fixed and random tau."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.baselines import user_level as bl
from dpstream.operators.errors import BudgetExceededError, InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, RecordingNoise, ZeroNoise
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import distinct_count as dc
from dpstream.operators.user_level import k_selection as ks
from dpstream.operators.user_level.svt import LOG

KEY = bytes(range(32))

Item = tuple[str, int, int]  # (user, bin, units)


# ---------------------------------------------------------------------------------------
# Advanced composition


def test_advanced_composition_illustration():
    """Advanced composition: delta = 1e-6, T = 5e7, epsilon = 2 gives eps' ~ 5.04e-5."""
    eps = bl.solve_step_epsilon(2, 1e-6, 5 * 10**7)
    assert float(eps) == pytest.approx(5.04e-5, rel=1e-3)
    assert float(eps) == pytest.approx(5.0392e-5, rel=1e-4)
    assert bl.advanced_composition_epsilon(eps, 5 * 10**7, 1e-6) <= 2


@given(
    st.sampled_from([0.1, 1, 2, 8]),
    st.sampled_from([1e-9, 1e-6, 1e-3]),
    st.sampled_from([1, 10, 1000, 10**6, 5 * 10**7]),
)
def test_solver_rounds_toward_privacy_and_is_tight(epsilon, delta, horizon):
    """Style rule 7: the composed epsilon never exceeds the target (asserted as an
    inequality), and eps' is within 1e-6 of the largest admissible value."""
    eps = bl.solve_step_epsilon(epsilon, delta, horizon)
    assert eps > 0
    assert bl.advanced_composition_epsilon(eps, horizon, delta) <= epsilon
    assert bl.advanced_composition_epsilon(eps * (1 + 1e-6), horizon, delta) > epsilon * (1 - 2e-9)


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 1e-6, 10), "epsilon must be finite and > 0, got"),
        ((1, 0, 10), "delta must be in (0, 1), got 0"),
        ((1, 1e-6, 0), "horizon must be >= 1, got 0"),
    ],
)
def test_solver_rejects_bad_parameters(args, message):
    with pytest.raises(InvalidOperatorConfig) as info:
        bl.solve_step_epsilon(*args)
    assert message in str(info.value)


# ---------------------------------------------------------------------------------------
# AdvComp static mechanisms


def feed_advcomp(spec: bl.AdvCompSpec, ticks: list[list[Item]], noise):
    state, totals, releases = bl.advcomp_init(spec), {}, []
    for items in ticks:
        bands, crossings, totals = ul.split_tick(totals, items, spec.bins)
        state, rel = bl.advcomp_step(spec, state, bands, crossings, noise)
        releases.append(rel)
    return state, releases, totals


def test_advcomp_static_count_with_zero_noise():
    """With noise 0 the AboveThreshold choice stops at the first j with
    Count(D_t, 2^j) < (6/eps_1) LOG(2/beta), eps_1 = eps'/2; the release is then the
    exact truncated count sum_u min(c_u, 2^j)."""
    spec = bl.make_advcomp("c", "count", 2000, 1)
    eps_1 = spec.step_epsilon / 2
    margin = 6 / float(eps_1) * LOG(2 / spec.beta)
    assert 1 < margin < 20
    # 40 users: 30 with 5 items, 10 with 40 items.
    ticks = [[(f"u{u}", 0, 1) for u in range(40) for _ in range(5 if u < 30 else 40)]]
    _, releases, totals = feed_advcomp(spec, ticks, ZeroNoise())
    expected_j = next(
        j for j in range(1, 21) if sum(1 for c in totals.values() if c > 1 << j) < margin
    )
    rel = releases[0]
    assert rel.tau == 1 << expected_j == 64
    assert rel.value == sum(min(c, rel.tau) for c in totals.values())


def test_advcomp_noise_nodes_and_scales():
    """Per tick: threshold (scale 2/eps_1), one query per j until the stop (4/eps_1), then
    one Laplace per bin with scale m tau / eps_2 (m = 2 for a histogram with any-subset)."""
    spec = bl.make_advcomp("h", "histogram", 2000, 3, bins=2, any_subset=True)
    noise = RecordingNoise(ZeroNoise())
    ticks = [[("a", 0, 1), ("b", 1, 1)], [], [("a", 1, 1)]]
    _, releases, _ = feed_advcomp(spec, ticks, noise)
    eps_1 = spec.step_epsilon / 2
    eps_2 = spec.step_epsilon - eps_1
    for node, scale, _ in noise.calls:
        assert node[:2] == ("h", "adv")
        if node[3] == "svt":
            assert scale == (2 / eps_1 if node[4] == "eta" else 4 / eps_1)
        else:
            assert node[3] == "v" and scale == 2 * releases[node[2] - 1].tau / eps_2
    assert releases[-1].values == (1, 2)


def test_advcomp_refuses_releases_beyond_the_horizon():
    spec = bl.make_advcomp("c", "count", 2, 2)
    state = bl.advcomp_init(spec)
    for _ in range(2):
        state, _ = bl.advcomp_step(spec, state, (), (), ZeroNoise())
    with pytest.raises(BudgetExceededError, match="tick must be <= horizon = 2, got 3"):
        bl.advcomp_step(spec, state, (), (), ZeroNoise())


def test_advcomp_distinct_count_uses_the_signed_band_units():
    """F_0 of Truncate(D_t, 2^j) is the sum of the cumulative signed units of bands 0..j:
    on Example E, 3 at tau = 2 (and 4). With noise 0 and two users the first query stops,
    so tau = 2."""
    spec = bl.make_advcomp("f", "distinct_count", 2000, 5)
    table: dict[int, int] = {}
    totals: dict[str, int] = {}
    state = bl.advcomp_init(spec)
    for items in [[("a", 5)], [("a", 7)], [("a", 9)], [("b", 9)], [("b", 5)]]:
        by_band, crossings, totals = dc.split_values_tick(totals, items)
        updates, units = dc.first_occurrence_units(table, by_band)
        table.update(updates)
        state, rel = bl.advcomp_step(spec, state, [[u] for u in units], crossings, ZeroNoise())
    assert state.totals == (2, 1, 0)
    assert rel.tau == 2 and rel.value == 3


def test_advcomp_max_is_the_first_r_above_the_threshold():
    """U(r) = users with an item >= r; with noise 0 the scan from the top outputs the first
    r with U(r) > (6/eps') LOG(2R/beta)."""
    spec = bl.make_advcomp_max("m", 8, 2000, 1)
    margin = 6 / float(spec.step_epsilon) * LOG(2 * 8 / spec.beta)
    assert 1 < margin < 10
    # users' maxima: 20 users reach 3, 5 of them reach 6, 1 reaches 8
    reached = [20, 20, 20, 5, 5, 5, 1, 1]
    state, rel = bl.advcomp_max_step(spec, bl.advcomp_max_init(spec), reached, ZeroNoise())
    assert state.users_at_least == tuple(reached)
    expected = max(r for r in range(1, 9) if reached[r - 1] > margin)
    assert rel.value == expected and rel.margin == margin


def test_advcomp_states_round_trip():
    spec = bl.make_advcomp("c", "histogram", 2, 10, bins=3)
    state, _, _ = feed_advcomp(spec, [[("a", 2, 1), ("a", 1, 1)], [("b", 0, 1)]], KeyedNoise(KEY))
    data = orjson.loads(orjson.dumps(state_codec.to_json(state)))
    assert state_codec.from_json(bl.AdvCompState, data) == state


# ---------------------------------------------------------------------------------------
# Fixed and random tau


ticks_strategy = st.lists(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.just(1)), max_size=6),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(ticks_strategy, st.sampled_from([1, 2, 4, 8]))
def test_fixed_tau_zero_noise_is_the_truncated_histogram(ticks, tau):
    spec = bl.make_fixed_tau("f", "histogram", 1, tau, bins=3)
    state, totals = bl.fixed_tau_init(spec), {}
    used: dict[str, int] = {}
    truth = [0, 0, 0]
    for items in ticks:
        bands, _, totals = ul.split_tick(totals, items, 3)
        for user, r, _ in items:
            used[user] = used.get(user, 0) + 1
            truth[r] += used[user] <= tau
        state, rel = bl.fixed_tau_step(spec, state, bands, ZeroNoise())
        assert rel.values == tuple(truth) and rel.tau == tau


@pytest.mark.parametrize(
    "statistic, any_subset, m",
    [("count", False, 1), ("histogram", True, 2), ("distinct_count", False, 2)],
)
def test_fixed_tau_scales_use_the_full_epsilon(statistic, any_subset, m):
    """Alg. 3: node scale (l+1) m tau / epsilon with the FULL epsilon (no tracker, no
    instance series); F_0 has m = 2 (4 with any-subset)."""
    bins = 2 if statistic == "histogram" else 1
    spec = bl.make_fixed_tau("f", statistic, 2, 8, bins=bins, any_subset=any_subset)
    assert spec.multiplier == m
    noise = RecordingNoise(ZeroNoise())
    state = bl.fixed_tau_init(spec)
    for _ in range(6):
        state, _ = bl.fixed_tau_step(spec, state, (), noise)
    for node, scale, _ in noise.calls:
        period = node[3] if node[2] == "P" else node[2]
        assert scale == Fraction((period + 1) * m * 8, 2)
    assert {node[-1] for node, _, _ in noise.calls} == set(range(bins))


def test_fixed_tau_distinct_count_example_e():
    for tau, values in ((2, [1, 2, 2, 3, 3]), (4, [1, 2, 3, 3, 3])):
        spec = bl.make_fixed_tau("f", "distinct_count", 1, tau)
        table: dict[int, int] = {}
        totals: dict[str, int] = {}
        state, out = bl.fixed_tau_init(spec), []
        for items in [[("a", 5)], [("a", 7)], [("a", 9)], [("b", 9)], [("b", 5)]]:
            by_band, _, totals = dc.split_values_tick(totals, items)
            updates, units = dc.first_occurrence_units(table, by_band)
            table.update(updates)
            state, rel = bl.fixed_tau_step(spec, state, [[u] for u in units], ZeroNoise())
            out.append(rel.value)
        assert out == values


def test_fixed_tau_rejects_a_tau_that_is_not_a_power_of_two():
    with pytest.raises(InvalidOperatorConfig, match="tau must be a power of two, got 12"):
        bl.make_fixed_tau("f", "count", 1, 12)
    with pytest.raises(InvalidOperatorConfig, match="statistic must be one of"):
        bl.make_fixed_tau("f", "median", 1, 8)


def test_random_tau_draws_the_papers_candidates():
    rng = np.random.Generator(np.random.PCG64(5))
    draws = [bl.random_tau(rng) for _ in range(400)]
    assert set(draws) <= set(bl.RANDOM_TAU_CANDIDATES)
    assert bl.RANDOM_TAU_CANDIDATES[0] == 2 and bl.RANDOM_TAU_CANDIDATES[-1] == 2**20
    assert len(set(draws)) == 20


@pytest.mark.parametrize("dyadic", [True, False])
def test_fixed_tau_k_selection_example_g(dyadic):
    for k, want in ((1, 7), (2, 5), (3, 4)):
        spec = bl.make_fixed_tau_k_selection(
            "m", 8, 2, Fraction(1, 10), 8, k=k, dyadic=dyadic, delta_mode="zero"
        )
        assert sum(lv.epsilon for lv in spec.levels) == 2
        state, totals = bl.fixed_tau_k_selection_init(spec), {}
        for i, x in enumerate([7, 3, 5, 4, 1]):
            bands, _, totals = ul.split_tick(totals, [(f"u{i}", x - 1, 1)], 8)
            state, rel = bl.fixed_tau_k_selection_step(spec, state, bands, ZeroNoise())
        assert rel.value == want
        assert ks.rank_error([1, 0, 1, 1, 1, 0, 1, 0], k, rel.value) == 0


def test_fixed_tau_k_selection_margins():
    spec = bl.make_fixed_tau_k_selection("m", 8, 2, Fraction(1, 10), 4, delta_mode="eq3")
    state, rel = bl.fixed_tau_k_selection_step(
        spec, bl.fixed_tau_k_selection_init(spec), (), ZeroNoise()
    )
    per_bin = ul.noise_e(1, Fraction(1, 2) / 4, Fraction(1, 80))
    assert rel.margin == pytest.approx(2 * per_bin) and rel.value == 0
    assert math.isfinite(rel.margin)


def test_baseline_states_round_trip():
    """Plain-data states: FixedTau, FixedTauKSelection and AdvCompMax survive JSON."""
    noise = KeyedNoise(KEY)
    fixed = bl.make_fixed_tau("f", "histogram", 1, 4, bins=2)
    f_state = bl.fixed_tau_init(fixed)
    for bands in (((1, 2),), (), ((0, 1), (3, 0))):
        f_state, _ = bl.fixed_tau_step(fixed, f_state, bands, noise)
    ksel = bl.make_fixed_tau_k_selection("k", 5, 1, Fraction(1, 10), 4, delta_mode="chernoff")
    k_state = bl.fixed_tau_k_selection_init(ksel)
    for bands in (((1, 0, 2),), ((0, 0, 0, 0, 1),)):
        k_state, _ = bl.fixed_tau_k_selection_step(ksel, k_state, bands, noise)
    amax = bl.make_advcomp_max("m", 4, 2, 10)
    m_state, _ = bl.advcomp_max_step(amax, bl.advcomp_max_init(amax), [3, 1, 0, 0], noise)
    for cls, state in (
        (bl.FixedTauState, f_state),
        (bl.FixedTauKSelectionState, k_state),
        (bl.AdvCompMaxState, m_state),
    ):
        data = orjson.loads(orjson.dumps(state_codec.to_json(state)))
        assert state_codec.from_json(cls, data) == state
