"""Continual mean under user-level DP, George et al.: Algorithms 1, 2, 5, 6, 7 and baseline B0.

Structural oracles and worked examples (ours), the corrections listed in docs/papers.md,
caps, affine scaling, state round trips, keyed replay, the
multi-partition protocol, and seeded statistical checks of the error's shape.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.baselines import naive_mean as nm
from dpstream.operators.baselines import per_step_mean as b0
from dpstream.operators.errors import BudgetExceededError, InvalidOperatorConfig
from dpstream.operators.means import continual_mean as cm
from dpstream.operators.noise import (
    KeyedNoise,
    RecordingNoise,
    SeededNoise,
    ZeroNoise,
    discrete_laplace_variance,
    laplace_variance,
)
from dpstream.operators.selection import private_median as pm
from dpstream.operators.trees import binary_mechanism as bm

KEY = b"continual-mean-test-key-0123456789"
E5 = {"epsilon": 1, "delta": 0.1, "n": 1024, "m": 16}


def bernoulli_events(rng: random.Random, order: Sequence[int], mu: float) -> list[tuple[int, int]]:
    return [(u, int(rng.random() < mu)) for u in order]


def contiguous(users: int, per_user: int) -> list[int]:
    return [u for u in range(users) for _ in range(per_user)]


def round_robin(users: int, per_user: int) -> list[int]:
    return [u for _ in range(per_user) for u in range(users)]


def random_order(rng: random.Random, users: int, per_user: int) -> list[int]:
    order = contiguous(users, per_user)
    rng.shuffle(order)
    return order


# ---------------------------------------------------------------------------------------
# Reference: Algorithm 6 as printed (with its [FIX]es), one arrival at a time, on the grid.


def paper_alg6(spec: cm.ContinualMeanSpec, events: Sequence[tuple[int, int]]) -> list[dict]:
    """Alg. 6 (our corrections, docs/papers.md) verbatim, medians at eps' -> infinity (argmin c).

    Written from the paper's pseudo-code, independently of the module: D_l is recomputed
    from scratch at every arrival, the median fills exactly K arrays in first-arrival
    order and stops, the buffer is a list in arrival order. Values are grid units.
    """
    big_l, n, m, g = spec.levels, spec.n, spec.m, spec.resolution
    counts: dict[int, int] = {}
    samples: dict[int, list[int]] = {}
    order: list[int] = []
    inactive = list(range(2, big_l + 1))
    buffer: dict[int, list[int]] = {lv: [] for lv in range(big_l + 1)}
    leaves: dict[int, list[int]] = {lv: [] for lv in range(big_l + 1)}
    centre: dict[int, int] = {}
    total, medians_called, out = 0, [], []

    def snapshot() -> dict:
        return {
            "total": total,
            "active": max([1] + [lv for lv in range(2, big_l + 1) if lv not in inactive]),
            "leaves": tuple(len(leaves[lv]) for lv in range(big_l + 1)),
            "sums": tuple(sum(leaves[lv]) for lv in range(big_l + 1)),
            "medians": tuple(medians_called),
        }

    for u, q in events:
        if u not in counts:
            if len(order) >= n:
                out.append(snapshot())
                continue
            order.append(u)
            counts[u], samples[u] = 0, []
        if counts[u] >= m:
            out.append(snapshot())
            continue
        counts[u] += 1
        samples[u].append(q)
        for lv in list(inactive):
            s = 2 ** (lv - 1)
            k = math.ceil(spec.constants[lv].k)
            if sum(min(c, s) for c in counts.values()) >= s * k:
                medians_called.append(lv)
                flat = [x for v in order for x in samples[v][: min(counts[v], s)]]
                arrays = [sum(flat[j * s : (j + 1) * s]) / (s * g) for j in range(k)]
                mids = pm.midpoints(lv)
                snapped = [
                    min(range(len(mids)), key=lambda i, y=y: (abs(y - mids[i]), i)) for y in arrays
                ]
                c = [
                    max(sum(1 for b in snapped if b < i), sum(1 for b in snapped if b > i))
                    for i in range(len(mids))
                ]
                best = c.index(min(c))
                centre[lv] = math.floor(s * g * Fraction(mids[best]) + Fraction(1, 2))
                h = spec.half_widths[lv]
                for sigma in buffer[lv]:
                    leaves[lv].append(min(max(sigma, centre[lv] - h), centre[lv] + h))
                    total += s
                buffer[lv] = []
                inactive.remove(lv)  # [FIX] P3
        cnt = counts[u]
        if cnt & (cnt - 1) == 0:
            lv = cnt.bit_length() - 1
            sigma = q if lv == 0 else sum(samples[u][2 ** (lv - 1) : 2**lv])
            if lv in (0, 1):
                leaves[lv].append(sigma)
                total += 1
            elif lv not in inactive:
                h = spec.half_widths[lv]
                leaves[lv].append(min(max(sigma, centre[lv] - h), centre[lv] + h))
                total += 2 ** (lv - 1)  # [FIX] P2
            else:
                buffer[lv].append(sigma)
        out.append(snapshot())
    return out


def units(spec: cm.ContinualMeanSpec, events: Sequence[tuple[int, float]]) -> list[tuple[int, int]]:
    return [(u, cm.to_units(spec, x)[0]) for u, x in events]


def run_per_arrival(spec: cm.ContinualMeanSpec, events, noise=None):
    return cm.simulate(spec, cm.arrivals(events), noise or ZeroNoise())


# ---------------------------------------------------------------------------------------
# Worked examples


def test_e1_binary_mechanism():
    spec = bm.make_binary_mechanism(1, 1, 8, ("s",))
    assert spec.scale == 4 and spec.depth == 4
    assert bm.nodes_containing(spec, 1) == [1, 2, 4, 8]
    assert [node[-1] for node, _, _ in bm.release_nodes(spec, 7)] == [4, 6, 7]
    assert [node[-1] for node, _, _ in bm.release_nodes(spec, 6)] == [4, 6]
    assert bm.variance(spec, 7, continuous=True) == 96
    assert bm.variance(spec, 8, continuous=True) == 32
    # Alg. 2 with T = 1024, m = 8, eps = 0.5: eta = 8 * 11 / 0.5 (per unit of range).
    assert nm.make_naive_mean(0.5, 128, 8, horizon=1024, resolution=1).tree.scale == 176


def test_binary_mechanism_every_leaf_lies_in_at_most_depth_nodes():
    for capacity in (1, 2, 7, 8, 100, 1000, 1024):
        spec = bm.make_binary_mechanism(1, 1, capacity, ("s",))
        for leaf in range(1, capacity + 1):
            nodes = bm.nodes_containing(spec, leaf)
            assert len(nodes) <= spec.depth == 1 + int(math.log2(capacity))
            # NPS[i] covers (i - 2^lowbit(i), i]
            assert all(i - (i & -i) < leaf <= i for i in nodes)


def test_binary_mechanism_zero_noise_is_the_prefix_sum_and_capacity_is_enforced():
    spec = bm.make_binary_mechanism(1, 3, 10, ("s",))
    state = bm.init(spec)
    assert bm.release(spec, state, RecordingNoise(ZeroNoise())).value == 0
    state = bm.append(spec, state, 7, 12)
    assert bm.release(spec, state, ZeroNoise()).value == 12
    with pytest.raises(ValueError, match="capacity 10"):
        bm.append(spec, state, 4, 1)


def e2_events() -> list[tuple[int, int]]:
    # user order 1,2,2,2,1,2,1,1 ; values chosen so every element sum is distinct
    order = [1, 2, 2, 2, 1, 2, 1, 1]
    xs = [1, 0, 1, 1, 0, 1, 1, 0]
    return list(zip(order, xs, strict=True))


def test_e2_withhold_release_trace():
    """All levels active (Alg. 5 mode): per-level streams, totals and release times."""
    spec = cm.make_oracle_prior_mean(0.5, 1, 0.1, 1 << 20, 4, resolution=1)
    releases, sim = run_per_arrival(spec, e2_events())
    totals = [r.total for r in releases]
    assert totals == [1, 2, 3, 3, 4, 6, 6, 8]
    assert totals != [1, 2, 4, 4, 6, 10, 10, 14]  # the literal typo "total += M(u_t)"
    created = [t + 1 for t, msg in enumerate(sim.messages) if sum(msg.counts)]
    assert created == [1, 2, 3, 5, 6, 8]
    # BinMech[0] = [x1, x2], BinMech[1] = [x3, x5], BinMech[2] = [x4+x6, x7+x8]
    per_level = [
        [(t + 1, msg.sums[lv]) for t, msg in enumerate(sim.messages) if msg.counts[lv]]
        for lv in range(3)
    ]
    assert per_level == [[(1, 1), (2, 0)], [(3, 1), (5, 0)], [(6, 2), (8, 1)]]
    assert sim.state.leaves == (2, 2, 2)


def test_e2_trace_under_algorithm_6_buffers_level_2():
    spec = cm.make_continual_mean(1, 0.1, 1024, 4, resolution=1)
    releases, sim = run_per_arrival(spec, e2_events())
    assert [r.total for r in releases] == [1, 2, 3, 3, 4, 4, 4, 4]
    assert sim.state.buffers[2] == ((1, 1), (2, 1))  # x7+x8 = 1, x4+x6 = 2, withheld
    assert sim.state.active == 1


def test_e4_algorithm_5_constants():
    consts = cm.prior_constants(1, 0.1, 1024, 16)
    assert [round(c.eta, 2) for c in consts] == [262.78, 371.62, 525.55, 743.25, 1051.11]
    assert [round(c.delta, 4) for c in consts[1:]] == [2.6284, 3.8636, 5.7568, 8.7271]


def test_e5_constants_table():
    consts = cm.paper_constants(**E5)
    assert [round(c.k, 2) for c in consts] == [612.80, 657.16, 701.52, 745.88, 790.24]
    assert [c.arrays for c in consts[2:]] == [702, 746, 791]
    assert [c.threshold for c in consts[2:]] == [1404, 2984, 6328]
    assert [round(c.delta, 4) for c in consts] == [5.2110, 7.3838, 10.4611, 14.8191, 20.9906]
    assert [round(c.eta, 2) for c in consts] == [1146.42, 1624.43, 2301.43, 3260.21, 4617.94]
    # the spec prints A_2 + B_2 = 3.5232 + 6.9379 (last digits rounded; the sum is exact)
    assert (consts[2].a, consts[2].b) == pytest.approx((3.5232, 6.9379), abs=2e-4)
    spec = cm.make_continual_mean(**E5)
    assert (spec.levels, spec.trees[0].epsilon) == (4, Fraction(1, 10))
    assert spec.medians[2].epsilon == Fraction(1, 8)
    assert [spec.medians[lv].arrays for lv in (2, 3, 4)] == [702, 746, 791]
    # Exact unit scales: eta_l * G up to the rounding of h_l = ceil(Delta_l G + 1/2).
    for c, tree in zip(consts, spec.trees, strict=True):
        assert float(tree.scale) / spec.resolution == pytest.approx(
            c.eta, rel=1.5 / (c.delta * 1024)
        )
        assert float(tree.scale) / spec.resolution >= c.eta
    expected_bins = {
        2: [0.5],
        3: [0.35355, 0.85355],
        4: [0.25, 0.75],
        5: [0.17678, 0.53033, 0.85355],
        6: [0.125, 0.375, 0.625, 0.875],
    }
    for lv, bins in expected_bins.items():
        assert [round(b, 5) for b in pm.midpoints(lv)] == bins
        assert len(pm.midpoints(lv)) == math.ceil(2 ** (lv / 2) / 2)


def test_e5_end_to_end_1024_users_times_16_contiguous():
    spec = cm.make_continual_mean(**E5)
    rng = random.Random(5)
    events = bernoulli_events(rng, contiguous(1024, 16), 0.3)
    ticks = [events[i : i + 16] for i in range(0, len(events), 16)]  # one user per tick
    releases, sim = cm.simulate(spec, ticks, ZeroNoise())
    state = sim.state
    assert state.active == 4 and state.arrays[4] == 1024 >= 791  # D_4 = 8192 >= 6328
    assert state.leaves == (1024,) * 5
    assert [len(bm.release_nodes(t, 1024)) for t in spec.trees] == [1] * 5
    # Paper: sqrt(2 sum eta_l^2) / 16384 = 0.554 (continuous Laplace).
    paper = math.sqrt(2 * sum(c.eta**2 for c in spec.constants)) / 16384
    assert round(paper, 3) == 0.554
    ours_cont = math.sqrt(sum(laplace_variance(t.scale) for t in spec.trees)) / (16384 * 1024)
    assert ours_cont == pytest.approx(paper, rel=2e-3)
    assert releases[-1].std == pytest.approx(ours_cont, rel=1e-4)  # discrete ~ continuous here
    assert releases[-1].total == 16384
    # Alg. 5 with the same parameters: 0.126.
    alg5 = cm.prior_constants(**E5)
    assert round(math.sqrt(2 * sum(c.eta**2 for c in alg5)) / 16384, 3) == 0.126


def test_e6_exponential_mechanism_probabilities():
    spec = pm.make_private_median(4, 4, 0.01, 1, ("m",))
    hist = (2, 3)  # Y' = [0.25, 0.25, 0.75, 0.75, 0.75]
    assert pm.scores(hist) == (3, 2)
    assert pm.probabilities(spec, hist)[1] == pytest.approx(1 / (1 + math.exp(-1)), abs=1e-12)
    assert round(pm.probabilities(spec, hist)[1], 6) == 0.731059


@pytest.mark.statistical
def test_e6_sampler_frequency():
    """20000 seeded draws; SE of a frequency is sqrt(p(1-p)/n) = 0.0031; allow 5 SE."""
    spec = pm.make_private_median(4, 4, 0.01, 1, ("m",))
    noise = SeededNoise(6)
    n = 20000
    hits = sum(pm.select(spec, (2, 3), noise) for _ in range(n))
    p = 1 / (1 + math.exp(-1))
    assert abs(hits / n - p) <= 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.statistical
def test_exponential_mechanism_three_bins_matches_its_distribution():
    """Chi-square over 3 bins, 12000 draws: the statistic has 2 df; 13.8 is its 0.999 quantile."""
    spec = pm.make_private_median(Fraction(3, 2), 5, 0.01, 1, ("m",))
    hist = (4, 1, 3)
    probs = pm.probabilities(spec, hist)
    noise = SeededNoise(7)
    n = 12000
    seen = [0, 0, 0]
    for _ in range(n):
        seen[pm.select(spec, hist, noise)] += 1
    chi2 = sum((o - n * p) ** 2 / (n * p) for o, p in zip(seen, probs, strict=True))
    assert chi2 < 13.8


# ---------------------------------------------------------------------------------------
# Structural oracles 1-9 against the paper's procedure


def small_spec(**kw) -> cm.ContinualMeanSpec:
    # A large epsilon makes the medians' K_l small enough to activate levels in small tests.
    args = {"epsilon": 64, "delta": 0.1, "n": 64, "m": 16, "resolution": 16} | kw
    return cm.make_continual_mean(**args)


@pytest.mark.parametrize("order_name", ["contiguous", "round_robin", "random", "heavy_first"])
def test_staged_implementation_equals_the_paper_per_arrival(order_name):
    spec = small_spec()
    rng = random.Random(
        {"contiguous": 1, "round_robin": 2, "random": 3, "heavy_first": 4}[order_name]
    )
    users, per = 40, 16
    order = {
        "contiguous": contiguous(users, per),
        "round_robin": round_robin(users, per),
        "random": random_order(rng, users, per),
        "heavy_first": [0] * per + [u for _ in range(per) for u in range(1, users)],
    }[order_name]
    events = [(u, rng.random() * 0.7) for u in order]
    releases, sim = run_per_arrival(spec, events)
    ref = paper_alg6(spec, units(spec, events))
    assert [r.total for r in releases] == [row["total"] for row in ref]
    assert [r.active for r in releases] == [row["active"] for row in ref]
    states = []
    replay = cm.Simulation(spec)
    for event in events:
        replay.tick([event], ZeroNoise())
        states.append(replay.state)
    assert [s.leaves for s in states] == [row["leaves"] for row in ref]
    assert [s.sums for s in states] == [row["sums"] for row in ref]
    assert ref[-1]["medians"] == tuple(range(2, spec.levels + 1))  # each level once, ascending
    assert sim.state.active == spec.levels  # this stream activates every level


def test_oracle_1_elements_exactly_at_powers_of_two():
    spec = small_spec(m=32, resolution=100)
    part = cm.init_partition(spec)
    part, user = cm.admit(spec, part)
    xs = [random.Random(1).random() for _ in range(40)]
    units_ = [cm.to_units(spec, x)[0] for x in xs]
    for j, x in enumerate(xs, start=1):
        user, effect = cm.observe(spec, part, user, x)
        if j > 32:
            assert effect.unused
            continue
        if j & (j - 1) == 0:
            lv = j.bit_length() - 1
            assert effect.level == lv
            want = units_[0] if lv == 0 else sum(units_[2 ** (lv - 1) : 2**lv])
            assert effect.element == want
        else:
            assert effect.level == -1
    assert user.count == 32 and user.unused == 8


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 11), st.floats(0, 1)), min_size=1, max_size=300),
    st.integers(2, 40),
)
def test_oracles_2_and_5_sensitivity_structure_and_public_quantities(events, m):
    """One element per user per level, <= n per BinMech; totals, activation and counts
    depend on the arrival pattern only."""
    spec = small_spec(m=m, n=8)
    _, sim = run_per_arrival(spec, events)
    other = [(u, 1 - x) for u, x in events]
    _, sim2 = run_per_arrival(spec, other)
    for msg in sim.messages:
        assert all(c <= spec.n for c in msg.counts)
    assert all(k <= spec.n for k in sim.state.leaves)
    assert sum(sim.state.leaves) <= sim.state.users * (spec.levels + 1)
    pub = lambda s: (s.total, s.active, s.leaves, s.users, s.samples, s.samples_over_cap)  # noqa: E731
    trace1 = [pub(s) for s in _states(spec, events)]
    trace2 = [pub(s) for s in _states(spec, other)]
    assert trace1 == trace2
    # total = sum_u 2^min(floor(log2 m_u), a) (coverage formula, Claim C.1)
    counts: dict[int, int] = {}
    for u, _ in events:
        if u in counts or len(counts) < spec.n:
            counts[u] = min(counts.get(u, 0) + 1, m)
    a = sim.state.active
    assert sim.state.total == sum(2 ** min(c.bit_length() - 1, a) for c in counts.values())


def _states(spec, events):
    sim = cm.Simulation(spec)
    out = []
    for e in events:
        sim.tick([e], ZeroNoise())
        out.append(sim.state)
    return out


def test_oracle_2_one_element_per_user_per_level():
    spec = small_spec(m=64)
    part = cm.init_partition(spec)
    seen: dict[int, list[int]] = {}
    users = {}
    rng = random.Random(2)
    for _ in range(3000):
        u = rng.randrange(30)
        if u not in users:
            part, users[u] = cm.admit(spec, part)
        users[u], effect = cm.observe(spec, part, users[u], rng.random())
        if effect.level >= 0:
            seen.setdefault(u, []).append(effect.level)
    for levels in seen.values():
        assert len(levels) == len(set(levels)) <= spec.levels + 1


def test_oracle_3_node_scales_and_popcount_nodes():
    spec = cm.make_continual_mean(**E5)
    big_l, log_n = 4, 10
    for c, tree in zip(spec.constants, spec.trees, strict=True):
        h = math.ceil(c.delta * 1024 + 0.5)
        eps_bm = Fraction(1, 2 * (big_l + 1))
        assert tree.scale == Fraction(2 * h * (1 + log_n)) / eps_bm
    rng = random.Random(3)
    events = bernoulli_events(rng, random_order(rng, 50, 16), 0.4)
    _, sim = cm.simulate(spec, [events[:300], events[300:]], ZeroNoise())
    recorder = RecordingNoise(ZeroNoise())
    cm.release(spec, sim.state, recorder)
    per_level = [sum(1 for node, _, _ in recorder.calls if node[3] == lv) for lv in range(5)]
    assert per_level == [k.bit_count() for k in sim.state.leaves]
    assert all(node[2] == "level" for node, _, _ in recorder.calls)


@pytest.mark.statistical
def test_oracle_3_noise_variance_is_exact():
    """Var(S_t - exact) = sum_l V(b_l) popcount(k_l), checked on 2000 seeded releases of a
    fixed state. The sample variance has relative SE sqrt((2 + kappa) / n), kappa the
    excess kurtosis of the noise sum (cumulants of discrete Laplace terms, computed
    exactly below); 5 SE."""
    spec = cm.make_continual_mean(**E5)
    # the noise depends on the leaf counts only (any counts <= n)
    leaves = (1023, 1000, 777, 512, 3)
    state = dataclasses.replace(cm.init(spec), leaves=leaves, total=5000, sums=(7, 0, 0, 0, 0))
    noise = SeededNoise(32)
    n = 2000
    draws = []
    for _ in range(n):
        recorder = RecordingNoise(noise)
        rel = cm.release(spec, state, recorder)
        draws.append(sum(v for _, _, v in recorder.calls))
        assert rel.value == pytest.approx((7 + draws[-1]) / (5000 * 1024), rel=1e-12)
    terms = cm.noise_terms(spec, state)
    assert len(terms) == sum(k.bit_count() for k in leaves) == 10 + 6 + 4 + 1 + 2
    var = sum(discrete_laplace_variance(s) for _, s, _ in terms)
    k2 = k4 = 0.0
    for _, b, _ in terms:
        p = math.exp(-1 / float(b))
        k2 += 2 * p / (1 - p) ** 2
        k4 += 2 * p * (1 + 4 * p + p * p) / (1 - p) ** 4
    rel_se = math.sqrt((2 + k4 / k2**2) / n)
    assert float(np.var(draws)) == pytest.approx(var, rel=5 * rel_se)
    assert rel.std == pytest.approx(math.sqrt(var) / (5000 * 1024), rel=1e-12)


def test_oracle_4_coupled_privacy_loss():
    """Zero noise, neighbours differing in one user's values, same medians: the node
    vectors move by sum_l ||nodes_l - nodes'_l||_1 / eta_l <= eps/2 (<= eps/(2(L+1)) per
    level), and each median histogram by at most 2 arrays."""
    spec = small_spec(n=60, m=16, resolution=8)
    rng = random.Random(4)
    order = random_order(rng, 60, 16)
    events = [(u, rng.random() * 0.5 + 0.25) for u in order]
    victim = 7
    neighbour = [(u, (1.0 if x < 0.5 else 0.0) if u == victim else x) for u, x in events]
    (_, sim_a), (_, sim_b) = run_per_arrival(spec, events), run_per_arrival(spec, neighbour)
    assert sim_a.state.medians == sim_b.state.medians  # forced equal by the data choice
    eps_bm = spec.trees[0].epsilon
    loss = Fraction(0)
    active_a = [s.active for s in _states_from_messages(spec, sim_a)]
    active_b = [s.active for s in _states_from_messages(spec, sim_b)]
    assert active_a == active_b  # public
    for lv in range(spec.levels + 1):
        va, vb = leaf_vector(spec, sim_a, lv, active_a), leaf_vector(spec, sim_b, lv, active_b)
        assert len(va) == len(vb)
        tree = spec.trees[lv]
        level_loss = Fraction(node_l1(tree, va, vb)) / tree.scale
        assert level_loss <= eps_bm
        loss += level_loss
    assert loss <= spec.epsilon / 2
    for msg_a, msg_b in zip(sim_a.messages, sim_b.messages, strict=True):
        for (la, ha), (lb, hb) in zip(msg_a.medians, msg_b.medians, strict=True):
            assert la == lb and sum(ha) == sum(hb)
            assert sum(abs(x - y) for x, y in zip(ha, hb, strict=True)) <= 4  # 2 arrays moved
            ca, cb = pm.scores(ha), pm.scores(hb)
            assert max(abs(x - y) for x, y in zip(ca, cb, strict=True)) <= 2


def leaf_vector(spec, sim, lv, active_after) -> list[int]:
    """The leaves of BinMech[lv] in insertion order (each tick's in ascending order),
    rebuilt from the messages and the final centres."""
    out: list[int] = []
    buffered: list[int] = []
    c, h = sim.state.centres[lv], spec.half_widths[lv]

    def clip(v):
        return v if lv < spec.first_clipped else min(max(v, c - h), c + h)

    for t, msg in enumerate(sim.messages):
        if lv > active_after[t]:
            buffered += [v for v, k in msg.hists[lv] for _ in range(k)]
            continue
        batch = sorted(buffered + [v for v, k in msg.hists[lv] for _ in range(k)])
        if lv < spec.first_clipped:
            assert msg.counts[lv] <= 1  # one arrival per tick: the value is the sum
            batch = [msg.sums[lv]] * msg.counts[lv]
        buffered = []
        out += [clip(v) for v in batch]
    return out


def _states_from_messages(spec, sim):
    state, out = cm.init(spec), []
    for msg in sim.messages:
        state, _ = cm.step(spec, state, msg, ZeroNoise())
        out.append(state)
    return out


def node_l1(tree: bm.BinMechSpec, a: Sequence[int], b: Sequence[int]) -> int:
    """L1 distance of the full node vectors NPS[1..k] (every node, released or not)."""
    pa, pb = np.concatenate([[0], np.cumsum(a)]), np.concatenate([[0], np.cumsum(b)])
    total = 0
    for i in range(1, len(a) + 1):
        lo = i - (i & -i)
        total += abs(int(pa[i] - pa[lo]) - int(pb[i] - pb[lo]))
    return total


def test_oracle_6_coverage_all_levels_active():
    """Noise off, no clipping: mu^_t is the mean of each user's first 2^floor(log2 m_u) samples."""
    spec = cm.make_oracle_prior_mean(Fraction(1, 2), 1, 0.1, 10**6, 16, resolution=1000)
    rng = random.Random(6)
    order = random_order(rng, 30, 16)
    events = [(u, round(rng.random(), 3)) for u in order]
    releases, _ = run_per_arrival(spec, events)
    seen: dict[int, list[float]] = {}
    for t, (u, x) in enumerate(events):
        seen.setdefault(u, []).append(x)
        covered = [y for xs in seen.values() for y in xs[: 2 ** (len(xs).bit_length() - 1)]]
        assert releases[t].total == len(covered) >= (t + 1) / 2  # Claim C.1
        assert releases[t].value == pytest.approx(sum(covered) / len(covered), abs=1e-12)


def activation_spec() -> cm.ContinualMeanSpec:
    return small_spec(n=100, m=32)


def test_oracle_7_activation_rule_and_monotonicity():
    spec = activation_spec()
    rng = random.Random(7)
    order = random_order(rng, 80, 32)
    events = [(u, rng.random()) for u in order]
    releases, sim = run_per_arrival(spec, events)
    actives = [r.active for r in releases]
    assert actives == sorted(actives)  # the active set {0..a} only grows
    counts: dict[int, int] = {}
    first: dict[int, int] = {}
    for t, (u, _) in enumerate(events, start=1):
        counts[u] = counts.get(u, 0) + 1
        for lv in range(2, spec.levels + 1):
            s = 2 ** (lv - 1)
            if (
                lv not in first
                and sum(min(c, s) for c in counts.values()) >= s * spec.medians[lv].arrays
            ):
                first[lv] = t
    for lv, t in first.items():
        assert actives[t - 1] >= lv and (t == 1 or actives[t - 2] < lv)
    assert set(first) == set(range(2, spec.levels + 1))


def test_oracle_7_median_called_once_per_level_and_buffers_flushed_clipped(monkeypatch):
    spec = activation_spec()
    calls: list[int] = []
    real = pm.select

    def spy(median_spec, hist, noise):
        calls.append(median_spec.level)
        assert sum(hist) == median_spec.arrays  # oracle 8: exactly ceil(k) arrays
        return real(median_spec, hist, SeededNoise(len(calls)))

    monkeypatch.setattr(pm, "select", spy)
    rng = random.Random(8)
    events = [(u, rng.random()) for u in random_order(rng, 80, 32)]
    sim = cm.Simulation(spec)
    for event in events:
        before = sim.state
        sim.tick([event], ZeroNoise())  # the spy draws the medians with seeded noise
        after = sim.state
        for lv in range(before.active + 1, after.active + 1):
            assert after.buffers[lv] == ()
            c, h = after.centres[lv], spec.half_widths[lv]
            flushed = sum(k * min(max(v, c - h), c + h) for v, k in before.buffers[lv])
            new = [v for v, k in sim.messages[-1].hists[lv] for _ in range(k)]
            new_clipped = sum(min(max(v, c - h), c + h) for v in new)
            assert after.sums[lv] - before.sums[lv] == flushed + new_clipped
    assert calls == list(range(2, spec.levels + 1))
    assert all(b == () for b in sim.state.buffers)


def test_oracle_7_diversity_condition_implies_levels_active():
    """If (11) holds at t, every level <= floor(log2 M_t) is active."""
    spec = activation_spec()
    big_l, eps, delta = spec.levels, float(spec.epsilon), spec.delta
    rng = random.Random(10)
    events = [(u, rng.random()) for u in round_robin(80, 32)]
    releases, _ = run_per_arrival(spec, events)
    counts: dict[int, int] = {}
    checked = 0
    for t, (u, _) in enumerate(events):
        counts[u] = counts.get(u, 0) + 1
        big_m = max(counts.values())
        # (11) with k rounded up as the activation rule does (P8)
        k = math.ceil(16 / eps * 2 * big_l * math.log(3 * big_l * math.sqrt(big_m) / delta))
        need = big_m / 2 * k
        if sum(min(c, big_m / 2) for c in counts.values()) >= need:
            checked += 1
            assert releases[t].active >= big_m.bit_length() - 1
    assert checked > 1000  # of 2560 arrivals


def test_oracle_8_fill_uses_each_user_in_at_most_two_arrays():
    median = pm.make_private_median(1, 4, 0.01, 10, ("m",))
    s = 8
    rng = random.Random(11)
    users = []
    for _ in range(40):
        count = rng.randrange(1, 20)
        xs = [rng.randrange(11) for _ in range(min(count, s))]
        users.append((count, tuple(np.cumsum(xs).tolist())))
    # reference packing with user labels
    labels = [i for i, (c, _) in enumerate(users) for _ in range(min(c, s))]
    values = [x for c, p in users for x in np.diff((0, *p))[: min(c, s)]]
    arrays = len(labels) // s
    per_user = {}
    for j in range(arrays):
        for u in labels[j * s : (j + 1) * s]:
            per_user.setdefault(u, set()).add(j)
    assert max(len(v) for v in per_user.values()) <= 2
    want = [0] * len(median.midpoints)
    for j in range(arrays):
        want[pm.bin_of(median, int(sum(values[j * s : (j + 1) * s])))] += 1
    assert pm.fill(median, users) == tuple(want)
    assert sum(want) == arrays


def test_oracle_8_output_in_bins_and_argmin_at_infinite_epsilon():
    median = pm.make_private_median(10**9, 5, 0.01, 1, ("m",))
    hist = (3, 9, 4)
    assert pm.select(median, hist, ZeroNoise()) == 1
    assert pm.select(median, hist, SeededNoise(1)) == 1  # eps' huge: argmin w.p. ~1
    assert pm.select(median, (5, 0, 5), ZeroNoise()) == 0  # tie c = 5, 5, 5 -> smallest
    assert pm.bin_of(median, 0) == 0 and pm.bin_of(median, 16) == 2
    for lv in range(2, 12):
        assert len(pm.midpoints(lv)) == math.ceil(2 ** (lv / 2) / 2)
    two = pm.make_private_median(1, 2, 0.01, 1, ("m",))
    assert pm.select(two, (17,), RecordingNoise(ZeroNoise())) == 0  # T_2 = {0.5}


def test_bin_ties_go_to_the_smaller_midpoint():
    median = pm.make_private_median(1, 4, 0.01, 1, ("m",))  # T_4 = {0.25, 0.75}, s = 8
    assert pm.bin_of(median, 4) == 0  # Y = 0.5 is equidistant


@pytest.mark.parametrize("m", [2, 3, 4, 16, 100, 256, 1024])
def test_oracle_9_budget(m):
    spec = cm.make_continual_mean(Fraction(3, 7), 0.1, 1000, m)
    budget = cm.privacy_budget(spec)
    big_l = spec.levels
    assert budget["medians"] == (big_l - 1) * Fraction(3, 7) / (2 * big_l)
    assert budget["trees"] == Fraction(3, 14)
    assert budget["total"] <= spec.epsilon


# ---------------------------------------------------------------------------------------
# Corrections (docs/papers.md)


def test_p2_total_adds_the_element_size():
    spec = cm.make_oracle_prior_mean(0.5, 1, 0.1, 100, 16, resolution=1)
    releases, _ = run_per_arrival(spec, [(0, 1)] * 16)
    # releases at counts 1, 2, 4, 8, 16 add 1, 1, 2, 4, 8
    assert [releases[c - 1].total for c in (1, 2, 3, 4, 8, 16)] == [1, 2, 2, 4, 8, 16]


def test_p5_tree_depth_is_exact_and_never_above_the_paper():
    spec = cm.make_continual_mean(1, 0.1, 1000, 16)
    assert all(t.depth == 10 for t in spec.trees)  # 1000 leaves: levels 0..9
    for c, tree in zip(spec.constants, spec.trees, strict=True):
        assert float(tree.scale) / 1024 < c.eta  # 10 < 1 + log2(1000) = 10.97


def test_p6_levels_0_and_1_are_never_clipped():
    spec = small_spec(m=4, resolution=1)
    rng = random.Random(12)
    events = [(u, 1) for u in random_order(rng, 60, 4)]
    _, sim = run_per_arrival(spec, events)
    assert sim.state.sums[0] == sim.state.leaves[0] == 60
    assert sim.state.sums[1] == sim.state.leaves[1] == 60
    assert spec.half_widths[:2] == (0, 0)


def test_p9_caps_users_and_samples_are_counted_not_used():
    spec = small_spec(n=5, m=4)
    events = [(u, 0.5) for u in range(8)] + [(0, 0.5)] * 6
    releases, sim = run_per_arrival(spec, events)
    assert sim.state.users == 5 and sim.state.users_over_cap == 3
    # users 5..7 (3 samples) and user 0's samples 5..7 (3 samples beyond m = 4)
    assert sim.state.samples_over_cap == 6 == releases[-1].dropped
    assert sim.state.samples == 5 + 3
    assert sim.state.max_count == 4


def test_p9_user_quota_split_over_partitions():
    spec = small_spec(n=10, partitions=3)
    assert [cm.user_quota(spec, p) for p in range(3)] == [4, 3, 3]
    part = cm.init_partition(spec, 2)
    ranks = []
    for _ in range(5):
        part, user = cm.admit(spec, part)
        ranks.append(user.rank)
    assert ranks == [0, 1, 2, -1, -1] and part.users_over_cap == 2


def test_p13_raw_value_may_leave_the_range():
    spec = cm.make_continual_mean(1, 0.1, 1024, 16)
    rel = cm.simulate(spec, [[(0, 0.0)]], KeyedNoise(KEY))[0][0]
    assert rel.total == 1 and rel.std > 100  # mu^_1 = x_1 + Lap(eta_0): far outside [0, 1]
    assert not 0 <= rel.value <= 1


def test_no_data_tick_releases_a_data_independent_value():
    spec = cm.make_continual_mean(1, 0.1, 1024, 16, lower=-2, upper=6)
    rels, _ = cm.simulate(spec, [[], []], KeyedNoise(KEY))
    assert [(r.value, r.total, r.std, r.mean_ci95) for r in rels] == [(2.0, 0, 0.0, 4.0)] * 2


# ---------------------------------------------------------------------------------------
# Affine scaling, grid, clipping


def test_affine_scaling_maps_releases_and_error_bars():
    base = cm.make_continual_mean(8, 0.1, 64, 16, resolution=64)
    scaled = cm.make_continual_mean(8, 0.1, 64, 16, lower=10, upper=20, resolution=64)
    rng = random.Random(13)
    # values on the 1/64 grid, so 10 + 10 x is exact in binary and snaps to the same units
    events = [(u, rng.randrange(65) / 64) for u in random_order(rng, 40, 16)]
    ticks = [events[i : i + 25] for i in range(0, len(events), 25)]
    r0, _ = cm.simulate(base, ticks, KeyedNoise(KEY))
    shifted = [[(u, 10 + 10 * x) for u, x in tick] for tick in ticks]
    r1, _ = cm.simulate(scaled, shifted, KeyedNoise(KEY))  # same node ids, same unit noise
    for a, b in zip(r0, r1, strict=True):
        assert b.value == pytest.approx(10 + 10 * a.value, rel=1e-12)
        assert b.std == pytest.approx(10 * a.std) and b.ci95 == pytest.approx(10 * a.ci95)
        assert b.mean_ci95 == pytest.approx(10 * a.mean_ci95)
        assert (b.total, b.active) == (a.total, a.active)
    assert r1[-1].medians == tuple((lv, 10 + 10 * v) for lv, v in r0[-1].medians)


def test_values_outside_the_range_are_clipped_and_counted_locally():
    spec = cm.make_continual_mean(1, 0.1, 64, 16, lower=-1, upper=1, resolution=4)
    assert cm.to_units(spec, -1) == (0, False)
    assert cm.to_units(spec, 1) == (4, False)
    assert cm.to_units(spec, 0.1) == (2, False)  # y = 0.55 -> 2.2 units -> 2
    assert cm.to_units(spec, 0.125) == (2, False)  # 2.25 -> 2
    assert cm.to_units(spec, 0.25) == (3, False)  # 2.5 -> 3 (ties up)
    assert cm.to_units(spec, 7.5) == (4, True)
    assert cm.to_units(spec, -math.inf) == (0, True)
    assert cm.to_units(spec, math.nan) == (0, True)
    sim = cm.Simulation(spec)
    sim.tick([(0, 5.0), (0, -3.0), (1, 0.5)], ZeroNoise())
    assert sim.parts[0].clipped == 2
    assert "clipped" not in state_codec.to_json(sim.messages[0])


# ---------------------------------------------------------------------------------------
# State, replay, noise identities


def test_state_and_message_json_round_trip_and_replay_after_restart():
    spec = activation_spec()
    rng = random.Random(14)
    events = [(u, rng.random()) for u in random_order(rng, 150, 32)]
    ticks = [events[i : i + 97] for i in range(0, len(events), 97)]
    full, _ = cm.simulate(spec, ticks, KeyedNoise(KEY))
    sim = cm.Simulation(spec)
    for tick in ticks[:20]:
        sim.tick(tick, KeyedNoise(KEY))
    # "crash": persist everything as JSON, restore, continue
    restored = cm.Simulation(spec)
    restored.state = roundtrip(cm.MeanState, sim.state)
    restored.parts = [roundtrip(cm.PartitionState, p) for p in sim.parts]
    restored.users = {u: roundtrip(cm.UserState, s) for u, s in sim.users.items()}
    restored.ranked = [list(r) for r in sim.ranked]
    assert restored.state == sim.state and restored.users == sim.users
    rest = [restored.tick(tick, KeyedNoise(KEY)) for tick in ticks[20:]]
    assert rest == full[20:]
    for msg in sim.messages:
        assert roundtrip(cm.TickMessage, msg) == msg
    # re-releasing a stored state re-emits the same value (keyed noise, no redraw)
    assert cm.release(spec, restored.state, KeyedNoise(KEY)) == full[-1]


def roundtrip(cls, state):
    return state_codec.from_json(cls, orjson.loads(orjson.dumps(state_codec.to_json(state))))


def test_node_ids_never_repeat_for_different_quantities():
    spec = activation_spec()
    rng = random.Random(15)
    events = [(u, rng.random()) for u in random_order(rng, 150, 32)]
    recorder = RecordingNoise(KeyedNoise(KEY))
    cm.simulate(spec, [events[i : i + 50] for i in range(0, len(events), 50)], recorder)
    scale_of: dict = {}
    median_nodes = []
    for node, scale, _ in recorder.calls:
        assert scale_of.setdefault(node, scale) == scale
        assert node[:2] == ("mean", 0)
        if node[2] == "median":
            median_nodes.append(node)
    assert len(median_nodes) == len(set(median_nodes))  # each draw its own node
    tree_nodes = {n for n, _, _ in recorder.calls if n[2] == "level"}
    for node in tree_nodes:
        assert node[4] <= spec.n  # NPS index within capacity


# ---------------------------------------------------------------------------------------
# Several partitions


def test_partitions_sum_messages_and_activate_on_complete_arrays():
    spec1 = small_spec(n=120, m=16)
    spec3 = small_spec(n=120, m=16, partitions=3)
    rng = random.Random(16)
    events = [(u, rng.random()) for u in random_order(rng, 120, 16)]
    ticks = [events[i : i + 40] for i in range(0, len(events), 40)]
    r1, s1 = cm.simulate(spec1, ticks, ZeroNoise())
    r3, s3 = cm.simulate(spec3, ticks, ZeroNoise())
    # same public arrival pattern, same users: same samples, same elements
    assert s1.state.samples == s3.state.samples and s1.state.leaves == s3.state.leaves
    assert s3.state.active == spec3.levels
    assert s1.state.active == spec1.levels
    # with P partitions activation waits for sum_p floor(D^p / s) >= K
    assert all(r3[t].active <= r1[t].active for t in range(len(ticks)))


def test_missing_median_histogram_is_a_wiring_error():
    spec = small_spec(n=120, m=16, partitions=2)
    sim = cm.Simulation(spec)
    rng = random.Random(17)
    events = [(u, rng.random()) for u in round_robin(120, 16)]
    with pytest.raises(ValueError, match="median histogram of level 2 must cover"):
        for i in range(0, len(events), 60):
            for p, part in enumerate(sim.parts):
                sim.parts[p] = cm.with_known_active(part, spec.levels)  # lie: "all active"
            sim.tick(events[i : i + 60], ZeroNoise())


def test_merge_is_commutative_and_empty_is_identity():
    spec = small_spec(partitions=2)
    sim = cm.Simulation(spec)
    sim.tick([(0, 0.25), (1, 0.5), (0, 1.0), (3, 0.0)], ZeroNoise())
    msg = sim.messages[0]
    assert cm.merge(cm.empty_message(spec), msg) == msg == cm.merge(msg, cm.empty_message(spec))
    a = cm.TickMessage(**{**state_codec.to_json(msg), "medians": ((2, (1,)),)})
    b = cm.TickMessage(**{**state_codec.to_json(msg), "medians": ((2, (3,)), (3, (1, 2)))})
    assert cm.merge(a, b) == cm.merge(b, a)
    assert cm.merge(a, b).medians == ((2, (4,)), (3, (1, 2)))


# ---------------------------------------------------------------------------------------
# Baselines


def test_naive_mean_alg2_scale_and_release():
    spec = nm.make_naive_mean(Fraction(1, 2), 10, 8, resolution=4)
    assert spec.horizon == 80 and spec.tree.scale == Fraction(8 * 4 * 7, 1) / Fraction(1, 2)
    state = nm.init(spec)
    state, rel = nm.step(spec, state, 3, 6, ZeroNoise())
    assert (rel.value, rel.total) == (0.5, 3)
    state, rel = nm.step(spec, state, 100, 0, ZeroNoise())  # would overflow T: not used
    assert state.count == 3 and state.dropped == 100 and rel.dropped == 100


def test_per_step_baseline_b0():
    spec = b0.make_per_step_mean(1, 3, resolution=2)
    state = b0.init(spec)
    assert b0.scale(spec, 5) == 30
    recorder = RecordingNoise(ZeroNoise())
    state, rel = b0.step(spec, state, 4, 6, 2, recorder)
    assert rel.value == 0.75 and recorder.calls[0][1] == b0.scale(spec, 2)
    state, _ = b0.step(spec, state, 0, 0, 2, recorder)
    state, _ = b0.step(spec, state, 0, 0, 2, recorder)
    assert len({n for n, _, _ in recorder.calls}) == 3  # a fresh node per step
    with pytest.raises(BudgetExceededError, match="horizon 3"):
        b0.step(spec, state, 0, 0, 2, recorder)


# ---------------------------------------------------------------------------------------
# Validation messages


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0}, "epsilon must be finite and > 0, got Fraction(0, 1)"),
        ({"delta": 0}, "delta must be in (0, 1], got 0"),
        ({"delta": 1.5}, "delta must be in (0, 1], got 1.5"),
        ({"n": 0}, "n must be >= 1, got 0"),
        ({"m": 1}, "m must be >= 2, got 1"),
        ({"m": 2.5}, "m must be an integer, got 2.5"),
        ({"lower": 1, "upper": 1}, "upper must be > lower = 1, got 1"),
        ({"resolution": 0}, "resolution must be >= 1, got 0"),
        ({"partitions": 0}, "partitions must be >= 1, got 0"),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    args = {"epsilon": 1, "delta": 0.1, "n": 10, "m": 16} | kwargs
    with pytest.raises(InvalidOperatorConfig, match=_escape(message)):
        cm.make_continual_mean(**args)


def test_make_oracle_prior_rejects_a_prior_outside_the_range():
    with pytest.raises(InvalidOperatorConfig, match=_escape("prior must be in [0, 1], got 2")):
        cm.make_oracle_prior_mean(2, 1, 0.1, 10, 16)


def test_partition_index_is_validated():
    spec = small_spec(partitions=2)
    with pytest.raises(InvalidOperatorConfig, match="partition must be < 2, got 2"):
        cm.init_partition(spec, 2)


def test_epsilon_is_the_decimal_the_user_wrote():
    spec = cm.make_continual_mean(0.1, 0.1, 10, 16)
    assert spec.epsilon == Fraction(1, 10)
    assert spec.trees[0].epsilon == Fraction(1, 10) / 10


def _escape(s: str) -> str:
    import re

    return re.escape(s)


# ---------------------------------------------------------------------------------------
# Statistical checks of the error's shape, 1/sqrt(t) + sqrt(M_t)/(t eps)


def exact_noise_std(spec: cm.ContinualMeanSpec, users: int, per_user: int) -> float:
    """Noise std of mu^ at t = N M for N contiguous users x M samples, all levels active:
    sqrt(sum_{l <= log M} V(b_l) popcount(N)) / (N M G)."""
    var = sum(
        discrete_laplace_variance(spec.trees[lv].scale) * users.bit_count()
        for lv in range(per_user.bit_length())
    )
    return math.sqrt(var) / (users * per_user * spec.resolution)


def test_oracle_10_noise_std_scales_like_one_over_n_sqrt_m():
    """Same n, m; M in {16, 64, 256}: the noise std at t = NM is ~ 1/(N sqrt(M)) up to the
    log factors inside eta_l^2 ~ 2^l ln(...). Alg. 2's is ~ m / t, i.e. 1/(N M) * m."""
    n_users, m = 4096, 256
    spec = cm.make_continual_mean(1, 0.1, n_users, m)
    naive = nm.make_naive_mean(1, n_users, m)
    stds = {big_m: exact_noise_std(spec, n_users, big_m) for big_m in (16, 64, 256)}
    shape = {big_m: s * n_users * math.sqrt(big_m) for big_m, s in stds.items()}
    # sqrt(M) t^-1 shape: the normalized std moves by less than the log factors allow
    assert 0.9 < shape[64] / shape[16] < 1.25 and 0.9 < shape[256] / shape[64] < 1.25
    # and 4x more samples per user shrinks the std by ~2x, not 4x (Alg. 6) ...
    assert 1.6 < stds[16] / stds[64] < 2.2
    # ... while Alg. 2's std is m-bound: sqrt(popcount(t)) eta / t
    for big_m in (16, 64, 256):
        t = n_users * big_m
        naive_std = bm.std(naive.tree, t) / (t * naive.resolution)
        assert naive_std == pytest.approx(
            math.sqrt(t.bit_count() * discrete_laplace_variance(naive.tree.scale)) / (t * 1024)
        )


@pytest.mark.statistical
@pytest.mark.parametrize("big_m", [16, 64])
def test_oracle_10_empirical_noise_std_at_t_equal_nm(big_m):
    """The real mechanism over N = 2048 contiguous users x M samples (one user per tick;
    m = 64, eps = 1, so K_l <= 1396 users with M/2 samples activate every level <= log M),
    then 2000 seeded releases of its final state: the sample variance of the released
    mean matches exact_noise_std^2 within 5 SE (relative SE sqrt((2 + kappa)/n) <= sqrt(5/n),
    kappa <= 3 being the excess kurtosis of a sum of a few Laplace terms)."""
    n_users = 2048
    spec = cm.make_continual_mean(1, 0.1, n_users, 64)
    rng = random.Random(100 + big_m)
    events = bernoulli_events(rng, contiguous(n_users, big_m), 0.3)
    ticks = [events[i : i + big_m] for i in range(0, len(events), big_m)]
    _, sim = cm.simulate(spec, ticks, ZeroNoise())
    assert sim.state.active >= big_m.bit_length() - 1
    assert sim.state.leaves[: big_m.bit_length()] == (n_users,) * big_m.bit_length()
    exact = cm.exact_estimate(spec, sim.state)
    noise = SeededNoise(200 + big_m)
    n = 2000
    errs = [cm.release(spec, sim.state, noise).value - exact for _ in range(n)]
    want = exact_noise_std(spec, n_users, big_m)
    assert cm.release(spec, sim.state, ZeroNoise()).std == pytest.approx(want, rel=1e-9)
    assert float(np.var(errs)) == pytest.approx(want**2, rel=5 * math.sqrt(5 / n))


@pytest.mark.statistical
def test_statistical_term_decays_like_one_over_sqrt_t():
    """eps so large that the DP noise is negligible (< 1e-4 of the sampling error): the
    error at t is the sampling error of the total(t) covered samples, RMSE
    sqrt(mu(1-mu)/total(t)), total(t) in [t/2, t]. 300 seeded streams (data and noise); the
    MSE's relative SE is sqrt((2 + kappa)/R) with kappa ~ 0 for a binomial mean, so 5 SE
    = 0.41; the checkpoints span 64x in t, so slope -1/2 is tested against slope 0 or -1."""
    spec = cm.make_continual_mean(10**7, 0.1, 64, 16, resolution=1)
    mu, runs = 0.3, 300
    checkpoints = [16, 64, 256, 1024]
    sq: dict[int, list[float]] = {t: [] for t in checkpoints}
    totals: dict[int, int] = {}
    for run in range(runs):
        rng = random.Random(1000 + run)
        events = bernoulli_events(rng, round_robin(64, 16), mu)
        sim = cm.Simulation(spec)
        noise = SeededNoise(run)
        last = 0
        for t in checkpoints:
            rel = sim.tick(events[last:t], noise)
            last = t
            sq[t].append((rel.value - mu) ** 2)
            totals[t] = rel.total
            assert rel.std < 1e-4 * math.sqrt(mu * (1 - mu) / rel.total)
    for t in checkpoints:
        assert t / 2 <= totals[t] <= t
        mse = float(np.mean(sq[t]))
        assert mse == pytest.approx(mu * (1 - mu) / totals[t], rel=5 * math.sqrt(2 / runs))


@pytest.mark.statistical
def test_error_within_theorem_3_4_bound():
    """Thm 3.4 (explicit, c = 1, App. E.2): when (11) holds, |mu^_t - mu| <=
    sqrt(ln(2/delta)/t) + (1/t) ln(1/delta) sqrt(sum_{l <= log M_t} (1 + log n) eta_l^2)
    w.p. >= 1 - 3 delta. With n = 1024 users x 16 contiguous samples (eps = 1): 40 runs
    with seeded data (medians at eps' -> infinity: zero noise during the run), each
    releasing its final state with keyed noise (one key per run); failures must be
    <= 3 delta = 30% (binomial(40, 0.3) exceeds 22 with probability < 1e-3), and the bound
    must be the right size (not vacuous by more than 30x)."""
    spec = cm.make_continual_mean(1, 0.1, 1024, 16)
    mu, runs, failures = 0.5, 40, 0
    consts = spec.constants
    t = 1024 * 16
    bound = math.sqrt(math.log(2 / 0.1) / t) + math.log(1 / 0.1) / t * math.sqrt(
        sum((1 + 10) * c.eta**2 for c in consts)
    )
    for run in range(runs):
        rng = random.Random(3000 + run)
        events = bernoulli_events(rng, contiguous(1024, 16), mu)
        _, sim = cm.simulate(spec, [events[i : i + 512] for i in range(0, t, 512)], ZeroNoise())
        rel = cm.release(spec, sim.state, KeyedNoise(KEY + bytes([run])))
        failures += abs(rel.value - mu) > bound
    assert failures <= 22
    assert bound < 30 * exact_noise_std(spec, 1024, 16)
