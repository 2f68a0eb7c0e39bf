"""Exact error bars (dpstream.operators.noise.exact_quantile): the least h with
P(|Z| > h) <= alpha for Z a sum of discrete Laplace noises, against brute-force
convolutions and closed forms; its coverage over 30,000 seeded releases (statistical)."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import (
    SeededNoise,
    chernoff_interval,
    exact_half_width,
    noisy_release,
)
from dpstream.operators.noise import exact_quantile as eq
from dpstream.operators.trees import kary_tree, tree_counter
from tests.operators.support import discrete_laplace_pmf

# The quadrature's slack (2 TAIL plus the float allowance) may make h one more than the
# least h, but only when the least h covers less than 1 - alpha + SLACK.
SLACK = 1e-8


def convolved(scales: list[Fraction]) -> np.ndarray:
    """The pmf of the sum on [-K, K], K = 40 * sum of the scales + 40 (np.convolve)."""
    limit = math.ceil(40 * float(max(scales))) + 40
    support = np.arange(-limit, limit + 1)
    dist = np.array([1.0])
    for b in scales:
        dist = np.convolve(dist, discrete_laplace_pmf(b, support))
    return dist


def coverage(dist: np.ndarray, h: int) -> float:
    """P(|Z| <= h) from a centred pmf array."""
    centre = len(dist) // 2
    return float(dist[centre - h : centre + h + 1].sum()) if h >= 0 else 0.0


CASES = [
    [Fraction(1), Fraction(2), Fraction(3), Fraction(4), Fraction(4)],  # binary, t = 13
    [Fraction(3)] * 5,
    [Fraction(1, 2), Fraction(5)],
    [Fraction(10), Fraction(20)],
    [Fraction(7, 3)] * 12,
    [Fraction(1), Fraction(40)],
    [Fraction(30)] * 3 + [Fraction(60)] * 2,
    [Fraction(1, 3)] * 4,
]


@pytest.mark.parametrize("scales", CASES)
@pytest.mark.parametrize("alpha", [0.2, 0.05, 0.025, 0.001])
def test_the_half_width_is_the_least_covering_one(scales, alpha):
    dist = convolved(scales)
    h = exact_half_width(scales, alpha)
    assert h == int(h)
    assert coverage(dist, int(h)) >= 1 - alpha
    assert coverage(dist, int(h) - 1) < 1 - alpha + SLACK


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(1), Fraction(25), Fraction(10**9)])
def test_one_node_is_the_closed_form(scale):
    """P(|Z| > h) = 2 p^(h+1) / (1 + p): the least h with that <= 0.05, and not one less."""
    h = int(exact_half_width([scale]))
    b = float(scale)
    p = math.exp(-1 / b)
    assert 2 * math.exp(-(h + 1) / b) / (1 + p) <= 0.05
    assert h == 0 or 2 * math.exp(-h / b) / (1 + p) > 0.05 * (1 - 1e-9)


@pytest.mark.parametrize("scale", [Fraction(1000), Fraction(10**6), Fraction(10**8)])
def test_two_equal_large_scales_against_their_closed_form(scale):
    """Two i.i.d. discrete Laplace: P(Z = k) = c^2 p^k (k + 1 + 2 p^2 / (1 - p^2)) for
    k >= 0, c = (1 - p) / (1 + p), so P(Z > h) has a closed form. Scales far beyond what a
    convolution could check, computed in a handful of quadrature points."""
    b = float(scale)
    p = math.exp(-1 / b)
    one_minus_p = -math.expm1(-1 / b)
    c2 = (one_minus_p / (1 + p)) ** 2
    extra = 1 + 2 * p * p / (one_minus_p * (1 + p))

    def tail(h: int) -> float:  # P(|Z| > h) = 2 sum_{k > h} P(Z = k)
        return 2 * c2 * (p ** (h + 1) / one_minus_p * (h + extra) + p ** (h + 1) / one_minus_p**2)

    h = int(exact_half_width([scale, scale]))
    assert tail(h) <= 0.05
    assert tail(h - 1) > 0.05 - SLACK


def test_tiny_scales_count_as_misses():
    """A node of scale 1/1000 is nonzero with probability ~e^-1000: it changes nothing."""
    base = [Fraction(3), Fraction(5)]
    assert exact_half_width([*base, Fraction(1, 1000)]) == exact_half_width(base)
    assert exact_half_width([Fraction(1, 1000)] * 3) == 0.0


def test_nothing_has_half_width_zero_and_order_is_irrelevant():
    assert exact_half_width([]) == 0.0
    scales = [Fraction(5), Fraction(1), Fraction(3)]
    assert exact_half_width(scales) == exact_half_width(sorted(scales))
    assert exact_half_width(tuple(scales)) == exact_half_width(scales)


def test_a_structure_beyond_the_quadrature_falls_back_to_chernoff():
    """One node a million times the other: Phi decays like a single node's, so the
    quadrature would need ~10^6 points; the guaranteed Chernoff bound is returned."""
    scales = [Fraction(1), Fraction(10**6)]
    assert exact_half_width(scales) == chernoff_interval(scales, 0.05)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_rejects_bad_alpha(alpha):
    with pytest.raises(InvalidOperatorConfig, match="alpha must be in"):
        exact_half_width([Fraction(1)], alpha)


def test_rejects_bad_scales():
    with pytest.raises(InvalidOperatorConfig, match="scale must be finite and > 0"):
        exact_half_width([Fraction(1), Fraction(0)])
    with pytest.raises(InvalidOperatorConfig, match="scale must be a Fraction"):
        exact_half_width([0.5])


def tree_structures() -> list[list[Fraction]]:
    """The scale multisets of binary and k-ary releases at a spread of steps and scales."""
    out = []
    for eps, sensitivity in ((Fraction(1), 1), (Fraction(1, 10), 64), (Fraction(1, 100), 1024)):
        binary = tree_counter.make_binary_tree(eps, sensitivity, ("b",))
        kary = kary_tree.make_kary_tree(eps, sensitivity, ("k",), 19, True)
        for t in (2, 3, 7, 13, 100, 1000, 12345, 2**20 - 1, 10**7 + 3):
            out.append([b for _, b, _ in tree_counter.release_nodes(binary, t)])
            out.append([b for _, b, _ in kary_tree.release_terms(kary, t)])
    return out


def test_exact_is_narrower_than_chernoff_on_every_tree_structure():
    """1.4-2x narrower: the Chernoff bound's price, which the exact quantile does not pay."""
    for scales in tree_structures():
        ratio = chernoff_interval(scales) / exact_half_width(scales)
        assert 1.35 < ratio < 2.1


def test_is_fast_uncached():
    """Every tree structure above, uncached, in well under a second in total (measured:
    0.2-7 ms each, most below 1 ms); a release then reads it from the cache."""
    structures = tree_structures()
    best = math.inf
    for _ in range(3):
        eq._half_width.cache_clear()
        start = time.perf_counter()
        for scales in structures:
            exact_half_width(scales)
        best = min(best, time.perf_counter() - start)
    assert best < 2.0


# ---------------------------------------------------------------------------------------
# Coverage over seeded releases

RELEASES = 30_000
SHAPES = {
    "binary, eps 1, tau 1, t = 13": tree_counter.release_nodes(
        tree_counter.make_binary_tree(1, 1, ("cov",)), 13
    ),
    "binary, eps 1/10, tau 2, t = 1000": tree_counter.release_nodes(
        tree_counter.make_binary_tree(Fraction(1, 10), 2, ("cov",)), 1000
    ),
    "k-ary subtract k 19, eps 1/2, tau 1, t = 5000": kary_tree.release_terms(
        kary_tree.make_kary_tree(Fraction(1, 2), 1, ("cov",), 19, True), 5000
    ),
    "one node, scale 25": [(("cov", 0), Fraction(25), 1)],
}


@pytest.mark.statistical
@pytest.mark.parametrize("shape", list(SHAPES))
def test_coverage_of_30000_seeded_releases(shape):
    """The released 95% interval covers the exact value in 95.0-96.0% of the releases.

    Each release is ``noisy_release`` over the shape's nodes with fresh exact draws
    (``SeededNoise``, the production sampler). Its exact coverage c = P(|Z| <= ci95) is
    computed by a brute-force convolution and lies in [0.95, 0.96]: at least the stated
    confidence, and at most what the integer lattice forces. The measured share must be
    within 4 standard errors sqrt(c (1 - c) / n) of c (n = 30,000: about 0.5 percentage
    points; a correct interval fails this with probability 6e-5). The Chernoff bound it
    replaces covered 99.4-99.7% of these shapes.
    """
    terms = SHAPES[shape]
    scales = [b for _, b, _ in terms]
    noise = SeededNoise(20_260_630 + len(terms))
    first = noisy_release(1, 0, terms, noise)
    misses = abs(first.value) > first.ci95
    for _ in range(RELEASES - 1):
        release = noisy_release(1, 0, terms, noise)
        misses += abs(release.value) > release.ci95
    exact = coverage(convolved(scales), int(first.ci95))
    assert 0.95 <= exact <= 0.96
    measured = 1 - misses / RELEASES
    assert abs(measured - exact) <= 4 * math.sqrt(exact * (1 - exact) / RELEASES)
