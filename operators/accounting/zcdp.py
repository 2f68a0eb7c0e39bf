"""Zero-concentrated differential privacy (rho-zCDP): the Gaussian mechanism's rho, its
composition, and what a rho implies in (epsilon, delta)-DP.

A mechanism M is rho-zCDP when D_alpha(M(x) || M(x')) <= rho alpha for every alpha > 1
and neighbours x, x' (D_alpha the Renyi divergence; Bun-Steinke 2016 Def. 1.1). The
Gaussian mechanism, continuous or discrete, adding N(0, sigma^2) or N_Z(0, sigma^2) to a
query of L2 sensitivity Delta is Delta^2 / (2 sigma^2)-zCDP (Bun-Steinke Prop. 1.6;
Canonne-Kamath-Steinke 2020 Thm. 14 for the discrete one and integer-valued queries), and
the rhos of a composition add up, adaptively too (Bun-Steinke Lemma 1.7).

Exact rationals where the quantity is rational (rho, sigma^2, compositions); the
conversions to (epsilon, delta) involve logarithms and are floats rounded toward privacy:
a returned epsilon or delta is never below the true bound's value.

References:
    M. Bun, T. Steinke. Concentrated Differential Privacy: Simplifications, Extensions,
    and Lower Bounds. TCC 2016, arXiv:1605.02065. Def. 1.1, Prop. 1.3, Prop. 1.6,
    Lemma 1.7.
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010. Thm. 14, Prop. 12 and Cor. 13 (the tighter conversion).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from .. import _validate

# Relative margin on float results that must not undercut the bound they compute.
_OUTWARD = 1 + 1e-12


def gaussian_rho(sensitivity: Fraction | int, sigma2: Fraction | int) -> Fraction:
    """rho = Delta^2 / (2 sigma^2) of the Gaussian mechanism (Bun-Steinke Prop. 1.6).

    Args:
        sensitivity: Delta > 0, the query's L2 sensitivity (exact).
        sigma2: sigma^2 > 0, the noise's variance parameter (exact).

    Returns:
        The exact rho.

    Raises:
        InvalidOperatorConfig: a parameter is not a positive exact rational.

    Example:
        >>> gaussian_rho(2, 8)
        Fraction(1, 4)
    """
    delta = _exact_positive("sensitivity", sensitivity)
    variance = _exact_positive("sigma2", sigma2)
    return delta * delta / (2 * variance)


def gaussian_sigma2(sensitivity: Fraction | int, rho: Fraction | int) -> Fraction:
    """The sigma^2 = Delta^2 / (2 rho) at which the Gaussian mechanism is exactly rho-zCDP.

    Args:
        sensitivity: Delta > 0 (exact).
        rho: rho > 0 (exact).

    Returns:
        The exact sigma^2.

    Raises:
        InvalidOperatorConfig: a parameter is not a positive exact rational.
    """
    delta = _exact_positive("sensitivity", sensitivity)
    return delta * delta / (2 * _exact_positive("rho", rho))


def compose(rhos: Iterable[Fraction | int]) -> Fraction:
    """rho of the composition: the sum (Bun-Steinke Lemma 1.7, adaptive composition).

    Args:
        rhos: each >= 0, exact.

    Returns:
        The exact sum.

    Raises:
        InvalidOperatorConfig: a rho is negative or not an exact rational.
    """
    total = Fraction(0)
    for rho in rhos:
        if isinstance(rho, bool) or not isinstance(rho, (int, Fraction)) or rho < 0:
            raise _validate.invalid("rho", "an exact rational >= 0", rho)
        total += rho
    return total


def epsilon_bun_steinke(rho: Fraction | float, delta: float) -> float:
    """epsilon = rho + 2 sqrt(rho ln(1/delta)): rho-zCDP implies (epsilon, delta)-DP
    (Bun-Steinke Prop. 1.3).

    Args:
        rho: rho >= 0.
        delta: delta in (0, 1).

    Returns:
        epsilon, rounded up.

    Example:
        >>> round(epsilon_bun_steinke(Fraction(1, 2), 1e-6), 4)
        5.7565
    """
    r = _check_rho(rho)
    _validate.check_probability("delta", delta)
    return (r + 2 * math.sqrt(r * math.log(1 / delta))) * _OUTWARD


def delta_cks(rho: Fraction | float, epsilon: float) -> float:
    """The delta with which rho-zCDP implies (epsilon, delta)-DP, by Canonne-Kamath-Steinke
    2020 Cor. 13: delta = inf over alpha > 1 of exp((alpha - 1)(alpha rho - epsilon)) /
    (alpha - 1) * (1 - 1/alpha)^alpha.

    The exponent is convex in alpha (its derivative, (2 alpha - 1) rho - epsilon +
    ln(1 - 1/alpha), increases), so we bisect on the derivative's sign; every alpha gives a
    valid bound, so an imprecise minimum costs only tightness, never validity.

    Args:
        rho: rho >= 0.
        epsilon: epsilon >= 0.

    Returns:
        delta in [0, 1], rounded up.
    """
    r = _check_rho(rho)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, Fraction)):
        raise _validate.invalid("epsilon", "a number", epsilon)
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps >= 0):
        raise _validate.invalid("epsilon", "finite and >= 0", epsilon)
    if r == 0:
        return 0.0
    low, high = 1.0, (eps + 1) / (2 * r) + 2
    for _ in range(200):
        alpha = (low + high) / 2
        if (2 * alpha - 1) * r - eps + math.log1p(-1 / alpha) < 0:
            low = alpha
        else:
            high = alpha
    alpha = high
    exponent = (alpha - 1) * (alpha * r - eps) + alpha * math.log1p(-1 / alpha)
    return min(1.0, math.exp(exponent) / (alpha - 1) * _OUTWARD)


def epsilon_cks(rho: Fraction | float, delta: float) -> float:
    """The least epsilon with ``delta_cks(rho, epsilon) <= delta``: what rho-zCDP implies
    in (epsilon, delta)-DP by Canonne-Kamath-Steinke 2020 Cor. 13, never above
    ``epsilon_bun_steinke`` (their bound is the tighter one).

    Args:
        rho: rho >= 0.
        delta: delta in (0, 1).

    Returns:
        epsilon: the upper end of a bisection that keeps delta_cks(rho, epsilon) <= delta,
        so (epsilon, delta)-DP holds.
    """
    r = _check_rho(rho)
    _validate.check_probability("delta", delta)
    if r == 0:
        return 0.0
    low, high = 0.0, epsilon_bun_steinke(rho, delta)
    if delta_cks(r, high) > delta:  # cannot happen: Cor. 13 is tighter than Prop. 1.3
        return high
    for _ in range(200):
        mid = (low + high) / 2
        if delta_cks(r, mid) <= delta:
            high = mid
        else:
            low = mid
        if high - low <= 1e-12 * high:
            break
    return high


def rho_cks(epsilon: float, delta: float) -> float:
    """The largest rho whose rho-zCDP implies (epsilon, delta)-DP by Canonne-Kamath-
    Steinke's conversion: what an (epsilon, delta) target allows a Gaussian mechanism.

    Args:
        epsilon: epsilon > 0.
        delta: delta in (0, 1).

    Returns:
        rho, the lower end of a bisection that keeps delta_cks(rho, epsilon) <= delta
        (rounded down: spending it keeps the target).
    """
    _validate.check_positive("epsilon", epsilon)
    _validate.check_probability("delta", delta)
    low, high = 0.0, float(epsilon) + 1
    for _ in range(200):
        mid = (low + high) / 2
        if delta_cks(mid, epsilon) <= delta:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return low


def _exact_positive(name: str, value: Fraction | int) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise _validate.invalid(name, "an exact rational (int or Fraction)", value)
    _validate.check_positive(name, value)
    return Fraction(value)


def _check_rho(rho: Fraction | float) -> float:
    if isinstance(rho, bool) or not isinstance(rho, (int, float, Fraction)):
        raise _validate.invalid("rho", "a number", rho)
    if not (math.isfinite(rho) and rho >= 0):
        raise _validate.invalid("rho", "finite and >= 0", rho)
    return float(rho)
