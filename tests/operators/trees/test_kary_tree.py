"""k-ary tree counters with and without subtraction, Andersson-Pagh-Torkamani: algorithms,
error formulas, properties."""

from __future__ import annotations

import itertools
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
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import (
    CachedNoise,
    KeyedNoise,
    NodeId,
    RecordingNoise,
    SeededNoise,
    ZeroNoise,
    discrete_laplace_variance,
)
from dpstream.operators.trees import kary_tree as kt
from dpstream.operators.trees import tree_counter as tc
from tests.noise_doubles import NodeNoise

KEY = b"kary-tree-test-key-0123456789abcdef"
PREFIX = ("clicks", 0)

# ---------------------------------------------------------------------------------------
# Reference maths, written from the paper independently of the module


def ref_digits(t: int, k: int, subtract: bool, h: int) -> tuple[int, ...]:
    """Balanced digits (Def. 3.8) in closed form: digit l = standard digit l of (t + M) - c."""
    c = (k - 1) // 2 if subtract else 0
    shifted = t + c * (k**h - 1) // (k - 1)
    assert 0 <= shifted < k**h, "t exceeds the capacity"
    return tuple((shifted // k**i) % k - c for i in range(h))


def ref_walk(d: Sequence[int], k: int) -> list[tuple[int, int, int, tuple[int, int]]]:
    """The walk of Algs. 2 and 3 verbatim: (p after the update, level, sign, node interval)."""
    p, out = 0, []
    for level in range(len(d), 0, -1):
        size = k ** (level - 1)
        for _ in range(abs(d[level - 1])):
            if d[level - 1] > 0:
                node = (p + 1, p + size)
                p += size
            else:
                node = (p - size + 1, p)
                p -= size
            out.append((p, level, 1 if d[level - 1] > 0 else -1, node))
    return out


def node_of_p(p: int, k: int, subtract: bool, h: int) -> tuple[tuple[int, int], int]:
    """The walk: the node and sign that p alone identifies."""
    d = ref_digits(p, k, subtract, h)
    level = next(i + 1 for i, v in enumerate(d) if v != 0)
    size = k ** (level - 1)
    if d[level - 1] > 0:
        return (p - size + 1, p), 1
    return (p + 1, p + size), -1


def interval(level: int, index: int, k: int) -> tuple[int, int]:
    size = k ** (level - 1)
    return index * size + 1, (index + 1) * size


def module_tree_nodes(k: int, subtract: bool, h: int, t: int) -> list[tuple[tuple, int, int]]:
    """(interval, sign, p) of the module's walk of t in the paper's single tree."""
    out = []
    for level, index, sign in kt._walk(kt._digits(t, k, subtract, h), k):
        lo, hi = interval(level, index, k)
        out.append(((lo, hi), sign, hi if sign > 0 else lo - 1))
    return out


def period_start(k: int, period: int) -> int:
    return 1 + (k**period - 1) // (k - 1)


def run(spec, weights, noise):
    state, releases = kt.init(spec), []
    for w in weights:
        state, rel = kt.step(spec, state, w, noise)
        releases.append(rel)
    return state, releases


def node_marker(node: NodeId, scale: Fraction) -> int:
    """A distinct, recognisable integer per node (marker injection)."""
    period, level, index = node[-3:]
    return 1 + index + 1000 * level + 10**6 * period


MARKER_NOISE = NodeNoise(node_marker)


def record_step(spec, t: int):
    """Step the mechanism at global t from an exact state; return recorded asks and value."""
    recorder = RecordingNoise(ZeroNoise())
    _, rel = kt.step(spec, kt.KaryTreeState(t=t - 1, total=0), 0, recorder)
    _, marked = kt.step(spec, kt.KaryTreeState(t=t - 1, total=0), 0, MARKER_NOISE)
    return recorder.calls, rel, marked.value


# ---------------------------------------------------------------------------------------
# Worked examples (ours)


E1 = [  # t, digits, P(t), signed nodes, w, marker sum
    (1, (1, 0, 0), [1], [((1, 1), 1)], 1, 1),
    (2, (-1, 1, 0), [3, 2], [((1, 3), 1), ((3, 3), -1)], 2, 5),
    (3, (0, 1, 0), [3], [((1, 3), 1)], 1, 3),
    (4, (1, 1, 0), [3, 4], [((1, 3), 1), ((4, 4), 1)], 2, 7),
    (5, (-1, -1, 1), [9, 6, 5], [((1, 9), 1), ((7, 9), -1), ((6, 6), -1)], 3, 20),
    (6, (0, -1, 1), [9, 6], [((1, 9), 1), ((7, 9), -1)], 2, 15),
    (7, (1, -1, 1), [9, 6, 7], [((1, 9), 1), ((7, 9), -1), ((7, 7), 1)], 3, 22),
    (8, (-1, 0, 1), [9, 8], [((1, 9), 1), ((9, 9), -1)], 2, 17),
]


@pytest.mark.parametrize(("t", "digits", "ps", "nodes", "w", "marker"), E1)
def test_e1_alg2_k3_t8_single_tree(t, digits, ps, nodes, w, marker):
    assert kt.tree_height(3, True, 8) == 3
    assert kt.tree_capacity(3, True, 3) == 13
    assert kt._digits(t, 3, True, 3) == digits
    walked = module_tree_nodes(3, True, 3, t)
    assert [p for _, _, p in walked] == ps
    assert [(iv, s) for iv, s, _ in walked] == nodes
    assert sum(ps) == marker
    assert kt.weight_sum(3, True, 3, t) - kt.weight_sum(3, True, 3, t - 1) == w


@pytest.mark.parametrize(("t", "digits", "ps", "nodes", "w", "marker"), E1)
def test_e1_is_period_2_of_the_mechanism(t, digits, ps, nodes, w, marker):
    """Period 2 of k = 3 is the paper's tree for T = 9 >= 8: the same h = 3 and walk."""
    spec = kt.make_kary_tree(Fraction(1, 2), 3, PREFIX, 3, True)
    calls, rel, marked = record_step(spec, period_start(3, 2) + t - 1)
    totals, own = calls[:2], calls[2:]
    # The two completed periods' totals: their top nodes, scales h_q * tau / eps = 6, 12.
    assert [c[0] for c in totals] == [
        (*PREFIX, "kary_tree_subtract", 3, 0, 1, 0),
        (*PREFIX, "kary_tree_subtract", 3, 1, 2, 0),
    ]
    assert [c[1] for c in totals] == [6, 12]
    assert [interval(*c[0][-2:], 3) for c in own] == [iv for iv, _ in nodes]
    assert all(c[0][-3] == 2 and c[1] == 18 for c in own)  # h = 3: 3 * 3 / (1/2)
    signs = [s for iv, s in nodes]
    expected = sum(node_marker(c[0], c[1]) for c in totals) + sum(
        s * node_marker(c[0], c[1]) for c, s in zip(own, signs, strict=True)
    )
    assert marked == expected
    assert rel.value == 0
    # Variance: the totals (scales 6, 12) plus w nodes at scale 18.
    exact = 2 * 6**2 + 2 * 12**2 + w * 2 * 18**2
    assert kt.variance(spec, period_start(3, 2) + t - 1, continuous=True) == exact


def test_e1_whole_horizon_mse_and_leaf_8_unused():
    assert kt.weight_sum(3, True, 3, 8) == 16
    assert kt.fixed_tree_mse(3, True, 8) == 36
    used = {iv for t in range(1, 9) for iv, _, _ in module_tree_nodes(3, True, 3, t)}
    assert (8, 8) not in used
    assert (1, 9) in used  # z_9 is drawn at t = 5 although 9 > T


def test_e2_alg2_k3_full_capacity():
    assert kt.tree_height(3, True, 13) == 3
    assert kt.weight_sum(3, True, 3, 13) == 27
    assert kt.fixed_tree_mse(3, True, 13) == Fraction(486, 13)
    assert kt._digits(13, 3, True, 3) == (1, 1, 1)
    assert module_tree_nodes(3, True, 3, 13) == [
        ((1, 9), 1, 9),
        ((10, 12), 1, 12),
        ((13, 13), 1, 13),
    ]
    # Lemma 4.7: k (1 - 1/k^2) h^3 / (2 (1 - k^-h)).
    assert kt.fixed_tree_mse(3, True, 13) == Fraction(3 * 8 * 27, 9 * 2) / (1 - Fraction(1, 27))


@pytest.mark.parametrize(
    ("t", "digits", "ps", "nodes", "var"),
    [
        (5, (-1, -1, 1, 0), [9, 6, 5], None, 96),
        (
            14,
            (-1, -1, -1, 1),
            [27, 18, 15, 14],
            [((1, 27), 1), ((19, 27), -1), ((16, 18), -1), ((15, 15), -1)],
            128,
        ),
        (26, None, [27, 26], None, 64),
        (27, None, [27], None, 32),
    ],
)
def test_e3_alg2_k3_t27(t, digits, ps, nodes, var):
    assert kt.tree_height(3, True, 27) == 4
    assert kt.tree_capacity(3, True, 4) == 40
    walked = module_tree_nodes(3, True, 4, t)
    if digits is not None:
        assert kt._digits(t, 3, True, 4) == digits
    assert [p for _, _, p in walked] == ps
    if nodes is not None:
        assert [(iv, s) for iv, s, _ in walked] == nodes
    assert 2 * 4**2 * len(walked) == var  # b = 4 / eps, per-node variance 32 / eps^2
    # Period 3 of the mechanism is exactly this tree (T = 27 = 3^3, h = 4).
    spec = kt.make_kary_tree(1, 1, PREFIX, 3, True)
    calls, _, _ = record_step(spec, period_start(3, 3) + t - 1)
    assert [c[1] for c in calls] == [1, 2, 3] + [4] * len(walked)
    assert [interval(*c[0][-2:], 3) for c in calls[3:]] == [iv for iv, _, _ in walked]
    assert kt.variance(spec, period_start(3, 3) + t - 1, continuous=True) == 2 * 14 + var


def test_e3_whole_horizon():
    assert kt.weight_sum(3, True, 4, 27) == 68
    assert kt.fixed_tree_mse(3, True, 27) == Fraction(32 * 68, 27)
    assert float(kt.fixed_tree_mse(3, True, 27)) == pytest.approx(80.593, abs=5e-4)


def test_e4_alg2_k5_t12():
    assert kt.tree_height(5, True, 12) == 2
    weights = [len(module_tree_nodes(5, True, 2, t)) for t in range(1, 13)]
    assert weights == [1, 2, 3, 2, 1, 2, 3, 4, 3, 2, 3, 4]
    assert kt.weight_sum(5, True, 2, 12) == 30
    assert kt.fixed_tree_mse(5, True, 12) == 20 == Fraction(5 * 8, 2)
    assert kt._digits(8, 5, True, 2) == (-2, 2)
    assert module_tree_nodes(5, True, 2, 8) == [
        ((1, 5), 1, 5),
        ((6, 10), 1, 10),
        ((10, 10), -1, 9),
        ((9, 9), -1, 8),
    ]
    markers = [sum(p for _, _, p in module_tree_nodes(5, True, 2, t)) for t in range(1, 13)]
    assert markers == [1, 3, 12, 9, 5, 11, 18, 32, 24, 15, 26, 38]


def test_e5_alg1_k3_t8():
    assert kt.tree_height(3, False, 8) == 2
    assert kt._digits(5, 3, False, 2) == (2, 1)
    assert [iv for iv, _, _ in module_tree_nodes(3, False, 2, 5)] == [(1, 3), (4, 4), (5, 5)]
    assert 2 * 2**2 * 3 == 24
    ps = [[p for _, _, p in module_tree_nodes(3, False, 2, t)] for t in range(1, 9)]
    assert ps == [[1], [1, 2], [3], [3, 4], [3, 4, 5], [3, 6], [3, 6, 7], [3, 6, 7, 8]]
    assert [sum(p) for p in ps] == [1, 3, 3, 7, 12, 9, 16, 24]
    assert kt.weight_sum(3, False, 2, 8) == 18
    # T = 8 = k^h - 1 is full capacity, so Lemma 3.5 applies: (k - 1) h^3 / (1 - k^-h).
    assert kt.fixed_tree_mse(3, False, 8) == 18 == Fraction(2 * 8) / (1 - Fraction(1, 9))


def test_e5_binary_t8_and_its_mechanism_period():
    assert kt.tree_height(2, False, 8) == 4  # not 3: t = 8 needs 4 bits
    assert [iv for iv, _, _ in module_tree_nodes(2, False, 4, 5)] == [(1, 4), (5, 5)]
    popcounts = [len(module_tree_nodes(2, False, 4, t)) for t in range(1, 9)]
    assert popcounts == [1, 1, 2, 1, 2, 2, 3, 1]
    assert kt.fixed_tree_mse(2, False, 8) == 52
    markers = [sum(p for _, _, p in module_tree_nodes(2, False, 4, t)) for t in range(1, 9)]
    assert markers == [1, 2, 5, 4, 9, 10, 17, 8]
    assert float(kt.fixed_tree_mse(2, False, 15)) == pytest.approx(68.27, abs=5e-3)
    # Period 3 of the binary mechanism is the T = 8, h = 4 tree: at tau = 5, [1,4] and [5,5].
    spec = kt.make_kary_tree(1, 1, PREFIX, 2, False)
    calls, _, _ = record_step(spec, period_start(2, 3) + 4)
    assert [interval(*c[0][-2:], 2) for c in calls[3:]] == [(1, 4), (5, 5)]
    assert [c[1] for c in calls] == [1, 2, 3, 4, 4]


def test_e6_paper_figures():
    # Fig. 2: k = 3, t = 8, T = 9 (h = 3): +[1,9] -[9,9].
    assert kt.tree_height(3, True, 9) == 3
    assert [(iv, s) for iv, s, _ in module_tree_nodes(3, True, 3, 8)] == [
        ((1, 9), 1),
        ((9, 9), -1),
    ]
    # Fig. 1: k = 5, t = 24, T = 24.
    assert kt.tree_height(5, False, 24) == 2
    assert kt._digits(24, 5, False, 2) == (4, 4)
    assert 2 * 2**2 * len(module_tree_nodes(5, False, 2, 24)) == 64
    assert kt.tree_height(5, True, 24) == 3
    assert kt._digits(24, 5, True, 3) == (-1, 0, 1)
    assert [(iv, s) for iv, s, _ in module_tree_nodes(5, True, 3, 24)] == [
        ((1, 25), 1),
        ((25, 25), -1),
    ]
    assert float(kt.fixed_tree_mse(5, False, 24)) == pytest.approx(33.3, abs=0.05)
    assert float(kt.fixed_tree_mse(5, True, 24)) == pytest.approx(54.0, abs=0.05)


def test_e7_production_size_k19_t1e6():
    T = 10**6
    assert kt.tree_height(19, True, T) == 5
    assert kt.tree_capacity(19, True, 5) == 1_238_049
    assert kt._digits(T, 19, True, 5) == (-8, 2, -4, -6, 8)
    walked = module_tree_nodes(19, True, 5, T)
    assert len(walked) == 28
    assert 2 * 5**2 * len(walked) == 1400
    ps = [p for _, _, p in walked]
    assert ps[:8] == [130321 * i for i in range(1, 9)]
    assert ps[8:14] == [1042568 - 6859 * i for i in range(1, 7)]
    assert ps[13] == 1001414
    assert ps[14:18] == [1001414 - 361 * i for i in range(1, 5)]
    assert ps[17] == 999970
    assert ps[18:20] == [999989, 1000008]
    assert ps[20:] == list(range(1000007, 999999, -1))
    assert float(kt.fixed_tree_mse(19, True, T)) == pytest.approx(1142.53, abs=5e-3)
    lemma_4_7 = 19 * (1 - Fraction(1, 361)) * 125 / (2 * (1 - Fraction(1, 19**5)))
    assert float(lemma_4_7) == pytest.approx(1184.21, abs=5e-3)
    assert float(kt.fixed_tree_mse(2, False, T)) == pytest.approx(7908.0, abs=0.05)


def test_table_6_2_rows():
    """Our exact values (from Lemmas 3.5 and 4.7): exact MSE * eps^2 of the single tree."""
    table = {
        10**3: (987.6, 299.9, 449.0, 280.1, 199.4),
        10**4: (2532.8, 778.5, 1206.9, 739.9, 472.5),
        10**6: (7908.0, 1872.9, 3524.8, 2174.4, 1142.5),
        2**20: (8820.0, 1880.5, 3531.4, 2194.5, 1147.4),
        10**9: (26724.5, 7150.2, 10569.1, 6321.5, 4262.4),
    }
    for T, row in table.items():
        got = [
            kt.fixed_tree_mse(k, sub, T)
            for k, sub in [(2, False), (17, False), (3, True), (5, True), (19, True)]
        ]
        assert [round(float(g), 1) for g in got] == list(row), T


# ---------------------------------------------------------------------------------------
# Properties


CASES = [(k, sub) for k in (3, 5, 7, 19) for sub in (False, True)] + [(2, False), (4, False)]


@pytest.mark.parametrize(("k", "subtract"), CASES)
def test_digits_heights_and_walk(k, subtract):
    """8.1 items 1-3 and 7 for T in 1..200 and the capacities around them."""
    horizons = set(range(1, 201))
    for h in range(1, 5):
        cap = kt.tree_capacity(k, subtract, h)
        horizons |= {cap, cap + 1}
    m = (k - 1) // 2
    for T in sorted(horizons):
        h = kt.tree_height(k, subtract, T)
        if subtract:
            assert k ** (h - 1) < 2 * T + 1 <= k**h
        else:
            assert k ** (h - 1) < T + 1 <= k**h
        cap = kt.tree_capacity(k, subtract, h)
        with pytest.raises(InvalidOperatorConfig, match="t must be <="):
            kt._digits(cap + 1, k, subtract, h)
        if T != 200 and not (T == cap <= 5000):
            continue
        seen: dict[int, tuple] = {}
        for t in range(1, T + 1):
            d = kt._digits(t, k, subtract, h)
            assert sum(v * k**i for i, v in enumerate(d)) == t
            assert all((-m <= v <= m) if subtract else (0 <= v < k) for v in d)
            assert d == ref_digits(t, k, subtract, h)
            walk = ref_walk(d, k)
            ps = [p for p, *_ in walk]
            assert ps[-1] == t
            assert len(ps) == len(set(ps)) == sum(map(abs, d))
            assert all(1 <= p <= cap for p in ps)
            assert module_tree_nodes(k, subtract, h, t) == [(node, s, p) for p, _, s, node in walk]
            for p, level, sign, node in walk:
                assert level <= h  # the root (level h + 1) is never used
                assert node_of_p(p, k, subtract, h) == (node, sign)
                assert seen.setdefault(p, (node, sign)) == (node, sign)
                if not subtract:
                    assert node[1] <= t  # Alg. 1 is online: complete nodes only
        if cap == T:
            assert set(seen) == set(range(1, cap + 1))


def test_digit_vectors_are_unique():
    for k, subtract, h in [(3, True, 4), (5, True, 3), (3, False, 4), (4, False, 3)]:
        m = (k - 1) // 2
        values = range(-m, m + 1) if subtract else range(k)
        sums = [sum(v * k**i for i, v in enumerate(d)) for d in itertools.product(values, repeat=h)]
        positives = [s for s in sums if s >= 1]
        assert len(positives) == len(set(positives)) == kt.tree_capacity(k, subtract, h)


@pytest.mark.parametrize(
    ("k", "subtract", "T", "h"),
    [
        (19, True, (19**12 + 1) // 2, 13),
        (3, True, (3**40 + 1) // 2, 41),
        (2, False, 2**60, 61),
        (19, True, (19**5 - 1) // 2, 5),
        (19, True, (19**4 + 1) // 2, 5),
        (3, True, 2**60, 39),
    ],
)
def test_heights_are_integer_exact_where_floating_logs_fail(k, subtract, T, h):
    assert kt.tree_height(k, subtract, T) == h


@pytest.mark.parametrize(("k", "subtract", "h"), [(3, True, 3), (5, True, 2), (3, False, 3)])
def test_alg3_factorization_and_sensitivity(k, subtract, h):
    """8.1 items 4 and 10: L R = A on [1, T_cap], max column l1-norm of R = h, and the
    zero-noise Alg. 3 returns S(t) even with data on every one of the k^h leaves."""
    cap = kt.tree_capacity(k, subtract, h)
    nodes = sorted(
        {node for t in range(1, cap + 1) for node, _, _ in module_tree_nodes(k, subtract, h, t)}
    )
    col = {node: j for j, node in enumerate(nodes)}
    L = np.zeros((cap, len(nodes)), dtype=int)
    for t in range(1, cap + 1):
        for node, sign, _ in module_tree_nodes(k, subtract, h, t):
            L[t - 1, col[node]] = sign
    leaves = k**h
    R = np.zeros((len(nodes), leaves), dtype=int)
    for (lo, hi), j in col.items():
        R[j, lo - 1 : hi] = 1
    A = np.tril(np.ones((cap, leaves), dtype=int))
    assert (L @ R == A).all()
    assert np.abs(R[:, :cap]).sum(axis=0).max() == h
    rng = random.Random(7)
    x = np.array([rng.randint(0, 9) for _ in range(leaves)])
    assert (L @ (R @ x) == np.cumsum(x)[:cap]).all()


@pytest.mark.parametrize(
    ("k", "subtract", "hs"),
    [(2, False, range(1, 9)), (3, False, range(1, 6)), (4, False, range(1, 5))]
    + [(5, False, range(1, 5)), (7, False, range(1, 4)), (17, False, range(1, 3))]
    + [(k, True, range(1, 5)) for k in (3, 5, 7, 9)]
    + [(19, True, range(1, 4))],
)
def test_closed_forms_equal_exact_sums_at_capacity(k, subtract, hs):
    """8.1 item 8 in rationals: Lemma 3.5 (Alg. 1) and Lemma 4.7 (Alg. 2) at T = T_cap,
    against W(T) summed digit by digit."""
    for h in hs:
        cap = kt.tree_capacity(k, subtract, h)
        if cap <= 20000:
            brute = sum(sum(map(abs, kt._digits(t, k, subtract, h))) for t in range(1, cap + 1))
            assert kt.weight_sum(k, subtract, h, cap) == brute
        exact = kt.fixed_tree_mse(k, subtract, cap)
        edge = 1 - Fraction(1, k**h)
        if subtract:
            closed = k * (1 - Fraction(1, k * k)) * h**3 / (2 * edge)
        else:
            closed = (k - 1) * h**3 / edge
        assert exact == closed


def test_weight_sum_matches_brute_force_for_every_n():
    for k, subtract, h in [(3, True, 4), (5, True, 3), (19, True, 2), (3, False, 4), (2, False, 6)]:
        running = 0
        for n in range(kt.tree_capacity(k, subtract, h) + 1):
            if n:
                running += sum(map(abs, kt._digits(n, k, subtract, h)))
            assert kt.weight_sum(k, subtract, h, n) == running
    with pytest.raises(InvalidOperatorConfig, match=r"n must be in \[0, 13\], got 14"):
        kt.weight_sum(3, True, 3, 14)


def test_max_weight_matches_brute_force_for_every_n():
    """The largest digit weight over steps 1..n, for every n, against a running maximum."""
    for k, subtract, h in [(3, True, 4), (5, True, 3), (19, True, 2), (3, False, 4), (2, False, 6)]:
        for k2, sub2, h2 in [(k, subtract, h), (4, True, 3), (6, True, 2), (17, False, 2)]:
            running = 0
            for n in range(1, kt.tree_capacity(k2, sub2, h2) + 1):
                running = max(running, sum(map(abs, kt._digits(n, k2, sub2, h2))))
                assert kt.max_weight(k2, sub2, h2, n) == running
    with pytest.raises(InvalidOperatorConfig, match=r"n must be in \[1, 13\], got 0"):
        kt.max_weight(3, True, 3, 0)


@pytest.mark.parametrize(
    ("k", "subtract"), [(2, False), (3, True), (4, True), (5, False), (13, True)]
)
def test_errors_are_the_mean_and_the_largest_variance(k, subtract):
    """``errors`` over many horizons at once equals the mean and the max of ``variance``
    over steps 1..T, both variance kinds (exact rationals for continuous Laplace)."""
    spec = kt.make_kary_tree(Fraction(1, 3), 2, PREFIX, k, subtract)
    horizons = [1, 2, 3, 7, 50, 400, 2000]
    for continuous in (False, True):
        got = kt.errors(spec, horizons, continuous)
        per_step = [kt.variance(spec, t, continuous) for t in range(1, 2001)]
        for (mse, largest), T in zip(got, horizons, strict=True):
            assert mse == pytest.approx(sum(per_step[:T]) / T, rel=1e-12)
            assert largest == pytest.approx(max(per_step[:T]), rel=1e-12)
            assert (mse, largest) == (
                kt.mse(spec, T, continuous),
                kt.max_variance(spec, T, continuous),
            )
    with pytest.raises(InvalidOperatorConfig, match="horizons must be ascending"):
        kt.errors(spec, [5, 3])


def test_the_unbounded_stream_tree():
    """``mechanism: auto`` without a horizon: k-ary with subtraction, k = 13. Over the
    horizons users see (10^3 to 10^8 ticks) its exact MSE stays within 14% of the tree
    ``choose_tree`` picks for each horizon (whose k moves with T), while the binary tree's
    is 4-8 times it (docs/kary-mse.md, section 6, has the largest variances too)."""
    assert kt.choose_unbounded_tree() == ("kary_subtract", 13)
    pick = kt.make_kary_tree(1, 1, PREFIX, 13, True)
    binary = kt.make_kary_tree(1, 1, PREFIX, 2, False)
    horizons = [10**e for e in range(3, 9)]
    picks = [kt.choose_tree(1, 1, T, PREFIX) for T in horizons]
    for T, (name, k), mine, base in zip(
        horizons,
        picks,
        kt.errors(pick, horizons, True),
        kt.errors(binary, horizons, True),
        strict=True,
    ):
        best_mse = kt.mse(kt.make_kary_tree(1, 1, PREFIX, k, name == "kary_subtract"), T, True)
        assert mine[0] <= 1.14 * best_mse
        assert 3.9 < base[0] / mine[0] < 9
    assert len({k for _, k in picks}) > 2  # the per-horizon choice moves with T


def test_asymptotic_constants():
    assert kt.asymptotic_constant(2, False) == 1.0
    assert kt.asymptotic_constant(17, False) == pytest.approx(0.2343, abs=5e-5)
    assert kt.asymptotic_constant(19, True) == pytest.approx(0.1236, abs=5e-5)
    odd = {k: kt.asymptotic_constant(k, True) for k in range(3, 41, 2)}
    assert min(odd, key=odd.get) == 19
    add = {k: kt.asymptotic_constant(k, False) for k in range(2, 41)}
    assert min(add, key=add.get) == 17


# ---------------------------------------------------------------------------------------
# The infinite-stream mechanism


@pytest.mark.parametrize("k", [2, 3, 5, 17])
@pytest.mark.parametrize("subtract", [False, True])
def test_periods_and_totals(k, subtract):
    """A period's last release is its top node; later releases add it under the same id."""
    if subtract and k % 2 == 0:
        return
    spec = kt.make_kary_tree(1, 2, PREFIX, k, subtract)
    for p in range(4 if k < 17 else 3):
        first, last = period_start(k, p), period_start(k, p + 1) - 1
        assert kt.period_of(k, first) == (p, 1)
        assert kt.period_of(k, last) == (p, k**p)
        top = ((*PREFIX, kt.mechanism(spec), k, p, p + 1, 0), Fraction(2 * (p + 1)), 1)
        assert kt.release_terms(spec, last)[-1] == top
        assert kt.release_terms(spec, last + 1)[p] == top
        assert all(s == 2 * (p + 1) for _, s, _ in kt.release_terms(spec, last)[p:])


def test_binary_k2_is_the_tree_counter_node_for_node():
    """Like with like: k = 2 without subtraction = tree_counter's periods, nodes, scales."""
    eps = Fraction(1, 3)
    binary = tc.make_binary_tree(eps, 3, PREFIX)
    kary = kt.make_kary_tree(eps, 3, PREFIX, 2, False)
    for t in range(1, 2100):
        theirs = sorted((n[-3], n[-2] + 1, n[-1], s) for n, s, _ in tc.release_nodes(binary, t))
        ours = sorted((n[-3], n[-2], n[-1], s) for n, s, _ in kt.release_terms(kary, t))
        assert ours == theirs, t
        assert kt.std(kary, t) == pytest.approx(tc.std(binary, t), rel=1e-12)
    horizon = 2099
    mean_var = sum(tc.std(binary, t) ** 2 for t in range(1, horizon + 1)) / horizon
    assert kt.mse(kary, horizon) == pytest.approx(mean_var, rel=1e-10)


@pytest.mark.parametrize(("k", "subtract"), [(2, False), (3, True), (5, False), (19, True)])
def test_variance_std_and_mse_are_exact(k, subtract):
    eps = Fraction(2, 3)
    spec = kt.make_kary_tree(eps, 2, PREFIX, k, subtract)
    horizon = 900
    exact_sum = Fraction(0)
    disc_sum = 0.0
    for t in range(1, horizon + 1):
        terms = kt.release_terms(spec, t)
        cont = sum(2 * s * s for _, s, _ in terms)
        assert kt.variance(spec, t, continuous=True) == float(cont)
        disc = sum(discrete_laplace_variance(s) for _, s, _ in terms)
        assert kt.variance(spec, t) == pytest.approx(disc, rel=1e-12)
        assert kt.std(spec, t) == pytest.approx(math.sqrt(disc), rel=1e-12)
        exact_sum += cont
        disc_sum += disc
        if t in (1, 7, 100, horizon):
            assert kt.mse(spec, t, continuous=True) == float(exact_sum / t)
            assert kt.mse(spec, t) == pytest.approx(disc_sum / t, rel=1e-12)
    assert kt.mse(spec, horizon) < kt.mse(spec, horizon, continuous=True)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([(2, False), (3, False), (3, True), (5, True), (7, True), (4, False)]),
    st.lists(st.integers(0, 40), min_size=1, max_size=400),
)
def test_zero_noise_releases_the_exact_prefix_sums(shape, weights):
    k, subtract = shape
    spec = kt.make_kary_tree(0.5, 3, PREFIX, k, subtract)
    state, releases = run(spec, weights, ZeroNoise())
    assert [r.value for r in releases] == list(itertools.accumulate(weights))
    assert [r.t for r in releases] == list(range(1, len(weights) + 1))
    assert kt.exact_value(state) == sum(weights)


def alg3_batch(spec, x: Sequence[int], noise) -> list[int]:
    """Alg. 3 over the periods: noisy node sums over ALL of x (future leaves included),
    combined with signs; an independent batch form of the streaming mechanism."""
    k = spec.k
    out = []
    for t in range(1, len(x) + 1):
        period, tau = divmod_period(k, t)
        count = 0
        for q in range(period):
            lo = period_start(k, q)
            count += sum(x[lo - 1 : lo - 1 + k**q]) + noise.discrete_laplace(
                (*spec.node_prefix, kt.mechanism(spec), k, q, q + 1, 0),
                Fraction((q + 1) * spec.sensitivity) / spec.epsilon,
            )
        base = period_start(k, period) - 1
        h = period + 1
        for _, level, sign, (lo, hi) in ref_walk(ref_digits(tau, k, spec.subtract, h), k):
            node = (
                *spec.node_prefix,
                kt.mechanism(spec),
                k,
                period,
                level,
                (lo - 1) // k ** (level - 1),
            )
            noisy = sum(x[base + lo - 1 : base + hi]) + noise.discrete_laplace(
                node, Fraction(h * spec.sensitivity) / spec.epsilon
            )
            count += sign * noisy
        out.append(count)
    return out


def divmod_period(k: int, t: int) -> tuple[int, int]:
    period = 0
    while period_start(k, period + 1) <= t:
        period += 1
    return period, t - period_start(k, period) + 1


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([(2, False), (3, False), (3, True), (5, True), (9, True)]),
    st.lists(st.integers(0, 5), min_size=1, max_size=150),
)
def test_streaming_equals_batch_alg3(shape, x):
    """8.1 items 4-6: the streaming release equals Alg. 3 on noisy node sums, with the
    same keyed noise, and with zero noise (the future leaves cancel)."""
    k, subtract = shape
    spec = kt.make_kary_tree(1, 5, PREFIX, k, subtract)
    noise = CachedNoise(KeyedNoise(KEY))
    _, releases = run(spec, x, noise)
    assert [r.value for r in releases] == alg3_batch(spec, x, noise)
    _, zero = run(spec, x, ZeroNoise())
    assert [r.value for r in zero] == alg3_batch(spec, x, ZeroNoise())


@pytest.mark.parametrize(
    ("k", "subtract", "steps"),
    [(3, True, 1200), (19, True, 8000), (5, False, 4000), (2, False, 4000)],
)
def test_each_node_is_drawn_once_and_live_noise_is_small(k, subtract, steps):
    """8.1 item 6 / Prop. 4.10 / Lemma 4.12: a node is used on one contiguous run of steps,
    so an LRU cache holding two steps' live sets draws every node exactly once; the live
    set is P(t) plus one total per completed period, at most h (k - 1) / 2 + p (Alg. 2)."""
    spec = kt.make_kary_tree(1, 1, PREFIX, k, subtract)
    live_max = 0
    first_last: dict = {}
    for t in range(1, steps + 1):
        terms = kt.release_terms(spec, t)
        period, _ = kt.period_of(k, t)
        h = period + 1
        bound = h * (k - 1) // 2 if subtract else h * (k - 1)
        assert len(terms) - period <= bound
        live_max = max(live_max, len(terms))
        for node, _, sign in terms:
            first, last, s = first_last.setdefault(node, (t, t, sign))
            assert last in (t - 1, t) and s == sign  # contiguous use, fixed sign
            first_last[node] = (first, t, sign)
    recorder = RecordingNoise(KeyedNoise(KEY))
    noise = CachedNoise(recorder, maxsize=2 * live_max)  # P(t-1) and P(t)
    run(spec, [1] * steps, noise)
    drawn = [node for node, _, _ in recorder.calls]
    assert len(drawn) == len(set(drawn)) == len(first_last)
    # Draws stay O(T): at a period end exactly one node per step was ever drawn.
    end = period_start(k, kt.period_of(k, steps)[0]) - 1
    assert sum(1 for f, _, _ in first_last.values() if f <= end) == end


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**12), st.integers(-(10**9), 10**9))
def test_state_round_trips_through_state_codec_and_orjson(t, total):
    state = kt.KaryTreeState(t=t, total=total)
    data = orjson.loads(orjson.dumps(state_codec.to_json(state)))
    assert state_codec.from_json(kt.KaryTreeState, data) == state


def test_state_round_trip_after_real_steps_is_small():
    spec = kt.make_kary_tree(1, 1, PREFIX, 19, True)
    state, _ = run(spec, [1, 0, 2] * 50, ZeroNoise())
    blob = orjson.dumps(state_codec.to_json(state))
    assert state_codec.from_json(kt.KaryTreeState, orjson.loads(blob)) == state
    assert len(blob) < 40


@pytest.mark.parametrize(("k", "subtract"), [(3, True), (19, True), (4, False)])
def test_keyed_noise_is_replay_safe_after_a_restart(k, subtract):
    spec = kt.make_kary_tree(1, 4, ("events", 0), k, subtract)
    rng = random.Random(3)
    weights = [rng.randint(0, 4) for _ in range(60)]
    _, first = run(spec, weights, KeyedNoise(KEY))
    state, _ = run(spec, weights[:23], CachedNoise(KeyedNoise(KEY)))
    restored = state_codec.from_json(
        kt.KaryTreeState, orjson.loads(orjson.dumps(state_codec.to_json(state)))
    )
    rest = []
    for w in weights[23:]:
        restored, rel = kt.step(spec, restored, w, KeyedNoise(KEY))
        rest.append(rel)
    assert rest == first[23:]
    _, other = run(spec, weights, KeyedNoise(bytes(32)))
    assert [r.value for r in other] != [r.value for r in first]


def test_counters_with_different_prefixes_or_shapes_do_not_share_noise():
    a = kt.make_kary_tree(1, 1, ("a", 0), 3, True)
    b = kt.make_kary_tree(1, 1, ("b", 0), 3, True)
    _, ra = run(a, [0] * 40, KeyedNoise(KEY))
    _, rb = run(b, [0] * 40, KeyedNoise(KEY))
    assert [r.value for r in ra] != [r.value for r in rb]
    # Same prefix, different shape: no node id in common (differencing would cancel it).
    shapes = [(3, True), (3, False), (5, True), (2, False)]
    ids = [
        {
            n
            for t in range(1, 300)
            for n, _, _ in kt.release_terms(kt.make_kary_tree(1, 1, PREFIX, k, s), t)
        }
        for k, s in shapes
    ]
    for x, y in itertools.combinations(ids, 2):
        assert not x & y
    binary = tc.make_binary_tree(1, 1, PREFIX)
    binary_ids = {n for t in range(1, 300) for n, _, _ in tc.release_nodes(binary, t)}
    assert not binary_ids & ids[3]


def test_release_carries_exact_std_and_interval():
    spec = kt.make_kary_tree(Fraction(1, 2), 1, PREFIX, 19, True)
    state, rel = kt.step(spec, kt.KaryTreeState(t=999_999, total=5), 1, ZeroNoise())
    assert state == kt.KaryTreeState(t=10**6, total=6)
    assert rel.value == 6
    assert rel.std == pytest.approx(math.sqrt(kt.variance(spec, 10**6)), rel=1e-12)
    assert rel.ci95 > 1.9 * rel.std


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0}, "epsilon must be finite and > 0, got Fraction(0, 1)"),
        ({"epsilon": -1.5}, "epsilon must be finite and > 0, got Fraction(-3, 2)"),
        ({"epsilon": "x"}, "epsilon must be a finite rational number, got 'x'"),
        ({"sensitivity": 0}, "sensitivity must be >= 1, got 0"),
        ({"sensitivity": 2.5}, "sensitivity must be an integer, got 2.5"),
        ({"k": 1, "subtract": False}, "k must be >= 2, got 1"),
        ({"k": 2.0, "subtract": False}, "k must be an integer, got 2.0"),
        ({"k": True, "subtract": False}, "k must be an integer, got True"),
        ({"k": 2, "subtract": True}, "k must be >= 3 when subtract is True, got 2"),
        ({"subtract": 1}, "subtract must be a bool, got 1"),
        ({"node_prefix": "clicks"}, "node_prefix must be a tuple of str and int, got 'clicks'"),
        ({"node_prefix": ("a", 1.5)}, "node_prefix must be a tuple of str and int, got ('a', 1.5)"),
        (
            {"node_prefix": ("a", True)},
            "node_prefix must be a tuple of str and int, got ('a', True)",
        ),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    args = {"epsilon": 1, "sensitivity": 1, "node_prefix": PREFIX, "k": 19, "subtract": True}
    with pytest.raises(InvalidOperatorConfig) as info:
        kt.make_kary_tree(**{**args, **kwargs})
    assert str(info.value) == message


def test_other_entry_points_reject_bad_arguments():
    spec = kt.make_kary_tree(1, 1, PREFIX, 3, True)
    with pytest.raises(InvalidOperatorConfig, match="^t must be >= 1, got 0$"):
        kt.release_terms(spec, 0)
    with pytest.raises(InvalidOperatorConfig, match="^horizon must be >= 1, got 0$"):
        kt.mse(spec, 0)
    with pytest.raises(InvalidOperatorConfig, match="^horizon must be >= 1, got 0$"):
        kt.choose_tree(1, 1, 0, PREFIX)
    with pytest.raises(InvalidOperatorConfig, match="^sensitivity must be >= 1, got 0$"):
        kt.choose_tree(1, 0, 10, PREFIX)


def test_epsilon_is_the_decimal_the_user_wrote_and_names():
    spec = kt.make_kary_tree(0.1, 1, ["s", 0], 19, True)
    assert spec.epsilon == Fraction(1, 10)
    assert spec.node_prefix == ("s", 0)
    assert kt.mechanism(spec) == kt.MECHANISM_SUBTRACT == "kary_tree_subtract"
    assert kt.mechanism(kt.make_kary_tree(1, 1, PREFIX, 4, False)) == kt.MECHANISM_ADD


def test_choose_tree_picks_the_least_exact_mse():
    """k = auto: data-independent, and Alg. 1 can win at small T."""
    picks = {T: kt.choose_tree(1, 1, T, PREFIX) for T in (1, 2, 5, 10, 100, 10**4, 10**6)}
    assert picks[1] == ("binary", 2)  # every shape ties at T = 1; the simplest wins
    assert picks[5] == ("kary_subtract", 4)  # the even-k variant (App. A.3) wins here
    assert picks[10] == ("kary_subtract", 8)  # even k = 8 edges out odd k = 7 at T = 10
    assert picks[10**6][0] == "kary_subtract"
    for T, (name, k) in picks.items():
        chosen = kt.mse(kt.make_kary_tree(1, 1, PREFIX, k, name == "kary_subtract"), T)
        others = [
            (2, False),
            (3, False),
            (4, False),
            (17, False),
            (3, True),
            (4, True),
            (19, True),
            (20, True),
            (21, True),
        ]
        for k2, sub in others:
            assert chosen <= kt.mse(kt.make_kary_tree(1, 1, PREFIX, k2, sub), T)
    assert kt.choose_tree(1, 1, 10**6, ("other", 9)) == picks[10**6]
    # At 10^6 the doubling scheme beats binary by about 6.6x (exact MSE).
    ratio = kt.mse(kt.make_kary_tree(1, 1, PREFIX, 2, False), 10**6) / kt.mse(
        kt.make_kary_tree(1, 1, PREFIX, picks[10**6][1], True), 10**6
    )
    assert ratio > 6


# ---------------------------------------------------------------------------------------
# Privacy sanity check: exact likelihood ratio of whole output sequences


def output_matrix(spec, horizon: int):
    """L with M - S = L z, over the nodes used up to ``horizon``; z in first-use order."""
    nodes: dict = {}
    rows = []
    for t in range(1, horizon + 1):
        row = {}
        for node, scale, sign in kt.release_terms(spec, t):
            nodes.setdefault(node, scale)
            row[node] = sign
        rows.append(row)
    order = list(nodes)
    L = np.array([[row.get(n, 0) for n in order] for row in rows], dtype=np.int64)
    return L, order, [nodes[n] for n in order]


def log_likelihood_ratio(Linv, m, s, s_other, scales) -> Fraction:
    """log P(m | x) - log P(m | x') = sum_I (|z'_I| - |z_I|) / b_I for discrete Laplace
    (the normalising constants cancel), with z = L^-1 (m - S) the unique implied noise."""
    z = Linv @ (m - s)
    z_other = Linv @ (m - s_other)
    return sum(
        (Fraction(int(abs(b))) - Fraction(int(abs(a)))) / scale
        for a, b, scale in zip(z, z_other, scales, strict=True)
    )


@pytest.mark.parametrize(
    ("k", "subtract", "periods"), [(3, True, 3), (3, False, 3), (2, False, 4), (5, True, 2)]
)
def test_likelihood_ratio_of_neighbouring_streams_is_at_most_epsilon(k, subtract, periods):
    """At a period end every step has drawn exactly one new node, so z -> M is a bijection
    (L is square and unimodular) and P(M = m | x) = prod_I pmf_{b_I}(z_I). For every leaf
    i, x' = x with x_i shifted by +-sensitivity; the ratio must stay <= epsilon on sampled
    outputs, and reach it. With half the noise (2 * epsilon as scale parameter) it must
    exceed epsilon, so this check can fail."""
    horizon = period_start(k, periods) - 1
    eps, sens = Fraction(1, 2), 2
    rng = random.Random(11)
    x = np.array([rng.randint(0, 3) * sens for _ in range(horizon)], dtype=np.int64)
    s = np.cumsum(x)
    for claimed, actual_eps, must_hold in [(eps, eps, True), (eps, 2 * eps, False)]:
        spec = kt.make_kary_tree(actual_eps, sens, PREFIX, k, subtract)
        L, order, scales = output_matrix(spec, horizon)
        assert L.shape == (horizon, horizon)
        assert round(abs(np.linalg.det(L.astype(float)))) == 1
        Linv = np.rint(np.linalg.inv(L.astype(float))).astype(np.int64)
        assert (Linv @ L == np.eye(horizon, dtype=np.int64)).all()
        worst = Fraction(-1)
        for sample in range(60):
            recorder = RecordingNoise(KeyedNoise(KEY + bytes([sample])))
            _, releases = run(spec, list(x), CachedNoise(recorder))
            m = np.array([r.value for r in releases], dtype=np.int64)
            drawn = {node: value for node, _, value in recorder.calls}
            assert list(Linv @ (m - s)) == [drawn[n] for n in order]
            for i in range(horizon):
                for delta in (sens, -sens):
                    x_other = x.copy()
                    x_other[i] += delta
                    llr = log_likelihood_ratio(Linv, m, s, np.cumsum(x_other), scales)
                    worst = max(worst, llr)
                    if must_hold:
                        assert llr <= claimed
        if must_hold:
            assert worst == claimed  # the bound is attained: the noise is not wasteful
        else:
            assert worst > claimed


# ---------------------------------------------------------------------------------------
# Statistical checks (seeded)


def moments(scale: Fraction) -> tuple[float, float]:
    """(E Z^2, E Z^4) of discrete Laplace by direct summation of its pmf."""
    p = math.exp(-1 / float(scale))
    norm = (1 - p) / (1 + p)
    limit = math.ceil(80 * float(scale)) + 80
    m2 = sum(2 * z**2 * norm * p**z for z in range(1, limit))
    m4 = sum(2 * z**4 * norm * p**z for z in range(1, limit))
    return m2, m4


def kurtosis_of_sum(scales: Sequence[Fraction]) -> float:
    """E S^4 / (E S^2)^2 of a sum of independent discrete Laplace terms (signs irrelevant).

    One discrete Laplace has kurtosis 6 + (1 - p)^2 / (2p) > 6 (the continuous Laplace's 6
    is its limit), so we compute it instead of assuming 6.
    """
    m2s, m4s = zip(*(moments(b) for b in scales), strict=True)
    var = sum(m2s)
    fourth = sum(m4s) + 3 * (var**2 - sum(v * v for v in m2s))
    return fourth / var**2


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("k", "subtract", "t"),
    [(3, True, 5 + 4), (3, True, 14 + 13), (19, True, 10**6), (17, False, 5000), (2, False, 13)],
)
def test_empirical_variance_matches_exact_variance(k, subtract, t):
    """8.1 item 9: mean of squared errors over n seeded releases at step t vs Var(M_t).

    n = 4000. The error has mean 0, so mean(e^2) is unbiased with variance
    sigma^4 (kappa - 1) / n, kappa the kurtosis of the sum of the release's discrete
    Laplace terms (computed exactly from the pmf: 3.1 to 3.9 for these 5 to 34 terms):
    the relative standard error is sqrt((kappa - 1) / n) <= 2.7%, and we allow 5 of them
    (seeded, so not flaky).
    """
    n = 4000
    spec = kt.make_kary_tree(1, 1, PREFIX, k, subtract)
    noise = SeededNoise(20261122 + t + k)
    state = kt.KaryTreeState(t=t - 1, total=100)  # the exact state: noise-free
    errors = np.array([kt.step(spec, state, 1, noise)[1].value - 101 for _ in range(n)])
    kappa = kurtosis_of_sum([s for _, s, _ in kt.release_terms(spec, t)])
    rel_se = math.sqrt((kappa - 1) / n)
    assert float(np.mean(errors**2)) == pytest.approx(kt.variance(spec, t), rel=5 * rel_se)


@pytest.mark.statistical
def test_empirical_covariance_of_consecutive_releases():
    """8.1 item 9: k = 3, tau = 5, 6 of the T = 27 tree (period 3): the two releases share
    z_9 and z_6 (scale 4) and the three period totals (scales 1, 2, 3).

    n = 3000 keyed runs (one key per run). For zero-mean errors, mean(e5 * e6) has variance
    <= E[e5^2 e6^2] / n <= (kappa5 kappa6)^(1/2) sigma5^2 sigma6^2 / n (Cauchy-Schwarz);
    we allow 5 of those standard errors.
    """
    n = 3000
    spec = kt.make_kary_tree(1, 1, PREFIX, 3, True)
    t5 = period_start(3, 3) + 4
    shared = {n_ for n_, _, _ in kt.release_terms(spec, t5)} & {
        n_ for n_, _, _ in kt.release_terms(spec, t5 + 1)
    }
    cov = sum(
        discrete_laplace_variance(s) for n_, s, _ in kt.release_terms(spec, t5) if n_ in shared
    )
    assert len(shared) == 5
    products = []
    for run_id in range(n):
        noise = CachedNoise(KeyedNoise(KEY + run_id.to_bytes(4, "big")))
        state = kt.KaryTreeState(t=t5 - 1, total=0)
        state, a = kt.step(spec, state, 0, noise)
        _, b = kt.step(spec, state, 0, noise)
        products.append(a.value * b.value)
    k5 = kurtosis_of_sum([s for _, s, _ in kt.release_terms(spec, t5)])
    k6 = kurtosis_of_sum([s for _, s, _ in kt.release_terms(spec, t5 + 1)])
    se = math.sqrt(math.sqrt(k5 * k6) * kt.variance(spec, t5) * kt.variance(spec, t5 + 1) / n)
    assert abs(float(np.mean(products)) - cov) <= 5 * se
    # Releases in different top-level halves share only the period totals (8.1 item 9).
    t13 = period_start(3, 3) + 12
    common = {n_ for n_, _, _ in kt.release_terms(spec, t13)} & {
        n_ for n_, _, _ in kt.release_terms(spec, t13 + 1)
    }
    assert {n_[-3] for n_ in common} == {0, 1, 2}


# --- the even-k variant (App. A.3) -------------------------------------------------------


def test_even_k_example_e8():
    """E8: k = 4, T = 10 is the capacity of h = 2; rep(7) = (-1, 2); W = 23; MSE 18.4."""
    assert kt.tree_capacity(4, True, 2) == 10
    assert kt.tree_height(4, True, 10) == 2
    assert kt._digits(7, 4, True, 2) == (-1, 2)
    weights = [sum(map(abs, kt._digits(t, 4, True, 2))) for t in range(1, 11)]
    assert weights == [1, 2, 2, 1, 2, 3, 3, 2, 3, 4]
    assert kt.weight_sum(4, True, 2, 10) == 23
    assert kt.fixed_tree_mse(4, True, 10) == Fraction(92, 5)  # 18.4


@pytest.mark.parametrize("k", [4, 6, 20])
@pytest.mark.parametrize("h", [1, 2, 3, 4])
def test_even_k_closed_form_at_capacity(k, h):
    """Our exact closed form (App. A.3): at T = k(k^h - 1)/(2(k - 1)),
    MSE eps^2 = k h^3 / (2 (1 - k^-h)) + (k - 2) h^2 / (2 (k - 1))."""
    cap = kt.tree_capacity(k, True, h)
    assert cap == k * (k**h - 1) // (2 * (k - 1))
    expected = Fraction(k * h**3, 2) / (1 - Fraction(1, k**h)) + Fraction(
        (k - 2) * h * h, 2 * (k - 1)
    )
    assert kt.fixed_tree_mse(k, True, cap) == expected


@pytest.mark.parametrize("k", [4, 6, 8, 20])
def test_even_k_digits_are_in_range_and_unique(k):
    h = 3
    cap = kt.tree_capacity(k, True, h)
    seen = set()
    for t in range(1, cap + 1):
        digits = kt._digits(t, k, True, h)
        assert all(-k // 2 + 1 <= d <= k // 2 for d in digits)
        assert sum(d * k**i for i, d in enumerate(digits)) == t
        seen.add(digits)
    assert len(seen) == cap
    with pytest.raises(InvalidOperatorConfig):
        kt._digits(cap + 1, k, True, h)


def test_even_k_constants():
    assert kt.asymptotic_constant(4, True) == pytest.approx(0.25, abs=5e-5)
    assert kt.asymptotic_constant(20, True) == pytest.approx(0.12387, abs=5e-6)
    # Worse than the odd-k variant by 1/(1 - 1/k^2), as App. A.3 says.
    ratio = kt.asymptotic_constant(20, True) / (20 * (1 - 1 / 400) / (2 * math.log2(20) ** 3))
    assert ratio == pytest.approx(1 / (1 - 1 / 400))


@pytest.mark.parametrize("k", [4, 6])
def test_even_k_mechanism_releases_exact_sums_and_uses_signed_nodes(k):
    spec = kt.make_kary_tree(1, 2, ("even", 0), k, subtract=True)
    assert kt.mechanism(spec) == kt.MECHANISM_SUBTRACT
    state, total, signs = kt.init(spec), 0, set()
    rng = np.random.default_rng(k)
    for _ in range(200):
        w = int(rng.integers(0, 5))
        total += w
        recorder = RecordingNoise(ZeroNoise())
        state, rel = kt.step(spec, state, w, recorder)
        assert rel.value == total
        signs |= {sign for _, _, sign in kt.release_terms(spec, state.t)}
        assert rel.std == pytest.approx(kt.std(spec, state.t))
    assert signs == {1, -1}
