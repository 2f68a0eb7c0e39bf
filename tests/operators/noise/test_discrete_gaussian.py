"""The exact discrete Gaussian sampler (dpstream.operators.noise.discrete_gaussian): CKS 2020
Algorithm 3 bit for bit at centre 0, exact shifts by integers, and chi-square fits to the
exact pmf at several sigma^2 and centres (statistical)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import SeededNoise, sample_discrete_gaussian, sources
from dpstream.operators.noise import discrete_laplace as dl
from tests.operators.support import chi2_sf


def pmf(support: np.ndarray, sigma2: Fraction, center: Fraction) -> np.ndarray:
    """P(X = x) of N_Z(center, sigma2) on ``support``, normalised over +-40 sigma."""
    s2, c = float(sigma2), float(center)
    half = math.ceil(40 * math.sqrt(s2)) + 40
    everything = np.arange(math.floor(c) - half, math.floor(c) + half + 1)
    total = np.exp(-((everything - c) ** 2) / (2 * s2)).sum()
    return np.exp(-((support - c) ** 2) / (2 * s2)) / total


def chi_square_p_value(samples: list[int], sigma2: Fraction, center: Fraction) -> float:
    """Goodness of fit to N_Z(center, sigma2): one bin per value whose expected count is
    >= 5, the two tails pooled."""
    n, c = len(samples), math.floor(center + Fraction(1, 2))
    lo = hi = c
    while n * pmf(np.array([lo - 1]), sigma2, center)[0] >= 5:
        lo -= 1
    while n * pmf(np.array([hi + 1]), sigma2, center)[0] >= 5:
        hi += 1
    inner = pmf(np.arange(lo + 1, hi), sigma2, center)
    tails = 1 - inner.sum()
    far = math.ceil(40 * math.sqrt(float(sigma2))) + 40
    left = pmf(np.arange(lo - far, lo + 1), sigma2, center).sum()
    expected = np.concatenate(([left], inner, [tails - left])) * n
    observed = np.bincount(np.clip(np.asarray(samples), lo, hi) - lo, minlength=hi - lo + 1)
    stat = float(((observed - expected) ** 2 / expected).sum())
    return chi2_sf(stat, df=len(expected) - 1)


def algorithm_3(sigma2: Fraction, rand_below) -> int:
    """CKS 2020 Algorithm 3 as printed: t = floor(sigma) + 1; Y ~ discrete Laplace(t);
    accept with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))."""
    t = math.isqrt(math.floor(sigma2)) + 1
    while True:
        y = dl.sample_discrete_laplace(Fraction(t), rand_below)
        if dl._bernoulli_exp((abs(y) - sigma2 / t) ** 2 / (2 * sigma2), rand_below):
            return y


@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(1), Fraction(10), Fraction(1000, 3)])
def test_centre_zero_is_algorithm_3_bit_for_bit(sigma2):
    for seed in range(50):
        ours = np.random.Generator(np.random.PCG64(seed))
        theirs = np.random.Generator(np.random.PCG64(seed))
        assert sample_discrete_gaussian(
            sigma2, lambda n, g=ours: sources._generator_rand_below(g, n)
        ) == algorithm_3(sigma2, lambda n, g=theirs: sources._generator_rand_below(g, n))


@pytest.mark.parametrize("center", [Fraction(1, 3), Fraction(-1, 2), Fraction(7, 5)])
def test_an_integer_shift_of_the_centre_shifts_the_draw(center):
    for seed in range(30):
        draws = []
        for shift in (0, 5, -12):
            g = np.random.Generator(np.random.PCG64(seed))
            draws.append(
                sample_discrete_gaussian(
                    Fraction(9), lambda n, g=g: sources._generator_rand_below(g, n), center + shift
                )
                - shift
            )
        assert len(set(draws)) == 1


@pytest.mark.parametrize(
    ("sigma2", "center", "message"),
    [
        (Fraction(-1), Fraction(0), "sigma2 must be finite and > 0, got Fraction(-1, 1)"),
        (2.0, Fraction(0), "sigma2 must be a Fraction, got 2.0"),
        (Fraction(2), "1", "center must be a Fraction, got '1'"),
    ],
)
def test_rejects_bad_parameters(sigma2, center, message):
    with pytest.raises(InvalidOperatorConfig) as info:
        sample_discrete_gaussian(sigma2, lambda n: 0, center)
    assert str(info.value) == message


GOF = [
    (Fraction(1, 2), Fraction(0)),
    (Fraction(1), Fraction(0)),
    (Fraction(4), Fraction(1, 3)),
    (Fraction(25), Fraction(-1, 2)),
    (Fraction(400), Fraction(0)),
    (Fraction(10**6), Fraction(5, 7)),
]


@pytest.mark.statistical
@pytest.mark.parametrize(("sigma2", "center"), GOF)
def test_seeded_draws_fit_the_exact_pmf(sigma2, center):
    """20,000 draws per case; a correct sampler fails with probability 1e-4 per case."""
    source = SeededNoise(int(sigma2 * 1000) % 10_007)
    draws = [source.discrete_gaussian(("gof",), sigma2, center) for _ in range(20_000)]
    assert chi_square_p_value(draws, sigma2, center) > 1e-4


@pytest.mark.statistical
def test_the_goodness_of_fit_test_has_power():
    """The same kind of sample judged against a 10% larger sigma^2, or a centre off by a
    tenth of sigma, is rejected."""
    source = SeededNoise(7)
    draws = [source.discrete_gaussian(("gof",), Fraction(25)) for _ in range(20_000)]
    assert chi_square_p_value(draws, Fraction(25), Fraction(0)) > 1e-4
    assert chi_square_p_value(draws, Fraction(55, 2), Fraction(0)) < 1e-4
    assert chi_square_p_value(draws, Fraction(25), Fraction(1, 2)) < 1e-4


@pytest.mark.statistical
def test_keyed_draws_over_distinct_nodes_fit_the_exact_pmf():
    source = sources.KeyedNoise(b"k" * 32)
    sigma2, center = Fraction(9), Fraction(1, 4)
    draws = [source.discrete_gaussian(("gof", i), sigma2, center) for i in range(20_000)]
    assert chi_square_p_value(draws, sigma2, center) > 1e-4
