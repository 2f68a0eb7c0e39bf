"""Exact discrete Gaussian noise: N_Z(c, sigma^2), P(X = x) proportional to
exp(-(x - c)^2 / (2 sigma^2)) over the integers.

The sampler is Canonne-Kamath-Steinke's Algorithm 3: propose Y from the discrete Laplace
of scale t = floor(sigma) + 1 (their Algorithm 2, ``sample_discrete_laplace``) and accept
it with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)) (their Algorithm 1,
``bernoulli_exp``). Everything is integer and Fraction arithmetic driven by a uniform
integer source, so the output distribution is exactly the discrete Gaussian: no
floating-point Gaussian (Mironov 2012's attack applies to it as to the Laplace).

**A rational centre** (our extension, for a streaming factorization whose next noise is
centred on what the previous ones predict, ``trees/sqrt_factorization``): with
c = a + f, a the integer nearest c and |f| <= 1/2, X = a + Y where Y has
P(Y = y) proportional to exp(-(y - f)^2 / (2 sigma^2)). With the same proposal, accept
with probability exp(-gamma),

    gamma = (y - f)^2 / (2 sigma^2) - |y| / t + sigma^2 / (2 t^2) + |f| / t,

which is >= 0 because (y - f)^2 / (2 sigma^2) >= |y - f| / t - sigma^2 / (2 t^2) and
|y - f| + |f| >= |y|; the accepted Y then has P(y) proportional to
exp(-|y|/t) exp(-gamma(y)), i.e. to exp(-(y - f)^2 / (2 sigma^2)). For f = 0, gamma is
Algorithm 3's (|y| - sigma^2/t)^2 / (2 sigma^2). The acceptance rate falls by at most
exp(-1/(2t)) against f = 0.

References:
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010. Algorithms 1-3, Theorem 14 (privacy), Corollary 13.
    I. Mironov. On significance of the least significant bits for differential privacy.
    CCS 2012.
"""

from __future__ import annotations

import math
from fractions import Fraction

from ..errors import InvalidOperatorConfig
from .discrete_laplace import RandBelow, _bernoulli_exp, sample_discrete_laplace

VERSION = 1  # of the sampler: a statistic's identity names it (its draws are its noise)


def check_gaussian(sigma2: Fraction, center: Fraction) -> tuple[Fraction, Fraction]:
    """Validate a discrete Gaussian's variance parameter and centre, as exact rationals.

    Args:
        sigma2: sigma^2 > 0, a Fraction or int (a float is refused: Fraction(0.1) is the
            binary double, not 1/10).
        center: c, a Fraction or int.

    Returns:
        (sigma2, center) as Fractions.

    Raises:
        InvalidOperatorConfig: either is not an exact rational, or sigma2 <= 0.
    """
    for name, value in (("sigma2", sigma2), ("center", center)):
        if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
            raise InvalidOperatorConfig(f"{name} must be a Fraction, got {value!r}")
    if sigma2 <= 0:
        raise InvalidOperatorConfig(f"sigma2 must be finite and > 0, got {sigma2!r}")
    return Fraction(sigma2), Fraction(center)


def sample_discrete_gaussian(
    sigma2: Fraction, rand_below: RandBelow, center: Fraction = Fraction(0)
) -> int:
    """One exact draw of N_Z(center, sigma2) (CKS 2020 Algorithm 3; module docstring).

    Args:
        sigma2: sigma^2 > 0, exact.
        rand_below: uniform integer source, ``rand_below(n)`` in [0, n).
        center: c, exact (default 0).

    Returns:
        The integer X.

    Raises:
        InvalidOperatorConfig: ``sigma2`` or ``center`` is not an exact rational, or
            sigma2 <= 0.
    """
    sigma2, center = check_gaussian(sigma2, center)
    shift = math.floor(center + Fraction(1, 2))
    offset = center - shift  # in [-1/2, 1/2)
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1  # floor(sigma) + 1
    bound = sigma2 / (2 * t * t) + abs(offset) / t
    while True:
        y = sample_discrete_laplace(Fraction(t), rand_below)
        gamma = (y - offset) ** 2 / (2 * sigma2) - Fraction(abs(y), t) + bound
        if _bernoulli_exp(gamma, rand_below):
            return shift + y
