"""Real values on a public grid, so real-valued statistics use integer mechanisms.

Floating-point Laplace noise leaks through the bit patterns of its outputs (Mironov
2012). dpstream never adds floating noise: a real value ``x`` is mapped EXACTLY (its
binary double read as a rational, no rounding error) to the integer number of grid units
``floor(x / g + 1/2)`` for a public grid step ``g``, the mechanism runs on those integers
with exact discrete Laplace noise, and the release is ``units * g`` (post-processing).

Sensitivity: if a neighbour changes the summed value by at most ``delta``, the unit
count changes by at most ``ceil(delta / g)``: for reals u, v the integers floor(u) and
floor(v) differ by less than |u - v| + 1, hence by at most ceil(|u - v|). Rounding each
item separately adds at most 1/2 unit of error per item, which is data error, not noise.

References:
    I. Mironov. On significance of the least significant bits for differential privacy.
    CCS 2012. C. Canonne, G. Kamath, T. Steinke. The discrete Gaussian for differential
    privacy. NeurIPS 2020 (exact discrete Laplace sampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1


@dataclass(frozen=True, slots=True)
class Grid:
    """Attributes: step, the public grid spacing g > 0 (an exact rational)."""

    step: Fraction


def make_grid(step: float | int | str | Fraction) -> Grid:
    g = _validate.exact_fraction("grid step", step)
    _validate.check_positive("grid step", g)
    return Grid(step=g)


def to_units(grid: Grid, value: float) -> int:
    """The nearest grid point to ``value``, in units (ties upward), computed exactly."""
    if not math.isfinite(value):
        raise ValueError("value must be finite")  # validated upstream; a programming error
    return math.floor(Fraction(value) / grid.step + Fraction(1, 2))


def unit_sensitivity(grid: Grid, delta: float | int | str | Fraction) -> int:
    """ceil(delta / g): the L1 change in units when the summed value changes by delta."""
    d = _validate.exact_fraction("sensitivity", delta)
    _validate.check_positive("sensitivity", d)
    return math.ceil(d / grid.step)


def from_units(grid: Grid, units: int) -> float:
    """A released unit count back in value units (post-processing of a private value)."""
    return float(units * grid.step)


def clip_to_grid(
    lower: Fraction, upper: Fraction, resolution: int, x: float | int | Fraction
) -> tuple[int, bool]:
    """(q, clipped): ``x`` clipped to [lower, upper] and snapped to the grid of
    ``resolution`` units over that range, q = floor((x - lower) / (upper - lower) * R + 1/2)
    in {0, ..., R}; ``clipped`` says whether x lay outside [lower, upper].

    Exact: the binary double is read as a rational, so the same x always gives the same q
    (no floating-point rounding that could differ between runs or machines). NaN counts
    as clipped to ``lower``.

    Example:
        >>> clip_to_grid(Fraction(0), Fraction(100), 4, 40.0)
        (2, False)
        >>> clip_to_grid(Fraction(0), Fraction(100), 4, 37.4)
        (1, False)
        >>> clip_to_grid(Fraction(0), Fraction(100), 4, 250.0)
        (4, True)
    """
    if x == lower:
        return 0, False
    if x == upper:
        return resolution, False
    if isinstance(x, float) and not math.isfinite(x):
        return (resolution, True) if x == math.inf else (0, True)
    value = Fraction(x)
    if value < lower:
        return 0, True
    if value > upper:
        return resolution, True
    y = (value - lower) / (upper - lower)
    return math.floor(y * resolution + Fraction(1, 2)), False
