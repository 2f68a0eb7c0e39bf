"""Per-cell user-level means of Rameshwar et al.: grouping, mechanisms, worked examples, properties.

Worked examples E1-E5 and the stand-in count vector are ours (docs/papers.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections import Counter
from fractions import Fraction

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators.cells import cell_mean as cm
from dpstream.operators.cells import pseudo_users as pu
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, RecordingNoise, SeededNoise, ZeroNoise
from dpstream.operators.selection import exponential_mechanism as em
from dpstream.operators.selection import private_interval as pi
from dpstream.operators.selection import private_quantile as pq
from tests.noise_doubles import NodeNoise

KEY = b"cell-means-test-key-0123456789abcdef"
CELL = ("speed", "8a2a1072b59ffff", 17)

E1 = {"u1": [10, 20, 30, 40], "u2": [50, 60], "u3": [70, 80], "u4": [90, 100]}
E2_COUNTS = {"u1": 10, "u2": 6, "u3": 4, "u4": 2, "u5": 1}

# The stand-in count vector (ours; it matches the ITMS numbers of the paper's Sec. IV),
# value x multiplicity, sorted descending.
STAND_IN = (
    "417 359x14 312 305 296 290 280 274 272 265 264 261 260 252x2 236 226 184 183 174 169 "
    "155 145 133 129 122 102 100 95 94 92 91 85 81 80 79x2 68 63 62 60 57 56 55 54 50 48 "
    "47x48 46x2 44x2 43x2 42x2 41x2 40x2 39x2 37 36 35x5 33x5 32x4 31x4 30 29x2 28x2 27x6 "
    "26x2 25x3 24x4 23x4 22x5 21x4 20 19 18 17 16x2 15 14x2 13x2 12x4 11x2 10x4 9x3 8x4 "
    "7x2 6x2 5x3 4x3 3x3 1"
)


def stand_in_counts() -> dict[str, int]:
    values: list[int] = []
    for token in STAND_IN.split():
        value, _, times = token.partition("x")
        values += [int(value)] * int(times or 1)
    return {f"user{i:03d}": m for i, m in enumerate(values)}


def make(mechanism: str = "baseline", **kw) -> cm.CellMeanSpec:
    args = {"epsilon": 1, "lower": 0, "upper": 100, "step": 1, "counts_public": True}
    args.update(kw)
    return cm.make_cell_mean(mechanism, **args)


def aggs(spec: cm.CellMeanSpec, data: dict[str, list[float]]) -> list[cm.UserCellAggregate]:
    return [cm.aggregate(spec, user, values) for user, values in data.items()]


def prepared(spec: cm.CellMeanSpec, data: dict[str, list[float]]) -> cm.PreparedCell:
    return cm.prepare(spec, aggs(spec, data))


def concat_chunks(counts: dict[str, int], m_ub: int) -> list[list[tuple[str, int]]]:
    """An equivalent form of WrapAround (Alg. 1): concatenate prefixes, cut, keep full."""
    order = sorted(counts.items(), key=lambda um: (-um[1], um[0]))
    flat = [(user, j) for user, m in order for j in range(min(m, m_ub))]
    return [flat[i : i + m_ub] for i in range(0, len(flat) - m_ub + 1, m_ub)]


def expand(array: pu.PseudoUser) -> list[tuple[str, int]]:
    return [(user, j) for user, start, stop in array for j in range(start, stop)]


counts_strategy = st.dictionaries(
    st.sampled_from([f"u{i:02d}" for i in range(30)]), st.integers(1, 40), min_size=1
)


# ---------------------------------------------------------------------------------------
# E1: the tiny dataset, m_UB = 3


def test_e1_baseline() -> None:
    spec = make("baseline")
    prep = prepared(spec, E1)
    assert (prep.n_samples, prep.m_star, prep.total) == (10, 4, 550)
    assert cm.statistic(spec, prep) == 55
    assert cm.sensitivity(spec, prep) == 40
    for eps, scale in ((1, 40.0), (Fraction(1, 2), 80.0)):
        spec_eps = make("baseline", epsilon=eps)
        recorder = RecordingNoise(ZeroNoise())
        out = cm.release_cell(spec_eps, CELL, aggs(spec_eps, E1), recorder)
        assert out.release is not None and out.release.noise_scale == scale
        # Lap(Delta / eps) on the lattice Delta / D: discrete scale D / eps, one draw.
        assert recorder.calls == [((*CELL, "mean"), Fraction(1024) / Fraction(eps), 0)]
        assert out.release.value == 55.0  # 55 is on the lattice 40 / 1024


def test_e1_wrap_around() -> None:
    counts = {u: len(v) for u, v in E1.items()}
    arrays = pu.wrap_around(counts, 3)
    assert arrays == (
        (("u1", 0, 3),),
        (("u2", 0, 2), ("u3", 0, 1)),
        (("u3", 1, 2), ("u4", 0, 2)),
    )
    spec = make("array_averaging", grouping="wrap_around", m_ub=3)
    prep = prepared(spec, E1)
    assert prep.sorted_means == (20, 60, 90)  # sample 40 dropped
    assert cm.statistic(spec, prep) == Fraction(170, 3)  # 56.667
    assert cm.sensitivity(spec, prep) == Fraction(200, 3)  # 2U/K = 66.667
    assert prep.used_samples == 9 and prep.kept_users == ("u1", "u2", "u3", "u4")


def test_e1_best_fit() -> None:
    counts = {u: len(v) for u, v in E1.items()}
    assert pu.best_fit(counts, 3) == (
        (("u1", 0, 3),),
        (("u2", 0, 2),),
        (("u3", 0, 2),),
        (("u4", 0, 2),),
    )
    spec = make("array_averaging", m_ub=3)
    prep = prepared(spec, E1)
    assert prep.sorted_means == (20, 55, 75, 95)
    assert cm.statistic(spec, prep) == Fraction(245, 4)  # 61.25
    assert cm.sensitivity(spec, prep) == 25
    proxy = pu.proxy_sensitivity(counts, 3, Fraction(100))
    assert proxy == Fraction(100, 3) <= pu.baseline_sensitivity(counts, Fraction(100)) == 40


# ---------------------------------------------------------------------------------------
# E2: counts (10, 6, 4, 2, 1)


def test_e2_eq10_and_median() -> None:
    values = [math.sqrt(pu.eq10_objective(E2_COUNTS, m)) for m in range(1, 11)]
    expected = [5.000, 6.364, 6.928, 7.500, 7.603, 7.757, 7.559, 7.425, 7.333, 7.273]
    assert [round(v, 3) for v in values] == expected
    assert pu.eq10_m_ub(E2_COUNTS) == 6
    assert pu.median_m_ub(E2_COUNTS) == 4
    assert pu.opt_gain(E2_COUNTS) == Fraction(50, 23)


def test_e2_groupings() -> None:
    u = Fraction(100)
    # m_UB = 4: sum r = 15, K = 3; wrap drops u4, u5; BestFit {u1}{u2}{u3}{u4,u5}.
    assert pu.wrap_count(E2_COUNTS, 4) == 3
    assert pu.users_of(pu.wrap_around(E2_COUNTS, 4)) == ("u1", "u2", "u3")
    best = pu.best_fit(E2_COUNTS, 4)
    assert [[s[0] for s in a] for a in best] == [["u1"], ["u2"], ["u3"], ["u4", "u5"]]
    delta_f = pu.baseline_sensitivity(E2_COUNTS, u)
    proxy = pu.proxy_sensitivity(E2_COUNTS, 4, u)
    assert round(float(delta_f), 3) == 43.478 and round(float(proxy), 3) == 26.667
    assert round(float(delta_f / proxy), 3) == 1.630 >= float(pu.opt_gain(E2_COUNTS)) / 2
    # m_UB = 6: sum r = 19, K = 3, wrap u1 | u2 | u3+u4; BestFit w = 6, 6, 6, 1.
    wrap = pu.wrap_around(E2_COUNTS, 6)
    assert [[s[0] for s in a] for a in wrap] == [["u1"], ["u2"], ["u3", "u4"]]
    best6 = pu.best_fit(E2_COUNTS, 6)
    assert [[s[0] for s in a] for a in best6] == [["u1"], ["u2"], ["u3", "u4"], ["u5"]]
    assert [pu.fill(a) for a in best6] == [6, 6, 6, 1]
    assert u / len(best6) == 25 and 2 * u / len(wrap) == Fraction(200, 3)


# ---------------------------------------------------------------------------------------
# E3: Levy's private interval


def test_e3_private_interval() -> None:
    means = [Fraction(v) for v in (18, 21, 22, 24, 60)]
    lo, hi, tau = Fraction(0), Fraction(100), Fraction(10)
    assert pi.centers(lo, hi, tau) == [Fraction(k) for k in range(5, 100, 10)]
    nb = pi.bin_count(lo, hi, tau)
    assert [lo + (pi.bin_of(m, lo, tau, nb) - Fraction(1, 2)) * tau for m in means] == [
        15, 25, 25, 25, 55
    ]  # fmt: skip
    assert pi.scores(means, lo, hi, tau) == [5, 4, 1, 4, 4, 4, 5, 5, 5, 5]
    probs = pi.interval_probabilities(means, lo, hi, tau, Fraction(2))
    assert round(probs[2], 5) == 0.38923
    assert [round(probs[k], 5) for k in (1, 3, 4, 5)] == [0.08685] * 4
    assert [round(probs[k], 5) for k in (0, 6, 7, 8, 9)] == [0.05268] * 5
    # The mode (25) is what a noiseless source picks; the oracle's "if mu^ = 25" case.
    chosen = pi.private_interval(
        means, lo, hi, tau, Fraction(2), 1, em.NoiseBits(ZeroNoise(), ("x",))
    )
    assert (chosen.center, chosen.lower, chosen.upper) == (25, 10, 40)
    spec = make("levy", epsilon=2)
    prep = dataclasses.replace(
        prepared(spec, E1),
        sorted_means=tuple(means),
        prefix=tuple(itertools.accumulate(means, initial=Fraction(0))),
        n_arrays=5,
    )
    interval = (chosen.lower, chosen.upper)
    assert cm.statistic(spec, prep, interval) == 25  # projections (18, 21, 22, 24, 40)
    assert cm.sensitivity(spec, prep, interval) == 6
    assert cm.sensitivity(spec, prep, interval) / cm.mean_budget(spec) == 6  # Lap(6)


def test_e3_tau_formula() -> None:
    tau = pi.tau(Fraction(100), 20, 50, Fraction(1, 5))
    assert round(float(tau), 3) == 23.018
    assert pi.bin_count(Fraction(0), Fraction(100), tau) == 5


# ---------------------------------------------------------------------------------------
# E4: private quantile


def test_e4_private_quantile() -> None:
    values = [Fraction(v) for v in (2, 4, 8)]
    starts, sizes = pq.rank_groups(values, Fraction(0), Fraction(10), Fraction(1))
    assert sizes == [2, 2, 4, 2] and starts == [0, 2, 4, 8]  # the lengths of [0,2] ... [8,10]
    probs = pq.group_probabilities(values, Fraction(1, 2), Fraction(1), 1, 0, 10, Fraction(1))
    assert [round(p, 4) for p in probs] == [0.1440, 0.2374, 0.4747, 0.1440]


def test_quantile_levels() -> None:
    assert pq.levels("fixed", Fraction(1), 164) == (Fraction(1, 10), Fraction(9, 10))
    assert pq.levels("optimized", Fraction(1), 164) == (Fraction(2, 164), Fraction(162, 164))
    assert pq.levels("optimized", Fraction(3, 4), 164) == (Fraction(3, 164), Fraction(161, 164))
    assert pq.levels("optimized", Fraction(1, 10), 20) == (Fraction(1, 2), Fraction(1, 2))
    with pytest.raises(InvalidOperatorConfig, match="quantile must be one of"):
        pq.levels("median", Fraction(1), 10)


# ---------------------------------------------------------------------------------------
# The stand-in count vector


def test_stand_in_vector() -> None:
    counts = stand_in_counts()
    ms = list(counts.values())
    assert (len(ms), sum(ms), max(ms), min(ms)) == (217, 17166, 417, 1)
    assert pu.median_m_ub(counts) == 46
    assert pu.eq10_m_ub(counts) == 47
    assert pu.wrap_count(counts, 47) == 160 and len(pu.best_fit(counts, 47)) == 164
    assert pu.wrap_count(counts, 46) == 161 and len(pu.best_fit(counts, 46)) == 165
    assert round(float(pu.opt_gain(counts)), 4) == 5.2714


# ---------------------------------------------------------------------------------------
# Grouping properties


@given(counts_strategy, st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_wrap_around_properties(counts: dict[str, int], m_ub: int) -> None:
    arrays = pu.wrap_around(counts, m_ub)
    assert [expand(a) for a in arrays] == concat_chunks(counts, m_ub)
    assert len(arrays) == pu.wrap_count(counts, m_ub)
    assert all(pu.fill(a) == m_ub for a in arrays)
    where: dict[str, list[int]] = {}
    for i, array in enumerate(arrays):
        for user, _, _ in array:
            where.setdefault(user, []).append(i)
    for user, idx in where.items():
        assert len(idx) <= 2 and idx == list(range(idx[0], idx[0] + len(idx)))
        used = sorted(j for a in arrays for u, j in expand(a) if u == user)
        assert used == list(range(len(used)))  # a prefix of the user's samples


@given(counts_strategy, st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_best_fit_properties(counts: dict[str, int], m_ub: int) -> None:
    arrays = pu.best_fit(counts, m_ub)
    seen = Counter(user for a in arrays for user, _, _ in a)
    assert set(seen) == set(counts) and set(seen.values()) == {1}
    for array in arrays:
        assert 0 < pu.fill(array) <= m_ub
        for user, start, stop in array:
            assert (start, stop) == (0, min(counts[user], m_ub))
    assert sum(pu.fill(a) for a in arrays) == sum(pu.clipped_counts(counts, m_ub).values())
    k_bar = len(arrays)
    assert pu.wrap_count(counts, m_ub) <= k_bar <= len(counts)
    assert k_bar >= sum(m >= m_ub for m in counts.values())
    # Deterministic under ties: the dict's insertion order does not matter.
    reordered = dict(sorted(counts.items(), reverse=True))
    assert pu.best_fit(reordered, m_ub) == arrays
    assert pu.wrap_around(reordered, m_ub) == pu.wrap_around(counts, m_ub)


def test_best_fit_picks_the_fullest_fitting_array_lowest_index() -> None:
    # m_UB = 10: u1 (6) opens A1, u2 (6) opens A2, u3 (4) fits both (w 6), goes to A1,
    # u4 (3) fits only A2, u5 (3) opens A3, u6 (1) fits A2 (w 9) and A3 (w 3): A2.
    counts = {"u1": 6, "u2": 6, "u3": 4, "u4": 3, "u5": 3, "u6": 1}
    arrays = pu.best_fit(counts, 10)
    assert [[s[0] for s in a] for a in arrays] == [["u1", "u3"], ["u2", "u4", "u6"], ["u5"]]


@given(counts_strategy, st.data())
@settings(max_examples=60, deadline=None)
def test_grouping_depends_on_counts_only(counts: dict[str, int], data: st.DataObject) -> None:
    for mechanism, grouping in (("array_averaging", "best_fit"), ("levy", "wrap_around")):
        spec = make(mechanism, grouping=grouping)
        one = {
            u: data.draw(st.lists(st.integers(0, 100), min_size=m, max_size=m))
            for u, m in counts.items()
        }
        two = {
            u: data.draw(st.lists(st.integers(0, 100), min_size=m, max_size=m))
            for u, m in counts.items()
        }
        p1, p2 = prepared(spec, one), prepared(spec, two)
        assert (p1.m_ub, p1.n_arrays, p1.kept_users, p1.used_samples) == (
            p2.m_ub, p2.n_arrays, p2.kept_users, p2.used_samples
        )  # fmt: skip


# ---------------------------------------------------------------------------------------
# Sensitivity brute force


def brute_force_max_change(spec, data, interval=None) -> tuple[Fraction, dict[str, Fraction]]:
    """max over users of |f(D_lo) - f(D_hi)| (user's values all lower vs all upper), and the
    largest |f(D) - f(D')| over D' in {D_lo, D_hi}, per user."""
    base = cm.statistic(spec, prepared(spec, data), interval)
    per_user = {}
    for user, values in data.items():
        f_lo = cm.statistic(spec, prepared(spec, {**data, user: [0] * len(values)}), interval)
        f_hi = cm.statistic(spec, prepared(spec, {**data, user: [100] * len(values)}), interval)
        per_user[user] = abs(f_hi - f_lo)
        assert abs(f_hi - base) <= per_user[user] and abs(f_lo - base) <= per_user[user]
    return max(per_user.values()), per_user


datasets = st.dictionaries(
    st.sampled_from([f"u{i}" for i in range(12)]),
    st.lists(st.integers(0, 100), min_size=1, max_size=15),
    min_size=1,
)


@given(datasets, st.sampled_from(["baseline", "array_averaging", "levy", "quantile"]),
       st.sampled_from(pu.GROUPINGS), st.sampled_from(["median", "eq10", 3]))  # fmt: skip
@settings(max_examples=150, deadline=None)
def test_sensitivity_bounds_every_user(data, mechanism, grouping, m_ub) -> None:
    spec = make(mechanism, grouping=grouping, m_ub=m_ub)
    interval = (Fraction(20), Fraction(45)) if mechanism in ("levy", "quantile") else None
    worst, _ = brute_force_max_change(spec, data, interval)
    assert worst <= cm.sensitivity(spec, prepared(spec, data), interval)


def test_sensitivity_is_tight_where_spec_003_says() -> None:
    data = {"a": [5] * 6, "b": [50, 60], "c": [70], "d": [1, 2, 3]}
    spec = make("baseline")
    _, per_user = brute_force_max_change(spec, data)
    assert per_user["a"] == cm.sensitivity(spec, prepared(spec, data)) == Fraction(600, 12)
    best = make("array_averaging", m_ub=3)
    _, per_user = brute_force_max_change(best, data)
    # "a" fills an array alone (r = m_UB = 3): moving its values moves f by U / K_bar.
    assert per_user["a"] == cm.sensitivity(best, prepared(best, data)) == Fraction(100, 3)


# ---------------------------------------------------------------------------------------
# PrivateInterval


@given(
    st.lists(st.integers(0, 100), min_size=1, max_size=8),
    st.integers(9, 60),
    st.sampled_from([Fraction(1, 2), Fraction(1), Fraction(2)]),
    st.sampled_from([1, 2]),
)
@settings(max_examples=60, deadline=None)
def test_private_interval_neighbour_ratio(values, tau_int, eps, s) -> None:
    lo, hi, tau = Fraction(0), Fraction(100), Fraction(tau_int)
    means = [Fraction(v) for v in values]
    probs = pi.interval_probabilities(means, lo, hi, tau, eps, s)
    assert math.fsum(probs) == pytest.approx(1, abs=1e-12)
    bound = math.exp(float(eps) / 2) * (1 + 1e-9)
    # A user moves one mean (BestFit, s = 1) or two (WrapAround, s = 2) anywhere: only
    # their bins matter, so every combination of bin centres is tried.
    spots = [c for c in pi.centers(lo, hi, tau) if c <= hi] + [hi]
    for moved in itertools.combinations(range(len(means)), min(s, len(means))):
        for targets in itertools.product(spots, repeat=len(moved)):
            other = list(means)
            for i, t in zip(moved, targets, strict=True):
                other[i] = t
            probs2 = pi.interval_probabilities(other, lo, hi, tau, eps, s)
            assert max(p / q for p, q in zip(probs, probs2, strict=True)) <= bound


@given(
    st.lists(st.integers(0, 100), min_size=1, max_size=20),
    st.integers(1, 120),
    st.integers(0, 10**6),
)
@settings(max_examples=150, deadline=None)
def test_private_interval_bounds(values, tau_int, seed) -> None:
    lo, hi, tau = Fraction(0), Fraction(100), Fraction(tau_int)
    means = tuple(sorted(Fraction(v) for v in values))
    bits = em.NoiseBits(SeededNoise(seed), ("i",))
    got = pi.private_interval(means, lo, hi, tau, Fraction(1), 1, bits)
    assert 0 <= got.lower <= got.upper <= 100
    assert got.upper - got.lower <= min(3 * tau, hi - lo)
    prep = cm.PreparedCell(
        n_users=len(means), n_samples=len(means), total=0, m_star=1, m_ub=1,
        n_arrays=len(means), sorted_means=means,
        prefix=tuple(itertools.accumulate(means, initial=Fraction(0))), used_samples=len(means),
        kept_users=(), capped_count=0, centered_sum=0,
    )  # fmt: skip
    f = cm.projected_mean(prep, got.lower, got.upper)
    assert got.lower <= f <= got.upper
    assert f == sum(min(max(m, got.lower), got.upper) for m in means) / len(means)


# ---------------------------------------------------------------------------------------
# Private quantile


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=4),
    st.sampled_from([Fraction(1, 10), Fraction(1, 2), Fraction(9, 10)]),
    st.sampled_from([1, 2]),
)
@settings(max_examples=40, deadline=None)
def test_quantile_neighbour_density_ratio(values, level, s) -> None:
    lo, hi, step, eps_q = Fraction(0), Fraction(10), Fraction(1, 4), Fraction(1)
    zs = [Fraction(v, 4) for v in values]
    probs = pq.point_probabilities(zs, level, eps_q, s, lo, hi, step)
    assert len(probs) == 40 and math.fsum(probs) == pytest.approx(1, abs=1e-12)
    bound = math.exp(float(eps_q)) * (1 + 1e-9)
    spots = [Fraction(k, 8) for k in range(0, 81, 6)]  # on and between grid points
    for moved in itertools.combinations(range(len(zs)), min(s, len(zs))):
        for targets in itertools.product(spots, repeat=len(moved)):
            other = list(zs)
            for i, t in zip(moved, targets, strict=True):
                other[i] = t
            probs2 = pq.point_probabilities(other, level, eps_q, s, lo, hi, step)
            assert max(p / q for p, q in zip(probs, probs2, strict=True)) <= bound


@given(st.lists(st.integers(-50, 150), min_size=1, max_size=30), st.integers(0, 10**6))
@settings(max_examples=100, deadline=None)
def test_quantile_output_on_the_grid_inside_bounds(values, seed) -> None:
    bits = em.NoiseBits(SeededNoise(seed), ("q",))
    y = pq.private_quantile([Fraction(v) for v in values], Fraction(1, 10), Fraction(1, 4), 1,
                           Fraction(0), Fraction(100), Fraction(5), bits)  # fmt: skip
    assert 0 < y < 100 and (y - Fraction(5, 2)) % 5 == 0


# ---------------------------------------------------------------------------------------
# Eq. (10), scaling, Lemmas III.1 and III.2


@given(counts_strategy)
@settings(max_examples=200, deadline=None)
def test_eq10_argmax_is_a_count_and_matches_brute_force(counts) -> None:
    m_ub = pu.eq10_m_ub(counts)
    lo, hi = min(counts.values()), max(counts.values())
    assert m_ub in counts.values() and lo <= m_ub <= hi
    brute = max(range(lo, hi + 1), key=lambda m: (pu.eq10_objective(counts, m), -m))
    assert m_ub == brute


@given(counts_strategy, st.integers(2, 6))
@settings(max_examples=100, deadline=None)
def test_scaling_identities(counts, lam) -> None:
    scaled = {u: lam * m for u, m in counts.items()}
    replicated = {f"{u}/{i}": m for u, m in counts.items() for i in range(lam)}
    for rule in (pu.eq10_m_ub, pu.median_m_ub):
        m_ub = rule(counts)
        assert rule(scaled) == lam * m_ub
        assert rule(replicated) == m_ub
        # Sample scaling: K and K_bar unchanged.
        assert pu.wrap_count(scaled, lam * m_ub) == pu.wrap_count(counts, m_ub)
        assert len(pu.best_fit(scaled, lam * m_ub)) == len(pu.best_fit(counts, m_ub))
        # User scaling: K^ = floor(lam sum min / m_UB), not lam K.
        clipped = sum(pu.clipped_counts(counts, m_ub).values())
        assert pu.wrap_count(replicated, m_ub) == (lam * clipped) // m_ub


def test_lemmas_iii_1_and_iii_2_on_random_count_vectors() -> None:
    rng = random.Random(3)
    u = Fraction(1)
    for _ in range(2000):
        counts = {f"u{i}": rng.choice([1, 2, 3, 5, 8, 20, 100]) * rng.randint(1, 9)
                  for i in range(rng.randint(1, 25))}  # fmt: skip
        ms = list(counts.values())
        m_star, n = max(ms), sum(ms)
        # Lemma III.1, Delta_f = U m*/N >= U m_UB / S(m_UB), cross-multiplied (integers).
        for m_ub in range(1, m_star + 1):
            assert m_star * sum(min(m, m_ub) for m in ms) >= m_ub * n
        median = pu.median_m_ub(counts)
        gain = pu.baseline_sensitivity(counts, u) / pu.proxy_sensitivity(counts, median, u)
        assert gain >= pu.opt_gain(counts) / 2  # Lemma III.2


# ---------------------------------------------------------------------------------------
# The release path


@pytest.mark.parametrize(
    ("mechanism", "grouping"),
    [("baseline", "best_fit"), ("array_averaging", "best_fit"), ("array_averaging", "wrap_around"),
     ("levy", "best_fit"), ("levy", "wrap_around"), ("quantile", "best_fit")],
)  # fmt: skip
def test_release_is_order_independent_and_replays_identically(mechanism, grouping) -> None:
    spec = make(mechanism, grouping=grouping, quantile="optimized")
    data = {f"user{i}": [(7 * i + 13 * j) % 101 for j in range(1 + i % 7)] for i in range(25)}
    items = aggs(spec, data)
    first = cm.release_cell(spec, CELL, items, KeyedNoise(KEY))
    again = cm.release_cell(spec, CELL, list(reversed(items)), KeyedNoise(KEY))
    assert first == again
    assert orjson.dumps(dataclasses.asdict(first.release)) == orjson.dumps(
        dataclasses.asdict(again.release)
    )
    other_cell = cm.release_cell(spec, (*CELL[:2], 18), items, KeyedNoise(KEY))
    assert other_cell.release.value != first.release.value


def test_exactly_one_mean_draw_and_public_node_ids() -> None:
    spec = make("quantile", grouping="best_fit")
    data = {f"user{i}": [(11 * i + 3 * j) % 101 for j in range(1 + i % 5)] for i in range(30)}
    recorder = RecordingNoise(SeededNoise(4))
    out = cm.release_cell(spec, CELL, aggs(spec, data), recorder)
    mean_calls = [c for c in recorder.calls if c[0] == (*CELL, "mean")]
    assert len(mean_calls) == 1
    assert mean_calls[0][1] == Fraction(1024) / (spec.epsilon / 2)
    others = {c[0][: len(CELL) + 2] for c in recorder.calls if c[0] != (*CELL, "mean")}
    assert others == {(*CELL, "quantile", "lower"), (*CELL, "quantile", "upper")}
    assert out.charge.cell == CELL and out.charge.epsilon == 1
    assert out.charge.users == tuple(sorted(data)) == out.kept_users


def test_noise_is_added_on_the_lattice() -> None:
    spec = make("array_averaging", grouping="wrap_around", m_ub=3)
    out = cm.release_cell(spec, CELL, aggs(spec, E1), NodeNoise(5))
    rho = Fraction(200, 3) / 1024
    f = Fraction(170, 3)
    assert out.release.value == float((math.floor(f / rho + Fraction(1, 2)) + 5) * rho)
    assert abs(out.release.value - 5 * float(rho) - float(f)) <= float(rho) / 2


def test_release_value_units_follow_the_grid() -> None:
    spec = cm.make_cell_mean("baseline", 1, "0", "65", "0.01", counts_public=True)
    agg = cm.aggregate(spec, "u", [10.004, 10.006, 70.0, -3.0])
    assert agg.head == (1000, 1001, 6500, 0) and agg.total == 8501 and agg.count == 4
    out = cm.release_cell(spec, CELL, [agg], ZeroNoise())
    assert out.release.value == pytest.approx(21.2525, abs=65 / 1024 / 2)  # lattice rounding
    assert out.release.noise_scale == pytest.approx(65.0)  # U m*/N / eps = 65 * 4 / 4


def test_add_value_is_stage_one_fold() -> None:
    spec = make("levy", head_cap=3, step="0.5")
    agg = None
    for v in [10.2, 99.0, 120.0, -1.0, 50.24]:
        agg = cm.add_value(spec, agg, "u", v)
    # 10.2 -> 20 units (10.0), 99 -> 198, 120 -> clip 100 -> 200, -1 -> 0, 50.24 -> 100.
    assert agg == cm.UserCellAggregate("u", 5, 20 + 198 + 200 + 0 + 100, (20, 198, 200))
    assert cm.aggregate(spec, "u", [10.2, 99.0, 120.0, -1.0, 50.24]) == agg
    with pytest.raises(InvalidOperatorConfig, match="value must be finite"):
        cm.add_value(spec, agg, "u", math.nan)
    with pytest.raises(InvalidOperatorConfig, match="user must be the aggregate's user"):
        cm.add_value(spec, agg, "v", 1.0)


def test_empty_cell_with_public_counts_releases_nothing() -> None:
    spec = make("levy")
    out = cm.release_cell(spec, CELL, [], SeededNoise(1))
    assert out == cm.CellOutcome(release=None, kept_users=(), charge=None)


def test_wrap_around_does_not_charge_dropped_users() -> None:
    spec = make("array_averaging", grouping="wrap_around", m_ub=4)
    data = {"u1": [1] * 10, "u2": [2] * 6, "u3": [3] * 4, "u4": [4] * 2, "u5": [5]}
    out = cm.release_cell(spec, CELL, aggs(spec, data), SeededNoise(2))
    assert out.kept_users == ("u1", "u2", "u3")  # E2: u4, u5 fall in the dropped tail
    assert out.release.n_users == 3 and out.release.n_samples == 12


def test_m_ub_is_capped_by_head_cap_and_m_star() -> None:
    spec = make("array_averaging", m_ub=50, head_cap=3)
    prep = prepared(spec, {"a": [1] * 10, "b": [2] * 2})
    assert prep.m_ub == 3
    spec = make("array_averaging", m_ub=50)
    assert prepared(spec, {"a": [1] * 10, "b": [2] * 2}).m_ub == 10


def test_malformed_aggregates() -> None:
    spec = make("baseline")
    good = cm.aggregate(spec, "u", [1, 2])
    with pytest.raises(cm.MalformedAggregates, match="distinct users"):
        cm.prepare(spec, [good, good])
    with pytest.raises(cm.MalformedAggregates, match=r"head must hold min\(count, head_cap\) = 2"):
        cm.prepare(spec, [cm.UserCellAggregate("u", 2, 3, (1,))])
    # Out-of-bound values are clamped, never rejected.
    wild = cm.prepare(spec, [cm.UserCellAggregate("u", 2, 900, (500, -4))])
    assert wild.total == 200


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mechanism": "median"}, "mechanism must be one of"),
        ({"counts_public": False}, "mechanism must be 'noisy_ratio' unless counts_public is True"),
        ({"epsilon": 0}, "epsilon must be finite and > 0, got Fraction(0, 1)"),
        ({"lower": "0.5"}, "lower must be a multiple of the grid step 1, got Fraction(1, 2)"),
        ({"upper": 0}, "upper must be > lower = 0, got Fraction(0, 1)"),
        ({"grouping": "first_fit"}, "grouping must be one of"),
        ({"m_ub": "mean"}, "m_ub must be one of ('median', 'eq10') or an integer"),
        ({"m_ub": 0}, "m_ub must be >= 1, got 0"),
        ({"gamma": 1}, "gamma must be in (0, 1), got Fraction(1, 1)"),
        ({"quantile": "median"}, "quantile must be one of"),
        ({"quantile_step": 3}, "quantile_step must be a divisor of upper - lower = 100"),
        ({"head_cap": 0}, "head_cap must be >= 1, got 0"),
        ({"lattice": 0}, "lattice must be >= 1, got 0"),
        ({"mechanism": "noisy_ratio"}, "contribution_cap must be an integer for noisy_ratio"),
        ({"mechanism": "noisy_ratio", "contribution_cap": 9, "head_cap": 4},
         "contribution_cap must be <= head_cap = 4, got 9"),
        ({"counts_public": 1}, "counts_public must be a bool, got 1"),
        ({"any_subset": 1}, "any_subset must be a bool, got 1"),
        ({"any_subset": True}, "any_subset must be False when counts_public is True, got True"),
    ],
)  # fmt: skip
def test_make_cell_mean_rejects_bad_parameters(kwargs, message) -> None:
    args = {"mechanism": "levy", "epsilon": 1, "lower": 0, "upper": 100, "step": 1,
            "counts_public": True}  # fmt: skip
    args.update(kwargs)
    mechanism = args.pop("mechanism")
    with pytest.raises(InvalidOperatorConfig) as info:
        cm.make_cell_mean(mechanism, **args)
    assert message in str(info.value)


def test_config_values_are_exact_rationals() -> None:
    spec = cm.make_cell_mean("levy", 0.1, "0", "65", 0.01, counts_public=True)
    assert spec.epsilon == Fraction(1, 10) and spec.step == Fraction(1, 100)
    assert (spec.lo, spec.hi, spec.value_range) == (0, 6500, 6500)
    assert spec.m_ub == "eq10" and make("array_averaging").m_ub == "median"


# ---------------------------------------------------------------------------------------
# Strict mode (ours, docs/papers.md)


def strict(**kw) -> cm.CellMeanSpec:
    args = {"epsilon": 1, "lower": 0, "upper": 100, "step": 1, "contribution_cap": 3}
    args.update(kw)
    return cm.make_cell_mean("noisy_ratio", **args)


def test_strict_is_the_default_and_releases_even_when_empty() -> None:
    spec = strict()
    assert spec.counts_public is False
    recorder = RecordingNoise(ZeroNoise())
    out = cm.release_cell(spec, CELL, [], recorder)
    assert out.release.value == 50.0 and out.release.n_users is None
    assert [c[0] for c in recorder.calls] == [(*CELL, "sum"), (*CELL, "count")]
    assert [c[1] for c in recorder.calls] == [Fraction(600), Fraction(6)]  # cU/(eps/2), c/(eps/2)


@given(datasets)
@settings(max_examples=100, deadline=None)
def test_strict_sum_and_count_sensitivity_under_add_remove(data) -> None:
    spec = strict()
    full = prepared(spec, data)
    for user in data:
        rest = prepared(spec, {u: v for u, v in data.items() if u != user})
        assert abs(full.centered_sum - rest.centered_sum) <= 3 * 100  # c U (doubled units)
        assert abs(full.capped_count - rest.capped_count) <= 3
    out = cm.release_cell(spec, CELL, aggs(spec, data), ZeroNoise())
    capped = [v for vals in data.values() for v in vals[:3]]
    assert out.release.value == pytest.approx(sum(capped) / len(capped))
    assert out.kept_users == tuple(sorted(data))


# Exhaustive worst case of the strict mode's sum and count, under both relations: every
# value sequence of one user (values in STRICT_GRID, lengths 1..2c) against every neighbour
# (add/remove: the user absent; any subset: every subsequence, the empty one included),
# beside another user's fixed data, through the real ``prepare``. Lower 0, upper 4, step 1:
# grid units are values, U = 4, centred values 2x - 4 are -4, 0 or 4. Across cells (the
# epoch cap's admission moves a user between cells): tests/statistics/test_cell_mean.py.
STRICT_GRID = (0, 2, 4)  # lo, the midpoint, hi
STRICT_OTHERS = (cm.UserCellAggregate("other", 3, 5, (1, 4, 0)),)


def strict_worst_case(c: int, any_subset: bool) -> tuple[int, int]:
    """max |Delta centred_sum|, max |Delta capped_count| over one user's neighbours."""
    spec = cm.make_cell_mean("noisy_ratio", 1, 0, 4, 1, contribution_cap=c)
    cache: dict[tuple[int, ...], tuple[int, int]] = {}

    def sum_and_count(values: tuple[int, ...]) -> tuple[int, int]:
        if values not in cache:
            user = cm.UserCellAggregate("u", len(values), sum(values), values)
            prep = cm.prepare(spec, STRICT_OTHERS + ((user,) if values else ()))
            cache[values] = (prep.centered_sum, prep.capped_count)
        return cache[values]

    d_sum = d_count = 0
    for n in range(1, 2 * c + 1):
        for values in itertools.product(STRICT_GRID, repeat=n):
            s, k = sum_and_count(values)
            kept_sets = (
                [keep for r in range(n) for keep in itertools.combinations(range(n), r)]
                if any_subset
                else [()]
            )
            for keep in kept_sets:
                s2, k2 = sum_and_count(tuple(values[i] for i in keep))
                d_sum, d_count = max(d_sum, abs(s - s2)), max(d_count, abs(k - k2))
    return d_sum, d_count


def strict_scales(spec: cm.CellMeanSpec) -> tuple[Fraction, Fraction]:
    """The (sum, count) Laplace scales a release draws at, read from the noise source."""
    recorder = RecordingNoise(ZeroNoise())
    cm.release_cell(spec, CELL, [], recorder)
    scales = {node[-1]: scale for node, scale, _ in recorder.calls}
    return scales["sum"], scales["count"]


@pytest.mark.parametrize("c", [1, 2, 3])
@pytest.mark.parametrize("any_subset", [False, True])
def test_strict_scales_are_calibrated_to_the_exact_worst_case_of_each_relation(c, any_subset):
    """scale * (eps / 2) equals (not just bounds) the exhaustive max |Delta|: c U / 2 c U
    for the sum (doubled units, add/remove / any subset), c for the count under both."""
    u = 4
    d_sum, d_count = strict_worst_case(c, any_subset)
    assert (d_sum, d_count) == ((2 if any_subset else 1) * c * u, c)
    spec = cm.make_cell_mean(
        "noisy_ratio", "0.7", 0, u, 1, contribution_cap=c, any_subset=any_subset
    )
    sum_scale, count_scale = strict_scales(spec)
    half = spec.epsilon / 2
    assert sum_scale * half == d_sum == cm.sum_sensitivity(spec)
    assert count_scale * half == d_count == cm.count_sensitivity(spec)


@pytest.mark.parametrize("c", [1, 2, 3])
def test_add_remove_calibration_is_exceeded_under_any_subset(c):
    """The add/remove-user calibration (c U) is what strict cells used whatever the relation:
    under any subset the sum moves by 2 c U, e.g. c values at lo then c at hi, the first c
    dropped: the kept values flip from -U each to +U each."""
    u = 4
    add_remove = cm.make_cell_mean("noisy_ratio", 1, 0, u, 1, contribution_cap=c)
    sum_scale, _ = strict_scales(add_remove)
    calibrated = sum_scale * add_remove.epsilon / 2
    assert calibrated == c * u
    d_sum, _ = strict_worst_case(c, any_subset=True)
    assert d_sum == 2 * c * u > calibrated
    values = (0,) * c + (u,) * c
    full = cm.prepare(add_remove, [cm.UserCellAggregate("u", 2 * c, sum(values), values)])
    later = cm.prepare(add_remove, [cm.UserCellAggregate("u", c, c * u, values[c:])])
    assert (full.centered_sum, later.centered_sum) == (-c * u, c * u)


# ---------------------------------------------------------------------------------------
# Statistical checks


@pytest.mark.statistical
def test_laplace_calibration() -> None:
    """Laplace calibration: the noise on f is Lap(Delta / eps) on a fine lattice.

    n = 10^5 draws. For Laplace(b), |Z| has sd b, so mean |Z| has standard error
    b / sqrt(n) = 0.32% of b: 2% is > 6 standard errors. The sample variance has standard
    error sqrt(20 / n) b^2 (E Z^4 = 24 b^4), 0.71% of 2 b^2, i.e. 0.35% on the std: 2% is
    > 5 standard errors. The lattice (D = 1024) changes both by < 1e-6.
    """
    spec = make("baseline", epsilon=Fraction(1, 2))
    prep = prepared(spec, E1)
    b = float(cm.sensitivity(spec, prep) / spec.epsilon)  # 80
    noise = SeededNoise(99)
    n = 100_000
    errors = [cm.release_prepared(spec, CELL, prep, noise).release.value - 55.0 for _ in range(n)]
    mean_abs = math.fsum(abs(e) for e in errors) / n
    std = math.sqrt(math.fsum(e * e for e in errors) / n)
    assert abs(mean_abs / b - 1) < 0.02
    assert abs(std / (math.sqrt(2) * b) - 1) < 0.02


@pytest.mark.statistical
def test_private_interval_sampler_matches_its_probabilities() -> None:
    means = [Fraction(v) for v in (18, 21, 22, 24, 60, 33, 35, 47)]
    lo, hi, tau, eps = Fraction(0), Fraction(100), Fraction(10), Fraction(1)
    probs = pi.interval_probabilities(means, lo, hi, tau, eps)
    n = 20000  # about 20 s on one core; every centre within 5 binomial sd (< 40 * 5.7e-7)
    noise = SeededNoise(11)
    counts = Counter(
        int((pi.private_interval(means, lo, hi, tau, eps, 1, em.NoiseBits(noise, ("i", k))).center
             - 5) / 10)
        for k in range(n)
    )  # fmt: skip
    for k, p in enumerate(probs):
        assert abs(counts.get(k, 0) - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1e-9


@pytest.mark.statistical
def test_private_quantile_sampler_matches_point_probabilities() -> None:
    values = [Fraction(v) for v in (2, 4, 8, 5)]
    args = (Fraction(1, 2), Fraction(1), 1, Fraction(0), Fraction(10), Fraction(1))
    probs = pq.point_probabilities(values, *args)
    n = 20000  # about 20 s; 10 points, each within 5 binomial sd (< 10 * 5.7e-7)
    noise = SeededNoise(12)
    counts = Counter(
        int(pq.private_quantile(values, *args, em.NoiseBits(noise, ("q", k))) - Fraction(1, 2))
        for k in range(n)
    )
    for k, p in enumerate(probs):
        assert abs(counts.get(k, 0) - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1e-9


@pytest.mark.statistical
@pytest.mark.parametrize("mechanism", ["baseline", "noisy_ratio"])
def test_ci95_covers_the_statistic(mechanism) -> None:
    """ci95 is a guaranteed bound, so it misses f in at most 5% of runs. With n = 4000 runs
    a correct bound's miss rate has sd <= sqrt(0.05 * 0.95 / 4000) = 0.34%: allow 5% + 1.2%
    (3.5 sd)."""
    data = {f"u{i}": [(17 * i + j) % 101 for j in range(1 + i % 4)] for i in range(40)}
    spec = make("baseline") if mechanism == "baseline" else strict()
    prep = prepared(spec, data)
    truth = float(cm.statistic(spec, prep)) * float(spec.step)
    noise = SeededNoise(5)
    n, misses = 4000, 0
    for _ in range(n):
        rel = cm.release_prepared(spec, CELL, prep, noise).release
        misses += abs(rel.value - truth) > rel.ci95
    assert misses / n <= 0.062
