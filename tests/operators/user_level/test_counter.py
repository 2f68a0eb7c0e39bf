"""User-level count, sum and histogram with efficient restart: Dong-Luo-Yi Alg. 5, Sec. IV-A,
IV-B and our re-admission; worked examples A, C, D, E (the reusable tree), F; oracles 1-7
(our numbering); statistical checks."""

from __future__ import annotations

import math
import re
from collections import deque
from fractions import Fraction

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import (
    KeyedNoise,
    RecordingNoise,
    SeededNoise,
    ZeroNoise,
    discrete_laplace_variance,
    laplace_variance,
)
from dpstream.operators.trees import kary_tree
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import svt
from tests.noise_doubles import MemoNoise
from tests.operators.support import binomial_upper

KEY = bytes(range(32))

Item = tuple[int, int, int]  # (user, bin, units)


# ---------------------------------------------------------------------------------------
# Drivers and independent references


def run(spec: ul.UserLevelSpec, ticks: list[list[Item]], noise) -> tuple[list, list]:
    """Feed a stream through the reference stage 1 (split_tick) and the mechanism."""
    state, totals, states, releases = ul.init(spec), {}, [], []
    for items in ticks:
        bands, crossings, totals = ul.split_tick(totals, items, spec.bins)
        state, rel = ul.step(spec, state, bands, crossings, noise)
        states.append(state)
        releases.append(rel)
    return states, releases


def trim(values) -> tuple[int, ...]:
    out = list(values)
    while out and out[-1] == 0:
        out.pop()
    return tuple(out)


def add_vectors(a, b) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def truncated_leaves(ticks: list[list[Item]], tau: int, bins: int) -> list[list[int]]:
    """Leaf s (1-based list index s-1) of Truncate(D, tau), per bin: each user's first tau
    units in time order, a straddling item kept partly (sections 2.3 and 2.7)."""
    used: dict[int, int] = {}
    leaves = []
    for items in ticks:
        leaf = [0] * bins
        for user, r, units in items:
            before = used.get(user, 0)
            leaf[r] += min(max(tau - before, 0), units)
            used[user] = before + units
        leaves.append(leaf)
    return leaves


def dyadic_nodes(leaves: list[list[int]], bins: int) -> dict[ul.TreeNode, list[int]]:
    """From-scratch node contents at t = len(leaves): period totals and live nodes, each
    summed straight from its leaf range (no incremental tree code)."""
    t = len(leaves)
    period, k = t.bit_length() - 1, t - (1 << (t.bit_length() - 1)) + 1

    def total(lo: int, hi: int) -> list[int]:  # ticks lo..hi inclusive
        return [sum(leaves[s - 1][r] for s in range(lo, hi + 1)) for r in range(bins)]

    closed = k == 1 << period
    nodes: dict[ul.TreeNode, list[int]] = {
        ("P", p): total(1 << p, (2 << p) - 1) for p in range(period + 1 if closed else period)
    }
    if not closed:
        start = 1 << period  # first tick of the current period
        for level in range(period, -1, -1):
            if k >> level & 1:
                nodes[("alpha", level)] = total(start, start + (1 << level) - 1)
                start += 1 << level
    return nodes


class RefTree:
    """A second, independent exact tree (lists, per-bin), for the FIFO reference."""

    def __init__(self, bins: int) -> None:
        self.bins, self.t, self.periods, self.alpha = bins, 0, [], []

    def advance(self, leaf: list[int]) -> None:
        self.t += 1
        period = self.t.bit_length() - 1
        k = self.t - (1 << period) + 1
        if k == 1:
            self.alpha = [[0] * self.bins for _ in range(period + 1)]
        level = 0
        while not k >> level & 1:
            level += 1
        node = list(leaf)
        for lower in range(level):
            node = [a + b for a, b in zip(node, self.alpha[lower], strict=True)]
            self.alpha[lower] = [0] * self.bins
        self.alpha[level] = node
        if k == 1 << period:
            self.periods.append(self.alpha[period])
            self.alpha = []

    def add(self, s: int, r: int, w: int) -> None:
        """Re-admission: into P[p] if s is in a completed period, else into the live
        node covering s (set bits of k from high to low)."""
        p = s.bit_length() - 1
        if p < len(self.periods):
            self.periods[p][r] += w
            return
        period = self.t.bit_length() - 1
        k = self.t - (1 << period) + 1
        local, start = s - (1 << period) + 1, 1
        for level in range(period, -1, -1):
            if k >> level & 1:
                if local < start + (1 << level):
                    self.alpha[level][r] += w
                    return
                start += 1 << level
        raise AssertionError("s not covered")

    def nodes(self) -> dict[ul.TreeNode, list[int]]:
        period = self.t.bit_length() - 1
        k = self.t - (1 << period) + 1
        out: dict[ul.TreeNode, list[int]] = {("P", p): v for p, v in enumerate(self.periods)}
        for level in range(len(self.alpha)):
            if k >> level & 1:
                out[("alpha", level)] = self.alpha[level]
        return out


class FifoReference:
    """Our streaming re-admission literally: per-user c_u (S_u) and an overflow FIFO of (s, bin,
    first unit position, units); on a tau increase, pop every overflow unit with position <= the new
    tau and re-admit it at its ORIGINAL tick; the leaf keeps the units of rank <= tau."""

    def __init__(self, bins: int) -> None:
        self.tree = RefTree(bins)
        self.used: dict[int, int] = {}
        self.overflow: dict[int, deque] = {}
        self.tau = 0

    def step(self, items: list[Item], tau: int) -> None:
        s = self.tree.t + 1
        if tau != self.tau:
            for queue in self.overflow.values():
                while queue and queue[0][2] <= tau:
                    tick, r, first, units = queue.popleft()
                    back = min(units, tau - first + 1)
                    self.tree.add(tick, r, back)
                    if back < units:  # a straddling sum item: the rest stays queued
                        queue.appendleft((tick, r, first + back, units - back))
                        break
            self.tau = tau
        leaf = [0] * self.tree.bins
        self.tree.advance(leaf)  # placeholder: the leaf is added below via add() at s
        for user, r, units in items:
            first = self.used.get(user, 0) + 1
            self.used[user] = first + units - 1
            kept = min(max(tau - first + 1, 0), units)
            if kept:
                self.tree.add(s, r, kept)
            if kept < units:
                self.overflow.setdefault(user, deque()).append((s, r, first + kept, units - kept))


def forced(schedule: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Hypothesis (t, exponent increment) pairs -> a valid forced tau schedule."""
    out, exponent, last_t = [], 1, 0
    for t, inc in sorted(schedule):
        if t > last_t:
            exponent += inc
            out.append((t, 1 << exponent))
            last_t = t
    return out


def stream_strategy(bins: int, max_units: int, max_ticks: int = 40):
    item = st.tuples(st.integers(0, 4), st.integers(0, bins - 1), st.integers(1, max_units))
    return st.lists(st.lists(item, max_size=4), min_size=1, max_size=max_ticks)


schedule_strategy = st.lists(st.tuples(st.integers(1, 45), st.integers(0, 2)), max_size=5)

MODES = {  # (bins, max units): count, histogram, sum, histogram of sums
    "count": (1, 1),
    "histogram": (3, 1),
    "sum": (1, 9),
    "sum_histogram": (2, 6),
}


# ---------------------------------------------------------------------------------------
# Stage-1 helpers


def test_rank_bands():
    assert [ul.rank_band(c) for c in range(1, 18)] == [0, 1, 2, 2, 3, 3, 3, 3] + [4] * 8 + [5]
    assert [ul.band_range(b) for b in range(5)] == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16)]
    for c in range(1, 300):
        lo, hi = ul.band_range(ul.rank_band(c))
        assert lo <= c <= hi
    # a count item of rank c is band_units(c - 1, 1)
    assert ul.band_units(4, 1) == [(3, 1)]
    # a sum item straddling several powers of two splits exactly
    assert ul.band_units(3, 10) == [(2, 1), (3, 4), (4, 5)]  # positions 4 | 5..8 | 9..13
    assert ul.band_units(0, 0) == []


def test_crossed_powers():
    assert ul.crossed_powers(0, 1) == []  # 1 > 1 is false (strict, Sec. II-A)
    assert ul.crossed_powers(0, 2) == [0]
    assert ul.crossed_powers(1, 2) == [0]
    assert ul.crossed_powers(2, 3) == [1]
    assert ul.crossed_powers(3, 4) == []
    assert ul.crossed_powers(4, 5) == [2]
    assert ul.crossed_powers(0, 100) == [0, 1, 2, 3, 4, 5, 6]  # P12: one item, many powers
    assert ul.crossed_powers(8, 8) == []
    for before in range(0, 40):
        for after in range(before, 70):
            expected = [j for j in range(10) if before <= 2**j < after]
            assert ul.crossed_powers(before, after) == expected


def test_split_tick_and_merge_reports():
    bands, crossings, totals = ul.split_tick({"a": 1}, [("a", 0, 1), ("b", 1, 1), ("a", 1, 1)], 2)
    # a's ranks 2 (band 1) and 3 (band 2), b's rank 1 (band 0); a: 1 -> 3 crosses 2^0, 2^1
    assert bands == ((0, 1), (1, 0), (0, 1))
    assert crossings == (1, 1)
    assert totals == {"a": 3, "b": 1}
    merged = ul.merge_reports([(bands, crossings), (((2,),), (0, 0, 5))])
    assert merged == (((2, 1), (1, 0), (0, 1)), (1, 1, 5))
    with pytest.raises(InvalidOperatorConfig, match=r"bin must be in \[0, 2\), got 2"):
        ul.split_tick({}, [("a", 2, 1)], 2)


# ---------------------------------------------------------------------------------------
# Example A (instances), Example C, Noise_E / Noise_U


def test_example_a_instance_series_and_tracker_half():
    spec = ul.make_user_level("c", 2, Fraction(1, 10), 1)
    assert [ul.epsilon_instance(spec, j) for j in (1, 2, 3)] == [
        Fraction(1, 4),
        Fraction(1, 9),
        Fraction(1, 16),
    ]
    assert spec.tracker.epsilon == 1 and spec.tracker.beta == Fraction(1, 20)
    assert [svt.epsilon_i(spec.tracker, i) for i in (1, 2, 3, 4)] == [
        Fraction(1, 4),
        Fraction(1, 9),
        Fraction(1, 16),
        Fraction(1, 25),
    ]
    practical = ul.make_user_level("c", 2, Fraction(1, 10), 1, practical=True)
    assert svt.epsilon_i(practical.tracker, 1) == Fraction(3, 16)
    assert ul.epsilon_instance(practical, 1) == Fraction(1, 4)  # default: original series
    shifted = ul.make_user_level("c", 2, Fraction(1, 10), 1, practical_instances=True)
    assert ul.epsilon_instance(shifted, 1) == Fraction(3, 16)


def test_example_c_nodes_scales_and_variance():
    """t = 13: P0[1], P1[2-3], P2[4-7], alpha_2[8-11], alpha_1[12-13]; event-level scales
    1, 2, 3, 4, 4 times tau/eps_inst = 4/0.25 = 16: Var = 2 * 16^2 * 46 = 23552."""
    spec = ul.make_user_level("c", 2, Fraction(1, 10), 1, forced_schedule=[(1, 4)])
    nodes = ul.release_nodes(spec, 13, 1, 4)
    assert [node for node, _, _ in nodes] == [
        ("P", 0),
        ("P", 1),
        ("P", 2),
        ("alpha", 2),
        ("alpha", 1),
    ]
    assert [nid for _, nid, _ in nodes] == [
        ("c", "inst", 1, "P", 0),
        ("c", "inst", 1, "P", 1),
        ("c", "inst", 1, "P", 2),
        ("c", "inst", 1, 3, 2, 0),
        ("c", "inst", 1, 3, 1, 2),
    ]
    scales = [b for _, _, b in nodes]
    assert [b / 16 for b in scales] == [1, 2, 3, 4, 4]
    assert sum(laplace_variance(b) for b in scales) == 23552
    assert sum(laplace_variance(b / 16) for b in scales) == 92
    # an all-ones stream (13 users, one item each): exact parts 1, 2, 4, 4, 2
    states, releases = run(spec, [[(u, 0, 1)] for u in range(13)], ZeroNoise())
    tree = ul.tree_of(states[-1])
    assert [ul.kept_bins(spec, ul.exact_node(tree, n), 4)[0] for n, _, _ in nodes] == [
        1,
        2,
        4,
        4,
        2,
    ]
    assert releases[-1].value == 13
    assert releases[-1].bins[0].std == pytest.approx(
        math.sqrt(sum(discrete_laplace_variance(b) for b in scales)), rel=1e-12
    )


def test_noise_e_noise_u_and_bias_bound():
    assert ul.noise_e(13, 1, Fraction(1, 10)) == pytest.approx(106.3017, abs=1e-4)
    assert ul.noise_e(13, 1, 0.1) == pytest.approx(4 * 4**1.5 * math.log2(10), rel=1e-12)
    # Noise_U(8, 1000, 2, 0.1, 1): eps_eff = 2 / (2 * 8 * 5^2) = 0.005
    assert ul.noise_u(8, 1000, 2, Fraction(1, 10), 1) == pytest.approx(109337.09, abs=0.01)
    assert ul.noise_u(8, 1000, 2, Fraction(1, 10), 1) == pytest.approx(
        ul.noise_e(1000, 0.005, 0.05), rel=1e-12
    )
    spec = ul.make_user_level("c", 2, Fraction(1, 10), 1)
    # (kappa - tau)^+ [12 LOG(2/beta_1) + 16 LOG(t+1)]/eps_1 = 3 * 415.4525 at t = 1
    assert ul.bias_bound(spec, 5, 2, 1, 1) == pytest.approx(3 * 415.4525, abs=1e-3)
    assert ul.bias_bound(spec, 2, 4, 1, 2) == 0


# ---------------------------------------------------------------------------------------
# Examples D and F (truncation and re-admission)


def test_example_d_truncation_and_readmission():
    users = ["a", "a", "a", "b", "a", "b", None, "a"]
    ticks = [[(u, 0, 1)] if u else [] for u in users]
    kept = ZeroNoise()
    spec2 = ul.make_user_level("c", 2, Fraction(1, 10), forced_schedule=[])
    states, releases = run(spec2, ticks, kept)
    assert [r.tau for r in releases] == [2] * 8
    assert [leaf[0] for leaf in truncated_leaves(ticks, 2, 1)] == [1, 1, 0, 1, 0, 1, 0, 0]
    tree = ul.tree_of(states[-1])
    # t = 8: period 3, k = 1: P = [1, 1, 2], alpha_0[8] = 0
    assert [ul.kept_bins(spec2, p, 2)[0] for p in tree.periods] == [1, 1, 2]
    assert ul.kept_bins(spec2, tree.alpha[0], 2) == (0,)
    assert releases[-1].value == 4
    assert states[-1].crossings[1] == 1 and states[-1].crossings[2] == 1  # Count(D_8, 2), (., 4)
    # switch to tau = 4 at t = 8: t=3 returns into P[1], t=5 into P[2]; t=8 (rank 5) stays out
    spec4 = ul.make_user_level("c", 2, Fraction(1, 10), forced_schedule=[(8, 4)])
    states, releases = run(spec4, ticks, kept)
    assert [r.tau for r in releases] == [2] * 7 + [4]
    assert [r.instance for r in releases] == [1] * 7 + [2]
    tree = ul.tree_of(states[-1])
    assert [ul.kept_bins(spec4, p, 4)[0] for p in tree.periods] == [1, 2, 3]
    assert ul.kept_bins(spec4, tree.alpha[0], 4) == (0,)
    assert releases[-1].value == 6
    # true count 7; bias 1 = (5 - 4) * Count(D_8, 4) = 1 * 1
    assert 7 - releases[-1].value == (5 - 4) * states[-1].crossings[2] == 1


def test_example_f_sum_clipping():
    ticks = [[("a", 0, 3)], [("b", 0, 5)], [("a", 0, 4)], [("a", 0, 2)], []]
    spec = ul.make_user_level("s", 2, Fraction(1, 10), forced_schedule=[(1, 4), (5, 8)])
    states, releases = run(spec, ticks, ZeroNoise())
    assert [leaf[0] for leaf in truncated_leaves(ticks, 4, 1)] == [3, 4, 1, 0, 0]
    assert [r.value for r in releases[:4]] == [3, 7, 8, 8]  # truncated sum 8 at tau = 4
    # Count(., 4) = |{u : S_u > 4}| = 2 (S_a = 9, S_b = 5)
    assert ul.bound_of(states[3]).crossings[2] == 2
    # tau = 8 at t = 5: kept 3, 5, 4, 1, total 13; the true sum is 14, phi = 9
    assert [leaf[0] for leaf in truncated_leaves(ticks, 8, 1)] == [3, 5, 4, 1, 0]
    assert releases[4].value == 13 and releases[4].instance == 2
    true_sum = sum(x for items in ticks for _, _, x in items)
    assert true_sum == 14 and max(9, 5) == 9  # phi = max_u S_u
    assert true_sum - releases[4].value == sum(max(s - 8, 0) for s in (9, 5)) == 1


def test_histogram_truncates_by_total_rank_across_bins():
    """P6: a user's rank counts items in every bin; empty bins still get noise."""
    ticks = [[("a", 0, 1), ("a", 1, 1), ("a", 2, 1)], [("a", 0, 1)], []]
    spec = ul.make_user_level("h", 2, Fraction(1, 10), bins=4, forced_schedule=[(3, 4)])
    rec = RecordingNoise(ZeroNoise())
    states, releases = run(spec, ticks, rec)
    assert releases[1].values == (1, 1, 0, 0)  # ranks 1, 2 kept at tau = 2; 3 and 4 not
    assert releases[2].values == (2, 1, 1, 0)  # tau = 4 re-admits ranks 3 and 4
    bins_noised = {node[-1] for node, _, _ in rec.calls if node[1] == "inst"}
    assert bins_noised == {0, 1, 2, 3}


# ---------------------------------------------------------------------------------------
# Oracle 4: re-admission equivalence (and oracle 5: the gap)


@pytest.mark.parametrize("mode", list(MODES))
def test_oracle_4_and_5_on_random_streams(mode):
    bins, max_units = MODES[mode]

    @settings(max_examples=60, deadline=None)
    @given(stream_strategy(bins, max_units), schedule_strategy)
    def check(ticks, schedule):
        spec = ul.make_user_level(
            "o4", 2, Fraction(1, 10), bins=bins, forced_schedule=forced(schedule)
        )
        states, releases = run(spec, ticks, ZeroNoise())
        fifo = FifoReference(bins)
        previous_tau = 0
        for t, (state, rel) in enumerate(zip(states, releases, strict=True), 1):
            tau = svt.forced_tau(spec.tracker, t)
            assert rel.tau == state.tau == tau
            assert rel.instance == state.instance
            assert (rel.instance - (releases[t - 2].instance if t > 1 else 0)) == (
                tau != previous_tau
            )
            previous_tau = tau
            # (a) from scratch on Truncate(D_t, tau_t)
            leaves = truncated_leaves(ticks[:t], tau, bins)
            scratch = dyadic_nodes(leaves, bins)
            tree = ul.tree_of(state)
            mine = {
                node: list(ul.kept_bins(spec, ul.exact_node(tree, node), tau))
                for node in ul.tree_nodes(t)
            }
            assert mine == scratch
            # levels whose bit of k is 0 hold nothing
            period, k = ul.period_of(t)
            for level, vector in enumerate(tree.alpha):
                if not k >> level & 1:
                    assert vector == ()
            # (b) the per-user FIFO re-admission, node for node
            fifo.step(ticks[t - 1], tau)
            assert fifo.tree.nodes() == scratch
            # the output (zero noise) is F(Truncate(D_t, tau_t)) ...
            truth = [sum(leaf[r] for leaf in leaves) for r in range(bins)]
            assert list(rel.values) == truth == list(ul.exact_values(spec, state))
            # ... and oracle 5: the gap is sum_u (c_u - tau)^+ <= (kappa - tau)^+ Count(D_t, tau)
            totals: dict[int, int] = {}
            raw = [0] * bins
            for items in ticks[:t]:
                for user, r, units in items:
                    totals[user] = totals.get(user, 0) + units
                    raw[r] += units
            gap = sum(raw) - sum(rel.values)
            assert all(v <= w for v, w in zip(rel.values, raw, strict=True))
            assert gap == sum(max(c - tau, 0) for c in totals.values())
            kappa = max(totals.values(), default=0)
            count = sum(c > tau for c in totals.values())
            assert count == svt.count_at(state.crossings, tau.bit_length() - 1)
            assert gap <= max(kappa - tau, 0) * count

    check()


def test_fifo_reference_is_not_vacuous():
    """The references disagree with a mechanism that forgets to re-admit: the FIFO's
    re-admission changes P[1] and P[2] in Example D."""
    ticks = [[(u, 0, 1)] if u is not None else [] for u in [0, 0, 0, 1, 0, 1, None, 0]]
    fifo = FifoReference(1)
    for t, items in enumerate(ticks, 1):
        fifo.step(items, 2 if t < 8 else 4)
    assert [p[0] for p in fifo.tree.periods] == [1, 2, 3]
    no_readmit = dyadic_nodes(truncated_leaves(ticks, 2, 1), 1)
    assert [no_readmit[("P", p)][0] for p in range(3)] == [1, 1, 2]


# ---------------------------------------------------------------------------------------
# The reusable exact tree


def test_covering_node():
    assert [ul.covering_node(13, s) for s in range(1, 14)] == (
        [("P", 0)] + [("P", 1)] * 2 + [("P", 2)] * 4 + [("alpha", 2)] * 4 + [("alpha", 1)] * 2
    )
    assert ul.covering_node(15, 15) == ("P", 3) and ul.covering_node(16, 16) == ("alpha", 0)
    with pytest.raises(InvalidOperatorConfig, match="s must be <= t = 5, got 6"):
        ul.covering_node(5, 6)


def test_example_e_first_occurrence_shift_on_the_exact_tree():
    """Ex E's leaves: 1,1,0,1,0 -> P = [1, 1], alpha_1[4-5] = 1; moving 9's first occurrence
    from 4 to 3 (-1 at 4, +1 at 3) gives P = [1, 2], alpha_1 = 0, F_0 still 3."""
    tree = ul.ExactTreeState()
    for w in (1, 1, 0, 1, 0):
        tree = ul.exact_tree_advance(tree, (w,))
    assert tree.periods == ((1,), (1,)) and tree.alpha == ((), (1,), ())
    tree = ul.exact_tree_add(tree, 4, (-1,))
    tree = ul.exact_tree_add(tree, 3, (1,))
    assert tree.periods == ((1,), (2,)) and tree.alpha == ((), (), ())
    assert ul.exact_tree_total(tree) == (3,)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=70),
    st.lists(st.tuples(st.integers(1, 70), st.integers(-3, 3), st.integers(0, 2)), max_size=8),
)
def test_exact_tree_add_equals_a_rebuild(leaves, adds):
    tree = ul.ExactTreeState()
    for leaf in leaves:
        tree = ul.exact_tree_advance(tree, leaf)
    t = len(leaves)
    dense = [list(leaf) + [0] * (3 - len(leaf)) for leaf in leaves]
    for s, w, r in adds:
        s = (s - 1) % t + 1
        delta = [0, 0, 0]
        delta[r] = w
        tree = ul.exact_tree_add(tree, s, delta)
        dense[s - 1][r] += w
    expected = {n: tuple(v) for n, v in dyadic_nodes(dense, 3).items()}
    got = {
        n: ul.exact_node(tree, n) + (0,) * (3 - len(ul.exact_node(tree, n)))
        for n in ul.tree_nodes(t)
    }
    assert got == expected
    assert ul.exact_tree_total(tree) == trim(sum(c) for c in zip(*dense, strict=True))


# ---------------------------------------------------------------------------------------
# Oracle 1: the privacy ledger


@pytest.mark.parametrize(
    ("theta", "practical"), [(1, False), (Fraction(1, 2), False), (1, True), (Fraction(3, 2), True)]
)
def test_oracle_1_ledger_after_many_restarts(theta, practical):
    start = 64 if practical else 2
    schedule = [(t, start << t) for t in range(1, 61)]  # a restart at every tick
    spec = ul.make_user_level(
        "l",
        2,
        Fraction(1, 10),
        theta,
        practical=practical,
        practical_instances=practical,
        forced_schedule=schedule,
    )
    state = ul.init(spec)
    for _ in range(60):
        state, rel = ul.step(spec, state, (), (), ZeroNoise())
    assert rel.instance == 60
    tracker = ul.tracker_spent_epsilon(spec, state.svt_index)
    instances = ul.instance_spent_epsilon(spec, state.instance)
    assert tracker < Fraction(1) and instances < Fraction(1)  # each series < epsilon/2
    assert ul.spent_epsilon(spec, state) == tracker + instances < 2
    assert ul.tracker_spent_beta(spec, state.svt_index) < Fraction(1, 20)
    assert ul.spent_epsilon(spec, state) > ul.spent_epsilon(spec, ul.init(spec)) == 0


def test_oracle_1_ledger_from_the_recorded_noise():
    """The epsilon actually consumed, read back from the scales of the draws (SVT i:
    threshold scale 2/eps_i; instance j: node scale (p+1) m tau_j / eps_j), equals the
    exact ledger and is < epsilon, with real noise and several data-driven restarts."""
    spec = ul.make_user_level("l", 2, Fraction(1, 10), 1, multiplier=2)
    rec = RecordingNoise(MemoNoise.seeded(5))
    state, tau_of = ul.init(spec), {}
    for t in range(1, 40):
        crossings = [0, 3000 if t == 2 else 0, 3000 if t == 5 else 0, 3000 if t == 9 else 0]
        state, rel = ul.step(spec, state, ((1,),), crossings, rec)
        tau_of[rel.instance] = rel.tau
    assert state.instance >= 3  # restarts happened
    svt_eps = {
        node[2]: 2 / scale for node, scale, _ in rec.calls if node[1] == "svt" and node[-1] == "eta"
    }
    inst_eps: dict[int, set] = {}
    for node, scale, _ in rec.calls:
        if node[1] == "inst":
            j, p = node[2], (node[4] if node[3] == "P" else node[3])
            inst_eps.setdefault(j, set()).add(Fraction((p + 1) * 2 * tau_of[j]) / scale)
    assert all(len(v) == 1 for v in inst_eps.values())  # one epsilon per instance
    assert sorted(svt_eps) == list(range(1, state.svt_index + 1))
    assert sorted(inst_eps) == list(range(1, state.instance + 1))
    ledger = sum(svt_eps.values()) + sum(min(v) for v in inst_eps.values())
    assert ledger == ul.spent_epsilon(spec, state) < spec.epsilon


# ---------------------------------------------------------------------------------------
# Oracles 2, 3 and 6


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 1500), max_size=5), min_size=1, max_size=40),
    st.integers(0, 2**31),
    st.booleans(),
)
def test_oracle_2_instances_follow_tau(crossings_steps, seed, practical):
    spec = ul.make_user_level("o2", 8, Fraction(1, 10), practical=practical)
    noise = MemoNoise.seeded(seed)
    state, previous = ul.init(spec), None
    start = 64 if practical else 2
    for crossings in crossings_steps:
        old = state
        state, rel = ul.step(spec, state, (), crossings, noise)
        assert rel.tau == state.tau and rel.tau & (rel.tau - 1) == 0 and rel.tau >= start
        assert rel.tau == svt.tau_i(spec.tracker, rel.svt_index)
        if previous is not None:
            assert rel.tau >= previous.tau
        changed = previous is None or rel.tau != previous.tau
        assert rel.instance == old.instance + int(changed)  # at most one per step
        assert rel.instance <= rel.svt_index
        previous = rel


def test_oracle_2_one_instance_for_a_fourfold_jump():
    spec = ul.make_user_level("o2", 2, Fraction(1, 10))
    state, rel = ul.step(spec, ul.init(spec), (), (0, 10**6, 10**6), ZeroNoise())
    assert (rel.tau, rel.instance, rel.svt_index) == (8, 1, 3)
    state, rel = ul.step(spec, state, (), (), ZeroNoise())
    assert (rel.tau, rel.instance) == (8, 1)
    state, rel = ul.step(spec, state, (), (0, 0, 0, 10**6, 10**6), ZeroNoise())
    assert (rel.tau, rel.instance, rel.svt_index) == (32, 2, 5)


def heavy_stream(ticks: int, heavy: int = 3000, light: int = 50) -> list:
    """Per-tick (bands, crossings) of ``heavy`` users who each send one item every tick and
    ``light`` new single-item users per tick (computed once, without per-user loops)."""
    out = []
    for t in range(1, ticks + 1):
        band = ul.rank_band(t)
        bands = [[0] for _ in range(band + 1)]
        bands[band][0] += heavy
        bands[0][0] += light
        crossings = [0] * t.bit_length()
        for j in ul.crossed_powers(t - 1, t):
            crossings[j] += heavy
        out.append((bands, crossings))
    return out


@pytest.mark.parametrize("noise_factory", [lambda: KeyedNoise(KEY), lambda: SeededNoise(11)])
def test_oracle_3_online_prefix_bit_identical(noise_factory):
    spec = ul.make_user_level("o3", 2, Fraction(1, 10), bins=2)
    stream = [([[1, 2], [0, 3]], c) for _, c in heavy_stream(24, heavy=600)]
    full, prefix = [], []
    for out, length in ((full, 24), (prefix, 13)):
        noise, state = noise_factory(), ul.init(spec)
        for bands, crossings in stream[:length]:
            state, rel = ul.step(spec, state, bands, crossings, noise)
            out.append(rel)
    assert full[:13] == prefix
    assert full[-1].instance > 1  # restarts are part of what is compared


@pytest.mark.parametrize("multiplier", [1, 2])
def test_oracle_6_noise_structure(multiplier):
    spec = ul.make_user_level("o6", 2, Fraction(1, 10), bins=2, multiplier=multiplier)
    stream = heavy_stream(40, heavy=1200)
    rec = RecordingNoise(ZeroNoise())
    state, seen, previous = ul.init(spec), set(), set()
    restarts = 0
    for t, (bands, crossings) in enumerate(stream, 1):
        rec.calls.clear()
        old = state
        state, rel = ul.step(spec, state, [row + [0] for row in bands], crossings, rec)
        draws = [(node, scale) for node, scale, _ in rec.calls if node[1] == "inst"]
        period, k = ul.period_of(t)
        eps = ul.epsilon_instance(spec, rel.instance)
        for r in (0, 1):
            mine = [(node, scale) for node, scale in draws if node[-1] == r]
            # floor(log2 t) period totals plus popcount(k) live nodes
            assert len(mine) == period + bin(k).count("1")
            for node, scale in mine:
                assert node[:3] == ("o6", "inst", rel.instance)
                p = node[4] if node[3] == "P" else node[3]
                assert scale == Fraction((p + 1) * multiplier * rel.tau) / eps
        current = set(draws)
        if rel.instance != old.instance:
            restarts += 1
            assert not current & seen  # after a restart every node is a NEW draw
        else:
            # all but the node completing at t were used at t-1, same id and scale
            level = (k & -k).bit_length() - 1
            new_node = ("P", period) if k == 1 << period else (period, level, (k >> level) - 1)
            fresh = {d for d in current if d[0][3:-1] == new_node}
            assert len(fresh) == 2 and not fresh & seen
            assert current - fresh <= previous
        seen |= current
        previous = current
    assert restarts >= 3


# ---------------------------------------------------------------------------------------
# Oracle 7: sensitivity


def level_nodes(leaves: list[list[int]]) -> dict[tuple[int, int, int], list[int]]:
    """Every node Alg. 2 creates so far, (period, level, index) -> per-bin sum: the
    complete dyadic nodes with an EVEN index (an odd one completes at the same step as its
    parent and is never released on its own)."""
    horizon, bins = len(leaves), len(leaves[0])
    out = {}
    for period in range(horizon.bit_length()):
        for level in range(period + 1):
            for index in range(0, 1 << (period - level), 2):
                lo = (1 << period) + index * (1 << level)
                hi = lo + (1 << level) - 1
                if hi <= horizon:
                    out[(period, level, index)] = [
                        sum(leaves[s - 1][r] for s in range(lo, hi + 1)) for r in range(bins)
                    ]
    return out


def mechanism_nodes(ticks: list[list[Item]], tau: int, bins: int) -> dict:
    """Every node the mechanism (zero noise, tau forced constant) ever releases, read from
    its state: (period, level, index) -> kept per-bin vector."""
    spec = ul.make_user_level("o7", 2, Fraction(1, 10), bins=bins, forced_schedule=[(1, tau)])
    states, _ = run(spec, ticks, ZeroNoise())
    out = {}
    for t, state in enumerate(states, 1):
        period, k = ul.period_of(t)
        tree = ul.tree_of(state)
        for node in ul.tree_nodes(t):
            kind, index = node
            key = (index, index, 0) if kind == "P" else (period, index, (k >> index) - 1)
            out[key] = list(ul.kept_bins(spec, ul.exact_node(tree, node), tau))
    return out


@settings(max_examples=40, deadline=None)
@given(stream_strategy(2, 5, max_ticks=33), st.sampled_from([2, 4, 8]), st.data())
def test_oracle_7_sensitivity(ticks, tau, data):
    """Removing all of one user's items changes Count(D_t, 2^j) by <= 1 and each level's
    node vector of Truncate(., tau) by <= tau in L1; the privacy loss of every node of
    the instance, sum |delta| / scale, is <= epsilon_inst. Removing a SUBSET also changes
    Count by <= 1, but can move the nodes by up to 2 tau (P1): multiplier 2 covers it."""
    bins, horizon = 2, len(ticks)
    users = sorted({u for items in ticks for u, _, _ in items}) or [0]
    user = data.draw(st.sampled_from(users))
    full = truncated_leaves(ticks, tau, bins)
    nodes = level_nodes(full)
    assert mechanism_nodes(ticks, tau, bins) == nodes  # what the mechanism releases

    def crossings_of(stream):
        totals, g, out = {}, [], []
        for items in stream:
            _, crossings, totals = ul.split_tick(totals, items, bins)
            g = add_vectors(g, crossings)
            out.append(g)
        return out

    g_full = crossings_of(ticks)
    for subset in (None, data.draw(st.sets(st.integers(0, 40)))):
        position = 0
        reduced = []
        for items in ticks:
            keep = []
            for item in items:
                if item[0] == user:
                    position += 1
                    if subset is None or position in subset:
                        continue
                keep.append(item)
            reduced.append(keep)
        g_red = crossings_of(reduced)
        for a, b in zip(g_full, g_red, strict=True):
            n = max(len(a), len(b))
            a, b = list(a) + [0] * (n - len(a)), list(b) + [0] * (n - len(b))
            assert all(abs(x - y) <= 1 for x, y in zip(a, b, strict=True))
        other = level_nodes(truncated_leaves(reduced, tau, bins))
        assert mechanism_nodes(reduced, tau, bins) == other
        bound = tau if subset is None else 2 * tau
        loss = Fraction(0)
        for level in range(horizon.bit_length()):
            l1 = sum(
                abs(x - y)
                for key in nodes
                if key[1] == level
                for x, y in zip(nodes[key], other[key], strict=True)
            )
            assert l1 <= bound
        for key, vec in nodes.items():
            delta = sum(abs(x - y) for x, y in zip(vec, other[key], strict=True))
            loss += Fraction(delta, key[0] + 1)
        # sum over nodes |delta| / ((p+1) m tau / eps) <= eps  <=>  sum |delta|/(p+1) <= m tau
        assert loss <= bound


def test_any_subset_removal_moves_2_tau():
    """Deleting items 1..tau of a user with 2 tau items: the leaf L1 difference is 2 tau."""
    tau = 4
    ticks = [[(0, 0, 1)] for _ in range(2 * tau)]
    full = truncated_leaves(ticks, tau, 1)
    reduced = truncated_leaves([[] for _ in range(tau)] + ticks[tau:], tau, 1)
    assert sum(abs(a[0] - b[0]) for a, b in zip(full, reduced, strict=True)) == 2 * tau


# ---------------------------------------------------------------------------------------
# State, validation


def test_state_json_round_trip_and_replay():
    spec = ul.make_user_level("js", 2, Fraction(1, 10), bins=2)
    stream = [([[1, 2], [0, 3], [4]], c) for _, c in heavy_stream(30, heavy=700)]
    noise = KeyedNoise(KEY)
    state, first = ul.init(spec), []
    for bands, crossings in stream:
        state, rel = ul.step(spec, state, bands, crossings, noise)
        first.append(rel)
    state = ul.init(spec)
    for bands, crossings in stream[:17]:
        state, _ = ul.step(spec, state, bands, crossings, noise)
    blob = orjson.dumps(state_codec.to_json(state))
    restored = state_codec.from_json(ul.UserLevelState, orjson.loads(blob))
    assert restored == state and restored.instance > 1
    rest = []
    for bands, crossings in stream[17:]:
        restored, rel = ul.step(spec, restored, bands, crossings, KeyedNoise(KEY))
        rest.append(rel)
    assert rest == first[17:]


def test_state_size_is_logarithmic():
    spec = ul.make_user_level("sz", 2, Fraction(1, 10), bins=3)
    state = ul.init(spec)
    for bands, crossings in heavy_stream(200, heavy=10):
        state, _ = ul.step(spec, state, [row * 3 for row in bands], crossings, ZeroNoise())
    assert len(state.periods) == 7 and len(state.alpha) == 8
    bands_max = ul.rank_band(200) + 1
    assert all(len(v) <= bands_max * 3 for v in state.periods + state.alpha)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0}, "epsilon must be finite and > 0, got Fraction(0, 1)"),
        ({"beta": 0}, "beta must be in (0, 1), got Fraction(0, 1)"),
        ({"bins": 0}, "bins must be >= 1, got 0"),
        ({"multiplier": 0}, "multiplier must be >= 1, got 0"),
        ({"multiplier": 1.5}, "multiplier must be an integer, got 1.5"),
        ({"practical_instances": "yes"}, "practical_instances must be a bool, got 'yes'"),
        ({"theta": 0}, "theta must be finite and > 0, got Fraction(0, 1)"),
        ({"forced_schedule": [(1, 6)]}, "forced_schedule tau must be a power of two, got 6"),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    params = {"name": "v", "epsilon": 2, "beta": Fraction(1, 10)} | kwargs
    with pytest.raises(InvalidOperatorConfig) as info:
        ul.make_user_level(**params)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("bands", "crossings", "message"),
    [
        (((1, 2, 3),), (), "bands[0] length must be <= bins = 2, got 3"),
        (((1,), (-1,)), (), "bands[1] entries must be >= 0, got 'a negative entry'"),
        (((1.5,),), (), "bands[0] entries must be integers, got 'float'"),
        ((), (0, -2), "crossings entries must be >= 0, got 'a negative entry'"),
    ],
)
def test_step_rejects_malformed_reports(bands, crossings, message):
    spec = ul.make_user_level("v", 2, Fraction(1, 10), bins=2)
    with pytest.raises(InvalidOperatorConfig) as info:
        ul.step(spec, ul.init(spec), bands, crossings, ZeroNoise())
    assert str(info.value) == message


def test_empty_ticks_release_noise_for_every_bin():
    spec = ul.make_user_level("e", 2, Fraction(1, 10), bins=3)
    rec = RecordingNoise(ZeroNoise())
    _, rel = ul.step(spec, ul.init(spec), (), (), rec)
    assert rel.values == (0, 0, 0) and rel.t == 1 and rel.tau == 2 and rel.instance == 1
    assert sorted(node[-1] for node, _, _ in rec.calls if node[1] == "inst") == [0, 1, 2]
    assert rel.bins[0].ci95 > 0 and rel.bins[2].std == rel.bins[0].std


# ---------------------------------------------------------------------------------------
# Statistical checks


def excess_kurtosis(scales) -> float:
    """Excess kurtosis of a sum of independent discrete Laplace terms (cumulants add):
    k2 = 2p/(1-p)^2, k4 = 2p(1 + 4p + p^2)/(1-p)^4, p = exp(-1/b)."""
    k2 = k4 = 0.0
    for b in scales:
        p = math.exp(-1 / float(b))
        k2 += 2 * p / (1 - p) ** 2
        k4 += 2 * p * (1 + 4 * p + p * p) / (1 - p) ** 4
    return k4 / k2**2


@pytest.mark.statistical
def test_s2_variance_at_a_fixed_t():
    """S2: Var(F~ - F_trunc) at t = 13 (tau = 4, eps_inst = 1/4: scales 16, 32, 48, 64, 64).

    n = 10000 runs, each with its own production KeyedNoise key, two bins. The sample
    variance has relative standard error sqrt((2 + excess kurtosis) / n) (~1.5% here);
    the assertions allow 5 of them around the exact discrete-Laplace variance, and check
    within +-10% of 2 sum b^2 = 23552. The two bins must be independent (their noise
    ids differ in r): |sample correlation| <= 5 / sqrt(n).
    """
    n = 10000
    spec = ul.make_user_level("s2", 2, Fraction(1, 10), bins=2, forced_schedule=[(1, 4)])
    ticks = [[(u % 5, u % 2, 1)] for u in range(12)]
    states, _ = run(spec, ticks, ZeroNoise())
    state = states[-1]
    exact = ul.exact_values(spec, ul.step(spec, state, ((1,),), (), ZeroNoise())[0])
    assert exact == (7, 6)
    errors = np.empty((n, 2))
    for i in range(n):
        _, rel = ul.step(spec, state, ((1,),), (), KeyedNoise(i.to_bytes(16, "big")))
        errors[i] = [rel.values[0] - exact[0], rel.values[1] - exact[1]]
    scales = [b for _, _, b in ul.release_nodes(spec, 13, 1, 4)]
    exact_var = sum(discrete_laplace_variance(b) for b in scales)
    rel_se = math.sqrt((2 + excess_kurtosis(scales)) / n)
    for r in (0, 1):
        var = float(np.var(errors[:, r]))
        assert var == pytest.approx(exact_var, rel=5 * rel_se)
        assert var == pytest.approx(23552, rel=0.10)
    assert abs(float(np.corrcoef(errors[:, 0], errors[:, 1])[0, 1])) <= 5 / math.sqrt(n)


@pytest.mark.statistical
def test_s3_coverage_of_noise_u_plus_bias():
    """S3: |F~ - F| <= Noise_U(tau~_t, t, eps, beta, theta) + bias bound (Thm III.3, concrete
    form) with probability >= 1 - beta at each t.

    Stream: 3000 users send one item every tick and 50 new users one item each, 128 ticks,
    eps = 2, beta = 0.1, theta = 1: tau~ climbs through restarts while kappa(D_t) = t runs
    ahead of it (real truncation bias). n = 600 runs; at each checkpoint the number of
    misses exceeds binomial_upper(n, beta) with probability <= 1e-6 for a correct
    mechanism. Also checked: the release's own 95% interval around F(Truncate(D_t, tau~_t))
    (misses <= binomial_upper(n, 0.05)), and that restarts really happened.
    """
    n, horizon, heavy, light = 600, 128, 3000, 50
    spec = ul.make_user_level("s3", 2, Fraction(1, 10), 1)
    stream = heavy_stream(horizon, heavy, light)
    checkpoints = {16, 32, 64, 128}
    misses = dict.fromkeys(checkpoints, 0)
    ci_misses = dict.fromkeys(checkpoints, 0)
    taus = set()
    for run_index in range(n):
        noise = MemoNoise.seeded(104_729 * run_index + 3)
        state = ul.init(spec)
        for t, (bands, crossings) in enumerate(stream, 1):
            state, rel = ul.step(spec, state, bands, crossings, noise)
            if t not in checkpoints:
                continue
            truth = (heavy + light) * t
            truncated = heavy * min(t, rel.tau) + light * t
            err = rel.value - truth
            bound_u = ul.noise_u(rel.tau, t, spec.epsilon, spec.beta, spec.theta)
            bias = ul.bias_bound(spec, t, rel.tau, t, rel.svt_index)
            misses[t] += not (-bound_u - bias <= err <= bound_u)
            ci_misses[t] += abs(rel.value - truncated) > rel.bins[0].ci95
            taus.add(rel.tau)
    assert len(taus) >= 3
    for t in checkpoints:
        assert misses[t] <= binomial_upper(n, float(spec.beta))
        assert ci_misses[t] <= binomial_upper(n, 0.05)


# ---------------------------------------------------------------------------------------
# The tuning a new statistic gets (docs/user-level.md section 6)


def tuned(**options) -> ul.UserLevelSpec:
    """tau: auto as a new count runs it: a quarter of epsilon = 1 to the tracker, the
    telescoping series for both, tau_1 = 256."""
    base = {
        "tracker_share": Fraction(1, 4),
        "tracker_series": "telescoping",
        "instance_series": "telescoping",
        "start_exponent": 8,
    }
    return ul.make_user_level("n", 1, Fraction(1, 10), practical=True, **(base | options))


def test_new_tuning_budgets_compose_exactly_to_epsilon():
    """By hand: the tracker gets 1/4, SVT i (1/4) / (i (i+1)) = 1/8, 1/24, 1/48; the
    instances 3/4, instance j (3/4) / (j (j+1)) = 3/8, 1/8, 1/16. After n of each the
    spend is (1/4 + 3/4) n / (n+1) = n / (n+1) < 1 = epsilon, exactly."""
    spec = tuned()
    assert spec.tracker.epsilon == Fraction(1, 4) and ul.instance_budget(spec) == Fraction(3, 4)
    assert spec.tracker.beta == Fraction(1, 20)
    assert [svt.epsilon_i(spec.tracker, i) for i in (1, 2, 3)] == [
        Fraction(1, 8),
        Fraction(1, 24),
        Fraction(1, 48),
    ]
    assert [ul.epsilon_instance(spec, j) for j in (1, 2, 3)] == [
        Fraction(3, 8),
        Fraction(1, 8),
        Fraction(1, 16),
    ]
    assert ul.tracker_spent_epsilon(spec, 3) == Fraction(3, 16)  # 1/8 + 1/24 + 1/48
    assert ul.instance_spent_epsilon(spec, 2) == Fraction(1, 2)  # 3/8 + 1/8
    for n in range(200):
        spent = ul.tracker_spent_epsilon(spec, n) + ul.instance_spent_epsilon(spec, n)
        assert spent == Fraction(n, n + 1) < spec.epsilon
        assert ul.tracker_spent_epsilon(spec, n) == sum(
            (svt.epsilon_i(spec.tracker, i) for i in range(1, n + 1)), Fraction(0)
        )
    assert [svt.tau_i(spec.tracker, i) for i in (1, 2, 3)] == [256, 512, 1024]
    # What the operator reports after a restart to tau 1024 (SVT 3, instance 2).
    forced = tuned(forced_schedule=[(3, 1024)])
    state = ul.init(forced)
    for _ in range(4):
        state, rel = ul.step(forced, state, (), (), ZeroNoise())
    assert (rel.tau, rel.svt_index, rel.instance) == (1024, 3, 2)
    assert ul.spent_split(forced, state) == (Fraction(3, 16), Fraction(1, 2))
    # Alg. 5's split is unchanged by the new parameters' defaults.
    paper = ul.make_user_level("n", 1, Fraction(1, 10), practical=True)
    assert paper.tracker.epsilon == Fraction(1, 2) == ul.instance_budget(paper)
    assert ul.epsilon_instance(paper, 1) == Fraction(1, 8)


def test_make_rejects_bad_tuning():
    for options, message in (
        ({"tracker_share": 1}, "tracker_share must be in (0, 1)"),
        ({"tracker_share": 0}, "tracker_share must be in (0, 1)"),
        ({"instance_series": "geometric"}, "instance_series must be dly or telescoping"),
        ({"tracker_series": "geometric"}, "series must be dly or telescoping"),
        ({"growth": 0}, "growth must be"),
        ({"discount_scale": 0}, "discount_scale must be"),
    ):
        with pytest.raises(InvalidOperatorConfig, match=re.escape(message)):
            tuned(**options)


def table3_ticks(users: int, events: int, ticks: int, seed: int) -> list[list[Item]]:
    """Dong-Luo-Yi Sec. VII-A's Zipf data, scaled down: per-user totals f(x) ~ (x + 10)^-1
    on [1024], all tokens shuffled, the first ``events`` spread evenly over ``ticks``."""
    rng = np.random.default_rng(seed)
    x = np.arange(1, 1025)
    p = 1.0 / (x + 10.0)
    tokens = np.repeat(np.arange(users), rng.choice(x, users, p=p / p.sum()))
    rng.shuffle(tokens)
    tokens = tokens[:events]
    per_tick = events // ticks
    return [
        [(int(u), 0, 1) for u in tokens[i * per_tick : (i + 1) * per_tick]] for i in range(ticks)
    ]


def truncated_totals(ticks: list[list[Item]]) -> dict[int, int]:
    """The count at the last tick truncated at tau = 2^j, j = 0..40 (2^40: the true count)."""
    per_user: dict[int, int] = {}
    for items in ticks:
        for user, _, units in items:
            per_user[user] = per_user.get(user, 0) + units
    return {1 << j: sum(min(c, 1 << j) for c in per_user.values()) for j in range(41)}


def fixed_tau_mse(ticks: list[list[Item]], tau: int) -> float:
    """Exact MSE at the last tick of a fixed-tau count (Alg. 3, epsilon 1) on the tree a
    new statistic gets: the k-ary counter's variance plus the squared truncation bias."""
    counter = kary_tree.make_kary_tree(1, tau, ("fixed",), 13, subtract=True)
    totals = truncated_totals(ticks)
    return kary_tree.variance(counter, len(ticks)) + (totals[1 << 40] - totals[tau]) ** 2


def predicted_mse(spec: ul.UserLevelSpec, ticks, tau: int, instance: int) -> float:
    """Exact MSE at the last tick given the tracker's path: instance j's variance plus the
    squared bias of truncating at tau."""
    variance = kary_tree.variance(ul.instance_tree(spec, instance, tau), len(ticks))
    totals = truncated_totals(ticks)
    return variance + (totals[1 << 40] - totals[tau]) ** 2


@pytest.mark.statistical
def test_tau_auto_is_within_3x_of_the_best_fixed_tau_on_a_skewed_workload():
    """docs/user-level.md section 6 on a small skewed workload: Table III's Zipf users (1,000
    of them, 50,000 events over 250 ticks, kappa = 285), epsilon 1, the default tree.
    The best fixed tau (256, exact MSE) against R = 60 full noisy runs of the operator
    with the new tuning, each under its own production KeyedNoise key.

    The squared error at the last tick is averaged over the runs; its standard error is
    the sample std of the squared errors / sqrt(R). The assertions: the runs' MSE agrees
    with the exact MSE given each run's tracker path (within 4 standard errors: this is
    what bench/tau_auto.py computes), and it is below 9 times the best fixed tau's MSE
    (ratio 3) plus 3 standard errors. The exact ratio is 8/3 (the instance has 3/8 of
    epsilon at tau 256 = the best tau); Alg. 5's tuning has 5.2 here, which fails it."""
    ticks = table3_ticks(1000, 50_000, 250, seed=3)
    best = min(fixed_tau_mse(ticks, 1 << j) for j in range(11))
    assert best == fixed_tau_mse(ticks, 256)
    spec = tuned(tree=("kary_subtract", 13))
    truth = truncated_totals(ticks)[1 << 40]
    runs = 60
    squared, predicted = np.empty(runs), np.empty(runs)
    paths: dict[tuple[int, int], float] = {}
    reports, totals = [], {}
    for items in ticks:  # stage 1 does not depend on the noise: once for every run
        bands, crossings, totals = ul.split_tick(totals, items)
        reports.append((bands, crossings))
    for r in range(runs):
        state, noise = ul.init(spec), KeyedNoise(r.to_bytes(16, "big"))
        for bands, crossings in reports:
            state, rel = ul.step(spec, state, bands, crossings, noise)
        squared[r] = (rel.value - truth) ** 2
        predicted[r] = paths.get((rel.tau, rel.instance)) or paths.setdefault(
            (rel.tau, rel.instance), predicted_mse(spec, ticks, rel.tau, rel.instance)
        )
    mse, se = float(squared.mean()), float(squared.std(ddof=1)) / math.sqrt(runs)
    assert abs(mse - float(predicted.mean())) <= 4 * se
    assert mse <= 9 * best + 3 * se
    assert math.sqrt(float(predicted.mean()) / best) == pytest.approx(8 / 3, rel=0.01)
    # Alg. 5's tuning on the same data (its tracker path under zero noise stays at 64,
    # as under noise in bench/tau_auto.py): beyond 3x, so the check above can fail.
    paper = ul.make_user_level("n", 1, Fraction(1, 10), practical=True, tree=("kary_subtract", 13))
    assert predicted_mse(paper, ticks, 64, 1) > 9 * best
