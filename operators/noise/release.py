"""What every continual counter releases at a step, built from its noisy nodes.

A release is ``exact + sum(sign_i * noise(node_i, scale_i))``: the exact (truncated)
running value plus the keyed noise of the public set of nodes the mechanism uses at that
step. Its std and interval depend on the scales only, never on the data: the interval is
the exact 95% quantile of that sum of discrete Laplace noises (``exact_quantile``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .discrete_laplace import NodeId, discrete_laplace_variance
from .exact_quantile import exact_half_width
from .sources import NoiseSource

# (node identity, discrete Laplace scale, sign +1 or -1)
Term = tuple[NodeId, Fraction, int]


@dataclass(frozen=True, slots=True)
class TreeRelease:
    """The private value at step ``t`` and its error bar (public parameters only).

    Attributes:
        t: the step (1-based) this release is for.
        value: exact value plus noise.
        std: exact standard deviation of the noise.
        ci95: the least integer h with P(|noise| > h) <= 0.05, from the noise's exact
            distribution (guaranteed coverage, ``exact_quantile``).
    """

    t: int
    value: int
    std: float
    ci95: float


def noise_std(terms: Sequence[Term]) -> float:
    """Exact std of the noise of a release made of ``terms`` (signs do not matter)."""
    return _error_bar(tuple(sorted(scale for _, scale, _ in terms)))[0]


@functools.lru_cache(maxsize=4096)
def _error_bar(scales: tuple[Fraction, ...]) -> tuple[float, float]:
    # Releases repeat the same few multisets of scales, step after step.
    std = sum(discrete_laplace_variance(scale) for scale in scales) ** 0.5
    return std, exact_half_width(scales, 0.05)


def noisy_release(t: int, exact: int, terms: Sequence[Term], noise: NoiseSource) -> TreeRelease:
    """Add each term's keyed noise to ``exact``; the same terms give the same noise."""
    value = exact + sum(sign * noise.discrete_laplace(node, scale) for node, scale, sign in terms)
    # A two-sided geometric is symmetric: a minus sign leaves the interval unchanged.
    std, ci95 = _error_bar(tuple(sorted(scale for _, scale, _ in terms)))
    return TreeRelease(t=t, value=value, std=std, ci95=ci95)


def interval(value: float, half_width: float) -> list[float]:
    """The released interval ``[value - h, value + h]`` of an error bar's half-width ``h``."""
    return [value - half_width, value + half_width]


def ratio_bounds(num: float, den: float, h_num: float, h_den: float) -> tuple[float, float] | None:
    """The range (min, max) of s / c over the box s in [num - h_num, num + h_num],
    c in [den - h_den, den + h_den]; None when the box reaches c < 1.

    For c >= 1 the ratio is monotone in s and in c, so its extremes are at the corners. If
    the exact numerator and denominator lie in the box (e.g. both noises inside their
    97.5% quantiles), their exact ratio lies in the range.

    Example:
        >>> ratio_bounds(10, 5, 2, 1)
        (1.3333333333333333, 3.0)
        >>> ratio_bounds(10, 1.5, 2, 1) is None
        True
    """
    low = den - h_den
    if low < 1:
        return None
    corners = [s / c for s in (num - h_num, num + h_num) for c in (low, den + h_den)]
    return min(corners), max(corners)
