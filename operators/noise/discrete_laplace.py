"""Exact discrete Laplace noise: node identities, the exact sampler, variances and the
Chernoff bound.

Every noisy value a pure-DP statistic releases is ``exact + Z`` with Z discrete Laplace
(two-sided geometric), P(Z = z) proportional to exp(-|z| / b) over the integers. The
sampler uses only integer and Fraction arithmetic driven by a uniform-integer source,
so its output distribution is exactly the one the privacy proof assumes: no
floating-point Laplace, whose rounding artefacts leak the exact value (Mironov 2012).
The sources that draw it for a node (keyed in production) are in ``sources``.

References:
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010. Algorithms 1 and 2.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction

from .._validate import check_positive, check_probability
from ..errors import InvalidOperatorConfig

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

NodeId = tuple[str | int, ...]
"""Public identity of a node, e.g. ("events", 0, 3, 1, 2) = (statistic, instance,
period, level, index)."""

RandBelow = Callable[[int], int]
"""``rand_below(n)`` returns a uniform integer in [0, n)."""

_ONE = Fraction(1)


# ---------------------------------------------------------------------------------------
# Node identities


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(8, "big") + payload


def _int_bytes(value: int) -> bytes:
    return value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True)


def node_bytes(node: NodeId) -> bytes:
    """Canonical, unambiguous encoding of a node identity.

    Each field is a type tag, an 8-byte length and the payload, so that no two distinct
    nodes share an encoding: ("a1",) != ("a", 1) and ("1",) != (1,).

    Example:
        >>> node_bytes(("a1",)) == node_bytes(("a", 1))
        False
        >>> node_bytes(("1",)) == node_bytes((1,))
        False
        >>> node_bytes(("clicks", 3)) == node_bytes(("clicks", 3))
        True

    Args:
        node: tuple of str and int fields.

    Returns:
        The encoding.

    Raises:
        InvalidOperatorConfig: ``node`` is not a tuple of str and int (bool excluded,
            since True == 1 would otherwise alias two different-looking nodes).
    """
    if not isinstance(node, tuple):
        raise InvalidOperatorConfig(f"node must be a tuple, got {node!r}")
    parts = []
    for value in node:
        if isinstance(value, str):
            parts.append(_field(b"s", value.encode("utf-8")))
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(_field(b"i", _int_bytes(value)))
        else:
            raise InvalidOperatorConfig(f"node fields must be str or int, got {value!r}")
    return b"".join(parts)


# ---------------------------------------------------------------------------------------
# Exact sampler


def _check_scale(scale: Fraction) -> Fraction:
    if isinstance(scale, float):
        # Fraction(0.1) is the binary double, not 1/10: convert config values explicitly.
        raise InvalidOperatorConfig(
            f"scale must be a Fraction (see _validate.exact_fraction), got {scale!r}"
        )
    if isinstance(scale, bool) or not isinstance(scale, (int, Fraction)):
        raise InvalidOperatorConfig(f"scale must be a Fraction, got {scale!r}")
    check_positive("scale", scale)
    return Fraction(scale)


def _bernoulli(num: int, den: int, rand_below: RandBelow) -> bool:
    """Bernoulli(num / den) for integers 0 <= num <= den, den > 0."""
    return rand_below(den) < num


def _bernoulli_exp(gamma: Fraction, rand_below: RandBelow) -> bool:
    """Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS 2020, Algorithm 1).

    Args:
        gamma: the exponent, a non-negative Fraction.
        rand_below: uniform integer source.

    Returns:
        True with probability exactly exp(-gamma).
    """
    if gamma <= 1:
        num, den = gamma.numerator, gamma.denominator
        # P(K > k) = gamma^k / k!, so P(K odd) is the alternating series of exp(-gamma).
        k = 1
        while _bernoulli(num, den * k, rand_below):
            k += 1
        return k % 2 == 1
    # exp(-gamma) = exp(-1)^floor(gamma) * exp(-frac(gamma)); the series above needs gamma <= 1.
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _bernoulli_exp(_ONE, rand_below):
            return False
    return _bernoulli_exp(gamma - whole, rand_below)


def sample_discrete_laplace(scale: Fraction, rand_below: RandBelow) -> int:
    """One exact draw of discrete Laplace noise (CKS 2020, Algorithm 2).

    Args:
        scale: b > 0; the draw Z has P(Z = z) proportional to exp(-|z| / b).
        rand_below: uniform integer source, ``rand_below(n)`` in [0, n).

    Returns:
        The integer Z.

    Raises:
        InvalidOperatorConfig: ``scale`` is not a positive Fraction (or int).
    """
    scale = _check_scale(scale)
    t, s = scale.numerator, scale.denominator
    while True:
        # U + t*V is geometric with ratio exp(-1/t): U its remainder mod t, V its quotient.
        u = rand_below(t)
        if not _bernoulli_exp(Fraction(u, t), rand_below):
            continue
        v = 0
        while _bernoulli_exp(_ONE, rand_below):
            v += 1
        y = (u + t * v) // s
        negative = _bernoulli(1, 2, rand_below)
        if negative and y == 0:
            # Otherwise zero would get both signs' mass.
            continue
        return -y if negative else y


def discrete_laplace_variance(scale: Fraction | float) -> float:
    """Exact variance 2p / (1 - p)^2, p = exp(-1/b), of discrete Laplace with scale b.

    It is below the continuous 2b^2 (by about 1/6 for large b, far more for small b).

    Args:
        scale: b > 0.

    Returns:
        The variance.
    """
    check_positive("scale", scale)
    inv = 1 / float(scale)
    p = math.exp(-inv)
    one_minus_p = -math.expm1(-inv)
    return 2 * p / one_minus_p**2


def laplace_variance(scale: Fraction | float) -> float:
    """Variance 2b^2 of the continuous Laplace distribution, the one papers quote.

    Args:
        scale: b > 0.

    Returns:
        The variance.
    """
    check_positive("scale", scale)
    return 2 * float(scale) ** 2


# ---------------------------------------------------------------------------------------
# Error bars


def chernoff_interval(scales: Sequence[Fraction], alpha: float = 0.05) -> float:
    """Half-width h with P(|Z| > h) <= alpha for Z a sum of independent discrete Laplace.

    A guaranteed bound, not a normal approximation: the Chernoff bound
    P(|Z| >= h) <= 2 exp(-lambda h) E[exp(lambda Z)] with the exact moment generating
    function of each two-sided geometric, optimised over lambda. It depends on the
    public scales only.

    Args:
        scales: the scales b_i of the summed noises, each > 0 (order is irrelevant).
        alpha: allowed miss probability in (0, 1).

    Returns:
        h, or 0.0 for no scales.

    Raises:
        InvalidOperatorConfig: a scale or ``alpha`` is out of range.
    """
    check_probability("alpha", alpha)
    multiset = tuple(sorted(_check_scale(b) for b in scales))
    return _chernoff_half_width(multiset, float(alpha))


@functools.lru_cache(maxsize=1024)
def _chernoff_half_width(scales: tuple[Fraction, ...], alpha: float) -> float:
    if not scales:
        return 0.0
    # rate a = 1/b = -ln p; the MGF exists for lambda < min a.
    rates = [(1 / float(b), count) for b, count in Counter(scales).items()]
    log_2_over_alpha = math.log(2 / alpha)
    lam_max = min(a for a, _ in rates)

    def log_mgf(lam: float) -> float:
        # ln[(1-p)^2 / ((1-p e^lam)(1-p e^-lam))] through expm1 to avoid cancellation.
        return sum(
            count
            * (
                2 * math.log(-math.expm1(-a))
                - math.log(-math.expm1(lam - a))
                - math.log(-math.expm1(-lam - a))
            )
            for a, count in rates
        )

    def d_log_mgf(lam: float) -> float:
        return sum(
            count * (1 / math.expm1(a - lam) - 1 / math.expm1(a + lam)) for a, count in rates
        )

    def bound(lam: float) -> float:
        # The smallest h with 2 exp(-lam h + K(lam)) <= alpha, valid for EVERY lam.
        return (log_mgf(lam) + log_2_over_alpha) / lam

    # bound() is unimodal: its derivative has the sign of lam K'(lam) - K(lam) - ln(2/alpha),
    # which increases from -ln(2/alpha) at 0 to +inf at lam_max. Bisect on that sign.
    lo, hi = 0.0, lam_max
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid * d_log_mgf(mid) - log_mgf(mid) < log_2_over_alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * hi:
            break
    # Any lam gives a valid bound, so bisection error only costs tightness (second order);
    # the factor covers floating-point rounding so the returned h never undercuts the bound.
    return bound((lo + hi) / 2) * (1 + 1e-9)
