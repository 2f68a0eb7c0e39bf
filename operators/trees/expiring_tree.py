"""Continual counting with gradual privacy expiration: the dyadic-interval counter of Andersson et
al. (expiration).

Algorithm 3 of Andersson et al. (Theorem 1.2), with Algorithm 2 as its lambda = 1, B = 0
case. The leaf stream x_1, x_2, ... is released as a running sum with delay B:

* for t <= B the release is exactly 0 (no noise, no data);
* for t > B, with u = t - B, the release is S_u + sum of Z_I over the dyadic intervals I
  containing u, one per level l = 0..floor(log2 u) (Andersson et al. (expiration) Fact 3.3).

The dyadic intervals are I = [k * 2^l, (k + 1) * 2^l - 1] with k >= 1: an interval that
starts at 0 is never used, so step u needs floor(log2 u) + 1 noise terms and the stream
length need not be known. The stream is unbounded; nothing here depends on a horizon T.

Noise of a level-l interval: Z_I ~ Lap((1 + l)^(1 - lambda) * sensitivity / epsilon),
drawn as discrete Laplace (releases are integer counts) with an exact Fraction scale. When
(1 + l)^(1 - lambda) is irrational (lambda not an integer) it is rounded UP to a dyadic
rational with 48 significant bits: more noise, so the guarantee below still holds, and
``expiration`` reports the (slightly smaller) cost of the rounded scale.

Noise is never stored. Interval I at level l with index k has node identity
``(*node_prefix, l, k)``; every release asks the NoiseSource for the node of each interval
it uses, so the keyed production source returns the same Z_I at every step inside I and
after any replay (noise is drawn lazily and never redrawn: the paper's Sec. 3, and redrawing would
turn Alg. 3 into something like Alg. 1).

The privacy loss of an item d steps old (d = tau - j + 1: Andersson et al. (expiration) Def. 1.1,
our reading of its off-by-one, docs/papers.md) is
epsilon * g(d) with g(d) = 0 for d <= B and otherwise
g(d) = 2 * sum_{l=0}^{floor(log2(d - B))} (1 + l)^(lambda - 1) (Theorem 1.2 / Lemma 4.1).
``canonical_expiration`` gives the tighter worst-case cost of the canonical decomposition
that the paper's "empirical" curves plot.

Example:
    >>> from dpstream.operators.trees import expiring_tree as et
    >>> from dpstream.operators.noise import ZeroNoise
    >>> spec = et.make_expiring_tree(1, 1, ("clicks", 0), lam=2, delay=0)
    >>> [(node[-2:], scale) for node, scale, _ in et.release_terms(spec, 6)]
    [((0, 6), Fraction(1, 1)), ((1, 3), Fraction(1, 2)), ((2, 1), Fraction(1, 3))]
    >>> et.expiration(spec, 4)
    Fraction(12, 1)

References:
    J. Andersson, M. Henzinger, R. Pagh, T. A. Steiner, J. Upadhyay. Continual Counting
    with Gradual Privacy Expiration. NeurIPS 2024, arXiv:2406.03802. Algorithms 2 and 3,
    Definition 1.1, Lemma 3.4, Theorem 1.2, Lemma 4.1, Facts 3.2 and 3.3; our readings in
    docs/papers.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import (
    NodeId,
    NoiseSource,
    Term,
    TreeRelease,
    discrete_laplace_variance,
    laplace_variance,
    node_bytes,
    noise_std,
    noisy_release,
)

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "expiring_tree"

MAX_LAM_DENOMINATOR = 1000
"""lambda must be a rational with at most this denominator (the q-th root below is exact
integer arithmetic whose cost grows with q; 0.001 steps are finer than any use needs)."""

_ROOT_PRECISION_BITS = 48

Interval = tuple[int, int]
"""(level l, index k >= 1): the dyadic interval [k * 2^l, (k + 1) * 2^l - 1]."""


@dataclass(frozen=True, slots=True)
class ExpiringTreeSpec:
    """Public parameters of one expiring counter.

    Attributes:
        epsilon: the epsilon of Definition 1.1 (the loss of a d-old item is epsilon * g(d)).
        sensitivity: L1 change of the leaf stream between neighbours (they differ at one
            step by at most this): 1 for event level, tau after user truncation.
        node_prefix: public identity of this counter; every node id is
            ``(*node_prefix, level, k)``.
        lam: lambda >= 0, shape of the budget across levels (level l gets
            epsilon * (1 + l)^(lambda - 1)); 1 is uniform (Algorithm 2).
        delay: B >= 0; the first B releases are 0 and release t estimates S_(t - B).
    """

    epsilon: Fraction
    sensitivity: int
    node_prefix: NodeId
    lam: Fraction
    delay: int


@dataclass(frozen=True, slots=True)
class ExpiringTreeState:
    """Exact data only (no noise), O(B) ints. Plain data: serializable as it is.

    Attributes:
        t: number of time steps taken so far.
        total: exact delayed prefix sum S_u, u = max(0, t - delay).
        pending: the last min(t, delay) leaf weights, oldest first (not yet in ``total``).
    """

    t: int = 0
    total: int = 0
    pending: tuple[int, ...] = ()


def make_expiring_tree(
    epsilon: float | Fraction,
    sensitivity: int,
    node_prefix: NodeId,
    lam: float | Fraction,
    delay: int,
) -> ExpiringTreeSpec:
    """Validate the parameters and build an ExpiringTreeSpec.

    Args:
        epsilon: > 0; a float is read as the decimal it prints as (0.1 is 1/10).
        sensitivity: int >= 1.
        node_prefix: tuple of str and int fields identifying this counter.
        lam: lambda >= 0, a rational with denominator <= ``MAX_LAM_DENOMINATOR``.
        delay: B, int >= 0.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP with expiration g (Definition 1.1) for neighbouring leaf streams that
        differ at one step by at most ``sensitivity``: an item d steps old has loss
        epsilon * g(d), g(d) = 0 for d <= B, else 2 * sum_{l <= floor(log2(d - B))}
        (1 + l)^(lambda - 1). Node noise is discrete Laplace with scale
        (1 + l)^(1 - lambda) * sensitivity / epsilon (rounded up when irrational).

    References:
        Andersson et al. 2024, arXiv:2406.03802, Algorithm 3 and Theorem 1.2 (Lemma 4.1).
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("sensitivity", sensitivity, 1)
    lam_q = _validate.exact_fraction("lam", lam)
    if lam_q < 0:
        raise _validate.invalid("lam", ">= 0", lam_q)
    if lam_q.denominator > MAX_LAM_DENOMINATOR:
        raise _validate.invalid(
            "lam", f"a rational with denominator <= {MAX_LAM_DENOMINATOR}", lam_q
        )
    _validate.check_int_ge("delay", delay, 0)
    prefix = tuple(node_prefix)
    node_bytes(prefix)  # reject bad prefix fields now, not at the first step
    return ExpiringTreeSpec(
        epsilon=eps, sensitivity=sensitivity, node_prefix=prefix, lam=lam_q, delay=delay
    )


def init(spec: ExpiringTreeSpec) -> ExpiringTreeState:
    """The state before the first step.

    Args:
        spec: the counter's parameters (unused: the empty state is the same for all).

    Returns:
        The empty state.
    """
    return ExpiringTreeState()


# ---------------------------------------------------------------------------------------
# Dyadic intervals (Andersson et al. (expiration) Facts 3.2 and 3.3)


def intervals_containing(u: int) -> list[Interval]:
    """I_u of Fact 3.3: one interval per level l = 0..floor(log2 u), lowest level first.

    Args:
        u: a (delayed) time index >= 1.

    Returns:
        The (level, k) pairs; the level-l one is k = floor(u / 2^l).
    """
    _validate.check_int_ge("u", u, 1)
    return [(level, u >> level) for level in range(u.bit_length())]


def canonical_decomposition(a: int, b: int) -> list[Interval]:
    """Fact 3.2: the disjoint dyadic intervals whose union is [a, b], left to right.

    Greedy from p = a: take the largest l with 2^l | p and p + 2^l - 1 <= b. This is the
    set D whose noises the coupling of Lemma 3.4 / 4.1 shifts.

    Args:
        a: first element, >= 1 (intervals starting at 0 are not members).
        b: last element, >= a - 1 (b = a - 1 gives the empty decomposition).

    Returns:
        The (level, k) pairs.
    """
    _validate.check_int_ge("a", a, 1)
    _validate.check_int_ge("b", b, a - 1)
    out = []
    p = a
    while p <= b:
        level = min((p & -p).bit_length() - 1, (b - p + 1).bit_length() - 1)
        out.append((level, p >> level))
        p += 1 << level
    return out


# ---------------------------------------------------------------------------------------
# Scales and budgets


def _iroot_ceil(n: int, q: int) -> int:
    """The smallest integer m >= 0 with m^q >= n, for n >= 0 and q >= 1 (exact)."""
    if n <= 1:
        return n
    m = 1 << -(-n.bit_length() // q)  # 2^ceil(bits / q) >= n^(1/q): Newton from above
    while True:
        nxt = ((q - 1) * m + n // m ** (q - 1)) // q
        if nxt >= m:
            break
        m = nxt
    return m if m**q >= n else m + 1  # m is now floor(n^(1/q))


@functools.lru_cache(maxsize=4096)
def level_factor(lam: Fraction, level: int) -> Fraction:
    """r_l >= (1 + l)^(1 - lambda), the level-l noise scale in units of sensitivity/epsilon.

    Exact when lambda is an integer. Otherwise the irrational power is rounded UP to
    m / 2^k with about 48 significant bits (relative excess < 2^-47): rounding the
    scale up only adds noise, so the privacy claim holds for the rounded value.

    Args:
        lam: lambda >= 0 (a Fraction).
        level: l >= 0.

    Returns:
        r_l as a Fraction.
    """
    exponent = 1 - Fraction(lam)
    power = Fraction(1 + level) ** exponent.numerator  # exact: integer exponent
    q = exponent.denominator
    if q == 1:
        return power
    # Smallest m with (m / 2^k)^q >= power, i.e. m^q >= ceil(power * 2^(k q)).
    deficit = power.denominator.bit_length() - power.numerator.bit_length() + 1
    k = _ROOT_PRECISION_BITS + max(0, -(-deficit // q))
    target = -((-power.numerator << (k * q)) // power.denominator)
    return Fraction(_iroot_ceil(target, q), 1 << k)


def node_scale(spec: ExpiringTreeSpec, level: int) -> Fraction:
    """Discrete Laplace scale of every level-``level`` node: r_l * sensitivity / epsilon."""
    return level_factor(spec.lam, level) * spec.sensitivity / spec.epsilon


def level_cost(spec: ExpiringTreeSpec, level: int) -> Fraction:
    """Privacy cost, in units of epsilon, of shifting one level-l node by ``sensitivity``.

    It is sensitivity / (epsilon * scale) = 1 / r_l: (1 + l)^(lambda - 1) exactly for
    integer lambda, at most that otherwise.
    """
    return 1 / level_factor(spec.lam, level)


def node_id(spec: ExpiringTreeSpec, interval: Interval) -> NodeId:
    """Public identity of the noise of dyadic interval (level, k): (*node_prefix, level, k)."""
    level, k = interval
    return (*spec.node_prefix, level, k)


# ---------------------------------------------------------------------------------------
# Releases


def delayed_index(spec: ExpiringTreeSpec, t: int) -> int:
    """u = t - B, the prefix the release at step t estimates; 0 while t <= B."""
    return max(0, t - spec.delay)


def release_terms(spec: ExpiringTreeSpec, t: int) -> list[Term]:
    """The noisy nodes whose sum is the noise of the release at step t (public).

    None for t <= B; else one node per interval of I_u, u = t - B (indexed by
    u, not t, as the proof of Thm 1.2 needs), lowest level first.

    Args:
        spec: the counter's parameters.
        t: step >= 1.

    Returns:
        (node id, scale, +1) terms.
    """
    _validate.check_int_ge("t", t, 1)
    u = delayed_index(spec, t)
    if u == 0:
        return []
    return [(node_id(spec, iv), node_scale(spec, iv[0]), 1) for iv in intervals_containing(u)]


def std(spec: ExpiringTreeSpec, t: int) -> float:
    """Exact standard deviation of the noise of the release at step t (discrete Laplace).

    The release at t > B also carries the delay bias S_(t-B) - S_t, which depends on
    the data and is not part of this figure.
    """
    return noise_std(release_terms(spec, t))


def variance(spec: ExpiringTreeSpec, t: int, *, continuous: bool = False) -> float:
    """Noise variance at step t; ``continuous`` uses the paper's Lap variance 2 b^2.

    Andersson et al. (expiration) Thm 1.2 (our exact form): (2 / eps^2) * sum_{l <= floor(log2 u)}
    (1 + l)^(2 - 2 lambda) (times sensitivity^2) in the continuous case; the releases carry the
    exact discrete Laplace variance, which is smaller.
    """
    var = laplace_variance if continuous else discrete_laplace_variance
    return math.fsum(var(scale) for _, scale, _ in release_terms(spec, t))


def mean_noise_variance(spec: ExpiringTreeSpec, horizon: int, *, continuous: bool = False) -> float:
    """(1 / T) * sum_{t=1..T} Var(noise_t): the paper's MSE on a stream of length T.

    The delay bias is data-dependent and excluded (the paper runs B = 0). O(log T) time:
    level l is used by the T - B - 2^l + 1 steps with u >= 2^l.

    Args:
        spec: the counter's parameters.
        horizon: T >= 1.
        continuous: use the continuous Laplace variance 2 b^2 as the paper does.

    Returns:
        The mean variance.
    """
    _validate.check_int_ge("horizon", horizon, 1)
    var = laplace_variance if continuous else discrete_laplace_variance
    last = horizon - spec.delay
    total = math.fsum(
        var(node_scale(spec, level)) * (last - (1 << level) + 1)
        for level in range(max(last, 0).bit_length())
    )
    return total / horizon


def concentration_bound(spec: ExpiringTreeSpec, t: int, beta: float) -> float:
    """Lemma B.3 bound s with P(|noise_t| > s) <= beta for continuous Laplace noise.

    nu = max(sqrt(sum b_l^2), b_max * sqrt(ln(2/beta))) and s = nu * sqrt(8 ln(2/beta))
    (Andersson et al. (expiration) Lemma B.3 with a union bound). It is the paper's bound; the
    release's own ``ci95`` is the exact quantile of the discrete noise it actually adds. The
    delay bias (at most B times the largest leaf weight) comes on top.

    Args:
        spec: the counter's parameters.
        t: step >= 1.
        beta: miss probability in (0, 1).

    Returns:
        s (0.0 while t <= B).
    """
    _validate.check_probability("beta", beta)
    scales = [float(scale) for _, scale, _ in release_terms(spec, t)]
    if not scales:
        return 0.0
    log_term = math.log(2 / beta)
    nu = max(math.sqrt(math.fsum(b * b for b in scales)), max(scales) * math.sqrt(log_term))
    return nu * math.sqrt(8 * log_term)


def step(
    spec: ExpiringTreeSpec, state: ExpiringTreeState, weight: int, noise: NoiseSource
) -> tuple[ExpiringTreeState, TreeRelease]:
    """Advance one public time step with leaf weight ``weight`` (0 on an empty tick).

    The weight enters a FIFO of length B; the weight leaving it joins S_u. The release is
    S_u plus the keyed noise of the intervals containing u = t - B (exactly 0 while
    t <= B). Noise is recomputed from node ids, never stored (our streaming form of
    Andersson et al. (expiration) Alg. 3; the sum is recomputed from the per-level values, never
    kept as a running float).

    Args:
        spec: the counter's parameters.
        state: the state after step t - 1.
        weight: the leaf value x_t (already clipped/truncated upstream).
        noise: the noise source (keyed in production).

    Returns:
        The new state and the release for step t.

    Privacy:
        Over all steps, epsilon-DP with expiration g (see ``expiration``) for leaf streams
        differing at one step by at most ``spec.sensitivity``, provided ``noise`` returns
        the same value for a node every time it is asked (KeyedNoise does).

    References:
        Andersson et al. 2024, arXiv:2406.03802, Algorithm 3.
    """
    t = state.t + 1
    pending = (*state.pending, weight)
    total = state.total
    if len(pending) > spec.delay:
        total += pending[0]
        pending = pending[1:]
    new_state = ExpiringTreeState(t=t, total=total, pending=pending)
    return new_state, noisy_release(t, total, release_terms(spec, t), noise)


# ---------------------------------------------------------------------------------------
# Privacy expiration (Andersson et al. (expiration) Def. 1.1, Thm 1.2, Sec. 6)


def ceil_float(value: Fraction) -> float:
    """The smallest float >= ``value``: reported losses are never rounded down."""
    out = float(value)
    if Fraction(out) < value:
        out = math.nextafter(out, math.inf)
    return out


def expiration(spec: ExpiringTreeSpec, d: int) -> Fraction:
    """g(d) of Theorem 1.2 in units of epsilon, for an item d = tau - j + 1 steps old.

    0 for d <= B, else 2 * sum_{l=0}^{floor(log2(d - B))} level_cost(l), which is
    2 * sum (1 + l)^(lambda - 1) exactly for integer lambda (a hair less otherwise,
    since the scales were rounded up). Non-decreasing in d.

    Args:
        spec: the counter's parameters.
        d: elapsed time >= 1 (d = 1 is the item of the current step; Def. 1.1, our reading).

    Returns:
        g(d) as a Fraction.
    """
    _validate.check_int_ge("d", d, 1)
    span = d - spec.delay
    if span <= 0:
        return Fraction(0)
    return 2 * sum((level_cost(spec, level) for level in range(span.bit_length())), Fraction(0))


def privacy_loss(spec: ExpiringTreeSpec, d: int) -> float:
    """epsilon * g(d): the privacy loss of an item d steps old (rounded up to a float).

    Args:
        spec: the counter's parameters.
        d: elapsed time >= 1, d = tau - j + 1.

    Returns:
        The loss.

    Privacy:
        For neighbours differing at step j by at most ``sensitivity``, the whole sequence
        of releases 1..tau changes in probability by at most exp(privacy_loss(spec,
        tau - j + 1)) (Definition 1.1 with its off-by-one read as in docs/papers.md).

    References:
        Andersson et al. 2024, Theorem 1.2 / Lemma 4.1.
    """
    return ceil_float(spec.epsilon * expiration(spec, d))


def coupling_cost(spec: ExpiringTreeSpec, j: int, tau: int) -> Fraction:
    """Cost, in units of epsilon, of the coupling for an item at j and releases up to tau.

    Lemma 4.1 shifts the noise of every interval of D = decomposition of [j, tau - B] by
    the item's change; the cost is sum_{I in D} level_cost(level(I)) (0 if tau - B < j).
    It bounds the loss for this (j, tau) and is at most ``expiration(spec, tau - j + 1)``.

    Args:
        spec: the counter's parameters.
        j: the item's step, >= 1.
        tau: the last release, >= j.

    Returns:
        The cost.
    """
    _validate.check_int_ge("j", j, 1)
    _validate.check_int_ge("tau", tau, j)
    last = tau - spec.delay
    if last < j:
        return Fraction(0)
    return sum(
        (level_cost(spec, level) for level, _ in canonical_decomposition(j, last)), Fraction(0)
    )


def canonical_expiration(spec: ExpiringTreeSpec, d: int) -> Fraction:
    """max over j of ``coupling_cost(spec, j, j + d - 1)``, in units of epsilon.

    The paper's "empirical" privacy loss (Andersson et al. (expiration) Sec. 6). [j, j + m - 1] (m =
    d - B) splits at the highest bit where j and j + m differ into a rising run, whose blocks
    are the bits of some r in [1, m], and a falling run with the bits of m - r; every
    split r is realised by some j. So the maximum is max_r w(r) + w(m - r), w(n) the sum
    of level_cost over the bits of n, found by a carry DP over the bits of m in
    O(log m). Not monotone in d (docs/papers.md); ``expiration`` is the monotone bound.

    Args:
        spec: the counter's parameters.
        d: elapsed time >= 1.

    Returns:
        The worst-case canonical cost.
    """
    _validate.check_int_ge("d", d, 1)
    m = d - spec.delay
    if m <= 0:
        return Fraction(0)
    # best[(carry, r_nonzero)] over the bits processed so far; r + f = m.
    best: dict[tuple[int, bool], Fraction] = {(0, False): Fraction(0)}
    for level in range(m.bit_length()):
        bit = m >> level & 1
        weight = level_cost(spec, level)
        nxt: dict[tuple[int, bool], Fraction] = {}
        for (carry, nonzero), value in best.items():
            for r_bit in (0, 1):
                for f_bit in (0, 1):
                    total = r_bit + f_bit + carry
                    if total & 1 != bit:
                        continue
                    key = (total >> 1, nonzero or r_bit == 1)
                    cand = value + weight * (r_bit + f_bit)
                    if key not in nxt or cand > nxt[key]:
                        nxt[key] = cand
        best = nxt
    return best[(0, True)]


def canonical_loss(spec: ExpiringTreeSpec, d: int) -> float:
    """epsilon * canonical_expiration(spec, d), rounded up: the paper's empirical curve."""
    return ceil_float(spec.epsilon * canonical_expiration(spec, d))


def expiration_curve(
    spec: ExpiringTreeSpec, d_max: int, *, canonical: bool = False
) -> tuple[float, ...]:
    """Privacy loss for d = 1..d_max, for an accountant or a dashboard.

    Args:
        spec: the counter's parameters.
        d_max: last elapsed time, >= 1.
        canonical: report the worst-case canonical cost (tighter, not monotone) instead
            of the Theorem 1.2 bound. Both are upper bounds, not measured losses:
            say which one a dashboard shows.

    Returns:
        The losses, index d - 1.
    """
    _validate.check_int_ge("d_max", d_max, 1)
    loss = canonical_loss if canonical else privacy_loss
    return tuple(loss(spec, d) for d in range(1, d_max + 1))
