"""Binary tree counter, Dong-Luo-Yi Alg. 2, and a worked example (Example C)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import (
    KeyedNoise,
    RecordingNoise,
    SeededNoise,
    ZeroNoise,
    discrete_laplace_variance,
    laplace_variance,
)
from dpstream.operators.trees import tree_counter as tc


def run(spec: tc.BinaryTreeSpec, weights: list[int], noise) -> tuple[tc.BinaryTreeState, list]:
    state, releases = tc.init(spec), []
    for w in weights:
        state, rel = tc.step(spec, state, w, noise)
        releases.append(rel)
    return state, releases


def test_example_c_nodes_scales_and_variance():
    spec = tc.make_binary_tree(1, 1, ("s", 0))
    nodes = tc.release_nodes(spec, 13)
    # P0[1], P1[2-3], P2[4-7], alpha_2[8-11], alpha_1[12-13]
    assert [n[2:] for n, _, _ in nodes] == [(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 2, 0), (3, 1, 2)]
    assert [s for _, s, _ in nodes] == [1, 2, 3, 4, 4]
    assert sum(laplace_variance(s) for _, s, _ in nodes) == 92
    # The release's std is the exact discrete-Laplace one, a little below 2b^2.
    assert tc.std(spec, 13) == pytest.approx(
        math.sqrt(sum(discrete_laplace_variance(s) for s in (1, 2, 3, 4, 4))), rel=1e-12
    )


def test_example_c_exact_parts_on_all_ones_stream():
    spec = tc.make_binary_tree(1, 1, ("s", 0))
    state, releases = run(spec, [1] * 13, ZeroNoise())
    assert state.period_totals == (1, 2, 4)
    assert state.alpha == (0, 2, 4, 0)  # alpha_1[12-13] = 2, alpha_2[8-11] = 4
    assert [r.value for r in releases] == list(range(1, 14))


def test_example_c_user_level_scales():
    # tau = 4, eps_inst = 0.25: every scale times 16, Var = 23552.
    spec = tc.make_binary_tree(Fraction(1, 4), 4, ("s", 0))
    assert sum(laplace_variance(s) for _, s, _ in tc.release_nodes(spec, 13)) == 23552


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=300))
def test_zero_noise_releases_the_exact_prefix_sums(weights):
    spec = tc.make_binary_tree(0.5, 3, ("s", 0))
    state, releases = run(spec, weights, ZeroNoise())
    assert [r.value for r in releases] == list(np.cumsum(weights))
    assert tc.exact_value(state) == sum(weights)


@pytest.mark.parametrize("t", [1, 2, 3, 7, 8, 13, 64, 100, 1023, 1024, 1025])
def test_noise_structure_per_step(t):
    """floor(log2 t) period totals plus popcount(k) live nodes; a closed period's top node
    is its total."""
    spec = tc.make_binary_tree(1, 2, ("s", 0))
    recorder = RecordingNoise(ZeroNoise())
    state = tc.BinaryTreeState()
    for _ in range(t - 1):
        state, _ = tc.step(spec, state, 1, ZeroNoise())
    tc.step(spec, state, 1, recorder)
    period, k = tc.period_of(t)
    expected = period + bin(k).count("1") if k != 1 << period else period + 1
    assert len(recorder.calls) == expected
    for node, scale, _ in recorder.calls:
        assert scale == (node[2] + 1) * 2  # (l + 1) * tau / eps


def test_keyed_noise_is_replay_safe_after_a_restart():
    key = bytes(range(32))
    spec = tc.make_binary_tree(1, 4, ("events", 0))
    weights = [3, 0, 5, 1, 0, 0, 7, 2, 2, 9]
    _, first = run(spec, weights, KeyedNoise(key))
    # "Crash" after 6 steps: persist the state as JSON, restore into a fresh process-like run.
    state, _ = run(spec, weights[:6], KeyedNoise(key))
    restored = tc.BinaryTreeState(
        **{
            k: tuple(v) if isinstance(v, list) else v
            for k, v in orjson.loads(orjson.dumps(state)).items()
        }
    )
    assert restored == state
    rest = []
    for w in weights[6:]:
        restored, rel = tc.step(spec, restored, w, KeyedNoise(key))
        rest.append(rel)
    assert rest == first[6:]
    _, other = run(spec, weights, KeyedNoise(bytes(32)))
    assert [r.value for r in other] != [r.value for r in first]


def test_counters_with_different_prefixes_do_not_share_noise():
    key = bytes(range(32))
    a = tc.make_binary_tree(1, 1, ("a", 0))
    b = tc.make_binary_tree(1, 1, ("b", 0))
    _, ra = run(a, [0] * 40, KeyedNoise(key))
    _, rb = run(b, [0] * 40, KeyedNoise(key))
    assert [r.value for r in ra] != [r.value for r in rb]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0, "sensitivity": 1}, "epsilon must be finite and > 0, got Fraction(0, 1)"),
        ({"epsilon": -1.5, "sensitivity": 1}, "epsilon must be finite and > 0"),
        ({"epsilon": 1, "sensitivity": 0}, "sensitivity must be >= 1, got 0"),
        ({"epsilon": 1, "sensitivity": 2.5}, "sensitivity must be an integer, got 2.5"),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    with pytest.raises(
        InvalidOperatorConfig, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        tc.make_binary_tree(node_prefix=("s", 0), **kwargs)


def test_epsilon_is_the_decimal_the_user_wrote():
    assert tc.make_binary_tree(0.1, 1, ("s", 0)).epsilon == Fraction(1, 10)


def excess_kurtosis(scales) -> float:
    """Excess kurtosis of a sum of independent discrete Laplace terms.

    X = G1 - G2 with G geometric, p = exp(-1/b): cumulants k2 = 2p/(1-p)^2 and
    k4 = 2p(1 + 4p + p^2)/(1-p)^4; for a sum they add, and excess = sum k4 / (sum k2)^2.
    (A single discrete Laplace of scale 1 has 3.54, above the continuous Laplace's 3.)
    """
    k2 = k4 = 0.0
    for b in scales:
        p = math.exp(-1 / b)
        k2 += 2 * p / (1 - p) ** 2
        k4 += 2 * p * (1 + 4 * p + p * p) / (1 - p) ** 4
    return k4 / k2**2


def test_excess_kurtosis_of_one_term_matches_the_exact_pmf():
    b = Fraction(1)
    xs = np.arange(-200, 201)
    pmf = np.exp(-np.abs(xs) / float(b))
    pmf /= pmf.sum()
    m2, m4 = (pmf * xs**2).sum(), (pmf * xs**4).sum()
    assert excess_kurtosis([b]) == pytest.approx(m4 / m2**2 - 3, rel=1e-9)


@pytest.mark.statistical
@pytest.mark.parametrize("t", [13, 24])
def test_empirical_variance_matches_exact_variance(t):
    """Var(released - exact) equals the exact variance.

    n = 6000 seeded runs. The sample variance of n draws has relative standard error
    sqrt((2 + excess kurtosis) / n) (normal-theory 2/n plus the excess), computed exactly
    for the release's scales; the assertion allows 5 standard errors.
    """
    n = 6000
    spec = tc.make_binary_tree(1, 1, ("s", 0))
    noise = SeededNoise(20261122 + t)
    state, _ = run(spec, [1] * (t - 1), ZeroNoise())  # exact state: independent of noise
    errors = [tc.step(spec, state, 1, noise)[1].value - t for _ in range(n)]
    var = float(np.var(errors))
    scales = [s for _, s, _ in tc.release_nodes(spec, t)]
    rel_se = math.sqrt((2 + excess_kurtosis(scales)) / n)
    assert var == pytest.approx(tc.std(spec, t) ** 2, rel=5 * rel_se)


def test_exact_variance_and_mse():
    spec = tc.make_binary_tree(Fraction(1, 2), 3, ("s", 0))
    assert tc.variance(spec, 13) == pytest.approx(tc.std(spec, 13) ** 2, rel=1e-12)
    assert tc.variance(tc.make_binary_tree(1, 1, ("s", 0)), 13, continuous=True) == 92
    for horizon in [*range(1, 70), 255, 256, 1000]:
        brute = sum(tc.variance(spec, t) for t in range(1, horizon + 1)) / horizon
        assert tc.mse(spec, horizon) == pytest.approx(brute, rel=1e-12)
    # The same counter seen as Andersson-Pagh-Torkamani's k = 2 tree (node for node, see
    # test_kary_tree).
    from dpstream.operators.trees import kary_tree as kt

    kary2 = kt.make_kary_tree(Fraction(1, 2), 3, ("s", 0), 2, subtract=False)
    for horizon in (1, 7, 100, 10**6, 10**12):
        assert tc.mse(spec, horizon) == pytest.approx(kt.mse(kary2, horizon), rel=1e-9)
        assert tc.mse(spec, horizon, continuous=True) == pytest.approx(
            kt.mse(kary2, horizon, continuous=True), rel=1e-9
        )
