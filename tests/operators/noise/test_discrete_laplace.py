"""Tests of dpstream.operators.noise: exact sampler, noise sources, error bars."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import (
    KeyedNoise,
    SeededNoise,
    chernoff_interval,
    discrete_laplace_variance,
    laplace_variance,
    node_bytes,
    sample_discrete_laplace,
    sources,
)
from dpstream.operators.noise import discrete_laplace as dl
from tests.operators.support import chi2_sf

KEY = b"super-secret-key-material-0123456789"
OTHER_KEY = b"another-secret-key-material-98765"
GOF_SCALES = [Fraction(1, 2), Fraction(1), Fraction(2), Fraction(7, 2), Fraction(10)]

# ---------------------------------------------------------------------------------------
# Reference maths, independent of the module under test


def pmf(x: int, scale: Fraction) -> float:
    """Exact P(X = x) of discrete Laplace: (1 - p) / (1 + p) * p^|x|, p = exp(-1/b)."""
    inv = 1 / float(scale)
    p = math.exp(-inv)
    return -math.expm1(-inv) / (1 + p) * p ** abs(x)


def moment(k: int, scale: Fraction) -> float:
    """E[X^k] by direct summation, to the point where the terms vanish."""
    limit = math.ceil(60 * float(scale)) + 60
    return sum(x**k * pmf(x, scale) for x in range(-limit, limit + 1))


def abs_tail(h: float, scale: Fraction) -> float:
    """Exact P(|X| > h) = 2 P(X >= floor(h) + 1) = 2 p^m / (1 + p)."""
    p = math.exp(-1 / float(scale))
    return 2 * p ** (math.floor(h) + 1) / (1 + p)


def chi_square_p_value(samples: Sequence[int], scale: Fraction) -> float:
    """Goodness of fit of integer samples to discrete Laplace(scale).

    One bin per value in (-m, m), plus the pooled tails x <= -m and x >= m, where m is the
    largest value whose own expected count is >= 5 (so every bin expects >= 5).
    """
    n = len(samples)
    m = 0
    while n * pmf(m + 1, scale) >= 5:
        m += 1
    assert m >= 1
    p = math.exp(-1 / float(scale))
    tail = p**m / (1 + p)
    expected = np.array([tail] + [pmf(x, scale) for x in range(-m + 1, m)] + [tail]) * n
    observed = np.bincount(np.clip(np.asarray(samples), -m, m) + m, minlength=2 * m + 1)
    stat = float(((observed - expected) ** 2 / expected).sum())
    return chi2_sf(stat, df=2 * m)


def seeded_draws(seed: int, scale: Fraction, count: int) -> list[int]:
    source = SeededNoise(seed)
    return [source.discrete_laplace(("gof",), scale) for _ in range(count)]


# ---------------------------------------------------------------------------------------
# The reference maths itself


@pytest.mark.parametrize(
    ("x", "df", "expected"),
    [
        (3.841458820694124, 1, 0.05),
        (18.307038053275146, 10, 0.05),
        (6.634896601021214, 1, 0.01),
        (124.34211340400407, 100, 0.05),
        (0.10258658877510107, 2, 0.95),
    ],
)
def test_chi2_sf_matches_tabulated_quantiles(x: float, df: int, expected: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("df", [2, 4, 10, 40])
@pytest.mark.parametrize("x", [0.5, 3.0, 9.0, 30.0, 80.0])
def test_chi2_sf_matches_closed_form_for_even_df(x: float, df: int) -> None:
    # Poisson identity: sf(x, 2k) = exp(-x/2) * sum_{j<k} (x/2)^j / j!; exercises both branches.
    half = x / 2
    closed = math.exp(-half) * sum(half**j / math.factorial(j) for j in range(df // 2))
    assert chi2_sf(x, df) == pytest.approx(closed, rel=1e-9, abs=1e-300)


# ---------------------------------------------------------------------------------------
# node_bytes


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (("a1",), ("a", 1)),
        (("1",), (1,)),
        (("ab", "c"), ("a", "bc")),
        ((), ("",)),
        (("",), ("", "")),
        ((1, 2), (12,)),
        ((255,), (-1,)),
        ((0,), ("",)),
        (("events", 0, 3, 1, 2), ("events", 0, 3, 12)),
    ],
)
def test_node_bytes_separates_tricky_pairs(left: tuple, right: tuple) -> None:
    assert node_bytes(left) != node_bytes(right)


def test_node_bytes_is_a_pure_function() -> None:
    assert node_bytes(("events", 0, 3, 1, 2)) == node_bytes(("events", 0, 3, 1, 2))


# A tiny alphabet makes concatenation look-alikes such as ("a1",) and ("a", 1) frequent.
_fields = st.one_of(st.text(alphabet="a1", max_size=3), st.integers(min_value=-2, max_value=12))
_nodes = st.lists(_fields, max_size=4).map(tuple)


@given(st.lists(_nodes, min_size=2, max_size=30))
def test_node_bytes_is_injective(nodes: list[tuple]) -> None:
    assert len({node_bytes(n) for n in nodes}) == len(set(nodes))


@pytest.mark.parametrize("bad", [(True,), (1.0,), (None,), ["a", 1], "a"])
def test_node_bytes_rejects_other_types(bad: object) -> None:
    with pytest.raises(InvalidOperatorConfig, match="node"):
        node_bytes(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# The exact sampler


@pytest.mark.parametrize("bad", [0.5, Fraction(0), Fraction(-1, 2), -3, True, "1"])
def test_sampler_rejects_bad_scales(bad: object) -> None:
    rng = np.random.Generator(np.random.PCG64(0))
    with pytest.raises(InvalidOperatorConfig, match="scale"):
        sample_discrete_laplace(bad, lambda n: sources._generator_rand_below(rng, n))  # type: ignore[arg-type]


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_frequency(gamma: Fraction) -> None:
    rng = np.random.Generator(np.random.PCG64(99))
    trials = 20_000
    hits = sum(
        dl._bernoulli_exp(gamma, lambda n: sources._generator_rand_below(rng, n))
        for _ in range(trials)
    )
    p = math.exp(-float(gamma))
    assert abs(hits / trials - p) <= 5 * math.sqrt(p * (1 - p) / trials) + 1e-12


def test_discrete_laplace_variance_formula() -> None:
    e = math.exp(-1)
    assert discrete_laplace_variance(1) == pytest.approx(2 * e / (1 - e) ** 2, rel=0, abs=1e-12)
    assert laplace_variance(4) == 32
    assert laplace_variance(Fraction(1, 2)) == 0.5


@pytest.mark.parametrize("scale", GOF_SCALES)
def test_discrete_laplace_variance_matches_the_pmf(scale: Fraction) -> None:
    assert discrete_laplace_variance(scale) == pytest.approx(moment(2, scale), rel=1e-9)
    assert discrete_laplace_variance(scale) < laplace_variance(scale)


@pytest.mark.statistical
@pytest.mark.parametrize(("seed", "scale"), list(enumerate(GOF_SCALES, start=2024)))
def test_seeded_draws_fit_the_exact_pmf(seed: int, scale: Fraction) -> None:
    draws = seeded_draws(seed, scale, 20_000)
    assert chi_square_p_value(draws, scale) > 1e-4
    # Mean is 0, so mean(X^2) is unbiased for the variance; its own variance is mu4 - var^2.
    var = discrete_laplace_variance(scale)
    standard_error = math.sqrt((moment(4, scale) - var**2) / len(draws))
    assert abs(sum(x * x for x in draws) / len(draws) - var) <= 6 * standard_error


@pytest.mark.statistical
def test_goodness_of_fit_test_has_power() -> None:
    # The same kind of sample judged against a 10% larger scale must be rejected.
    draws = seeded_draws(2025, Fraction(1), 20_000)
    assert chi_square_p_value(draws, Fraction(11, 10)) < 1e-4


@pytest.mark.statistical
def test_keyed_draws_over_distinct_nodes_fit_the_exact_pmf() -> None:
    scale = Fraction(3)
    source = KeyedNoise(KEY)
    draws = [source.discrete_laplace(("gof", 0, 0, 0, i), scale) for i in range(20_000)]
    assert chi_square_p_value(draws, scale) > 1e-4
    var = discrete_laplace_variance(scale)
    standard_error = math.sqrt((moment(4, scale) - var**2) / len(draws))
    assert abs(sum(x * x for x in draws) / len(draws) - var) <= 6 * standard_error


def test_privacy_ratio_of_neighbouring_outputs() -> None:
    # pmf() is the distribution the sampler was fitted to at this scale (GOF_SCALES has 2).
    epsilon = Fraction(1, 2)
    scale = 1 / epsilon
    assert scale in GOF_SCALES
    bound = math.exp(epsilon) * (1 + 1e-12)
    ratios = []
    for x in range(-50, 50):
        ratios += [pmf(x, scale) / pmf(x + 1, scale), pmf(x + 1, scale) / pmf(x, scale)]
    assert max(ratios) <= bound
    assert max(ratios) >= math.exp(epsilon) * (1 - 1e-12)  # the bound is attained, not slack


# ---------------------------------------------------------------------------------------
# chernoff_interval


def test_chernoff_of_nothing_is_zero() -> None:
    assert chernoff_interval([]) == 0.0


def test_chernoff_is_monotone_in_alpha() -> None:
    scales = [Fraction(1), Fraction(2), Fraction(3)]
    widths = [chernoff_interval(scales, alpha) for alpha in (0.001, 0.01, 0.05, 0.2, 0.5)]
    assert widths == sorted(widths, reverse=True)
    assert len(set(widths)) == len(widths)


def test_chernoff_is_monotone_in_each_scale() -> None:
    base = [Fraction(1, 2), Fraction(1), Fraction(2), Fraction(7, 2), Fraction(10)]
    h = chernoff_interval(base)
    for i in range(len(base)):
        bigger = [*base[:i], base[i] * Fraction(5, 4), *base[i + 1 :]]
        assert chernoff_interval(bigger) > h


def test_chernoff_ignores_order_and_caches() -> None:
    scales = [Fraction(3), Fraction(1), Fraction(2)]
    assert chernoff_interval(scales) == chernoff_interval(sorted(scales))
    assert chernoff_interval(tuple(scales)) == chernoff_interval(scales)


@pytest.mark.parametrize("scale", GOF_SCALES)
@pytest.mark.parametrize("alpha", [0.2, 0.05, 0.01, 0.001])
def test_chernoff_single_scale_covers_the_exact_tail(scale: Fraction, alpha: float) -> None:
    h = chernoff_interval([scale], alpha)
    assert abs_tail(h, scale) <= alpha
    exact = next(q for q in range(10_000) if abs_tail(q, scale) <= alpha)
    # Chernoff on one Laplace is 1.5x to 2.5x the exact quantile (plus discreteness);
    # more means a badly optimised lambda.
    assert h < 3 * (exact + 1)


def test_chernoff_many_scales_against_the_exact_convolution() -> None:
    scales = [Fraction(3)] * 30 + [Fraction(7, 2)] * 10
    support = np.arange(-200, 201)
    dist = np.array([1.0])
    for b in scales:
        dist = np.convolve(dist, np.array([pmf(int(x), b) for x in support]))
    centre = len(dist) // 2
    h = chernoff_interval(scales)
    m = math.floor(h)
    tail = float(dist[: centre - m].sum() + dist[centre + m + 1 :].sum())
    assert tail <= 0.05
    # Near-Gaussian sum: Chernoff gives sqrt(2 ln 40) sigma ~ 1.39 x 1.96 sigma.
    inside = np.cumsum(dist[centre:] + np.concatenate(([0.0], dist[:centre][::-1])))
    q95 = int(np.searchsorted(inside, 0.95))
    assert 1.2 * q95 < h < 1.5 * q95


@pytest.mark.statistical
def test_chernoff_empirical_coverage_of_a_five_scale_sum() -> None:
    scales = [Fraction(5)] * 5
    source = SeededNoise(31337)
    sums = np.array(
        [sum(source.discrete_laplace(("c",), b) for b in scales) for _ in range(20_000)]
    )
    h = chernoff_interval(scales, 0.05)
    assert float(np.mean(np.abs(sums) <= h)) >= 0.95
    assert h < 1.6 * float(np.quantile(np.abs(sums), 0.95))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_chernoff_rejects_bad_alpha(alpha: float) -> None:
    with pytest.raises(InvalidOperatorConfig, match="alpha"):
        chernoff_interval([Fraction(1)], alpha)


def test_chernoff_rejects_bad_scales() -> None:
    with pytest.raises(InvalidOperatorConfig, match="scale"):
        chernoff_interval([Fraction(1), Fraction(0)])


def test_chernoff_is_fast_uncached() -> None:
    # The budget per release is 5 ms; 25 ms on the best of 5 keeps this immune to load.
    scales = [Fraction(i + 1, 2) for i in range(40)]
    best = math.inf
    for i in range(5):
        start = time.perf_counter()
        chernoff_interval(scales, 0.05 + i * 1e-9)  # a new alpha defeats the cache
        best = min(best, time.perf_counter() - start)
    assert best < 0.025
