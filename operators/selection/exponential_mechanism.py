"""The exponential mechanism, sampled exactly with randomness from a NoiseSource.

Rameshwar et al.'s private interval (Alg. 3, Sec. III-D) and private quantiles (Sec. III-E) pick
one of finitely many candidates i with probability proportional to

    w_i = a_i * exp(-gamma_i),

a_i >= 0 an integer multiplicity (1 per bin; the number of grid points of a quantile rank
group) and gamma_i >= 0 a rational (epsilon * score / (2 * sensitivity)). No floating-point
number decides the outcome, in the spirit of the exact discrete Laplace
(``noise.discrete_laplace``):

* **Bits.** The fair bits of ``noise.bits`` (``NoiseBits``): bit j of a choice is the sign
  of the keyed discrete Laplace draw of node ``(*node, j)``, so a replay makes the same
  choice again, it never re-draws.
* **Inversion.** A uniform U in [0, 1) is read one bit at a time and every w_i is bracketed
  by integers at a binary precision that grows on demand (``exp_neg_bounds``, rigorous:
  alternating Taylor series and outward rounding). The index is returned as soon as the
  bits read and the brackets *prove* which cumulative interval U * sum(w) falls in. The
  output therefore has exactly the distribution w_i / sum(w); the expected number of bits
  is the entropy of that distribution plus a few.
* **Noiseless test sources.** When the bits' source is degenerate (``ZeroNoise``, see
  ``noise.bits``) the sampler returns the mode (the most probable candidate, lowest index
  on ties; uniform choices return their middle element). Under a real source that event
  has probability below 2^-270 per bit: the mechanisms built on this module are epsilon-DP
  up to an additive delta below 2^-260.

References:
    F. McSherry, K. Talwar. Mechanism design via differential privacy. FOCS 2007.
    C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
    NeurIPS 2020, arXiv:2004.00010 (exact sampling from rational parameters).
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from collections.abc import Sequence
from fractions import Fraction

from .. import _validate
from ..noise import DegenerateNoise, NoiseBits

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

_START_PRECISION = 32
_BITS_PER_REFILL = 2


# ---------------------------------------------------------------------------------------
# Rigorous brackets of exp(-gamma)


def _ceil_shift(value: int, shift: int) -> int:
    return -((-value) >> shift)


@functools.lru_cache(maxsize=4096)
def _exp_neg_fraction(f: Fraction, work: int) -> tuple[int, int]:
    """Integers lo <= exp(-f) * 2^work <= hi for rational 0 <= f < 1.

    The Taylor series of exp(-f) alternates with terms f^k / k! that decrease (f < 1), so
    every partial sum ending on an odd term is below the limit, every even one above.
    """
    lower = upper = Fraction(1)
    term = Fraction(1)
    k = 0
    threshold = Fraction(1, 1 << (work + 2))
    while True:
        k += 1
        term = term * f / k
        if k % 2:
            lower = upper - term
        else:
            upper = lower + term
        if term < threshold and k >= 2:
            break
    scaled_lo = lower * (1 << work)
    scaled_hi = upper * (1 << work)
    return math.floor(scaled_lo), math.ceil(scaled_hi)


@functools.lru_cache(maxsize=256)
def _exp_neg_one(work: int) -> tuple[int, int]:
    """Integers lo <= exp(-1) * 2^work <= hi (same alternating series at f = 1)."""
    lower = upper = Fraction(1)
    term = Fraction(1)
    k = 0
    threshold = Fraction(1, 1 << (work + 2))
    while True:
        k += 1
        term = term / k
        if k % 2:
            lower = upper - term
        else:
            upper = lower + term
        if term < threshold and k >= 2:
            break
    return math.floor(lower * (1 << work)), math.ceil(upper * (1 << work))


def exp_neg_bounds(gamma: Fraction, prec: int) -> tuple[int, int]:
    """Integers lo <= exp(-gamma) * 2^prec <= hi, with hi - lo at most a few units.

    Exact integer and Fraction arithmetic only; every rounding goes outward, so the bracket
    is rigorous.

    Args:
        gamma: rational >= 0.
        prec: number of fractional bits, >= 1.

    Returns:
        (lo, hi).
    """
    gamma = Fraction(gamma)
    if gamma < 0:
        raise _validate.invalid("gamma", ">= 0", gamma)
    _validate.check_int_ge("prec", prec, 1)
    return _exp_neg_scaled(gamma.numerator, gamma.denominator, prec)


@functools.lru_cache(maxsize=1 << 16)
def _exp_neg_scaled(num: int, den: int, prec: int) -> tuple[int, int]:
    """``exp_neg_bounds`` of gamma = num / den (num >= 0, den >= 1), unchecked and cached."""
    if num == 0:
        return 1 << prec, 1 << prec
    whole = num // den
    if whole >= prec:
        # exp(-gamma) <= exp(-prec) < 2^-prec
        return 0, 1
    work = prec + whole.bit_length() + 8
    lo, hi = _exp_neg_fraction(Fraction(num - whole * den, den), work)
    if whole:
        one_lo, one_hi = _exp_neg_one(work)
        for _ in range(whole):
            lo = (lo * one_lo) >> work
            hi = _ceil_shift(hi * one_hi, work)
    shift = work - prec
    return lo >> shift, _ceil_shift(hi, shift)


# ---------------------------------------------------------------------------------------
# Sampling


def _check_weights(
    multiplicities: Sequence[int], exponents: Sequence[Fraction]
) -> tuple[list[int], list[Fraction]]:
    if len(multiplicities) != len(exponents):
        raise _validate.invalid(
            "exponents", f"as many as the multiplicities ({len(multiplicities)})", len(exponents)
        )
    mult = list(multiplicities)
    exps = [g if isinstance(g, Fraction) else Fraction(g) for g in exponents]
    _check_multiplicities(mult)
    for g in exps:
        if g < 0:
            raise _validate.invalid("exponent", ">= 0", g)
    return mult, exps


def _check_multiplicities(mult: list[int]) -> None:
    for a in mult:
        _validate.check_int_ge("multiplicity", a, 0)
    if not any(mult):
        raise _validate.invalid("multiplicities", "not all zero", tuple(mult))


def log_weights(multiplicities: Sequence[int], exponents: Sequence[Fraction]) -> list[float]:
    """ln(a_i) - gamma_i in floating point (-inf for a_i = 0): diagnostics and the mode."""
    return [
        math.log(a) - float(g) if a else -math.inf
        for a, g in zip(multiplicities, exponents, strict=True)
    ]


def probabilities(multiplicities: Sequence[int], exponents: Sequence[Fraction]) -> list[float]:
    """P(i) = a_i exp(-gamma_i) / sum, in floating point with log-sum-exp (for tests/docs).

    Args:
        multiplicities: a_i >= 0 integers, not all zero.
        exponents: gamma_i >= 0 rationals.

    Returns:
        The probabilities, summing to 1 up to rounding.
    """
    mult, exps = _check_weights(multiplicities, exponents)
    logs = log_weights(mult, exps)
    top = max(logs)
    raw = [math.exp(v - top) if v > -math.inf else 0.0 for v in logs]
    total = math.fsum(raw)
    return [r / total for r in raw]


def mode(multiplicities: Sequence[int], exponents: Sequence[Fraction]) -> int:
    """Index of the most probable candidate (lowest index among float ties)."""
    mult, exps = _check_weights(multiplicities, exponents)
    logs = log_weights(mult, exps)
    top = max(logs)
    return next(i for i, v in enumerate(logs) if v >= top - 1e-12 * max(1.0, abs(top)))


def sample_index(
    multiplicities: Sequence[int], exponents: Sequence[Fraction], bits: NoiseBits
) -> int:
    """Index i with probability exactly a_i exp(-gamma_i) / sum_j a_j exp(-gamma_j).

    Args:
        multiplicities: a_i >= 0 integers, not all zero.
        exponents: gamma_i >= 0 rationals (only differences matter).
        bits: the fair-bit source of this choice.

    Returns:
        The index; the mode if the source is degenerate.

    Raises:
        InvalidOperatorConfig: malformed weights (a programming error, never data).
    """
    mult, exps = _check_weights(multiplicities, exponents)
    den = math.lcm(*(g.denominator for g in exps))
    nums = [g.numerator * (den // g.denominator) for g in exps]
    return sample_index_scaled(mult, nums, den, bits)


def sample_index_scaled(
    multiplicities: Sequence[int], numerators: Sequence[int], denominator: int, bits: NoiseBits
) -> int:
    """``sample_index`` with gamma_i = numerators[i] / denominator (all integers, fast path).

    Args:
        multiplicities: a_i >= 0 integers, not all zero.
        numerators: integers >= 0.
        denominator: integer >= 1.
        bits: the fair-bit source of this choice.

    Returns:
        The index; the mode if the source is degenerate.
    """
    mult = list(multiplicities)
    nums = list(numerators)
    if len(mult) != len(nums):
        raise _validate.invalid(
            "numerators", f"as many as the multiplicities ({len(mult)})", len(nums)
        )
    _check_multiplicities(mult)
    _validate.check_int_ge("denominator", denominator, 1)
    if min(nums) < 0:
        raise _validate.invalid("numerator", ">= 0", min(nums))
    floor_num = min(g for a, g in zip(mult, nums, strict=True) if a)
    shifted = [g - floor_num if a else 0 for a, g in zip(mult, nums, strict=True)]
    prec = _START_PRECISION + len(mult).bit_length()
    u, drawn = 0, 0  # U lies in [u / 2^drawn, (u + 1) / 2^drawn)
    cum_lo, cum_hi = _cumulative_bounds(mult, shifted, denominator, prec)
    while True:
        total_lo, total_hi = cum_lo[-1], cum_hi[-1]
        x_lo = u * total_lo  # U * total, scaled by 2^drawn, is in [x_lo, x_hi)
        x_hi = (u + 1) * total_hi
        i = bisect_left(cum_lo, -((-x_hi) >> drawn))
        if i < len(mult) and (i == 0 or cum_hi[i - 1] << drawn <= x_lo):
            return i
        if (total_hi - total_lo) << (drawn + 2) > total_hi:
            prec += 32
            cum_lo, cum_hi = _cumulative_bounds(mult, shifted, denominator, prec)
            continue
        try:
            for _ in range(_BITS_PER_REFILL):
                u = (u << 1) | bits.bit()
                drawn += 1
        except DegenerateNoise:
            return mode(mult, [Fraction(g, denominator) for g in nums])


def _cumulative_bounds(
    mult: list[int], shifted: list[int], den: int, prec: int
) -> tuple[list[int], list[int]]:
    """Prefix sums of the integer brackets of a_i exp(-g_i / den) at ``prec`` bits."""
    cum_lo, cum_hi = [], []
    acc_lo = acc_hi = 0
    far = prec * den
    for a, g in zip(mult, shifted, strict=True):
        if a:
            if g >= far:  # exp(-g / den) < 2^-prec: the bracket (0, 1), without the series
                acc_hi += a
            else:
                lo, hi = _exp_neg_scaled(g, den, prec)
                acc_lo += a * lo
                acc_hi += a * hi
        cum_lo.append(acc_lo)
        cum_hi.append(acc_hi)
    return cum_lo, cum_hi
