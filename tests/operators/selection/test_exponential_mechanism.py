"""The exact exponential-mechanism sampler behind Rameshwar et al.'s private interval and
quantiles."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, SeededNoise, ZeroNoise
from dpstream.operators.noise import bits as nb
from dpstream.operators.selection import exponential_mechanism as em

KEY = b"exp-mech-test-key-0123456789abcdef"


def exact_exp_neg(gamma: Fraction) -> Decimal:
    """exp(-gamma) to 80 significant digits (Decimal's exp is correctly rounded)."""
    with localcontext() as ctx:
        ctx.prec = 80
        return (-(Decimal(gamma.numerator) / Decimal(gamma.denominator))).exp()


# ---------------------------------------------------------------------------------------
# Brackets of exp(-gamma)


@given(
    st.fractions(min_value=0, max_value=300, max_denominator=1000),
    st.sampled_from([8, 32, 48, 64, 128]),
)
@settings(max_examples=300, deadline=None)
def test_exp_neg_bounds_bracket_the_true_value(gamma: Fraction, prec: int) -> None:
    lo, hi = em.exp_neg_bounds(gamma, prec)
    with localcontext() as ctx:
        ctx.prec = 80
        scaled = exact_exp_neg(gamma) * (Decimal(2) ** prec)
    assert Decimal(lo) <= scaled <= Decimal(hi)
    assert 0 <= hi - lo <= 3


def test_exp_neg_bounds_edges_and_messages() -> None:
    assert em.exp_neg_bounds(Fraction(0), 10) == (1024, 1024)
    assert em.exp_neg_bounds(Fraction(40), 40) == (0, 1)  # exp(-40) < 2^-40
    with pytest.raises(InvalidOperatorConfig, match=r"gamma must be >= 0, got Fraction\(-1, 2\)"):
        em.exp_neg_bounds(Fraction(-1, 2), 10)
    with pytest.raises(InvalidOperatorConfig, match="prec must be >= 1, got 0"):
        em.exp_neg_bounds(Fraction(1), 0)


# ---------------------------------------------------------------------------------------
# Choices from fair bits (noise.bits)


def test_zero_noise_gives_the_mode() -> None:
    mult, exps = [2, 2, 4, 2], [Fraction(3, 4), Fraction(1, 4), Fraction(1, 4), Fraction(3, 4)]
    assert em.sample_index(mult, exps, nb.NoiseBits(ZeroNoise(), ("x",))) == 2
    assert em.mode([1, 1, 1], [Fraction(1), Fraction(0), Fraction(0)]) == 1  # lowest on ties
    assert nb.uniform_below(7, nb.NoiseBits(ZeroNoise(), ("y",))) == 3


def test_keyed_choices_replay_and_differ_across_nodes() -> None:
    mult, exps = [1] * 64, [Fraction(0)] * 64
    first = [
        em.sample_index(mult, exps, nb.NoiseBits(KeyedNoise(KEY), ("c", i))) for i in range(40)
    ]
    again = [
        em.sample_index(mult, exps, nb.NoiseBits(KeyedNoise(KEY), ("c", i))) for i in range(40)
    ]
    assert first == again
    assert len(set(first)) > 10


def test_weight_validation_messages() -> None:
    bits = nb.NoiseBits(SeededNoise(1), ("x",))
    with pytest.raises(InvalidOperatorConfig, match="multiplicities must be not all zero"):
        em.sample_index([0, 0], [Fraction(0), Fraction(1)], bits)
    with pytest.raises(InvalidOperatorConfig, match="multiplicity must be >= 0, got -1"):
        em.sample_index([1, -1], [Fraction(0), Fraction(1)], bits)
    with pytest.raises(
        InvalidOperatorConfig, match=r"exponent must be >= 0, got Fraction\(-1, 1\)"
    ):
        em.sample_index([1, 1], [Fraction(0), Fraction(-1)], bits)
    with pytest.raises(InvalidOperatorConfig, match=r"exponents must be as many as the multi"):
        em.sample_index([1, 1], [Fraction(0)], bits)
    with pytest.raises(InvalidOperatorConfig, match="n must be >= 1, got 0"):
        nb.uniform_below(0, bits)


def test_zero_multiplicity_is_never_drawn() -> None:
    noise = SeededNoise(5)
    mult, exps = [0, 3, 0, 1], [Fraction(0), Fraction(2), Fraction(0), Fraction(1, 3)]
    draws = {em.sample_index(mult, exps, nb.NoiseBits(noise, ("z", i))) for i in range(300)}
    assert draws <= {1, 3}


def test_probabilities_sum_to_one_and_match_the_formula() -> None:
    mult = [3, 0, 5, 1]
    exps = [Fraction(1, 3), Fraction(0), Fraction(700), Fraction(2)]
    probs = em.probabilities(mult, exps)
    raw = [a * math.exp(-float(g)) for a, g in zip(mult, exps, strict=True)]
    assert math.fsum(probs) == pytest.approx(1, abs=1e-15)
    for p, r in zip(probs, raw, strict=True):
        assert p == pytest.approx(r / sum(raw), rel=1e-12, abs=1e-300)


# ---------------------------------------------------------------------------------------
# Distribution


def assert_frequencies(counts: Counter, probs: list[float], n: int) -> None:
    """Every cell within 5 binomial standard deviations: with at most 40 cells, the chance
    that a correct sampler fails is below 40 * 5.7e-7 (two-sided normal tail at 5 sd)."""
    for i, p in enumerate(probs):
        sd = math.sqrt(n * p * (1 - p))
        assert abs(counts.get(i, 0) - n * p) <= 5 * sd + 1e-9, (i, counts.get(i, 0), n * p)


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("mult", "exps"),
    [
        ([2, 2, 4, 2], [Fraction(3, 4), Fraction(1, 4), Fraction(1, 4), Fraction(3, 4)]),  # E4
        ([1] * 10, [Fraction(c, 2) for c in (5, 4, 1, 4, 4, 4, 5, 5, 5, 5)]),  # E3 at eps = 2
        ([1, 1000, 7, 1], [Fraction(0), Fraction(9), Fraction(1, 7), Fraction(40)]),
    ],
)
def test_sample_index_has_the_target_distribution(mult: list[int], exps: list[Fraction]) -> None:
    n = 20000  # 5-10 s on one core with SeededNoise (~4 bits per choice)
    noise = SeededNoise(20240901)
    counts = Counter(em.sample_index(mult, exps, nb.NoiseBits(noise, ("s", i))) for i in range(n))
    assert_frequencies(counts, em.probabilities(mult, exps), n)


@pytest.mark.statistical
def test_uniform_below_is_uniform() -> None:
    n, k = 20000, 11
    noise = SeededNoise(7)
    counts = Counter(nb.uniform_below(k, nb.NoiseBits(noise, ("u", i))) for i in range(n))
    assert_frequencies(counts, [1 / k] * k, n)


def test_scaled_fast_path_agrees_with_fractions() -> None:
    mult = [3, 1, 0, 7, 2]
    exps = [Fraction(1, 3), Fraction(5, 6), Fraction(0), Fraction(3, 2), Fraction(7)]
    nums, den = [2, 5, 0, 9, 42], 6
    for i in range(50):
        a = em.sample_index(mult, exps, nb.NoiseBits(KeyedNoise(KEY), ("f", i)))
        b = em.sample_index_scaled(mult, nums, den, nb.NoiseBits(KeyedNoise(KEY), ("f", i)))
        assert a == b
    bits = nb.NoiseBits(SeededNoise(1), ("x",))
    with pytest.raises(InvalidOperatorConfig, match="numerator must be >= 0, got -1"):
        em.sample_index_scaled([1, 1], [0, -1], 2, bits)
    with pytest.raises(InvalidOperatorConfig, match="denominator must be >= 1, got 0"):
        em.sample_index_scaled([1, 1], [0, 1], 0, bits)
    with pytest.raises(InvalidOperatorConfig, match="numerators must be as many as the multi"):
        em.sample_index_scaled([1, 1], [0], 1, bits)
