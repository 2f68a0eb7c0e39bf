"""Exact error bars: the quantile of a sum of independent discrete Laplace noises.

A release adds the noise Z = sum_i s_i Z_i of a public set of nodes, Z_i discrete Laplace
with scale b_i and s_i = +1 or -1 (signs do not matter: each Z_i is symmetric). Its 95%
interval is ``value +- h`` with h the smallest integer such that P(|Z| <= h) >= 0.95, read
off the exact distribution of Z: guaranteed coverage, and no more than the integer
lattice forces (the coverage of h is below 0.95 + P(|Z| = h)).

**How.** Z is integer-valued with characteristic function

    Phi(theta) = prod_i phi_i(theta),  phi_i(theta) = 1 / (1 + sin^2(theta/2) / sinh^2(1/(2 b_i))),

so P(|Z| <= h) = (1/2pi) int_{-pi}^{pi} Phi(theta) D_h(theta) d theta with the Dirichlet
kernel D_h(theta) = sin((2h+1) theta/2) / sin(theta/2). The trapezoid rule with N points
computes this integral for Z mod N exactly, i.e. P(|Z| <= h) plus the mass that wraps
around, which is at most P(|Z| > L) when N >= 2L + 2 and h <= L. We take L from the
Chernoff bound (``chernoff_interval``) at miss probability ``TAIL``, so the wrap-around
costs at most TAIL. Phi decays fast in theta when the sum has several nodes, so the sum
over the N points is cut at the point J past which the rest is provably below ``TAIL``
(Phi is decreasing on [0, pi], |D_h| <= 1/sin(theta/2) <= pi/theta, and a monotone
Riemann sum is below its integral): the work is O(J) per evaluated h whatever the scales,
and J grows with the ratio of the scales, not with the scales themselves. One node has a
closed form, P(|Z| > h) = 2 p^(h+1) / (1 + p), p = exp(-1/b).

**Guarantee.** The bisection over h accepts an h only when the computed coverage, minus
2 TAIL (wrap-around and cut) and minus a floating-point allowance, is >= 1 - alpha, so
the returned h covers at least 1 - alpha. The allowance bounds the rounding of the
J-term sum: each term is computed with a relative error below (64 + 64 n) units of 2^-53
(n factors of Phi, a sine, a division; the angle is reduced modulo 2 pi exactly, in
integers), the terms' absolute values add up to at most 2 + ln(J + 1), and summing J + 1
of them adds at most J + 1 more units; we charge 4 times that (units of 2^-50): below
1e-8 at the largest J we accept, about 1e-11 for the trees' structures. With TAIL = 1e-10
the returned h is also the least one to within 1e-9 of coverage. Structures we cannot
evaluate in bounded time (a sum dominated by one huge scale next to tiny ones, where J
would exceed ``MAX_TERMS``; or scales so large that the exact angle reduction would
overflow int64) fall back to the Chernoff bound, which is guaranteed too.

References:
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010 (the discrete Laplace and its characteristic function).
    The quadrature and its error bounds are ours (docs/design.md, section 5).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from .._validate import check_probability
from .discrete_laplace import _check_scale, chernoff_interval

TAIL = 1e-10
"""Bound on the wrapped-around mass, and on the cut tail of the quadrature, each."""

MAX_TERMS = 1 << 18
"""Largest quadrature length J + 1 evaluated; beyond it the Chernoff bound is returned."""

TINY_SCALE = Fraction(1, 40)
"""Nodes at or below this scale are counted as misses instead of being convolved."""

_UNIT = 2.0**-50
_INT64_LIMIT = 1 << 62


def exact_half_width(scales: Sequence[Fraction], alpha: float = 0.05) -> float:
    """The smallest integer h with P(|Z| > h) <= alpha, Z the sum of the discrete Laplace
    noises of ``scales`` (independent, any signs), from Z's exact distribution.

    Args:
        scales: the scales b_i of the summed noises, each > 0 (order is irrelevant).
        alpha: allowed miss probability in (0, 1).

    Returns:
        h as a float, or 0.0 for no scales. Guaranteed: P(|Z| > h) <= alpha.

    Raises:
        InvalidOperatorConfig: a scale or ``alpha`` is out of range.

    Example:
        >>> from fractions import Fraction
        >>> exact_half_width([Fraction(1)])  # 1 - 2 e^-(h+1) / (1 + e^-1) >= 0.95 at h = 3
        3.0
        >>> exact_half_width([Fraction(3)] * 5)  # the Chernoff bound says 29.5
        19.0
    """
    check_probability("alpha", alpha)
    multiset = tuple(sorted(_check_scale(b) for b in scales))
    return _half_width(multiset, float(alpha))


@functools.lru_cache(maxsize=4096)
def _half_width(scales: tuple[Fraction, ...], alpha: float) -> float:
    # Releases repeat the same few multisets of scales, step after step.
    # A node of scale <= TINY_SCALE is nonzero with probability 2p/(1+p) < 2 exp(-1/b) <
    # 1e-17: counting that as a miss keeps the guarantee (and the Chernoff bound's moment
    # generating function, which overflows for such scales, out of it).
    tiny_miss = sum(2 * math.exp(-1 / float(b)) for b in scales if b <= TINY_SCALE) * (1 + 1e-9)
    if tiny_miss < alpha / 2:
        scales = tuple(b for b in scales if b > TINY_SCALE)
        alpha -= tiny_miss
    if not scales:
        return 0.0
    if len(scales) == 1:
        return float(_one_node(scales[0], alpha))
    counts = Counter(scales)
    limit = math.ceil(chernoff_interval(scales, TAIL))  # P(|Z| > limit) <= TAIL
    # N: Z mod N lands in [-h, h] (h <= limit) from outside it only when |Z| > limit.
    size = 2 * limit + 2
    terms = _quadrature_terms(counts, size)
    if terms is None or (2 * limit + 1) * (len(terms[0]) - 1) >= _INT64_LIMIT:
        return chernoff_interval(scales, alpha)
    weights, inv_sin, index = terms
    slack = 2 * TAIL + _UNIT * (2 + math.log(len(index))) * (len(index) + 64 + 64 * len(scales))

    def covered(h: int) -> bool:
        if h < 0:
            return False
        # (2h+1) theta_j / 2 = pi ((2h+1) j mod 2N) / N, reduced exactly in integers.
        turns = (index * (2 * h + 1)) % (2 * size)
        kernel = np.sin(np.pi * (turns / size)) * inv_sin
        kernel[0] = 2 * h + 1
        return float(np.dot(weights, kernel)) - slack >= 1 - alpha

    low, high = -1, limit
    if not covered(high):  # cannot happen above the float allowance; stay guaranteed
        return chernoff_interval(scales, alpha)
    while high - low > 1:
        mid = (low + high) // 2
        if covered(mid):
            high = mid
        else:
            low = mid
    return float(high)


def _one_node(scale: Fraction, alpha: float) -> int:
    """Smallest h >= 0 with 2 p^(h+1) / (1 + p) <= alpha, p = exp(-1/b): h + 1 >= b ln(2 /
    (alpha (1 + p))). The relative margin covers the float rounding of the logarithms."""
    b = float(scale)
    p = math.exp(-1 / b)
    need = b * math.log(2 / (alpha * (1 + p))) * (1 + 1e-12)
    return max(0, math.ceil(need) - 1)


def _quadrature_terms(
    counts: Counter[Fraction], size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The trapezoid weights times Phi, 1 / sin(theta_j / 2), and j, for j = 0..J, where
    the terms past J add up to at most TAIL; None when J would exceed MAX_TERMS."""
    half = size // 2  # size is even: theta = pi is the point j = N / 2
    cut = _cut(counts, size)
    last = half if cut is None else min(half, cut)
    if last + 1 > MAX_TERMS:
        return None
    index = np.arange(last + 1, dtype=np.int64)
    theta_half = np.pi * (index / size)  # theta_j / 2
    sin_half = np.sin(theta_half)
    sin2 = sin_half * sin_half
    log_phi = np.zeros(last + 1)
    for scale, count in counts.items():
        inv_s2 = _inv_sinh2(scale)
        log_phi -= count * np.log1p(sin2 * inv_s2)
    phi = np.exp(log_phi)
    weights = np.full(last + 1, 2.0 / size) * phi
    weights[0] = phi[0] / size
    if last == half:
        weights[-1] = phi[-1] / size
    inv_sin = np.zeros(last + 1)
    inv_sin[1:] = 1 / sin_half[1:]
    return weights, inv_sin, index


def _inv_sinh2(scale: Fraction) -> float:
    """1 / sinh(1/(2b))^2; 0.0 when sinh overflows (a scale so small the node is 0)."""
    x = 1 / (2 * float(scale))
    if x > 700:
        return 0.0
    return 1 / math.sinh(x) ** 2


def _cut(counts: Counter[Fraction], size: int) -> int | None:
    """The smallest J such that the quadrature terms past J add up to at most TAIL, or None
    when no cut helps. With K the k nodes of the largest scales, phi_i <= s_i^2 /
    sin^2(theta/2) (s_i = sinh(1/(2b_i))) for i in K and <= 1 otherwise, so the tail is at
    most prod_K s_i^2 pi^(2k) / (2k theta_J^(2k)); the best k gives the smallest theta_J."""
    log_s = sorted(
        math.log(math.sinh(1 / (2 * float(b)))) if 1 / (2 * float(b)) <= 700 else math.inf
        for b, count in counts.items()
        for _ in range(count)
    )
    best, total = math.inf, 0.0
    for k, value in enumerate(log_s, 1):
        if value == math.inf:
            break
        total += value
        log_theta = math.log(math.pi) + (2 * total - math.log(2 * k * TAIL)) / (2 * k)
        best = min(best, log_theta)
    if best >= math.log(math.pi):
        return None
    return math.ceil(math.exp(best) * size / (2 * math.pi))
