"""PrivateInterval (Alg. 3) of the Levy mechanism, Rameshwar et al. Sec. III-D.

Given the K_bar array means A_1..A_K (reals in [lo, hi]) and a public concentration radius
tau, the interval [a, b] that Levy projects onto is chosen privately:

1. bins ((k-1) tau, k tau] relative to lo, k = 1..nb, nb = ceil((hi - lo) / tau) (the
   paper's "U / tau bins", rounded up: our correction); candidates are the bin centres
   x_k = lo + (k - 1/2) tau;
2. every mean is replaced by the centre of its bin, mu_i = x_k with
   k = clamp(ceil((A_i - lo) / tau), 1, nb) (the paper's "min" is an argmin; A_i = lo maps
   to bin 1);
3. c(x) = max(#{i: mu_i < x}, #{i: mu_i > x}) and the centre is drawn with
   P(x) proportional to exp(-epsilon c(x) / (4 s)), epsilon the Levy call's TOTAL budget
   (not epsilon / 2), s = 1 for BestFit and 2 for WrapAround (docs/papers.md);
4. [a, b] = [max(lo, x - 3 tau / 2), min(x + 3 tau / 2, hi)].

Privacy:
    Under BestFit one user's values move one array mean, hence one mu_i, hence every c(x)
    by at most 1; under WrapAround by at most 2. With weights exp(-epsilon c / (4 s)) the
    choice is (epsilon / 2)-DP for user-level (value) neighbours with public counts
    (Rameshwar et al. Sec. II-D), the other half of Levy's budget going to the mean. Sampled exactly
    (``exponential_mechanism``).

tau (eq. 8) is U sqrt(ln(2 K_bar / gamma) / (2 m_UB)), a function of the public counts; it
is computed in floating point and rounded to a multiple of 2^-16 grid units (``tau``) so
that bins and bounds are exact rationals (our choice). Any public tau is private; only accuracy
depends on it.

References:
    Rameshwar et al. Sec. III-D, Alg. 3, eqs. (7)-(9). D. Levy, Z. Sun, K. Amin, S. Kale, A.
    Kulesza, M. Mohri, A. T. Suresh. Learning with user-level privacy. NeurIPS 2021,
    arXiv:2102.11845, Algorithm 6 (the subroutine Alg. 3 adapts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import NoiseBits
from .exponential_mechanism import probabilities, sample_index_scaled

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

TAU_RESOLUTION = 1 << 16
"""tau is rounded to a multiple of 1 / TAU_RESOLUTION grid units (never to 0)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """The outcome of PrivateInterval.

    Attributes:
        center: the chosen bin centre x (grid units).
        lower: a = max(lo, x - 3 tau / 2).
        upper: b = min(x + 3 tau / 2, hi).
    """

    center: Fraction
    lower: Fraction
    upper: Fraction


def tau(value_range: Fraction, k_bar: int, m_ub: int, gamma: Fraction) -> Fraction:
    """Concentration radius of eq. (8), U sqrt(ln(2 K_bar / gamma) / (2 m_UB)), as a rational.

    Args:
        value_range: U = hi - lo, in grid units.
        k_bar: number of arrays (K_bar, or K under WrapAround), >= 1.
        m_ub: array capacity, >= 1.
        gamma: failure probability of the Hoeffding + union bound heuristic, in (0, 1).

    Returns:
        tau > 0, rounded to the nearest multiple of 2^-16 units (at least one such unit).
    """
    _validate.check_positive("value_range", value_range)
    _validate.check_int_ge("k_bar", k_bar, 1)
    _validate.check_int_ge("m_ub", m_ub, 1)
    _validate.check_probability("gamma", gamma)
    real = float(value_range) * math.sqrt(math.log(2 * k_bar / float(gamma)) / (2 * m_ub))
    return Fraction(max(1, round(real * TAU_RESOLUTION)), TAU_RESOLUTION)


def bin_count(lo: Fraction, hi: Fraction, radius: Fraction) -> int:
    """nb = ceil((hi - lo) / tau)."""
    return max(1, math.ceil((hi - lo) / radius))


def centers(lo: Fraction, hi: Fraction, radius: Fraction) -> list[Fraction]:
    """The candidate set T = {lo + (k - 1/2) tau : k = 1..nb}."""
    return [lo + (k - Fraction(1, 2)) * radius for k in range(1, bin_count(lo, hi, radius) + 1)]


def bin_of(value: Fraction, lo: Fraction, radius: Fraction, nb: int) -> int:
    """k = clamp(ceil((A - lo) / tau), 1, nb): the bin (1-based) holding ``value``."""
    # ceil(((p / q) - (r / s)) / (t / w)) = ceil((p s - r q) w / (q s t)), in integers.
    p, q = value.numerator, value.denominator
    r, s = lo.numerator, lo.denominator
    t, w = radius.numerator, radius.denominator
    k = -((-(p * s - r * q) * w) // (q * s * t))
    return min(max(k, 1), nb)


def scores(means: Sequence[Fraction], lo: Fraction, hi: Fraction, radius: Fraction) -> list[int]:
    """c(x) = max(#{i: mu_i < x}, #{i: mu_i > x}) for every candidate x (lower is better).

    mu_i < x_k exactly when mu_i's bin is below k, so c is computed on bin indices.
    """
    lo, radius = Fraction(lo), Fraction(radius)
    nb = bin_count(lo, hi, radius)
    per_bin = [0] * (nb + 2)
    for value in means:
        per_bin[
            bin_of(value if isinstance(value, Fraction) else Fraction(value), lo, radius, nb)
        ] += 1
    n = len(means)
    out, below = [], 0
    for k in range(1, nb + 1):
        above = n - below - per_bin[k]
        out.append(max(below, above))
        below += per_bin[k]
    return out


def exponents(score_values: Sequence[int], epsilon: Fraction, sensitivity: int) -> list[Fraction]:
    """gamma_x = epsilon c(x) / (4 s): the log-weight of candidate x, negated."""
    return [Fraction(epsilon) * c / (4 * sensitivity) for c in score_values]


def interval_probabilities(
    means: Sequence[Fraction],
    lo: Fraction,
    hi: Fraction,
    radius: Fraction,
    epsilon: Fraction,
    sensitivity: int = 1,
) -> list[float]:
    """P(x) for every candidate centre x, in floating point (tests, docs).

    Args:
        means: array means, grid units.
        lo: lower bound of the values.
        hi: upper bound of the values.
        radius: tau.
        epsilon: Levy's total budget (the choice spends epsilon / 2).
        sensitivity: s, 1 for BestFit and 2 for WrapAround.

    Returns:
        One probability per centre, in centre order.
    """
    gammas = exponents(scores(means, lo, hi, radius), epsilon, sensitivity)
    return probabilities([1] * len(gammas), gammas)


def bounds(center: Fraction, lo: Fraction, hi: Fraction, radius: Fraction) -> Interval:
    """[a, b] = [max(lo, x - 3 tau / 2), min(x + 3 tau / 2, hi)] around a chosen centre."""
    half = 3 * radius / 2
    return Interval(center=center, lower=max(lo, center - half), upper=min(center + half, hi))


def private_interval(
    means: Sequence[Fraction],
    lo: Fraction,
    hi: Fraction,
    radius: Fraction,
    epsilon: Fraction,
    sensitivity: int,
    bits: NoiseBits,
) -> Interval:
    """Algorithm 3: draw a centre by the exponential mechanism and return [a, b].

    Args:
        means: array means A_1..A_K_bar, grid units (clipped to [lo, hi] by the bins).
        lo: lower value bound (grid units).
        hi: upper value bound (grid units), > lo.
        radius: tau > 0 (eq. 8, public).
        epsilon: Levy's TOTAL budget; this choice spends epsilon / 2.
        sensitivity: s = 1 (BestFit) or 2 (WrapAround).
        bits: fair bits of this choice (its node identifies the cell).

    Returns:
        The Interval; 0 <= b - a <= min(3 tau, hi - lo).
    """
    c = scores(means, lo, hi, radius)
    eps = Fraction(epsilon)  # gamma_x = eps c(x) / (4 s) = a c(x) / (4 s b), eps = a / b
    k = sample_index_scaled(
        [1] * len(c), [eps.numerator * v for v in c], 4 * sensitivity * eps.denominator, bits
    )
    return bounds(lo + (k + Fraction(1, 2)) * radius, lo, hi, radius)
