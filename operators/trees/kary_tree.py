"""k-ary tree counters, with and without subtraction, on an infinite stream
(Andersson-Pagh-Torkamani).

Andersson-Pagh-Torkamani (arXiv:2408.07021) release the running count S(t) of a stream of
known length T as S(t) plus the noise of a few nodes of a complete k-ary tree of height
h = h(T). Alg. 1 adds up to k - 1 left children per level (the digits of t in base k);
Alg. 2 (odd k) uses balanced digits in [-m, m], m = (k - 1) / 2, so it adds the parent and
*subtracts* right-most children instead of adding many left ones; for even k the same
algorithm runs with digits in [-k/2 + 1, k/2] (App. A.3; about 1/(1 - 1/k^2)
worse than odd k, so not the default). Every node has
Laplace scale h * sensitivity / epsilon; a release at t uses w(t) = ||digits of t||_1 nodes.

**Infinite streams (our choice; the paper only says a standard reduction applies).** Time is
cut into periods, in the same way as the binary tree of ``tree_counter`` (Dong-Luo-Yi
Alg. 2). Period p = 0, 1, 2, ... covers the k^p global steps
t in [g_p, g_p + k^p - 1], g_p = 1 + (k^p - 1) / (k - 1), and runs the paper's algorithm
verbatim for horizon T_p = k^p, on its own leaves, with the whole epsilon:

* both height rules (Alg. 1 and Alg. 2) give h_p = p + 1 at T = k^p, so every node of
  period p has scale (p + 1) * sensitivity / epsilon, exactly the paper's h / epsilon;
* k^p has the digit vector (0, ..., 0, 1) in both digit systems, so the release at the
  period's last step is ONE node, [1, k^p] at level p + 1. That node is the period's
  noisy total: later periods add it under the same node id, so its noise is re-derived,
  never redrawn, and it costs no extra budget (it is one of the period's own h_p levels);
* for k = 2 without subtraction this is node for node the binary scheme of
  ``tree_counter`` (periods [2^l, 2^(l+1) - 1], scale (l + 1) / epsilon, top node = total).

So a release in period p, at the period's local step tau, is

    M_t = S(t) + sum_{q < p} z(total of q) + sum_{nodes of walk(tau)} sign * z(node),
    Var(M_t) = sum_{q < p} V(b_q) + w_p(tau) * V(b_p),  b_q = (q + 1) * sensitivity / eps,

with V the discrete Laplace variance (or 2 b^2 for the paper's continuous Laplace).

Alternatives we rejected (exact MSE, our formulas from Lemmas 3.5 and 4.7, k = 19 with subtraction,
300 horizons T in [10^2, 10^12]): (a) periods of full capacity (k^h - 1) / 2 closed by
the otherwise unused root as the total: an extra level, so scale (h + 1) / epsilon for
the whole period; at best 1.5% better, 8% worse on average, up to 49% worse, and no
binary-tree equivalence; (b) full-capacity periods carrying their last release
(w = h * m nodes) as the total: the carried variance grows like log(t)^4, 1.7 times worse
at T = 10^6 and 3.3 times at 10^9; (c) a configured horizon T with a fresh tree on
overrun: it needs T up front, and the overrun needs a scheme like this one
anyway. The price of not knowing T: at T = 10^6 this mechanism's MSE is 1.42 times that
of the paper's tree built for exactly T = 10^6 (1.06 times at 10^9); binary pays 1.36
times for the same doubling (``docs/kary-mse.md``).

**Noise.** Nothing random is stored. A node is named
``(*node_prefix, mechanism, k, period, level, index)``, with level 1 the leaves and
``index`` the 0-based position of the node [index * k^(level-1) + 1, (index+1) * k^(level-1)]
in the period's local time; mechanism and k are part of the name so that two counters
of different shape under one prefix never share noise (differencing them would cancel it). Each
release asks the NoiseSource for every node it uses; a keyed source re-derives the same value after
a replay (a node's noise is shared by all its releases, never redrawn), and ``CachedNoise`` makes
the repeated asks cheap.

**Streaming cost (Sec. 4.3, Lemma 4.12).** The state is (t, S(t)): the digits and the
node walk are recomputed from t at each step in O(k log t) integer operations (the
simplest correct streaming form), which the release itself costs anyway,
since it re-reads the noise of its w(t) <= h * (k - 1) nodes. The live noise values are
P(t) plus one total per completed period, O(k log t); each node is drawn once (it is
used on one contiguous run of steps, Prop. 4.10), so with ``CachedNoise`` the new draws
per step are amortized O(1).

References:
    J. D. Andersson, R. Pagh, T. A. Steiner, S. Torkamani. Count on Your Elders: Laplace
    vs Gaussian Noise. FORC 2025, LIPIcs 329, paper 10; arXiv:2408.07021 (earlier title:
    Improved Counting under Continual Observation with Pure Differential Privacy).
    Alg. 1, Alg. 2, Alg. 3, Lemmas 3.3, 3.5, 4.5, 4.7, Cor. 4.9, Sec. 4.3; our corrections
    in docs/papers.md.
    T.-H. H. Chan, E. Shi, D. Song. Private and continual release of statistics.
    ACM TISSEC 2011 (periods of growing length for unknown T).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from .. import _validate
from ..noise import (
    NodeId,
    NoiseSource,
    Term,
    TreeRelease,
    discrete_laplace_variance,
    noise_std,
    noisy_release,
)

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM_ADD = "kary_tree"
MECHANISM_SUBTRACT = "kary_tree_subtract"

# The chooser's search range. The per-level weight grows linearly in k while the height
# shrinks only like 1/log k: searching k <= 200 over horizons 1..200 and 400 log-spaced ones
# up to 10^12, the best k never exceeded 29.
CHOOSER_MAX_K = 64
# What the chooser picks: the config's names of the counters it compares.
ChosenTree = Literal["binary", "kary", "kary_subtract"]
# The horizons an unbounded stream's chooser weighs: 41 log-spaced T from 10^3 to 10^8.
UNBOUNDED_HORIZONS: tuple[int, ...] = tuple(round(10 ** (3 + i / 8)) for i in range(41))


@dataclass(frozen=True, slots=True)
class KaryTreeSpec:
    """Public parameters of one k-ary tree counter.

    Attributes:
        epsilon: budget of the whole infinite stream.
        sensitivity: largest sum_t |x_t - x'_t| between neighbouring leaf streams (1 for
            event level, tau after truncation to tau units per user).
        node_prefix: public identity of this counter, e.g. (statistic, instance); it
            prefixes every node id so two counters never share noise.
        k: arity of the tree.
        subtract: False for Alg. 1 (digits 0..k-1), True for Alg. 2 (odd k, balanced
            digits -m..m, subtracted nodes).
    """

    epsilon: Fraction
    sensitivity: int
    node_prefix: NodeId
    k: int
    subtract: bool


@dataclass(frozen=True, slots=True)
class KaryTreeState:
    """Exact counts only (no noise). Plain ints: serializable as it is.

    Attributes:
        t: number of time steps taken so far.
        total: exact running sum S(t) of the leaves (sensitive: never publish it).
    """

    t: int = 0
    total: int = 0


def make_kary_tree(
    epsilon: float | Fraction,
    sensitivity: int,
    node_prefix: NodeId,
    k: int,
    subtract: bool,
) -> KaryTreeSpec:
    """Validate the parameters and build a KaryTreeSpec.

    Args:
        epsilon: budget of the whole stream; a float is read as the decimal it prints
            as (0.1 is 1/10).
        sensitivity: integer >= 1, see KaryTreeSpec.
        node_prefix: tuple of str and int.
        k: arity; >= 2 without subtraction, odd and >= 3 with it.
        subtract: use Alg. 2 (balanced digits) instead of Alg. 1.

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range or of the wrong kind.

    Privacy:
        epsilon-DP for neighbouring leaf streams x, x' with sum_t |x_t - x'_t| <=
        ``sensitivity`` (event level with sensitivity 1; user level after truncation).
        A leaf of period p lies in exactly h_p = p + 1 of the nodes that period can use,
        one per level 1..h_p (the root, level h_p + 1, is never used: Lemmas 3.3, 4.5),
        and every node of period p has discrete Laplace scale h_p * sensitivity /
        epsilon. A unit of change at any leaf therefore moves the noisy node vector by
        h_p units at that scale: privacy loss epsilon / sensitivity per unit, whatever
        its period, so at most epsilon in total. Releases are post-processing of the
        noisy nodes (Alg. 2 has the output distribution of Alg. 3, Prop. 4.3).

    References:
        Andersson-Pagh-Torkamani Alg. 1 and 2, Lemmas 3.3 and 4.5; App. A.3.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("sensitivity", sensitivity, 1)
    if not isinstance(subtract, bool):
        raise _validate.invalid("subtract", "a bool", subtract)
    _validate.check_int_ge("k", k, 2)
    if subtract and k < 3:
        # Odd k: Alg. 2's balanced digits; even k: App. A.3's digits in [-k/2 + 1, k/2]
        # (Andersson-Pagh-Torkamani App. A.3). k = 2 would be Alg. 1 under another name.
        raise _validate.invalid("k", ">= 3 when subtract is True", k)
    if not isinstance(node_prefix, (tuple, list)) or not all(
        isinstance(v, (str, int)) and not isinstance(v, bool) for v in node_prefix
    ):
        raise _validate.invalid("node_prefix", "a tuple of str and int", node_prefix)
    return KaryTreeSpec(
        epsilon=eps, sensitivity=sensitivity, node_prefix=tuple(node_prefix), k=k, subtract=subtract
    )


def mechanism(spec: KaryTreeSpec) -> str:
    """The release's mechanism name: MECHANISM_SUBTRACT for Alg. 2, else MECHANISM_ADD."""
    return MECHANISM_SUBTRACT if spec.subtract else MECHANISM_ADD


def init(spec: KaryTreeSpec) -> KaryTreeState:
    """The state before the first step."""
    return KaryTreeState()


def step(
    spec: KaryTreeSpec, state: KaryTreeState, weight: int, noise: NoiseSource
) -> tuple[KaryTreeState, TreeRelease]:
    """Advance one public time step with leaf weight ``weight`` (0 on an empty tick).

    Args:
        spec: the counter's parameters.
        state: the state after the previous step.
        weight: this step's leaf value, an int (already truncated).
        noise: where node noise comes from (keyed in production).

    Returns:
        The new state and the release S(t) + noise of the nodes ``release_terms(spec, t)``.

    Privacy:
        See ``make_kary_tree``. The nodes used depend on t only; S(t) is exact.

    References:
        Alg. 2 line 14 (output S(t) + noise); Sec. 4.3.
    """
    new_state = KaryTreeState(t=state.t + 1, total=state.total + weight)
    release = noisy_release(new_state.t, new_state.total, release_terms(spec, new_state.t), noise)
    return new_state, release


def exact_value(state: KaryTreeState) -> int:
    """The exact (truncated) running count the tree holds."""
    return state.total


# ---------------------------------------------------------------------------------------
# Public structure: periods, nodes, scales


def period_of(k: int, t: int) -> tuple[int, int]:
    """(p, tau): global step t >= 1 is the tau-th step (1-based) of period p.

    Period p has k^p steps and starts at g_p = 1 + (k^p - 1) / (k - 1); for k = 2,
    p = floor(log2 t) and g_p = 2^p (the binary mechanism's periods, tree_counter).
    """
    _validate.check_int_ge("t", t, 1)
    if k == 2:
        period = t.bit_length() - 1
        return period, t - (1 << period) + 1
    period, start, length = 0, 1, 1
    while t >= start + length:
        start += length
        length *= k
        period += 1
    return period, t - start + 1


def node_scale(spec: KaryTreeSpec, period: int) -> Fraction:
    """Discrete Laplace scale of every node of ``period``: h_p * sensitivity / epsilon."""
    return Fraction((period + 1) * spec.sensitivity) / spec.epsilon


def release_terms(spec: KaryTreeSpec, t: int) -> list[Term]:
    """The noisy nodes, scales and signs whose sum is the noise of the release at t.

    The totals of periods 0..p-1 (each the top node [1, k^q] at level q + 1 of its
    period, sign +1), then the nodes of the walk of tau in period p's tree, most
    significant level first. Public: depends on (spec, t) only.

    Args:
        spec: the counter's parameters.
        t: the global step, >= 1.

    Returns:
        The terms (node id, scale, sign).

    References:
        Alg. 2 lines 6-13 and Alg. 3 lines 11-16 (the walk).
    """
    period, tau = period_of(spec.k, t)
    prefix = (*spec.node_prefix, mechanism(spec), spec.k)
    terms: list[Term] = [((*prefix, q, q + 1, 0), node_scale(spec, q), 1) for q in range(period)]
    scale = node_scale(spec, period)
    height = period + 1
    for level, index, sign in _walk(_digits(tau, spec.k, spec.subtract, height), spec.k):
        terms.append(((*prefix, period, level, index), scale, sign))
    return terms


def std(spec: KaryTreeSpec, t: int) -> float:
    """Exact standard deviation of the release at step t (discrete Laplace noise)."""
    return noise_std(release_terms(spec, t))


def variance(spec: KaryTreeSpec, t: int, continuous: bool = False) -> float:
    """Exact variance of the release at step t, from public parameters only.

    Var(M_t) = sum_{q < p} V(b_q) + w_p(tau) * V(b_p) (module docstring).

    Args:
        spec: the counter's parameters.
        t: the global step, >= 1.
        continuous: False for the discrete Laplace noise the releases carry,
            V(b) = 2 e^(-1/b) / (1 - e^(-1/b))^2; True for the paper's continuous
            Laplace, V(b) = 2 b^2 (computed exactly, then rounded once to float).

    Returns:
        The variance.

    References:
        Lemmas 3.5 and 4.7 (our exact form for any T); Laplace variance 2 b^2.
    """
    period, tau = period_of(spec.k, t)
    weight = sum(abs(d) for d in _digits(tau, spec.k, spec.subtract, period + 1))
    node_var = _node_variances(spec, period, continuous)
    return float(sum(node_var[:period]) + weight * node_var[period])


def mse(spec: KaryTreeSpec, horizon: int, continuous: bool = False) -> float:
    """Exact mean squared error (1/T) sum_{t=1..T} Var(M_t) over steps 1..horizon.

    Computed per period with our O(hk) digit-count formula for sum_tau w(tau), so
    it costs O(k log(T)^2) integer operations even for T = 10^12.

    Args:
        spec: the counter's parameters.
        horizon: T >= 1.
        continuous: see ``variance``.

    Returns:
        The MSE (same unit as the squared counts).

    References:
        Lemmas 3.5 and 4.7, our exact form (W(T) via cnt_j).
    """
    return errors(spec, (horizon,), continuous)[0][0]


def max_variance(spec: KaryTreeSpec, horizon: int, continuous: bool = False) -> float:
    """Exact largest variance max_{t=1..T} Var(M_t) of the releases at steps 1..horizon.

    Period p's releases have variance sum_{q < p} V(b_q) + w_p(tau) V(b_p), so the largest
    is, over the periods reached, the carried variance plus the largest digit weight of
    the steps reached times V(b_p) (``max_weight``). O(log(T)^2) operations.

    Args:
        spec: the counter's parameters.
        horizon: T >= 1.
        continuous: see ``variance``.

    Returns:
        The largest variance (same unit as the squared counts).

    References:
        Lemmas 3.5 and 4.7 (the per-step variance); the maximum is our exact form.
    """
    return errors(spec, (horizon,), continuous)[0][1]


def errors(
    spec: KaryTreeSpec, horizons: Sequence[int], continuous: bool = False
) -> list[tuple[float, float]]:
    """(``mse``, ``max_variance``) at each of ``horizons`` (ascending), in one walk over
    the periods: the sums over the periods completed before a horizon are shared.

    Args:
        spec: the counter's parameters.
        horizons: T_1 <= T_2 <= ..., each >= 1.
        continuous: see ``variance``; then every sum is an exact integer times
            2 (sensitivity / epsilon)^2, rounded once to float.

    Returns:
        One (MSE, largest variance) pair per horizon.
    """
    for horizon in horizons:
        _validate.check_int_ge("horizon", horizon, 1)
    if list(horizons) != sorted(horizons):
        raise _validate.invalid("horizons", "ascending", horizons)
    k, subtract = spec.k, spec.subtract
    last, _ = period_of(k, horizons[-1])
    factor: Fraction | int = 1
    node_var: list = [discrete_laplace_variance(node_scale(spec, p)) for p in range(last + 1)]
    if continuous:  # 2 b_p^2 = (p + 1)^2 * 2 (sensitivity / epsilon)^2
        factor = 2 * (spec.sensitivity / spec.epsilon) ** 2
        node_var = [(p + 1) ** 2 for p in range(last + 1)]
    out = []
    total, carried, best = 0, 0, 0  # over the completed periods
    period, start, length = 0, 1, 1
    for horizon in horizons:
        while horizon >= start + length:  # period ``period`` ends before ``horizon``
            height, var = period + 1, node_var[period]
            total += length * carried + weight_sum(k, subtract, height, length) * var
            best = max(best, carried + max_weight(k, subtract, height, length) * var)
            carried += var
            start, length, period = start + length, length * k, period + 1
        steps, height, var = horizon - start + 1, period + 1, node_var[period]
        squares = total + steps * carried + weight_sum(k, subtract, height, steps) * var
        largest = max(best, carried + max_weight(k, subtract, height, steps) * var)
        out.append((float(squares * factor / horizon), float(largest * factor)))
    return out


def _node_variances(spec: KaryTreeSpec, last: int, continuous: bool) -> list:
    """Variance of one node of each period 0..last (Fractions if continuous, else floats)."""
    scales = [node_scale(spec, p) for p in range(last + 1)]
    if continuous:
        return [2 * b * b for b in scales]
    return [discrete_laplace_variance(b) for b in scales]


# ---------------------------------------------------------------------------------------
# Andersson-Pagh-Torkamani's single tree (the building block of each period; also the paper's
# numbers)


def tree_height(k: int, subtract: bool, horizon: int) -> int:
    """Height h of the paper's tree for a stream of known length T (integer loop).

    Alg. 1: the smallest h with k^h - 1 >= T. Alg. 2: the smallest h with
    (k^h - 1) / 2 >= T. No floating logs: they fail just above powers of k.
    """
    _validate.check_int_ge("horizon", horizon, 1)
    height = 0
    while tree_capacity(k, subtract, height) < horizon:
        height += 1
    return height


def tree_capacity(k: int, subtract: bool, height: int) -> int:
    """T_cap: the largest t with a digit vector of ``height`` digits.

    Alg. 1: k^h - 1. With subtraction the lowest digit is -c, c = (k - 1) // 2, and the
    digits of t are the standard digits of t + c (k^h - 1) / (k - 1), minus c; so
    T_cap = (k^h - 1) - c (k^h - 1) / (k - 1): (k^h - 1) / 2 for odd k (Alg. 2) and
    k (k^h - 1) / (2 (k - 1)) for even k (App. A.3, digits in [-k/2 + 1, k/2]).
    """
    if not subtract:
        return k**height - 1
    return k**height - 1 - (k - 1) // 2 * ((k**height - 1) // (k - 1))


def weight_sum(k: int, subtract: bool, height: int, n: int) -> int:
    """W(n) = sum_{t=1..n} w(t), w(t) = ||digits of t in ``height`` digits||_1.

    With c the magnitude of the lowest digit (0 for Alg. 1, m for Alg. 2) and
    M = c (k^h - 1) / (k - 1), digit l of t is the standard digit l of t + M, minus c; so
    W(n) = sum_l (D_l(n + M + 1) - D_l(M + 1)), where D_l(N) = sum_{n' < N} |s_l(n') - c|
    over the standard digit s_l (``_digit_cost``). O(h) operations.

    Args:
        k: arity.
        subtract: balanced digits (odd k) if True.
        height: number of digits h.
        n: 0 <= n <= tree_capacity(k, subtract, height).

    Returns:
        The integer W(n).

    References:
        Our exact form of Lemmas 3.5 and 4.7 (fast W(T)).
    """
    if not 0 <= n <= tree_capacity(k, subtract, height):
        raise _validate.invalid("n", f"in [0, {tree_capacity(k, subtract, height)}]", n)
    low = (k - 1) // 2 if subtract else 0
    offset = low * (k**height - 1) // (k - 1)
    return sum(
        _digit_cost(k, level, low, n + offset + 1) - _digit_cost(k, level, low, offset + 1)
        for level in range(1, height + 1)
    )


def max_weight(k: int, subtract: bool, height: int, n: int) -> int:
    """max_{t=1..n} w(t), w(t) = ||digits of t in ``height`` digits||_1, in O(height).

    As in ``weight_sum``, digit l of t is the standard digit l of N = t + M minus c, so
    this is the largest sum_l |s_l(N) - c| over N in [M + 1, M + n]. Below the leading
    digit where the two bounds differ, a number either takes a digit strictly between
    theirs (and then any digits below), or follows one bound down to some position, leaves
    it there for a digit beyond it (any digits below), or equals the bound. The largest
    |v - c| over a digit range [a, b] is max(|a - c|, |b - c|).

    Args:
        k: arity.
        subtract: balanced digits (odd k) if True.
        height: number of digits h.
        n: 1 <= n <= tree_capacity(k, subtract, height).

    Returns:
        The largest weight.

    References:
        Our exact form (docs/kary-mse.md, "unbounded streams").
    """
    if not 1 <= n <= tree_capacity(k, subtract, height):
        raise _validate.invalid("n", f"in [1, {tree_capacity(k, subtract, height)}]", n)
    low = (k - 1) // 2 if subtract else 0
    offset = low * (k**height - 1) // (k - 1)
    lo_digits = _standard_digits(offset + 1, k, height)
    hi_digits = _standard_digits(offset + n, k, height)
    widest = max(low, k - 1 - low)

    def reach(a: int, b: int) -> int:  # max |v - low| over digits a..b
        return max(abs(a - low), abs(b - low))

    level, prefix = 0, 0
    while level < height and lo_digits[level] == hi_digits[level]:
        prefix += abs(lo_digits[level] - low)
        level += 1
    if level == height:
        return prefix
    best = 0
    if hi_digits[level] - lo_digits[level] >= 2:
        between = reach(lo_digits[level] + 1, hi_digits[level] - 1)
        best = prefix + between + (height - level - 1) * widest
    for bound, upward in ((lo_digits, True), (hi_digits, False)):
        acc = prefix + abs(bound[level] - low)
        for j in range(level + 1, height):
            digit = bound[j]
            # leave the bound at j: above the lower bound's digit, below the upper one's
            first, last = (digit + 1, k - 1) if upward else (0, digit - 1)
            if first <= last:
                best = max(best, acc + reach(first, last) + (height - j - 1) * widest)
            acc += abs(digit - low)
        best = max(best, acc)
    return best


def _standard_digits(value: int, k: int, height: int) -> list[int]:
    """The ``height`` standard base-k digits of value, most significant first."""
    return [value // k**i % k for i in range(height - 1, -1, -1)]


def _digit_cost(k: int, level: int, low: int, bound: int) -> int:
    """D_l(N) = sum over n in [0, N) of |s_l(n) - low|, s_l the standard base-k digit l.

    Digit l runs through 0..k-1 in runs of k^(l-1): N // k^l whole cycles, then q = r //
    k^(l-1) whole runs (r = N mod k^l) and r mod k^(l-1) numbers with digit q.
    """
    run = k ** (level - 1)
    cycles, rest = divmod(bound, run * k)
    runs, partial = divmod(rest, run)
    return (cycles * _cost_below(k, low) + _cost_below(runs, low)) * run + partial * abs(runs - low)


def _cost_below(q: int, low: int) -> int:
    """sum_{v=0..q-1} |v - low|."""
    if q <= low:
        return q * low - q * (q - 1) // 2
    return low * (low + 1) // 2 + (q - 1 - low) * (q - low) // 2


def fixed_tree_mse(k: int, subtract: bool, horizon: int) -> Fraction:
    """MSE * epsilon^2 of the paper's single tree built for a known T, continuous Laplace.

    (2 h^2) W(T) / T with h = tree_height(k, subtract, T): the paper's error, exactly, for
    reproducing its numbers (experiments/kary_mse.py). Not the error of this module's
    infinite-stream mechanism (see ``mse``).

    Args:
        k: arity.
        subtract: Alg. 2 if True, else Alg. 1.
        horizon: T >= 1.

    Returns:
        The exact rational MSE * epsilon^2 (sensitivity 1).

    References:
        Andersson-Pagh-Torkamani Lemmas 3.5 and 4.7 (closed forms at T = T_cap; ours for any T).
    """
    height = tree_height(k, subtract, horizon)
    return Fraction(2 * height * height * weight_sum(k, subtract, height, horizon), horizon)


def asymptotic_constant(k: int, subtract: bool) -> float:
    """C with MSE ~ (C / epsilon^2) log2(T)^3 (Andersson-Pagh-Torkamani Thm 1.1, Thm 3.7, Cor. 4.9,
    Cor. A.7).

    Alg. 1: (k - 1) / log2(k)^3 (Thm 3.7 without its misprinted extra h); Alg. 2:
    k (1 - 1/k^2) / (2 log2(k)^3) (Cor. 4.9). These are the paper's constants for a
    known T; ``docs/kary-mse.md`` measures what the period scheme of ``mse`` adds.
    """
    log3 = math.log2(k) ** 3
    if not subtract:
        return (k - 1) / log3
    # Even k (App. A.3): worse than odd k by the factor 1 / (1 - 1/k^2); best k = 20.
    return k * (1 - 1 / k**2) / (2 * log3) if k % 2 else k / (2 * log3)


def _digits(t: int, k: int, subtract: bool, height: int) -> tuple[int, ...]:
    """rep_k(t, h) (Alg. 1) or rep^_k(t, h) (Alg. 2); index 0 is level 1 (units).

    Raises:
        InvalidOperatorConfig: t does not fit in ``height`` digits (a bug, not data).
    """
    top = k - 1 - (k - 1) // 2 if subtract else k - 1
    rest, digits = t, []
    for _ in range(height):
        r = rest % k
        if r > top:
            r -= k
        digits.append(r)
        rest = (rest - r) // k
    if rest != 0:
        raise _validate.invalid("t", f"<= {tree_capacity(k, subtract, height)}", t)
    return tuple(digits)


def _walk(digits: tuple[int, ...], k: int) -> list[tuple[int, int, int]]:
    """The walk of Algs. 2 and 3: (level, index, sign) of each node, most significant first.

    A positive digit adds the next left child [p+1, p+k^(l-1)]; a negative one subtracts
    the right child [p-k^(l-1)+1, p]. The order matters (most significant digit first): it is what
    makes each node's identity and sign independent of t.
    """
    out = []
    p = 0
    size = k ** len(digits)
    for level in range(len(digits), 0, -1):
        size //= k
        d = digits[level - 1]
        if d > 0:
            for _ in range(d):
                out.append((level, p // size, 1))
                p += size
        else:
            for _ in range(-d):
                p -= size
                out.append((level, p // size, -1))
    return out


# ---------------------------------------------------------------------------------------
# Choosing the tree for a configured horizon


def _candidates() -> list[tuple[ChosenTree, int, bool]]:
    """The counters the choosers compare, simplest first: binary, Alg. 1, Alg. 2."""
    candidates: list[tuple[ChosenTree, int, bool]] = [("binary", 2, False)]
    candidates += [("kary", k, False) for k in range(3, CHOOSER_MAX_K + 1)]
    candidates += [("kary_subtract", k, True) for k in range(3, CHOOSER_MAX_K + 1)]
    return candidates


@functools.lru_cache(maxsize=1)
def choose_unbounded_tree() -> tuple[ChosenTree, int]:
    """The counter for a stream without a horizon: least error over the ticks users see.

    An unbounded stream has no T to optimise for, so we score each candidate of
    ``choose_tree`` at every horizon T of ``UNBOUNDED_HORIZONS`` (log-spaced from 10^3 to
    10^8 ticks: a quarter of an hour to three years of one-second ticks) by two exact
    errors, the MSE over steps 1..T and the largest variance over them
    (``max_variance``), each divided by the best candidate's at that T, and pick the
    least mean of the two log-ratios over all T (``unbounded_scores``; ties to the
    earlier candidate). With continuous-Laplace variances, 2 b^2, the scores do not
    depend on epsilon or the sensitivity (every variance scales by
    (sensitivity / epsilon)^2), so neither is a parameter: the result is one fixed tree,
    ("kary_subtract", 13) (``docs/kary-mse.md``, section 6).

    Returns:
        (mechanism, k) as ``choose_tree`` returns them.

    Privacy:
        Free: a function of no data at all. The chosen counter spends its epsilon as
        documented in ``make_kary_tree``.

    References:
        Our rule on top of Andersson-Pagh-Torkamani's Alg. 1 and 2 under this module's
        period scheme; docs/design.md, section 5a.
    """
    name, k, _, _ = min(unbounded_scores(), key=lambda row: (row[2] + row[3]) / 2)
    return name, k


def unbounded_scores() -> list[tuple[ChosenTree, int, float, float]]:
    """Every candidate's (name, k, MSE score, largest-variance score): the mean over
    ``UNBOUNDED_HORIZONS`` of ln(its error / the best candidate's error at that T), in
    ``choose_tree``'s candidate order. ``choose_unbounded_tree`` takes the least mean of
    the two scores."""
    rows = []
    for name, k, subtract in _candidates():
        spec = make_kary_tree(1, 1, ("unbounded",), k, subtract)
        pairs = errors(spec, UNBOUNDED_HORIZONS, continuous=True)
        rows.append((name, k, [m for m, _ in pairs], [x for _, x in pairs]))
    best_mse = [min(row[2][i] for row in rows) for i in range(len(UNBOUNDED_HORIZONS))]
    best_max = [min(row[3][i] for row in rows) for i in range(len(UNBOUNDED_HORIZONS))]
    count = len(UNBOUNDED_HORIZONS)
    return [
        (
            name,
            k,
            sum(math.log(m / b) for m, b in zip(mses, best_mse, strict=True)) / count,
            sum(math.log(x / b) for x, b in zip(maxes, best_max, strict=True)) / count,
        )
        for name, k, mses, maxes in rows
    ]


def choose_tree(
    epsilon: float | Fraction, sensitivity: int, horizon: int, node_prefix: NodeId
) -> tuple[ChosenTree, int]:
    """The counter with the least exact MSE over steps 1..horizon (discrete Laplace).

    Candidates, all under this module's period scheme (which for k = 2 is exactly
    ``tree_counter``'s binary tree, so like is compared with like): "binary" (k = 2),
    "kary" (Alg. 1, 3 <= k <= CHOOSER_MAX_K) and "kary_subtract" (Alg. 2 for odd k, the
    App. A.3 variant for even k, k in the
    same range). Ties go to the earlier candidate in that order (simplest first).

    Args:
        epsilon: budget of the counter (as for ``make_kary_tree``).
        sensitivity: integer >= 1.
        horizon: the configured number of steps, >= 1 (public).
        node_prefix: the counter's identity; validated only, the choice ignores it.

    Returns:
        (mechanism, k) with mechanism the config name "binary", "kary" or
        "kary_subtract", and k = 2 for "binary".

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        Free: the choice is a function of public parameters only (our choice; docs/papers.md).
        The chosen counter then spends ``epsilon`` as documented in ``make_kary_tree``.

    References:
        Our "k = auto" rule on top of Andersson-Pagh-Torkamani Cor. 4.9 (k = 19); Alg. 1 can win at
        small T.
    """
    _validate.check_int_ge("horizon", horizon, 1)
    best: tuple[float, ChosenTree, int] | None = None
    for name, k, subtract in _candidates():
        spec = make_kary_tree(epsilon, sensitivity, node_prefix, k, subtract)
        error = mse(spec, horizon)
        if best is None or error < best[0]:
            best = (error, name, k)
    assert best is not None
    return best[1], best[2]
