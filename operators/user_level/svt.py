"""Sparse vector (AboveThreshold) and the continual contribution tracker, Dong-Luo-Yi
Alg. 1, Alg. 4 and App. C-A.

AboveThreshold (Alg. 1) compares sensitivity-1 queries with a noisy threshold
``eta + Z_eta``, Z_eta ~ Lap(2/epsilon), giving every query its own Z_q ~ Lap(4/epsilon), and
stops at the first query with ``Q + Z_q > eta + Z_eta`` (strict '>'). Noise is discrete
Laplace from a NoiseSource under public node ids supplied by the caller: the threshold's
node is ``(*node_prefix, "eta")`` and the query with key q is ``(*node_prefix, "q", q)``.
The production source is keyed (a node's draw is a pure function of the node and its
scale), so nothing noisy is ever stored: the threshold is re-derived whenever it is needed.

The contribution tracker (Alg. 4) runs a series of AboveThreshold instances.
SVT i (i = 1, 2, ...) has budget epsilon_i, failure probability beta_i and candidate bound
tau_i, and at step t asks the discounted query

    Count(D_t, tau_i) - (6/epsilon_i) LOG(2/beta_i) - (8/epsilon_i) LOG(t+1)

against the threshold eta = 0 (discounted with the CURRENT epsilon_i and beta_i, our reading of Alg.
4). When it fires, a NEW SVT i+1 starts with a fresh threshold and re-queries the SAME t, in a
``while`` loop, so tau can double several times in one step. The output tau_t = tau_i is a power of
two.

Series (Alg. 4, App. C-A): epsilon_i = epsilon theta / (i+1)^(1+theta) (original) or
epsilon theta 3^theta / (i+3)^(1+theta) (practical mode: tau_1 = 64); beta_i = beta/(i+1)^2
in both; tau_i = 2^i (original) or 64 * 2^(i-1) (practical). Both epsilon series sum to
less than epsilon (integral bound), the beta series to beta (pi^2/6 - 1) < beta.

Exact budgets: theta is a Fraction; for non-integer theta, (i+1)^(1+theta) is irrational,
so epsilon_i is a Fraction rounded DOWN to 48 significant bits (exact when theta is an
integer). Noise scales are computed from the rounded value: the noise is never smaller
than the series needs, and the exact ledger sums (``series_spent``) stay below the total.

Exact, leak-free comparison: the discount is a float computed from public values only
(epsilon_i, beta_i, t). The test ``count - discount + Z_q > Z_eta`` is evaluated as
``count + Z_q - Z_eta > discount``: an exact integer on the left, compared with the float
by Python's exact int/float comparison. No data-dependent value is ever rounded; the
float's own rounding only moves the public threshold by a data-independent amount, which
is still an AboveThreshold with a public threshold (the proof holds for any public eta).

Privacy:
    Under user-level neighbours (removing all, or any subset, of one user's items),
    Count(D_t, tau) changes by at most 1, and the discounts are data-independent, so SVT i
    is epsilon_i-DP for the whole infinite query sequence (Lemma II.10); adaptive basic
    composition over the series gives sum_i epsilon_i < epsilon for the tracker.

References:
    W. Dong, Q. Luo, K. Yi. Continual Observation under User-level Differential Privacy.
    IEEE S&P 2023. Alg. 1 (SVT), Lemma II.10, Alg. 4, Lemma III.2, Appendix C-A; our reading of
    Alg. 4 in docs/papers.md.
    C. Dwork, A. Roth. The Algorithmic Foundations of Differential Privacy, 2014, Alg. 1
    (AboveThreshold).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import NodeId, NoiseSource, node_bytes

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM_SVT = "above_threshold"
MECHANISM_TRACKER = "contribution_tracker"

MAX_THETA_DENOMINATOR = 1000
"""theta must be a rational with at most this denominator (the q-th root is exact integer
arithmetic whose cost grows with q)."""

PRACTICAL_TAU_START = 64
"""tau_1 in the practical mode of Dong-Luo-Yi App. C-A."""

_ROOT_PRECISION_BITS = 48


# ---------------------------------------------------------------------------------------
# LOG and the two noise scales


def LOG(x: float | Fraction | int) -> float:  # noqa: N802 - the paper's notation
    """The paper's logarithm (Dong-Luo-Yi Sec. II-A, footnote 3): max(1, log2 x).

    Args:
        x: a positive number.

    Returns:
        max(1, log2 x) as a float (log2 of an int or Fraction is taken without overflow).
    """
    if isinstance(x, Fraction):
        value = math.log2(x.numerator) - math.log2(x.denominator)
    else:
        value = math.log2(x)
    return max(1.0, value)


def threshold_scale(epsilon: Fraction) -> Fraction:
    """Scale 2/epsilon of the threshold noise (Alg. 1)."""
    return 2 / Fraction(epsilon)


def query_scale(epsilon: Fraction) -> Fraction:
    """Scale 4/epsilon of every query's noise (Alg. 1)."""
    return 4 / Fraction(epsilon)


def fires(count: int, discount: float | Fraction, query_noise: int, threshold_noise: int) -> bool:
    """The exact AboveThreshold test ``(count - discount) + Z_q > Z_eta``.

    Evaluated as ``count + Z_q - Z_eta > discount``: the left side is an exact integer and
    the right side public, so Python's exact int/float (or int/Fraction) comparison decides
    it without rounding any data-dependent quantity.

    Args:
        count: the integer, sensitivity-1 part of the query (e.g. Count(D_t, tau)).
        discount: the public, data-independent amount subtracted from it, plus the
            public threshold eta.
        query_noise: Z_q, drawn at scale 4/epsilon.
        threshold_noise: Z_eta, drawn at scale 2/epsilon.

    Returns:
        True iff the query is above the noisy threshold (strict).
    """
    return count + query_noise - threshold_noise > discount


# ---------------------------------------------------------------------------------------
# AboveThreshold (Alg. 1)


@dataclass(frozen=True, slots=True)
class AboveThresholdSpec:
    """Public parameters of one AboveThreshold run.

    Attributes:
        epsilon: its budget; the threshold noise has scale 2/epsilon, each query 4/epsilon.
        threshold: the public threshold eta.
        node_prefix: public identity; the threshold node is ``(*node_prefix, "eta")`` and
            the query with key q is ``(*node_prefix, "q", q)``.
    """

    epsilon: Fraction
    threshold: Fraction
    node_prefix: NodeId


@dataclass(frozen=True, slots=True)
class AboveThresholdState:
    """Attributes: queries, the number of queries answered; stopped_at, the 1-based index
    of the query that fired (0 while running). The noisy threshold is not stored."""

    queries: int = 0
    stopped_at: int = 0


def make_above_threshold(
    epsilon: float | Fraction, node_prefix: NodeId, threshold: float | Fraction = 0
) -> AboveThresholdSpec:
    """Validate and build an AboveThresholdSpec.

    Args:
        epsilon: budget > 0 (a decimal is read as the rational it denotes).
        node_prefix: public tuple of str and int fields.
        threshold: public eta.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        epsilon-DP for sensitivity-1 queries, however many are answered before the stop
        (Lemma II.10).
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    eta = _validate.exact_fraction("threshold", threshold)
    prefix = tuple(node_prefix)
    node_bytes(prefix)
    return AboveThresholdSpec(epsilon=eps, threshold=eta, node_prefix=prefix)


def above_threshold_init(spec: AboveThresholdSpec) -> AboveThresholdState:
    return AboveThresholdState()


def threshold_node(spec: AboveThresholdSpec) -> NodeId:
    """Node id of the threshold noise Z_eta."""
    return (*spec.node_prefix, "eta")


def query_node(spec: AboveThresholdSpec, key: int | str) -> NodeId:
    """Node id of the noise of the query with key ``key`` (e.g. the public step t)."""
    return (*spec.node_prefix, "q", key)


def above_threshold_step(
    spec: AboveThresholdSpec,
    state: AboveThresholdState,
    count: int,
    key: int | str,
    noise: NoiseSource,
    discount: float | Fraction = 0,
) -> tuple[AboveThresholdState, bool]:
    """Answer one query Q = count - discount (sensitivity 1 in ``count``).

    Args:
        spec: the run's parameters.
        state: its state.
        count: the data-dependent integer part of the query.
        key: public key of this query; each key must be used once per run (fresh noise).
        noise: the NoiseSource.
        discount: public, data-independent amount subtracted from ``count``.

    Returns:
        (new state, stopped): ``stopped`` is True iff the run has stopped, at this query or
        earlier. A stopped run draws no more noise and answers nothing.
    """
    if state.stopped_at:
        return state, True
    z_eta = noise.discrete_laplace(threshold_node(spec), threshold_scale(spec.epsilon))
    z_q = noise.discrete_laplace(query_node(spec, key), query_scale(spec.epsilon))
    index = state.queries + 1
    stop = fires(count, spec.threshold + discount, z_q, z_eta)
    return AboveThresholdState(queries=index, stopped_at=index if stop else 0), stop


# ---------------------------------------------------------------------------------------
# Budget series (sections 2.4, 2.6, 2.13)


def _iroot_floor(n: int, q: int) -> int:
    """The largest integer m >= 0 with m^q <= n, for n >= 0 and q >= 1 (exact)."""
    if n <= 1:
        return n
    m = 1 << -(-n.bit_length() // q)  # >= n^(1/q): Newton from above ends at the floor
    while True:
        nxt = ((q - 1) * m + n // m ** (q - 1)) // q
        if nxt >= m:
            return m
        m = nxt


@functools.lru_cache(maxsize=8192)
def series_epsilon(total: Fraction, theta: Fraction, index: int, practical: bool) -> Fraction:
    """epsilon_index of a telescoping series whose sum is below ``total``.

    Original: total * theta / (index+1)^(1+theta). Practical (App. C-A):
    total * theta * 3^theta / (index+3)^(1+theta). Exact when theta is an integer; else
    rounded DOWN to a dyadic rational with 48 significant bits.

    Args:
        total: the series' budget (the tracker's epsilon, or epsilon/2 for instances).
        theta: theta > 0, a Fraction.
        index: i >= 1.
        practical: use the shifted practical series.

    Returns:
        epsilon_index as a Fraction, never above the real-valued term.
    """
    _validate.check_int_ge("index", index, 1)
    shift = 3 if practical else 1
    p, q = theta.numerator, theta.denominator
    coefficient = Fraction(total) * theta
    # term = coefficient * (shift^p / (index+shift)^(p+q))^(1/q)
    ratio = Fraction(shift**p, (index + shift) ** (p + q))
    if q == 1:
        return coefficient * ratio
    # Largest m with m / 2^k <= coefficient * ratio^(1/q): m^q <= coefficient^q ratio 2^(kq).
    value = coefficient**q * ratio
    deficit = value.denominator.bit_length() - value.numerator.bit_length() + 1
    k = _ROOT_PRECISION_BITS + max(0, -(-deficit // q))
    return Fraction(_iroot_floor((value.numerator << (k * q)) // value.denominator, q), 1 << k)


@functools.lru_cache(maxsize=4096)
def series_spent(total: Fraction, theta: Fraction, count: int, practical: bool) -> Fraction:
    """Exact sum of epsilon_1..epsilon_count of ``series_epsilon`` (0 for count = 0)."""
    _validate.check_int_ge("count", count, 0)
    return sum(
        (series_epsilon(total, theta, i, practical) for i in range(1, count + 1)), Fraction(0)
    )


def telescoping_epsilon(total: Fraction, index: int) -> Fraction:
    """epsilon_index = total / (index (index+1)), exact: the telescoping series whose first n
    terms sum to total * n / (n+1) < total, and whose first term is total / 2.

    Args:
        total: the series' budget.
        index: i >= 1.

    Returns:
        epsilon_index as an exact Fraction.
    """
    _validate.check_int_ge("index", index, 1)
    return Fraction(total) / (index * (index + 1))


def telescoping_spent(total: Fraction, count: int) -> Fraction:
    """Exact sum of the first ``count`` telescoping terms: total * count / (count + 1)."""
    _validate.check_int_ge("count", count, 0)
    return Fraction(total) * count / (count + 1)


SERIES_DLY = "dly"
"""Dong-Luo-Yi's series (``series_epsilon``: theta, the practical shift)."""
SERIES_TELESCOPING = "telescoping"
"""total / (i (i+1)) (``telescoping_epsilon``): half the budget to the first term."""
SERIES = (SERIES_DLY, SERIES_TELESCOPING)


def term(total: Fraction, theta: Fraction, index: int, practical: bool, series: str) -> Fraction:
    """epsilon_index of ``series`` (``SERIES``) with budget ``total``."""
    if series == SERIES_TELESCOPING:
        return telescoping_epsilon(total, index)
    return series_epsilon(total, theta, index, practical)


def spent(total: Fraction, theta: Fraction, count: int, practical: bool, series: str) -> Fraction:
    """Exact sum of the first ``count`` terms of ``series`` (below ``total``)."""
    if series == SERIES_TELESCOPING:
        return telescoping_spent(total, count)
    return series_spent(total, theta, count, practical)


def series_beta(total: Fraction, index: int) -> Fraction:
    """beta_index = total / (index+1)^2 (both modes, App. C-A); sums to < total."""
    _validate.check_int_ge("index", index, 1)
    return Fraction(total) / (index + 1) ** 2


def beta_spent(total: Fraction, count: int) -> Fraction:
    """Exact sum of beta_1..beta_count."""
    _validate.check_int_ge("count", count, 0)
    return sum((series_beta(total, i) for i in range(1, count + 1)), Fraction(0))


# ---------------------------------------------------------------------------------------
# Continual contribution tracker (Alg. 4)


@dataclass(frozen=True, slots=True)
class ContributionTrackerSpec:
    """Public parameters of the tracker.

    Attributes:
        name: public identity; SVT i uses nodes ``(name, "svt", i, "eta")`` and
            ``(name, "svt", i, "q", t)``.
        epsilon: the tracker's whole budget (Alg. 5 passes epsilon/2).
        beta: its failure probability (Alg. 5 passes beta/2).
        theta: theta > 0, shape of the series.
        practical: App. C-A mode (tau_1 = 64, shifted epsilon series).
        forced_schedule: TEST HOOK. Change points ((t_1, tau_1), (t_2, tau_2), ...): when
            non-empty, tau_t is the tau of the last change point with t_k <= t (tau_1 of
            the series before the first), no noise is drawn and no data is read. NOT
            private; empty in production.
        series: the epsilon series of the SVTs (``SERIES``): Dong-Luo-Yi's (theta,
            practical shift) or the telescoping one.
        start_exponent: log2 tau_1; 0 means the paper's (1, or 6 in practical mode).
        growth: log2 of the factor tau grows by when an SVT fires (1: doubling, Alg. 4).
        discount_scale: the public discount of every query is multiplied by it (1: Alg. 4's
            (6/epsilon_i) LOG(2/beta_i) + (8/epsilon_i) LOG(t+1)). Any public,
            data-independent threshold keeps each SVT epsilon_i-DP (Lemma II.10); it only
            moves the utility bound (how early tau grows).
    """

    name: str
    epsilon: Fraction
    beta: Fraction
    theta: Fraction
    practical: bool = False
    forced_schedule: tuple[tuple[int, int], ...] = ()
    series: str = SERIES_DLY
    start_exponent: int = 0
    growth: int = 1
    discount_scale: Fraction = Fraction(1)


@dataclass(frozen=True, slots=True)
class ContributionTrackerState:
    """Attributes: t, the last step taken (0 before the first); svt_index, the index i of
    the running SVT. Its noisy threshold is re-derived from the keyed NoiseSource."""

    t: int = 0
    svt_index: int = 1


def make_contribution_tracker(
    name: str,
    epsilon: float | Fraction,
    beta: float | Fraction,
    theta: float | Fraction = 1,
    *,
    practical: bool = False,
    forced_schedule: Sequence[tuple[int, int]] = (),
    series: str = SERIES_DLY,
    start_exponent: int = 0,
    growth: int = 1,
    discount_scale: float | Fraction = 1,
) -> ContributionTrackerSpec:
    """Validate and build a ContributionTrackerSpec.

    Args:
        name: public identity of the tracker (prefix of every node id).
        epsilon: the tracker's budget > 0.
        beta: its failure probability in (0, 1).
        theta: theta > 0, a rational with denominator <= 1000.
        practical: Dong-Luo-Yi App. C-A mode.
        forced_schedule: test hook, see ContributionTrackerSpec.
        series: the SVTs' epsilon series, one of ``SERIES``.
        start_exponent: log2 tau_1 in [0, 40] (0: the paper's start).
        growth: log2 of tau's growth factor, in [1, 8].
        discount_scale: factor > 0 of the public discount.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        sum_i epsilon_i < epsilon under user-level neighbours (Count has sensitivity 1).
    """
    if not isinstance(name, str):
        raise _validate.invalid("name", "a str", name)
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    b = _validate.exact_fraction("beta", beta)
    _validate.check_probability("beta", b)
    th = _validate.exact_fraction("theta", theta)
    _validate.check_positive("theta", th)
    if th.denominator > MAX_THETA_DENOMINATOR:
        raise _validate.invalid(
            "theta", f"a rational with denominator <= {MAX_THETA_DENOMINATOR}", theta
        )
    if not isinstance(practical, bool):
        raise _validate.invalid("practical", "a bool", practical)
    if series not in SERIES:
        raise _validate.invalid("series", " or ".join(SERIES), series)
    _validate.check_int_ge("start_exponent", start_exponent, 0)
    if start_exponent > 40:
        raise _validate.invalid("start_exponent", "<= 40", start_exponent)
    _validate.check_int_ge("growth", growth, 1)
    if growth > 8:
        raise _validate.invalid("growth", "<= 8", growth)
    scale = _validate.exact_fraction("discount_scale", discount_scale)
    _validate.check_positive("discount_scale", scale)
    first = start_exponent or (PRACTICAL_TAU_START.bit_length() - 1 if practical else 1)
    schedule = tuple((t, tau) for t, tau in forced_schedule)
    start = 1 << first
    last_t, last_tau = 0, start
    for t, tau in schedule:
        _validate.check_int_ge("forced_schedule step", t, last_t + 1)
        _validate.check_int_ge("forced_schedule tau", tau, last_tau)
        if tau & (tau - 1):
            raise _validate.invalid("forced_schedule tau", "a power of two", tau)
        if (tau.bit_length() - 1 - first) % growth:
            raise _validate.invalid("forced_schedule tau", "a tau_i of the series", tau)
        last_t, last_tau = t, tau
    return ContributionTrackerSpec(
        name=name,
        epsilon=eps,
        beta=b,
        theta=th,
        practical=practical,
        forced_schedule=schedule,
        series=series,
        start_exponent=start_exponent,
        growth=growth,
        discount_scale=scale,
    )


def tracker_init(spec: ContributionTrackerSpec) -> ContributionTrackerState:
    return ContributionTrackerState()


def epsilon_i(spec: ContributionTrackerSpec, i: int) -> Fraction:
    """epsilon_i of SVT i (rounded down when theta is not an integer)."""
    return term(spec.epsilon, spec.theta, i, spec.practical, spec.series)


def beta_i(spec: ContributionTrackerSpec, i: int) -> Fraction:
    """beta_i = beta / (i+1)^2 of SVT i."""
    return series_beta(spec.beta, i)


def _first_exponent(spec: ContributionTrackerSpec) -> int:
    if spec.start_exponent:
        return spec.start_exponent
    return 6 if spec.practical else 1


def tau_exponent(spec: ContributionTrackerSpec, i: int) -> int:
    """log2 tau_i: i (original), i + 5 (practical, tau_1 = 64), in general
    start_exponent + growth (i - 1)."""
    _validate.check_int_ge("i", i, 1)
    return _first_exponent(spec) + spec.growth * (i - 1)


def tau_i(spec: ContributionTrackerSpec, i: int) -> int:
    """tau_i, the candidate bound of SVT i: 2^i or 64 * 2^(i-1) (doubling)."""
    return 1 << tau_exponent(spec, i)


def tau_start(spec: ContributionTrackerSpec) -> int:
    """tau_1: 2, or 64 in practical mode, or 2^start_exponent."""
    return tau_i(spec, 1)


def svt_index_of(spec: ContributionTrackerSpec, tau: int) -> int:
    """The i with tau_i = tau (tau one of the series' bounds)."""
    above = tau.bit_length() - 1 - _first_exponent(spec)
    i = above // spec.growth + 1
    if above < 0 or tau_i(spec, i) != tau:
        every = "" if spec.growth == 1 else f", 2^{spec.growth} times the one before"
        raise _validate.invalid("tau", f"a power of two >= {tau_start(spec)}{every}", tau)
    return i


def discount(spec: ContributionTrackerSpec, i: int, t: int) -> float:
    """(6/epsilon_i) LOG(2/beta_i) + (8/epsilon_i) LOG(t+1): the public discount of SVT i at t.

    Computed in floating point from public values only (see the module docstring).
    """
    plan = _plan(spec, i)
    return plan.constant + plan.per_log * LOG(t + 1)


def guaranteed_stop_level(spec: ContributionTrackerSpec, i: int, t: int) -> float:
    """(12/epsilon_i) LOG(2/beta_i) + (16/epsilon_i) LOG(t+1) = 2 * discount: once
    Count(D_t, tau_i) reaches it, SVT i has stopped by t with probability >= 1 - beta_i
    (proof of Lemma III.2)."""
    return 2 * discount(spec, i, t)


def tracker_threshold_node(spec: ContributionTrackerSpec, i: int) -> NodeId:
    """(name, "svt", i, "eta"): the threshold noise of SVT i."""
    return (spec.name, "svt", i, "eta")


def tracker_query_node(spec: ContributionTrackerSpec, i: int, t: int) -> NodeId:
    """(name, "svt", i, "q", t): SVT i's query noise at step t."""
    return (spec.name, "svt", i, "q", t)


def svt_spec(spec: ContributionTrackerSpec, i: int) -> AboveThresholdSpec:
    """SVT i as an AboveThresholdSpec: epsilon_i, eta = 0, prefix (name, "svt", i)."""
    return _plan(spec, i).svt


@dataclass(frozen=True, slots=True)
class _SvtPlan:
    """Everything public about SVT i, computed once (Fraction arithmetic is slow)."""

    svt: AboveThresholdSpec
    exponent: int
    eta_node: NodeId
    eta_scale: Fraction
    query_scale: Fraction
    constant: float  # (6/epsilon_i) LOG(2/beta_i), times the discount scale
    per_log: float  # 8/epsilon_i, times the discount scale


_PLANS: dict[int, tuple[ContributionTrackerSpec, dict[int, _SvtPlan]]] = {}
_MAX_PLANNED_SPECS = 64


def _plan(spec: ContributionTrackerSpec, i: int) -> _SvtPlan:
    # Keyed by identity (hashing a spec hashes its Fractions, the tracker's hot spot); the
    # entry holds the spec itself, so its id cannot be reused while the entry exists.
    entry = _PLANS.get(id(spec))
    if entry is None or entry[0] is not spec:
        if len(_PLANS) >= _MAX_PLANNED_SPECS:
            del _PLANS[next(iter(_PLANS))]
        entry = (spec, {})
        _PLANS[id(spec)] = entry
    plan = entry[1].get(i)
    if plan is None:
        eps = epsilon_i(spec, i)
        svt = AboveThresholdSpec(
            epsilon=eps, threshold=Fraction(0), node_prefix=(spec.name, "svt", i)
        )
        inv = float(spec.discount_scale) / float(eps)
        plan = _SvtPlan(
            svt=svt,
            exponent=tau_exponent(spec, i),
            eta_node=threshold_node(svt),
            eta_scale=threshold_scale(eps),
            query_scale=query_scale(eps),
            constant=6 * inv * LOG(2 / beta_i(spec, i)),
            per_log=8 * inv,
        )
        entry[1][i] = plan
    return plan


def count_at(crossings: Sequence[int], exponent: int) -> int:
    """Count(D_t, 2^exponent) = G[exponent]; a missing entry is 0."""
    return crossings[exponent] if exponent < len(crossings) else 0


def forced_tau(spec: ContributionTrackerSpec, t: int) -> int:
    """tau_t under the forced schedule (test hook)."""
    tau = tau_start(spec)
    for start, value in spec.forced_schedule:
        if start > t:
            break
        tau = value
    return tau


def tracker_step(
    spec: ContributionTrackerSpec,
    state: ContributionTrackerState,
    t: int,
    crossings: Sequence[int],
    noise: NoiseSource,
) -> tuple[ContributionTrackerState, int]:
    """One step of Alg. 4: decide tau_t from D_t.

    Args:
        spec: the tracker's parameters.
        state: its state after step t - 1.
        t: the public step, state.t + 1.
        crossings: the cumulative G, G[j] = |{u : c_u(t) > 2^j}| = Count(D_t, 2^j) on the
            ORIGINAL stream (missing j means 0).
        noise: the NoiseSource (keyed in production).

    Returns:
        (new state, tau_t), tau_t = tau_i of the SVT running after this step.

    Raises:
        InvalidOperatorConfig: ``t`` is not state.t + 1 (a caller bug, not data-dependent).
    """
    if t != state.t + 1:
        raise _validate.invalid("t", f"the next step {state.t + 1}", t)
    if spec.forced_schedule:
        tau = forced_tau(spec, t)
        return ContributionTrackerState(t=t, svt_index=svt_index_of(spec, tau)), tau
    i = state.svt_index
    log_t = LOG(t + 1)
    while True:
        # SVT i's AboveThreshold step (the same nodes and test as above_threshold_step,
        # inlined: this runs at every tick). The threshold node is fixed per SVT, the
        # query node is fresh at every (SVT, t).
        plan = _plan(spec, i)
        count = count_at(crossings, plan.exponent)
        z_eta = noise.discrete_laplace(plan.eta_node, plan.eta_scale)
        z_q = noise.discrete_laplace(query_node(plan.svt, t), plan.query_scale)
        if not fires(count, plan.constant + plan.per_log * log_t, z_q, z_eta):
            break
        i += 1  # a NEW SVT with a fresh threshold re-queries the same D_t (Alg. 4, our reading)
    return ContributionTrackerState(t=t, svt_index=i), tau_i(spec, i)


def spent_epsilon(spec: ContributionTrackerSpec, state: ContributionTrackerState) -> Fraction:
    """Exact epsilon committed so far: sum of epsilon_1..epsilon_i over the SVTs started
    (the running one included); 0 before the first step."""
    svts = state.svt_index if state.t else 0
    return spent(spec.epsilon, spec.theta, svts, spec.practical, spec.series)


def spent_beta(spec: ContributionTrackerSpec, state: ContributionTrackerState) -> Fraction:
    """Exact sum of beta_1..beta_i over the SVTs started (0 before the first step)."""
    return beta_spent(spec.beta, state.svt_index if state.t else 0)
