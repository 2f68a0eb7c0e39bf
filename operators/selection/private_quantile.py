"""Private quantile of array means (Smith's exponential mechanism), Rameshwar et al. Sec. III-E.

The paper cites "Alg. 2 of [smith]" without a formula. We use the standard
continuous version: sort the values z_1..z_n clipped to [lo, hi], and draw a point of
interval I_i = [z_i, z_{i+1}] (z_0 = lo, z_{n+1} = hi) with weight
length(I_i) exp(-eps_q |i - q n| / (2 s)).

dpstream releases no continuous randomness, so the output ranges over a public grid:
the centres y_k = lo + (k + 1/2) h, k = 0..M-1, of the M = (hi - lo) / h cells of width h
(h = the value grid step unless configured). The score of a point y is
-|rank(y) - q n| with rank(y) = #{j : z_j < y}; all points of equal rank form a *rank
group* i of n_i = #{k : z_i < y_k <= z_{i+1}} points, the grid analogue of length(I_i)
(identical when the z_j lie on cell boundaries). A group is drawn with
probability proportional to n_i exp(-eps_q |i - q n| / (2 s)), then a point uniformly
inside it, both exactly (``exponential_mechanism``).

Privacy:
    For every fixed y, rank(y) moves by at most s when one user's values change (one array
    mean under BestFit, two under WrapAround), so the score has sensitivity s and the
    choice is eps_q-DP (exponential mechanism over the fixed public grid with counting
    base measure), for value neighbours with public counts (Rameshwar et al. Sec. II-D).

Quantile levels (Rameshwar et al. Sec. III-E, Prop. IV.2): FixedQuantile uses (1/10, 9/10);
OptimizedQuantile uses (t / K_bar, 1 - t / K_bar) with t = ceil(2 / epsilon), epsilon the
mechanism's total budget, ceil for both ends and each level clamped to 1/2 when t / K_bar >= 1/2
(our choices).

References:
    Rameshwar et al. Sec. III-E. A. Smith. Privacy-preserving statistical estimation with optimal
    convergence rates. STOC 2011 (the exponential-mechanism quantile). K. Amin, A. Kulesza,
    A. Munoz, S. Vassilvitskii. Bounding user contributions: a bias-variance trade-off in
    differential privacy. ICML 2019 (the ceil(2 / epsilon)-th order statistic).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from .. import _validate
from ..noise import NoiseBits, uniform_below
from .exponential_mechanism import probabilities, sample_index_scaled

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

FIXED_LEVELS = (Fraction(1, 10), Fraction(9, 10))
QUANTILE_RULES = ("fixed", "optimized")


def grid_size(lo: Fraction, hi: Fraction, step: Fraction) -> int:
    """M = (hi - lo) / h, which must be a positive integer."""
    cells = (Fraction(hi) - Fraction(lo)) / Fraction(step)
    if cells.denominator != 1 or cells < 1:
        raise _validate.invalid("quantile step", f"a divisor of hi - lo = {hi - lo}", step)
    return int(cells)


def points_at_or_below(value: Fraction, lo: Fraction, step: Fraction, cells: int) -> int:
    """#{k in [0, M) : lo + (k + 1/2) h <= value} = clamp(floor((value - lo) / h - 1/2) + 1)."""
    # floor((2 (value - lo) - h) / (2 h)) in integers: value = p / q, lo = r / s, h = t / w.
    p, q = value.numerator, value.denominator
    r, s = lo.numerator, lo.denominator
    t, w = step.numerator, step.denominator
    k = ((2 * (p * s - r * q)) * w - t * q * s) // (2 * t * q * s) + 1
    return min(max(k, 0), cells)


def rank_groups(
    values: Sequence[Fraction], lo: Fraction, hi: Fraction, step: Fraction
) -> tuple[list[int], list[int]]:
    """The rank groups of the grid: (first point index, size n_i) for i = 0..n.

    Args:
        values: the z_j (any order; clipped to [lo, hi]).
        lo: lower end of the domain.
        hi: upper end of the domain.
        step: grid step h.

    Returns:
        (starts, sizes), each of length n + 1; sizes sum to M.
    """
    cells = grid_size(lo, hi, step)
    lo, step = Fraction(lo), Fraction(step)
    # The count of points <= z is monotone in z: sorting the counts sorts the values.
    below = sorted(points_at_or_below(_fraction(v), lo, step, cells) for v in values)
    edges = [0, *below, cells]
    return edges[:-1], [edges[i + 1] - edges[i] for i in range(len(below) + 1)]


def _fraction(value: Fraction | int) -> Fraction:
    return value if isinstance(value, Fraction) else Fraction(value)


def exponents(n: int, level: Fraction, epsilon_q: Fraction, sensitivity: int) -> list[Fraction]:
    """gamma_i = eps_q |i - q n| / (2 s) for the groups i = 0..n."""
    target = Fraction(level) * n
    return [Fraction(epsilon_q) * abs(i - target) / (2 * sensitivity) for i in range(n + 1)]


def group_probabilities(
    values: Sequence[Fraction],
    level: Fraction,
    epsilon_q: Fraction,
    sensitivity: int,
    lo: Fraction,
    hi: Fraction,
    step: Fraction,
) -> list[float]:
    """P(rank group i) for i = 0..n, in floating point (tests, docs)."""
    _, sizes = rank_groups(values, lo, hi, step)
    return probabilities(sizes, exponents(len(values), level, epsilon_q, sensitivity))


def point_probabilities(
    values: Sequence[Fraction],
    level: Fraction,
    epsilon_q: Fraction,
    sensitivity: int,
    lo: Fraction,
    hi: Fraction,
    step: Fraction,
) -> list[float]:
    """P(y_k) for every grid point k = 0..M-1 (the output distribution, floating point)."""
    starts, sizes = rank_groups(values, lo, hi, step)
    groups = group_probabilities(values, level, epsilon_q, sensitivity, lo, hi, step)
    out = [0.0] * grid_size(lo, hi, step)
    for start, size, p in zip(starts, sizes, groups, strict=True):
        for k in range(start, start + size):
            out[k] = p / size
    return out


def private_quantile(
    values: Sequence[Fraction],
    level: Fraction,
    epsilon_q: Fraction,
    sensitivity: int,
    lo: Fraction,
    hi: Fraction,
    step: Fraction,
    bits: NoiseBits,
) -> Fraction:
    """An eps_q-DP estimate of the ``level``-quantile of ``values`` on the grid.

    Args:
        values: the z_j (array means, grid units).
        level: q in (0, 1).
        epsilon_q: budget of this one quantile.
        sensitivity: s = 1 (BestFit) or 2 (WrapAround).
        lo: lower end of the domain.
        hi: upper end of the domain, hi - lo a positive multiple of ``step``.
        step: output grid step h.
        bits: fair bits of this choice.

    Returns:
        A grid point lo + (k + 1/2) h.
    """
    starts, sizes = rank_groups(values, lo, hi, step)
    # gamma_i = eps_q |i - q n| / (2 s) = a |i d - c n| / (2 s b d), eps_q = a/b, q = c/d.
    eps_q, level, n = Fraction(epsilon_q), Fraction(level), len(values)
    a, b, c, d = eps_q.numerator, eps_q.denominator, level.numerator, level.denominator
    nums = [a * abs(i * d - c * n) for i in range(n + 1)]
    group = sample_index_scaled(sizes, nums, 2 * sensitivity * b * d, bits)
    k = starts[group] + uniform_below(sizes[group], bits)
    return lo + (k + Fraction(1, 2)) * step


def levels(rule: str, epsilon: Fraction, k_bar: int) -> tuple[Fraction, Fraction]:
    """The two quantile levels of FixedQuantile or OptimizedQuantile (Sec. III-E).

    Args:
        rule: "fixed" or "optimized".
        epsilon: the Quantile mechanism's TOTAL budget.
        k_bar: number of array means.

    Returns:
        (lower level, upper level).
    """
    if rule == "fixed":
        return FIXED_LEVELS
    if rule != "optimized":
        raise _validate.invalid("quantile", f"one of {QUANTILE_RULES}", rule)
    _validate.check_int_ge("k_bar", k_bar, 1)
    t = math.ceil(2 / Fraction(epsilon))
    low = min(Fraction(t, k_bar), Fraction(1, 2))
    return low, 1 - low
