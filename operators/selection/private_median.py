"""PrivateMedian, George et al. Alg. 7: a coarse private mean for level l >= 2.

K = ceil(k) arrays of exactly s = 2^(l-1) samples each are filled with the users' first
r_u = min(m_u(t), s) samples, user after user in a data-independent order, contiguously
(a user's samples never skip an array). Each array mean Y_j is snapped to the nearest
midpoint of the bins of width w = 2 * 2^(-l/2) that cut [0, 1] (the last one shorter), the
set T_l with |T_l| = ceil(2^(l/2) / 2); ties go to the smaller midpoint. With c(y) =
max(#{Y'_j < y}, #{Y'_j > y}), the output is drawn by the exponential mechanism
P(y) proportional to exp(-eps' * c(y) / 4).

**Inputs are histograms.** Only the counts of the snapped means per bin matter, so
``fill`` turns one partition's users into a histogram over T_l and histograms of disjoint
user sets add up; ``select`` runs the exponential mechanism on the summed histogram. Each
partition packs its own users (dropping its last, incomplete array), so a user still
touches at most 2 arrays. With one partition this is the paper's fill exactly; with P
partitions up to P - 1 arrays' worth of samples are left out (``continual_mean`` counts
complete arrays per partition, so it activates only once K complete arrays exist).

**Exact sampling from a NoiseSource.** The draw uses only ``noise.discrete_laplace``, so a
keyed source makes it a pure function of (key, node ids): a replay re-emits the same
median. Draw i has node id ``(*node_prefix, i)``. Conditional on Z != 0, a discrete
Laplace Z of scale B has P(Z > 0) = 1/2 and P(|Z| - 1 >= r) = exp(-r / B). That gives fair
bits (B = 2^20, a zero draw is redrawn) and Bernoulli(exp(-gamma)) for rational gamma
(B = 2^20 * den(gamma), r = 2^20 * num(gamma)). A uniform proposal y accepted with
probability exp(-eps' (c(y) - min c) / 4) is then an exact sample of the exponential
mechanism; the loop ends after at most |T_l| proposals on average. No floating point
touches the draw (Ilvento 2020 on floating-point exponential mechanisms).

A source that returns 0 on 64 consecutive draws is ``ZeroNoise`` (a real source does so
with probability below 2^-1300): the result is then the eps' -> infinity limit, the
midpoint of least c (the binned median). NOT private; tests.

Privacy:
    eps'-DP for user-level neighbours (one user's samples change): the user lies in at most
    2 arrays, each moves c(y) by at most 1, so c has sensitivity 2 and the exponential
    mechanism exp(-eps' c / (2 * 2)) is eps'-DP (Claim E.1; not eps'/2, whose sensitivity would be
    1).

References:
    A. George, L. Ramesh, A. V. Singh, H. Tyagi. Continual Mean Estimation Under
    User-Level Privacy. Alg. 7, Claim E.1 (App. E.1); our reading in docs/papers.md.
    V. Feldman, T. Steinke. Generalization for adaptively-chosen estimators via stable
    median. COLT 2017 (FS17, Thm 3.1). C. Ilvento. Implementing the exponential mechanism
    with base-2 differential privacy. CCS 2020.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import (
    DegenerateNoise,
    NodeId,
    NoiseBits,
    NoiseSource,
    bernoulli_exp,
    node_bytes,
    uniform_below,
)

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "private_median"

_COIN_SCALE = Fraction(1 << 20)
_ZERO_STREAK = 64


@dataclass(frozen=True, slots=True)
class PrivateMedianSpec:
    """Public parameters of one PrivateMedian call.

    Attributes:
        epsilon: eps' of the call.
        level: l >= 2; arrays hold s = 2^(l-1) samples.
        k: k = (16 / eps') ln(2^(l/2) / beta), real.
        arrays: K = ceil(k), the number of arrays the paper fills (our correction).
        resolution: G, grid units per 1.0 of the [0, 1] sample scale.
        node_prefix: public identity; draw i uses node ``(*node_prefix, i)``.
        midpoints: T_l, ascending.
    """

    epsilon: Fraction
    level: int
    k: float
    arrays: int
    resolution: int
    node_prefix: NodeId
    midpoints: tuple[float, ...]


def make_private_median(
    epsilon: float | Fraction,
    level: int,
    beta: float,
    resolution: int,
    node_prefix: NodeId,
) -> PrivateMedianSpec:
    """Validate the parameters and build a PrivateMedianSpec.

    Args:
        epsilon: eps' > 0; a float is read as the decimal it prints as.
        level: l, int >= 2.
        beta: failure probability of the exponential mechanism, in (0, 1) (utility only).
        resolution: G, int >= 1.
        node_prefix: tuple of str and int fields identifying this call.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        eps'-DP, see the module docstring.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("level", level, 2)
    _validate.check_probability("beta", beta)
    _validate.check_int_ge("resolution", resolution, 1)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    k = k_value(eps, level, beta)
    return PrivateMedianSpec(
        epsilon=eps,
        level=level,
        k=k,
        arrays=math.ceil(k),
        resolution=resolution,
        node_prefix=prefix,
        midpoints=midpoints(level),
    )


def k_value(epsilon: Fraction | float, level: int, beta: float) -> float:
    """k(eps', l, beta) = (16 / eps') ln(2^(l/2) / beta), Alg. 7's Require (real)."""
    return 16 / float(epsilon) * (level / 2 * math.log(2) - math.log(beta))


def midpoints(level: int) -> tuple[float, ...]:
    """T_l: midpoints of the bins of width w = 2 * 2^(-l/2) cutting [0, 1], last one shorter.

    |T_l| = ceil(2^(l/2) / 2): l = 2 -> (0.5,), l = 3 -> (0.35355, 0.85355), l = 4 ->
    (0.25, 0.75), l = 5 -> (0.17678, 0.53033, 0.85355).
    """
    _validate.check_int_ge("level", level, 2)
    if level % 2 == 0:
        count = 1 << (level // 2 - 1)
        width = 1.0 / count
    else:
        width = 2.0 * 2.0 ** (-level / 2)
        count = math.ceil(1.0 / width)
    mids = [(i + 0.5) * width for i in range(count - 1)]
    mids.append(((count - 1) * width + 1.0) / 2)
    return tuple(mids)


def bin_of(spec: PrivateMedianSpec, array_units: int) -> int:
    """Index of the midpoint nearest to Y = array_units / (s * G); a tie goes to the smaller.

    Any deterministic snapping keeps c's sensitivity at 2, so floats are safe here.
    """
    y = array_units / ((1 << (spec.level - 1)) * spec.resolution)
    mids = spec.midpoints
    i = bisect.bisect_left(mids, y)
    if i == 0:
        return 0
    if i == len(mids):
        return i - 1
    return i - 1 if y - mids[i - 1] <= mids[i] - y else i


def fill(spec: PrivateMedianSpec, users: Iterable[tuple[int, Sequence[int]]]) -> tuple[int, ...]:
    """Histogram over T_l of the complete arrays of one partition (Alg. 7, lines 1-6).

    Args:
        spec: the call's parameters.
        users: (m_u, prefix_u) per user in the canonical (data-independent) order, where
            prefix_u[i] is the exact unit sum of the user's first i + 1 samples; it must
            hold at least min(m_u, 2^(l-1)) entries.

    Returns:
        Counts per midpoint; their sum is floor(sum_u min(m_u, s) / s). Every complete
        array is used (the paper stops at K; with one arrival per step it has exactly K
        when the level activates, see ``continual_mean``).
    """
    s = 1 << (spec.level - 1)
    hist = [0] * len(spec.midpoints)
    acc = fill_count = 0
    for count, prefix in users:
        r = min(count, s)
        start = 0
        while start < r:
            take = min(s - fill_count, r - start)
            end = start + take
            acc += prefix[end - 1] - (prefix[start - 1] if start else 0)
            fill_count += take
            start = end
            if fill_count == s:
                hist[bin_of(spec, acc)] += 1
                acc = fill_count = 0
    return tuple(hist)


def scores(histogram: Sequence[int]) -> tuple[int, ...]:
    """c(y_i) = max(#{Y' < y_i}, #{Y' > y_i}) for each midpoint y_i."""
    total = sum(histogram)
    out, below = [], 0
    for h in histogram:
        out.append(max(below, total - below - h))
        below += h
    return tuple(out)


def probabilities(spec: PrivateMedianSpec, histogram: Sequence[int]) -> tuple[float, ...]:
    """The exponential mechanism's output distribution (floats; for tests and docs only)."""
    c = scores(_checked(spec, histogram))
    low = min(c)
    weights = [math.exp(-float(spec.epsilon) * (ci - low) / 4) for ci in c]
    total = sum(weights)
    return tuple(w / total for w in weights)


def select(spec: PrivateMedianSpec, histogram: Sequence[int], noise: NoiseSource) -> int:
    """Draw the index of mu~ in T_l from the exponential mechanism, exactly.

    Args:
        spec: the call's parameters.
        histogram: counts of snapped array means per midpoint (summed over partitions).
        noise: the noise source (keyed in production).

    Returns:
        i with P(i) proportional to exp(-eps' c(y_i) / 4); ``midpoints[i]`` is mu~_l.

    Privacy:
        eps'-DP (module docstring), given ``histogram`` built by ``fill``.
    """
    c = scores(_checked(spec, histogram))
    if len(c) == 1:
        return 0
    low = min(c)
    coins = NoiseBits(noise, spec.node_prefix, _COIN_SCALE, _ZERO_STREAK)
    quarter = spec.epsilon / 4
    try:
        while True:
            i = uniform_below(len(c), coins)
            if coins.degenerate:  # a noiseless test source: the mode
                break
            if bernoulli_exp(quarter * (c[i] - low), coins):
                return i
    except DegenerateNoise:
        pass
    return c.index(low)


def midpoint(spec: PrivateMedianSpec, index: int) -> float:
    """mu~ for a drawn index."""
    return spec.midpoints[index]


def _checked(spec: PrivateMedianSpec, histogram: Sequence[int]) -> Sequence[int]:
    if len(histogram) != len(spec.midpoints) or any(h < 0 for h in histogram):
        raise ValueError(
            f"histogram must have {len(spec.midpoints)} counts >= 0, got {len(histogram)} counts"
        )
    return histogram
