"""k-selection under user-level DP, Dong-Luo-Yi Alg. 6: max, median, any k.

o_{t,1} >= o_{t,2} >= ... are the items of D_t (values in [domain], ties broken by time),
o_{t,k} = 0 when k > |D_t|. The mechanism releases an estimate o~ that is, with
probability >= 1 - beta, never ABOVE o_{t,k} (one-way rank error, ``rank_error``).

Alg. 6: pad the domain to a power of two R (our correction, docs/papers.md) and run LOG R + 1
user-level histograms H_i (``counter``, Alg. 5 with R / 2^(i-1) bins, each with epsilon/(LOG R +
1) and beta/(LOG R + 1), its own tracker and truncation by the user's TOTAL rank, Sec. IV-B); bin
b of level i counts the items in [(b-1) 2^(i-1) + 1, b 2^(i-1)]. At each tick, S(r) is the
sum of the noisy counts over the canonical dyadic decomposition of [r, R] (at most LOG R
bins), and the output is the LARGEST r with S(r) >= k + Delta (a scan from the top; 0 =
"none"). Since S(r) - F([r, R]) lies in [-Delta - bias, +Delta] for all r, a pass at r means
F([r, R]) >= k, i.e. o~ <= o_{t,k}, and the fail at r + 1 bounds the rank error by
2 Delta + bias (Thm IV.2).

Options (all public, fixed in the spec):

* ``search``: "scan" (the paper's loop, O(R log R) per tick: the largest passing r) or
  "bisect" (O(log^2 R): some r with S(r) passing and S(r + 1) failing, which is all the
  proof uses, but it can differ from the scan when S is not monotone). Default: scan.
* ``delta_mode``: "eq3", Delta of eq. (3) (Noise_U per level, beta/R: the paper's constant,
  very loose: at 10^3 ticks and tau~ = 64 it exceeds 10^6), or "chernoff", a guaranteed
  bound of the actual noise of S(r): the Chernoff half-width at miss probability beta/R
  of the sum of the discrete Laplace terms S(r) is made of (public scales; exact moment
  generating functions, minimised over a fixed lambda grid; the union bound over r gives
  the same all-r guarantee as eq. (3), typically 10^2 times smaller). "zero" is
  the TEST HOOK Delta = 0 (no one-way guarantee).
* ``practical`` (App. C-A): tracker from tau = 64 with the shifted series. It no
  longer halves Delta: the paper's Appendix C-A also uses the threshold k + Delta/2, but
  that is a separate opt-in, ``halve_delta`` (default False), because the one-way
  guarantee then no longer holds with probability 1 - beta (the paper's trade-off for its
  loose Delta; measured with the Chernoff Delta: P(o~ > o_{t,k}) above beta).
* ``dyadic=False`` (App. C-A, the paper's F_max experiments): ONE finest histogram with
  the full epsilon answers the suffix sums S(r) = sum_{x >= r} H(x); its Delta is
  sqrt(#bins in the suffix) * Noise_U of one bin (our choice; the paper leaves it open) or the
  Chernoff bound of the suffix's terms.
* ``quantile`` (Remark 1, e.g. the median q = 1/2): k_t = max(1, ceil(q * n~_t)) where
  n~_t is the noisy |D_t| that the histograms already release (the single top bin of
  level LOG R + 1, or the sum of the finest bins): post-processing, no extra budget.

The scan never considers r > domain (no item can lie in the padding; public), so padding
bins only add noise to the coarse bins that cover them.

Stage 1 -> stage 2, per tick: the finest-level histogram report of ``counter``:
``bands[b][x - 1]`` = this tick's items of value x whose rank (the user's new c_u over
ALL values) lies in band b, and ``crossings[j]`` = users whose c_u crossed 2^j. Stage 2
sums adjacent bins for the coarser levels; every level sees the same crossings.

Privacy:
    User-level neighbours. Each H_i is epsilon/(LOG R + 1)-DP (Alg. 5: tracker plus
    instances, one truncation by total rank over all bins, so the per-level L1 node
    sensitivity is tau~, or 2 tau~ with ``any_subset``); basic composition over the
    LOG R + 1 histograms gives epsilon. The single-histogram mode spends epsilon on one
    histogram. The selection, Delta and k_t are post-processing of released values and
    public parameters.

References:
    W. Dong, Q. Luo, K. Yi. Continual Observation under User-level Differential Privacy.
    IEEE S&P 2023. Alg. 6, eq. (3), Thm IV.2, Remarks 1-2, Appendix C-A; our corrections
    of Alg. 6 in docs/papers.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import _validate
from ..noise import NoiseSource
from . import counter as ul

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

Bin = tuple[int, int]
"""(level i, bin b), both 1-based: bin b of level i is [(b - 1) 2^(i-1) + 1, b 2^(i-1)]."""


def padded_domain(R: int) -> int:  # noqa: N803 - paper notation
    """The smallest power of two >= max(R, 2): the domain Alg. 6 runs on (our correction)."""
    _validate.check_int_ge("R", R, 1)
    return max(2, 1 << (R - 1).bit_length())


def num_levels(R: int) -> int:  # noqa: N803
    """LOG R + 1: the number of dyadic histograms, levels i = 1..LOG R + 1."""
    _check_power_of_two("R", R)
    return R.bit_length()  # log2 R + 1 (R >= 2, so LOG R = log2 R)


def level_bins(R: int, level: int) -> int:  # noqa: N803
    """R / 2^(i-1): the number of bins of level i (Alg. 6 prints 2^(i-1); our correction)."""
    return R >> (level - 1)


def bin_of(x: int, level: int) -> int:
    """b = ceil(x / 2^(i-1)): the bin of item x in the level-i histogram."""
    return ((x - 1) >> (level - 1)) + 1


def bin_interval(level: int, b: int) -> tuple[int, int]:
    """[(b - 1) 2^(i-1) + 1, b 2^(i-1)], the items the bin covers."""
    width = 1 << (level - 1)
    return (b - 1) * width + 1, b * width


def dyadic_decomposition(r: int, R: int) -> tuple[Bin, ...]:  # noqa: N803
    """The canonical dyadic decomposition of [r, R] (Dong-Luo-Yi Alg. 6).

    Start at r and repeatedly take the largest aligned block [r, r + 2^s - 1] with
    (r - 1) mod 2^s = 0 and r + 2^s - 1 <= R. For R = 8: [2, 8] = [2,2] u [3,4] u [5,8]
    and [6, 8] = [6,6] u [7,8]. At most log2 R blocks (one per level below the top,
    or the single top block when r = 1).

    Example:
        >>> dyadic_decomposition(2, 8)  # (level, bin): [2,2], [3,4], [5,8]
        ((1, 2), (2, 2), (3, 2))

    Args:
        r: left end, 1 <= r <= R (r = R + 1 gives the empty decomposition).
        R: domain size, a power of two >= 2.

    Returns:
        ((level, bin), ...) from left to right, levels 1-based.
    """
    _check_power_of_two("R", R)
    _validate.check_int_ge("r", r, 1)
    if r > R + 1:
        raise _validate.invalid("r", f"<= R + 1 = {R + 1}", r)
    out: list[Bin] = []
    while r <= R:
        s = ((r - 1) & -(r - 1)).bit_length() - 1 if r > 1 else R.bit_length() - 1
        while r + (1 << s) - 1 > R:
            s -= 1
        out.append((s + 1, ((r - 1) >> s) + 1))
        r += 1 << s
    return tuple(out)


def suffix_sum(hists: Sequence[Sequence[int]], r: int) -> int:
    """S(r): the sum of the (noisy) counts over the decomposition of [r, R].

    ``hists[i - 1][b - 1]`` is the count of bin b at level i; R = len(hists[0]).
    """
    R = len(hists[0])  # noqa: N806
    return sum(hists[level - 1][b - 1] for level, b in dyadic_decomposition(r, R))


Threshold = float | Callable[[int], float]
"""k + Delta, or a function r -> k + Delta(r) when Delta depends on the suffix."""


def _at(threshold: Threshold, r: int) -> float:
    return threshold(r) if callable(threshold) else threshold


def select_scan(S: Callable[[int], float], R: int, threshold: Threshold) -> int:  # noqa: N803
    """Alg. 6's loop: the LARGEST r in [1, R] with S(r) >= threshold, else 0 ("none").

    S need not be monotone (it is noisy); the scan tests r = R, R - 1, ... and stops at
    the first pass, so every r' > r failed. O(R) calls of S (O(R log R) with the
    dyadic suffix sums).
    """
    for r in range(R, 0, -1):
        if S(r) >= _at(threshold, r):
            return r
    return 0


def select_bisect(S: Callable[[int], float], R: int, threshold: Threshold) -> int:  # noqa: N803
    """Bisection on [0, R + 1] with cond(0) true and cond(R + 1) false by convention.

    Returns some r with S(r) >= threshold (or r = 0) and S(r + 1) < threshold (or
    r = R). That is all the utility proof of Thm IV.2 uses, but when S is not monotone
    it may return a smaller r than ``select_scan``. O(log R) calls of S.
    """
    lo, hi = 0, R + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if S(mid) >= _at(threshold, mid):
            lo = mid
        else:
            hi = mid
    return lo


def delta_eq3(
    taus: Sequence[int],
    t: int,
    epsilon: float | Fraction,
    beta: float | Fraction,
    theta: float | Fraction,
    R: int,  # noqa: N803
) -> float:
    """Delta of eq. (3): sqrt(sum_i Noise_U(tau~^i_t, t, eps / (LOG R + 1), beta / R, theta)^2).

    Args:
        taus: tau~^i_t of the LOG R + 1 level histograms (one tracker each).
        t: the step.
        epsilon, beta, theta: the k-selection's total parameters.
        R: the (padded) domain size.

    Returns:
        Delta. It is an upper bound on the noise of any suffix sum S(r) (with the
        union bound over the r), so the scan's threshold k + Delta makes the error one-way.
    """
    levels = num_levels(R)
    eps_level = Fraction(epsilon) / levels
    beta = Fraction(beta)
    return math.sqrt(sum(ul.noise_u(tau, t, eps_level, beta / R, theta) ** 2 for tau in taus))


def rank_error(counts: Sequence[int], k: int, estimate: int) -> float:
    """One-way rank error xi of ``estimate`` for the k-th largest item (Dong-Luo-Yi Alg. 6).

    xi = inf if estimate > o_k; else max{k' - k : o_k' >= estimate}. Items with equal
    values are ordered by timestamp (the paper assumes distinct items), and an estimate
    that equals an item value is credited with the best-ranked copy of that value:
    xi = max(0, #{x > estimate} + [estimate occurs] - k). So estimate = o_k gives 0 even
    with ties, and estimate = 0 ("none") gives |D_t| - k.

    Args:
        counts: ``counts[v - 1]`` = number of items of value v in D_t, v = 1..R.
        k: the rank asked for, >= 1.
        estimate: the released value, 0..R.

    Returns:
        xi (math.inf if the estimate is above the truth).
    """
    _validate.check_int_ge("k", k, 1)
    total = 0
    truth = 0
    for v in range(len(counts), 0, -1):
        total += counts[v - 1]
        if total >= k:
            truth = v
            break
    if estimate > truth:
        return math.inf
    if estimate <= 0:
        return float(max(0, sum(counts) - k))
    above = sum(counts[estimate:])
    return float(max(0, above + (counts[estimate - 1] > 0) - k))


def true_kth(counts: Sequence[int], k: int) -> int:
    """o_{t,k}: the k-th largest item value, 0 if |D_t| < k."""
    total = 0
    for v in range(len(counts), 0, -1):
        total += counts[v - 1]
        if total >= k:
            return v
    return 0


def _check_power_of_two(name: str, value: int) -> None:
    _validate.check_int_ge(name, value, 2)
    if value & (value - 1):
        raise _validate.invalid(name, "a power of two (pad the domain, Dong-Luo-Yi Alg. 6)", value)


# ---------------------------------------------------------------------------------------
# Selection from noisy histograms (shared with the fixed-tau baseline)

DELTA_MODES = ("eq3", "chernoff", "zero")
SEARCHES = ("scan", "bisect")


def suffix_function(hists: Sequence[Sequence[int]], dyadic: bool) -> Callable[[int], int]:
    """r -> S(r): dyadic decomposition over the LOG R + 1 level histograms, or the plain
    suffix sum of a single finest histogram (``hists = [finest]``)."""
    if dyadic:
        return lambda r: suffix_sum(hists, r)
    finest = hists[0]
    suffix = [0] * (len(finest) + 2)
    for x in range(len(finest), 0, -1):
        suffix[x] = suffix[x + 1] + finest[x - 1]
    return lambda r: suffix[r]


def suffix_scales(
    level_scales: Sequence[Sequence[Fraction]], r: int, top: int, dyadic: bool
) -> list[Fraction]:
    """The scales of every noise term of S(r): each bin of level i carries the same
    multiset ``level_scales[i - 1]`` (its release's nodes)."""
    if dyadic:
        R = 1 << (len(level_scales) - 1)  # noqa: N806
        return [s for level, _ in dyadic_decomposition(r, R) for s in level_scales[level - 1]]
    return list(level_scales[0]) * (top - r + 1)


_GRID = np.geomspace(1e-4, 1 - 1e-6, 256)
"""lambda grid, as fractions of the largest pole 1/b among the levels' scales."""


def _log_mgf(scales: Sequence[Fraction], lam: np.ndarray) -> np.ndarray:
    """ln E[exp(lam Z)] for Z the sum of independent discrete Laplace noises of ``scales``:
    sum of ln[(1-p)^2 / ((1-p e^lam)(1-p e^-lam))], p = e^(-1/b); +inf at or above a pole."""
    out = np.zeros_like(lam)
    counts: dict[Fraction, int] = {}
    for b in scales:
        counts[b] = counts.get(b, 0) + 1
    for b, count in counts.items():
        a = 1 / float(b)
        with np.errstate(invalid="ignore", divide="ignore"):
            term = (
                2 * math.log(-math.expm1(-a))
                - np.log(-np.expm1(lam - a))
                - np.log(-np.expm1(-lam - a))
            )
        out += count * np.where(lam < a, term, np.inf)
    return out


def chernoff_margin(
    level_scales: Sequence[Sequence[Fraction]], top: int, dyadic: bool, alpha: float
) -> Callable[[int], float]:
    """r -> h(r) with P(|noise of S(r)| > h(r)) <= alpha, guaranteed.

    The Chernoff bound of ``noise.chernoff_interval`` (exact moment generating function of
    each discrete Laplace term, h = (ln M(lam) + ln(2/alpha)) / lam), minimised over a fixed
    grid of lam instead of by bisection: any lam gives a valid bound, and the grid makes
    every suffix of a tick cost O(grid) after one O(grid * scales) pass per level.

    Args:
        level_scales: the scales of one bin's release at each level (every bin of a level
            carries the same multiset).
        top: the largest r considered (the domain).
        dyadic: S(r) over the dyadic decomposition, or a suffix of the finest level.
        alpha: the miss probability per r (beta / R in Alg. 6).
    """
    poles = [1 / float(max(scales)) for scales in level_scales if scales]
    if not poles:
        return lambda r: 0.0
    lam = max(poles) * _GRID
    per_level = [_log_mgf(scales, lam) for scales in level_scales]
    log_two_over_alpha = math.log(2 / alpha)
    R = 1 << (len(level_scales) - 1)  # noqa: N806

    def margin(r: int) -> float:
        if dyadic:
            total = np.zeros_like(lam)
            for level, _ in dyadic_decomposition(r, R):
                total = total + per_level[level - 1]
        else:
            total = (top - r + 1) * per_level[0]
        return float(np.min((total + log_two_over_alpha) / lam)) * (1 + 1e-9)

    return margin


def select(
    spec_search: str,
    S: Callable[[int], float],  # noqa: N803
    top: int,
    threshold: Threshold,
) -> int:
    """Run the configured search over r = 1..top (top = the public domain)."""
    if spec_search == "bisect":
        return select_bisect(S, top, threshold)
    return select_scan(S, top, threshold)


# ---------------------------------------------------------------------------------------
# The mechanism


@dataclass(frozen=True, slots=True)
class KSelectionSpec:
    """Public parameters of one user-level k-selection.

    Attributes:
        name: public identity; level i's histogram uses the node prefix ``f"{name}/L{i}"``.
        domain: items are values in [1, domain].
        R: histogram domain: ``padded_domain(domain)`` (dyadic) or ``domain`` (finest).
        k: the public rank asked for (1 = max), or 0 when ``quantile`` is used.
        quantile: q in (0, 1] for k_t = max(1, ceil(q n~_t)) (1/2: median), 0 if k is fixed.
        epsilon: total budget; beta: total failure probability; theta: series shape.
        dyadic: LOG R + 1 histograms (Alg. 6) or one finest histogram (App. C-A).
        levels: the histograms' specs (level 1 = finest).
        delta_mode: "eq3", "chernoff" or "zero" (module docstring).
        delta_factor: 1, or 1/2 with ``halve_delta`` (threshold k + Delta/2, no one-way
            guarantee).
        search: "scan" or "bisect".
    """

    name: str
    domain: int
    R: int
    k: int
    quantile: Fraction
    epsilon: Fraction
    beta: Fraction
    theta: Fraction
    dyadic: bool
    levels: tuple[ul.UserLevelSpec, ...]
    delta_mode: str
    delta_factor: Fraction
    search: str


@dataclass(frozen=True, slots=True)
class KSelectionState:
    """Plain-data state (JSON round-trip through ``state_codec``): one ``counter`` state
    per level, stored field by field (index = level - 1); the cumulative crossings G are
    the same for every level and stored once."""

    t: int = 0
    crossings: tuple[int, ...] = ()
    svt_index: tuple[int, ...] = ()
    instance: tuple[int, ...] = ()
    tau: tuple[int, ...] = ()
    alpha: tuple[tuple[ul.Vector, ...], ...] = ()
    periods: tuple[tuple[ul.Vector, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class KSelectionRelease:
    """What one tick releases.

    Attributes:
        t: the tick.
        value: o~_{t,k}, in [0, domain] (0 = "none": fewer than k items, as far as the
            noisy counts can tell).
        k: the rank used at this tick (k_t in quantile mode).
        margin: the error bar: threshold - k at the returned r (r = 1 when none), i.e.
            delta_factor * Delta. With delta_factor 1, with probability >= 1 - beta,
            value <= o_{t,k} and the items above value number at most k + 2 margin + bias.
        taus: tau~_t of each level's tracker.
        histograms: the noisy counts of every level (level 1 first).
    """

    t: int
    value: int
    k: int
    margin: float
    taus: tuple[int, ...]
    histograms: tuple[tuple[int, ...], ...]


def make_k_selection(
    name: str,
    domain: int,
    epsilon: float | Fraction,
    beta: float | Fraction,
    theta: float | Fraction = 1,
    *,
    k: int = 1,
    quantile: float | Fraction | None = None,
    dyadic: bool = True,
    practical: bool = False,
    halve_delta: bool = False,
    delta_mode: str = "eq3",
    search: str = "scan",
    any_subset: bool = False,
    practical_instances: bool = False,
    forced_schedule: Sequence[tuple[int, int]] = (),
) -> KSelectionSpec:
    """Validate and build a KSelectionSpec.

    Args:
        name: public identity.
        domain: the item domain [1, domain], >= 1 (padded to a power of two when dyadic).
        epsilon: total budget > 0.
        beta: failure probability in (0, 1).
        theta: theta > 0.
        k: rank >= 1 (1 = max); ignored when ``quantile`` is given.
        quantile: q in (0, 1] for a private rank k_t = ceil(q n~_t) (1/2: median).
        dyadic: Alg. 6's LOG R + 1 histograms (True) or one finest histogram (False).
        practical: App. C-A tracker (tau~ from 64, shifted series).
        halve_delta: threshold k + Delta/2 (Appendix C-A's practical threshold); default
            False, whatever ``practical``: only the full Delta keeps the one-way guarantee
            P(o~ <= o_{t,k}) >= 1 - beta.
        delta_mode: "eq3", "chernoff" or "zero" (test hook).
        search: "scan" or "bisect".
        any_subset: node multiplier 2 (any-subset neighbours, docs/papers.md).
        practical_instances: shifted series for the instances too.
        forced_schedule: TEST HOOK forcing every level's tau~ (not private).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        epsilon-DP under user-level neighbours (module docstring).
    """
    _validate.check_int_ge("domain", domain, 1)
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    b = _validate.exact_fraction("beta", beta)
    _validate.check_probability("beta", b)
    th = _validate.exact_fraction("theta", theta)
    _validate.check_positive("theta", th)
    flags = (("dyadic", dyadic), ("practical", practical), ("halve_delta", halve_delta))
    for flag_name, flag in flags:
        if not isinstance(flag, bool):
            raise _validate.invalid(flag_name, "a bool", flag)
    if quantile is None:
        _validate.check_int_ge("k", k, 1)
        q = Fraction(0)
    else:
        q = _validate.exact_fraction("quantile", quantile)
        if not 0 < q <= 1:
            raise _validate.invalid("quantile", "in (0, 1]", quantile)
        k = 0
    if delta_mode not in DELTA_MODES:
        raise _validate.invalid("delta_mode", f"one of {DELTA_MODES}", delta_mode)
    if search not in SEARCHES:
        raise _validate.invalid("search", f"one of {SEARCHES}", search)
    R = padded_domain(domain) if dyadic else domain  # noqa: N806
    count = num_levels(R) if dyadic else 1
    levels = tuple(
        ul.make_user_level(
            f"{name}/L{i}",
            eps / count,
            b / count,
            th,
            bins=level_bins(R, i),
            multiplier=2 if any_subset else 1,
            practical=practical,
            practical_instances=practical_instances,
            forced_schedule=forced_schedule,
        )
        for i in range(1, count + 1)
    )
    return KSelectionSpec(
        name=name,
        domain=domain,
        R=R,
        k=k,
        quantile=q,
        epsilon=eps,
        beta=b,
        theta=th,
        dyadic=dyadic,
        levels=levels,
        delta_mode=delta_mode,
        delta_factor=Fraction(1, 2) if halve_delta else Fraction(1),
        search=search,
    )


def init(spec: KSelectionSpec) -> KSelectionState:
    n = len(spec.levels)
    return KSelectionState(
        svt_index=(1,) * n,
        instance=(0,) * n,
        tau=(0,) * n,
        alpha=((),) * n,
        periods=((),) * n,
    )


def level_state(state: KSelectionState, index: int) -> ul.UserLevelState:
    """The ``counter`` state of level ``index + 1``."""
    return ul.UserLevelState(
        t=state.t,
        crossings=state.crossings,
        svt_index=state.svt_index[index],
        instance=state.instance[index],
        tau=state.tau[index],
        alpha=state.alpha[index],
        periods=state.periods[index],
    )


def aggregate_bands(
    bands: Sequence[Sequence[int]],
    domain: int,
    R: int,
    count: int,  # noqa: N803
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The band reports of ``count`` levels from the finest one (rows padded to R): level i
    sums 2^(i-1) adjacent bins."""
    rows = []
    for b, row in enumerate(bands):
        if len(row) > domain:
            raise _validate.invalid(f"bands[{b}] length", f"<= domain = {domain}", len(row))
        rows.append(tuple(row) + (0,) * (R - len(row)))
    out = [tuple(rows)]
    for _ in range(1, count):
        rows = [tuple(row[2 * x] + row[2 * x + 1] for x in range(len(row) // 2)) for row in rows]
        out.append(tuple(rows))
    return tuple(out)


def level_bands(
    spec: KSelectionSpec, bands: Sequence[Sequence[int]]
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The per-level band reports of ``spec`` from the finest one."""
    return aggregate_bands(bands, spec.domain, spec.R, len(spec.levels))


def step(
    spec: KSelectionSpec,
    state: KSelectionState,
    bands: Sequence[Sequence[int]],
    crossings: Sequence[int],
    noise: NoiseSource,
) -> tuple[KSelectionState, KSelectionRelease]:
    """One public tick t = state.t + 1 (empty ticks too: ``step(spec, s, (), (), noise)``).

    Args:
        spec: the mechanism's parameters.
        state: the state after tick t - 1.
        bands: ``bands[b][x - 1]`` = this tick's items of value x with rank in band b.
        crossings: ``crossings[j]`` = users whose c_u crossed 2^j this tick.
        noise: the NoiseSource (keyed in production).

    Returns:
        (new state, release).

    Raises:
        InvalidOperatorConfig: a malformed report (a stage-1 bug).
    """
    per_level = level_bands(spec, bands)
    states, releases = [], []
    for index, level_spec in enumerate(spec.levels):
        new, rel = ul.step(
            level_spec, level_state(state, index), per_level[index], crossings, noise
        )
        states.append(new)
        releases.append(rel)
    t = states[0].t
    hists = tuple(rel.values for rel in releases)
    taus = tuple(rel.tau for rel in releases)
    if spec.k:
        k = spec.k
    else:
        total = hists[-1][0] if spec.dyadic else sum(hists[0])
        k = max(1, math.ceil(spec.quantile * total))
    delta = _delta_function(spec, t, states, taus)
    value = select(
        spec.search,
        suffix_function(hists, spec.dyadic),
        spec.domain,
        lambda r: k + float(spec.delta_factor) * delta(r),
    )
    margin = float(spec.delta_factor) * delta(max(value, 1))
    new_state = KSelectionState(
        t=t,
        crossings=states[0].crossings,
        svt_index=tuple(s.svt_index for s in states),
        instance=tuple(s.instance for s in states),
        tau=taus,
        alpha=tuple(s.alpha for s in states),
        periods=tuple(s.periods for s in states),
    )
    return new_state, KSelectionRelease(
        t=t, value=value, k=k, margin=margin, taus=taus, histograms=hists
    )


def _delta_function(
    spec: KSelectionSpec, t: int, states: Sequence[ul.UserLevelState], taus: Sequence[int]
) -> Callable[[int], float]:
    """r -> Delta(r) at tick t (public: t, the taus and instances, the spec)."""
    if spec.delta_mode == "zero":
        return lambda r: 0.0
    if spec.delta_mode == "eq3":
        if spec.dyadic:
            constant = delta_eq3(taus, t, spec.epsilon, spec.beta, spec.theta, spec.R)
            return lambda r: constant
        per_bin = ul.noise_u(taus[0], t, spec.epsilon, spec.beta / spec.R, spec.theta)
        return lambda r: math.sqrt(spec.domain - r + 1) * per_bin
    level_scales = [
        tuple(ul.release_scales(level_spec, t, s.instance, s.tau))
        for level_spec, s in zip(spec.levels, states, strict=True)
    ]
    return chernoff_margin(level_scales, spec.domain, spec.dyadic, float(spec.beta) / spec.R)


def spent_split(spec: KSelectionSpec, state: KSelectionState) -> tuple[Fraction, Fraction]:
    """Exact epsilon committed so far by (the levels' trackers, the levels' instances)."""
    parts = [ul.spent_split(level, level_state(state, i)) for i, level in enumerate(spec.levels)]
    return sum((p[0] for p in parts), Fraction(0)), sum((p[1] for p in parts), Fraction(0))


def spent_epsilon(spec: KSelectionSpec, state: KSelectionState) -> Fraction:
    """Exact epsilon committed so far: the sum over the level histograms (< epsilon)."""
    return sum(spent_split(spec, state), Fraction(0))


def exact_counts(spec: KSelectionSpec, state: KSelectionState) -> tuple[int, ...]:
    """The finest level's F_ht(Truncate(D_t, tau~^1_t)) (the scan's target with noise 0)."""
    return ul.exact_values(spec.levels[0], level_state(state, 0))
