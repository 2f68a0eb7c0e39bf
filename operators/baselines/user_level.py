"""Baselines of Dong-Luo-Yi Sec. III-A and VII: advanced composition, fixed and random tau.

Advanced composition (AdvComp, Sec. III-A and VII). Give every release the budget eps'
solving eps = sqrt(2T ln(1/delta)) eps' + T eps'(e^eps' - 1) (``solve_step_epsilon``) and
rerun a STATIC user-DP algorithm on the whole prefix D_t at every tick t = 1..T: the T
releases are (eps, delta)-DP. The paper does not state delta; we use delta = 1e-6 by
default (its illustration: delta = 1e-6, T = 5e7, eps = 2 gives eps' ~ 5.04e-5). T must be
known: a release after tick T raises BudgetExceededError. Error O~(sqrt(T) kappa).

The static algorithm (the paper cites [20] shifted inverse and [24] Huang-Liang-Yi without
saying which goes with which query; [20]'s polynomial algorithms took > 1 hour per update):

* count, sum, histogram, distinct count (``make_advcomp``): clip at a privately chosen
  power of two, in the spirit of [24]'s clipping at a private high quantile of the user
  contributions. Half of eps' chooses tau = 2^j by AboveThreshold (``svt``) over
  j = 1..J (GS = 2^J = 2^20) on the sensitivity-1 query -Count(D_t, 2^j) with threshold
  -(6/eps_1) LOG(2/beta): it stops, with probability >= 1 - beta, by the first j with no
  user above 2^j (Lemma II.10), and it rarely stops while many users are above. The other
  half releases F(Truncate(D_t, tau)) + Lap(m tau / eps_2) per bin, where m tau bounds the
  L1 change of the truncated vector: tau for count, sum and distinct count (F_0 of the
  first tau items changes by <= tau even when a subset is removed: |F_0(C u X) -
  F_0(C u Y)| <= max(|X|, |Y|)), tau for a histogram under whole-user neighbours and
  2 tau under "any subset". Why this one: it is O~(kappa/eps') like [20] and [24] up to
  log factors, runs in O(J + R) per tick from the same stage-1 report as our mechanism
  (cumulative band units and Count(D_t, 2^j) = G[j]), and it has no tuning parameter.
* max (``make_advcomp_max``): U(r) = |{u : u has an item >= r}| is the number of users
  whose removal brings the max below r (the inverse-sensitivity count [20] builds on) and
  has sensitivity 1 under user-level neighbours. AboveThreshold with all of eps' scans
  r = R, R-1, ... and outputs the first r with U(r) above the threshold
  (6/eps') LOG(2R/beta): with probability >= 1 - beta it never passes an r with U(r) = 0,
  so the output is one-way (<= the true max), as for our k-selection.

Fixed tau (Alg. 3 with the FULL epsilon, Sec. III-A and VII; ``make_fixed_tau``): the
tree of Alg. 2 over Truncate(D, tau) with node scale (l+1) m tau / epsilon (m = 1; 2
for F_0; doubled with "any subset"), for count, sum, histogram and distinct count, and
the k-selection variant (``make_fixed_tau_k_selection``: LOG R + 1 fixed-tau histograms
with epsilon/(LOG R + 1) each, or one finest histogram). tau must be a power of two so
that the rank-band report of ``user_level.counter`` serves it (bands 0..log2 tau are kept).
"Random tau" (``random_tau``): tau drawn uniformly from {2, 4, ..., 2^20} by a public,
data-independent generator (no privacy cost); the paper averages 20 x 30 runs.

Stage 1 -> stage 2, per tick: the same reports as our mechanisms (``user_level.counter`` bands
and crossings; ``distinct_count.first_occurrence_units`` for F_0), plus for the static max
``reached[r - 1]`` = users whose running max went from < r to >= r this tick.

References:
    W. Dong, Q. Luo, K. Yi. Continual Observation under User-level Differential Privacy.
    IEEE S&P 2023. Sec. III-A, VII; Alg. 3; Lemma III.1.
    C. Dwork, G. Rothblum, S. Vadhan. Boosting and Differential Privacy. FOCS 2010
    (advanced composition); C. Dwork, A. Roth, 2014, Cor. 3.21.
    [20] J. Fang, W. Dong, K. Yi. Shifted Inverse: A General Mechanism for Monotonic
    Functions under User Differential Privacy. CCS 2022.
    [24] Z. Huang, Y. Liang, K. Yi. Instance-optimal Mean Estimation Under Differential
    Privacy. NeurIPS 2021.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import _validate
from ..errors import BudgetExceededError
from ..noise import NodeId, NoiseSource, TreeRelease, noisy_release
from ..user_level import counter as ul
from ..user_level import k_selection as ks
from ..user_level.svt import LOG, above_threshold_step, make_above_threshold
from ..user_level.svt import AboveThresholdState as _SvtState

# ---------------------------------------------------------------------------------------
# Advanced composition (Dong-Luo-Yi Sec. III-A and VII)

_SOLVER_MARGIN = 1e-9
"""Relative slack left below the target so float rounding in the check cannot exceed it."""


def advanced_composition_epsilon(
    step_epsilon: float | Fraction, horizon: int, delta: float | Fraction
) -> float:
    """Total epsilon of ``horizon`` eps'-DP steps: sqrt(2T ln(1/delta)) eps' + T eps'(e^eps' - 1).

    Dwork, Rothblum, Vadhan (2010), Thm III.3 as stated in Dwork-Roth Cor. 3.21 with
    delta' = delta: T adaptively chosen eps'-DP mechanisms are (epsilon, delta)-DP.
    """
    eps = float(step_epsilon)
    if eps > 700:  # e^eps overflows a float; the composition is astronomically large
        return math.inf
    first = math.sqrt(2 * horizon * math.log(1 / float(delta))) * eps
    return first + horizon * eps * math.expm1(eps)


def solve_step_epsilon(
    epsilon: float | Fraction, delta: float | Fraction, horizon: int
) -> Fraction:
    """The per-step eps' with sqrt(2T ln(1/delta)) eps' + T eps'(e^eps' - 1) <= epsilon.

    The left side is increasing in eps', so bisection finds the root; the result is
    rounded DOWN (to 15 significant decimal digits, then a rational) and re-checked, so the
    composition never exceeds ``epsilon`` (style rule 7). Example (Dong-Luo-Yi Sec. III-A and VII):
    delta = 1e-6, T = 5e7, epsilon = 2 gives eps' = 5.0392e-5.

    Args:
        epsilon: the total budget > 0.
        delta: the composition's delta in (0, 1).
        horizon: T >= 1, the number of releases the budget must cover.

    Returns:
        eps' as an exact Fraction.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_probability("delta", delta)
    _validate.check_int_ge("horizon", horizon, 1)
    target = float(eps) * (1 - _SOLVER_MARGIN)
    lo, hi = 0.0, float(eps)  # f(eps) >= eps already from the first term (sqrt(2 ln) > 1)
    while advanced_composition_epsilon(hi, horizon, delta) <= target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if advanced_composition_epsilon(mid, horizon, delta) <= target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    digits = 15 - math.floor(math.log10(lo)) if lo > 0 else 15
    step = Fraction(math.floor(Fraction(lo) * 10**digits), 10**digits)
    if step <= 0 or advanced_composition_epsilon(step, horizon, delta) > float(eps):
        raise _validate.invalid("epsilon", "large enough for a positive per-step budget", epsilon)
    return step


DEFAULT_DELTA = Fraction(1, 10**6)
"""delta of the AdvComp baseline (not stated in the paper; our choice)."""

DEFAULT_MAX_EXPONENT = 20
"""J: tau candidates 2^1..2^J, GS = 2^20 as in the paper's random-tau baseline."""

RANDOM_TAU_CANDIDATES = tuple(1 << j for j in range(1, DEFAULT_MAX_EXPONENT + 1))
"""{2, 4, ..., 2^20}: the paper's random-tau candidates (Dong-Luo-Yi Sec. III-A and VII)."""

STATISTICS = ("count", "sum", "histogram", "distinct_count")


def _check_statistic(statistic: str, bins: int) -> None:
    if statistic not in STATISTICS:
        raise _validate.invalid("statistic", f"one of {STATISTICS}", statistic)
    _validate.check_int_ge("bins", bins, 1)
    if statistic != "histogram" and bins != 1:
        raise _validate.invalid("bins", f"1 for {statistic}", bins)


def _rows(name: str, bands: Sequence[Sequence[int]], bins: int, signed: bool) -> list[list[int]]:
    """Validate a band report: ints (>= 0 unless ``signed``), rows of length <= bins."""
    out = []
    for b, row in enumerate(bands):
        if len(row) > bins:
            raise _validate.invalid(f"{name}[{b}] length", f"<= bins = {bins}", len(row))
        for value in row:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _validate.invalid(f"{name} entries", "integers", type(value).__name__)
            if value < 0 and not signed:
                raise _validate.invalid(f"{name} entries", ">= 0", "a negative entry")
        out.append(list(row) + [0] * (bins - len(row)))
    return out


def _add_counts(acc: Sequence[int], add: Sequence[int]) -> tuple[int, ...]:
    n = max(len(acc), len(add))
    return tuple(
        (acc[i] if i < len(acc) else 0) + (add[i] if i < len(add) else 0) for i in range(n)
    )


def _kept(rows: Sequence[Sequence[int]], exponent: int, bins: int) -> list[int]:
    """Per-bin units of bands 0..exponent (Truncate(., 2^exponent))."""
    kept = [0] * bins
    for row in rows[: exponent + 1]:
        for r, value in enumerate(row):
            kept[r] += value
    return kept


# ---------------------------------------------------------------------------------------
# AdvComp: a static user-DP algorithm rerun at every tick with eps'


@dataclass(frozen=True, slots=True)
class AdvCompSpec:
    """Public parameters of the AdvComp baseline for count / sum / histogram / F_0.

    Attributes:
        name: public identity (node prefix).
        statistic: "count", "sum", "histogram" or "distinct_count".
        epsilon, delta: the (epsilon, delta)-DP guarantee of the first ``horizon`` releases.
        horizon: T, the number of releases covered.
        step_epsilon: eps' of each release (``solve_step_epsilon``).
        beta: failure probability of each release's tau choice.
        bins: R (1 unless histogram).
        multiplier: m: the released vector's L1 sensitivity is m tau.
        max_exponent: J (tau <= 2^J).
        tau_share: the fraction of eps' spent on choosing tau.
    """

    name: str
    statistic: str
    epsilon: Fraction
    delta: Fraction
    horizon: int
    step_epsilon: Fraction
    beta: Fraction
    bins: int
    multiplier: int
    max_exponent: int
    tau_share: Fraction


@dataclass(frozen=True, slots=True)
class AdvCompState:
    """Attributes: t; crossings, the cumulative G (G[j] = Count(D_t, 2^j)); totals, the
    cumulative units per band and bin of D_t (flat index band * bins + bin)."""

    t: int = 0
    crossings: tuple[int, ...] = ()
    totals: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BaselineRelease:
    """What AdvComp and fixed-tau truncation release at a tick. Attributes: t; bins, one
    TreeRelease per bin (std and ci95 of its noise); tau, the clipping bound used."""

    t: int
    bins: tuple[TreeRelease, ...]
    tau: int

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(rel.value for rel in self.bins)

    @property
    def value(self) -> int:
        return self.bins[0].value


def make_advcomp(
    name: str,
    statistic: str,
    epsilon: float | Fraction,
    horizon: int,
    *,
    delta: float | Fraction = DEFAULT_DELTA,
    beta: float | Fraction = Fraction(1, 10),
    bins: int = 1,
    any_subset: bool = False,
    max_exponent: int = DEFAULT_MAX_EXPONENT,
    tau_share: float | Fraction = Fraction(1, 2),
) -> AdvCompSpec:
    """Validate and build an AdvCompSpec (module docstring).

    Args:
        name: public identity.
        statistic: "count", "sum", "histogram" or "distinct_count".
        epsilon: total budget > 0 over the horizon.
        horizon: T >= 1.
        delta: in (0, 1); default 1e-6.
        beta: in (0, 1).
        bins: R for a histogram.
        any_subset: "any subset" neighbours (histogram sensitivity 2 tau).
        max_exponent: J >= 1.
        tau_share: in (0, 1).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        Each release is eps'-DP under user-level neighbours (AboveThreshold with
        tau_share eps', then Laplace with the rest); advanced composition over the
        ``horizon`` releases gives (epsilon, delta)-DP.
    """
    _check_statistic(statistic, bins)
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    dlt = _validate.exact_fraction("delta", delta)
    _validate.check_probability("delta", dlt)
    b = _validate.exact_fraction("beta", beta)
    _validate.check_probability("beta", b)
    _validate.check_int_ge("horizon", horizon, 1)
    _validate.check_int_ge("max_exponent", max_exponent, 1)
    share = _validate.exact_fraction("tau_share", tau_share)
    _validate.check_probability("tau_share", share)
    if not isinstance(any_subset, bool):
        raise _validate.invalid("any_subset", "a bool", any_subset)
    multiplier = 2 if any_subset and statistic == "histogram" else 1
    return AdvCompSpec(
        name=name,
        statistic=statistic,
        epsilon=eps,
        delta=dlt,
        horizon=horizon,
        step_epsilon=solve_step_epsilon(eps, dlt, horizon),
        beta=b,
        bins=bins,
        multiplier=multiplier,
        max_exponent=max_exponent,
        tau_share=share,
    )


def advcomp_init(spec: AdvCompSpec) -> AdvCompState:
    return AdvCompState()


def choose_tau(spec: AdvCompSpec, t: int, crossings: Sequence[int], noise: NoiseSource) -> int:
    """The static tau choice at tick t: AboveThreshold over j = 1..J on -Count(D_t, 2^j).

    Nodes ``(name, "adv", t, "svt", "eta")`` and ``(name, "adv", t, "svt", "q", j)``; the
    first j that fires gives tau = 2^j (2^J if none does).
    """
    eps_1 = spec.step_epsilon * spec.tau_share
    svt = make_above_threshold(eps_1, (spec.name, "adv", t, "svt"))
    margin = 6 / float(eps_1) * LOG(2 / spec.beta)
    state = _SvtState()
    for j in range(1, spec.max_exponent + 1):
        count = crossings[j] if j < len(crossings) else 0
        # -Count + Z_q > -margin + Z_eta: stop once few users are above 2^j.
        state, stopped = above_threshold_step(svt, state, -count, j, noise, -margin)
        if stopped:
            return 1 << j
    return 1 << spec.max_exponent


def advcomp_step(
    spec: AdvCompSpec,
    state: AdvCompState,
    bands: Sequence[Sequence[int]],
    crossings: Sequence[int],
    noise: NoiseSource,
) -> tuple[AdvCompState, BaselineRelease]:
    """Tick t = state.t + 1: absorb the tick's report, rerun the static algorithm on D_t.

    Args:
        spec: the baseline's parameters.
        state: the state after tick t - 1.
        bands: this tick's ``bands[b][r]`` (``user_level.counter`` report; for distinct count the
            signed units of ``distinct_count.first_occurrence_units`` as ``[[u] for u in
            units]``).
        crossings: this tick's crossings.
        noise: the NoiseSource.

    Returns:
        (new state, release).

    Raises:
        BudgetExceededError: t > horizon (the (epsilon, delta) budget covers T releases).
        InvalidOperatorConfig: a malformed report.
    """
    t = state.t + 1
    if t > spec.horizon:
        raise BudgetExceededError(
            f"tick must be <= horizon = {spec.horizon}, got {t}: the advanced-composition "
            "budget covers that many releases"
        )
    rows = _rows("bands", bands, spec.bins, spec.statistic == "distinct_count")
    totals = _add_counts(state.totals, [v for row in rows for v in row])
    cumulative = _add_counts(state.crossings, crossings)
    tau = choose_tau(spec, t, cumulative, noise)
    exponent = tau.bit_length() - 1
    nbands = -(-len(totals) // spec.bins)
    total_rows = [totals[b * spec.bins : (b + 1) * spec.bins] for b in range(nbands)]
    kept = _kept(total_rows, exponent, spec.bins)
    scale = Fraction(spec.multiplier * tau) / (spec.step_epsilon * (1 - spec.tau_share))
    first = noisy_release(t, kept[0], [((spec.name, "adv", t, "v", 0), scale, 1)], noise)
    releases = (first,) + tuple(
        TreeRelease(
            t=t,
            value=kept[r] + noise.discrete_laplace((spec.name, "adv", t, "v", r), scale),
            std=first.std,
            ci95=first.ci95,
        )
        for r in range(1, spec.bins)
    )
    new_state = AdvCompState(t=t, crossings=cumulative, totals=totals)
    return new_state, BaselineRelease(t=t, bins=releases, tau=tau)


# ---------------------------------------------------------------------------------------
# AdvComp for the max: AboveThreshold on U(r) = |{u : some item >= r}|


@dataclass(frozen=True, slots=True)
class AdvCompMaxSpec:
    """Public parameters of the static max rerun per tick (module docstring).

    Attributes: name; domain (items in [1, domain]); epsilon, delta, horizon,
    step_epsilon as in AdvCompSpec; beta, the per-release failure probability.
    """

    name: str
    domain: int
    epsilon: Fraction
    delta: Fraction
    horizon: int
    step_epsilon: Fraction
    beta: Fraction


@dataclass(frozen=True, slots=True)
class AdvCompMaxState:
    """Attributes: t; users_at_least[r - 1] = U(r) on D_t."""

    t: int = 0
    users_at_least: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AdvCompMaxRelease:
    """Attributes: t; value, the estimate of the max (0 = none); margin, the threshold."""

    t: int
    value: int
    margin: float


def make_advcomp_max(
    name: str,
    domain: int,
    epsilon: float | Fraction,
    horizon: int,
    *,
    delta: float | Fraction = DEFAULT_DELTA,
    beta: float | Fraction = Fraction(1, 10),
) -> AdvCompMaxSpec:
    """Validate and build an AdvCompMaxSpec.

    Privacy:
        U(r) changes by <= 1 when one user's items (all, or any subset) are removed;
        AboveThreshold makes each release eps'-DP, advanced composition (epsilon, delta).
    """
    _validate.check_int_ge("domain", domain, 1)
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    dlt = _validate.exact_fraction("delta", delta)
    _validate.check_probability("delta", dlt)
    b = _validate.exact_fraction("beta", beta)
    _validate.check_probability("beta", b)
    _validate.check_int_ge("horizon", horizon, 1)
    return AdvCompMaxSpec(
        name=name,
        domain=domain,
        epsilon=eps,
        delta=dlt,
        horizon=horizon,
        step_epsilon=solve_step_epsilon(eps, dlt, horizon),
        beta=b,
    )


def advcomp_max_init(spec: AdvCompMaxSpec) -> AdvCompMaxState:
    return AdvCompMaxState(users_at_least=(0,) * spec.domain)


def advcomp_max_step(
    spec: AdvCompMaxSpec, state: AdvCompMaxState, reached: Sequence[int], noise: NoiseSource
) -> tuple[AdvCompMaxState, AdvCompMaxRelease]:
    """Tick t: U += reached; scan r = domain..1 with AboveThreshold (nodes
    ``(name, "adv", t, "svt", ...)``, query key r); output the first r that fires.

    Args:
        spec: the baseline's parameters.
        state: the state after tick t - 1.
        reached: ``reached[r - 1]`` = users whose running max went from < r to >= r.
        noise: the NoiseSource.

    Raises:
        BudgetExceededError: t > horizon.
        InvalidOperatorConfig: a malformed report.
    """
    t = state.t + 1
    if t > spec.horizon:
        raise BudgetExceededError(
            f"tick must be <= horizon = {spec.horizon}, got {t}: the advanced-composition "
            "budget covers that many releases"
        )
    (row,) = _rows("reached", [reached], spec.domain, False)
    users = tuple(a + b for a, b in zip(state.users_at_least, row, strict=True))
    svt = make_above_threshold(spec.step_epsilon, (spec.name, "adv", t, "svt"))
    margin = 6 / float(spec.step_epsilon) * LOG(2 * spec.domain / spec.beta)
    svt_state = _SvtState()
    value = 0
    for r in range(spec.domain, 0, -1):
        svt_state, stopped = above_threshold_step(svt, svt_state, users[r - 1], r, noise, margin)
        if stopped:
            value = r
            break
    return AdvCompMaxState(t=t, users_at_least=users), AdvCompMaxRelease(
        t=t, value=value, margin=margin
    )


# ---------------------------------------------------------------------------------------
# Fixed tau (Alg. 3 with the full epsilon) and random tau


@dataclass(frozen=True, slots=True)
class FixedTauSpec:
    """Public parameters of a fixed-tau truncation counter (count, sum, histogram, F_0).

    Attributes:
        name: public identity (node prefix).
        statistic: "count", "sum", "histogram" or "distinct_count".
        epsilon: the whole budget (Alg. 3: EventDP with epsilon / tau).
        tau: the truncation bound, a power of two.
        bins: R (1 unless histogram).
        multiplier: m in the node scale (l+1) m tau / epsilon: 1, 2 for F_0, doubled
            with "any subset" (docs/papers.md).
    """

    name: str
    statistic: str
    epsilon: Fraction
    tau: int
    bins: int
    multiplier: int


@dataclass(frozen=True, slots=True)
class FixedTauState:
    """The exact tree of the kept units (``user_level.ExactTreeState``'s fields; node
    vectors indexed by bin)."""

    t: int = 0
    alpha: tuple[ul.Vector, ...] = ()
    periods: tuple[ul.Vector, ...] = ()


def make_fixed_tau(
    name: str,
    statistic: str,
    epsilon: float | Fraction,
    tau: int,
    *,
    bins: int = 1,
    any_subset: bool = False,
) -> FixedTauSpec:
    """Validate and build a FixedTauSpec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range (tau must be a power of two).

    Privacy:
        Removing one user changes each level's node vector of Truncate(D, tau) by <= tau
        (count, sum, histogram; 2 tau with "any subset") or D-bar's by <= 2 tau (F_0;
        4 tau): epsilon-DP by group privacy (Dong-Luo-Yi Alg. 3; docs/papers.md for any subset).
    """
    _check_statistic(statistic, bins)
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    _validate.check_int_ge("tau", tau, 1)
    if tau & (tau - 1):
        raise _validate.invalid("tau", "a power of two", tau)
    if not isinstance(any_subset, bool):
        raise _validate.invalid("any_subset", "a bool", any_subset)
    multiplier = (2 if statistic == "distinct_count" else 1) * (2 if any_subset else 1)
    return FixedTauSpec(
        name=name, statistic=statistic, epsilon=eps, tau=tau, bins=bins, multiplier=multiplier
    )


def random_tau(rng: np.random.Generator) -> int:
    """tau uniform on {2, 4, ..., 2^20}, from a public generator independent of the data."""
    return RANDOM_TAU_CANDIDATES[int(rng.integers(len(RANDOM_TAU_CANDIDATES)))]


def fixed_tau_init(spec: FixedTauSpec) -> FixedTauState:
    return FixedTauState()


def fixed_scale(spec: FixedTauSpec, period: int) -> Fraction:
    """(period + 1) m tau / epsilon: the scale of every node of ``period``."""
    return Fraction((period + 1) * spec.multiplier * spec.tau) / spec.epsilon


def fixed_release_nodes(spec: FixedTauSpec, t: int) -> list[tuple[ul.TreeNode, NodeId, Fraction]]:
    """The nodes of the release at t: (exact node, noise id without the bin, scale).

    Ids ``(name, "fixed", "P", p)`` for completed period p and
    ``(name, "fixed", l, level, q)`` for a live node; append the bin r.
    """
    period, k = ul.period_of(t)
    out: list[tuple[ul.TreeNode, NodeId, Fraction]] = []
    for node in ul.tree_nodes(t):
        kind, index = node
        if kind == "P":
            out.append((node, (spec.name, "fixed", "P", index), fixed_scale(spec, index)))
        else:
            node_id = (spec.name, "fixed", period, index, (k >> index) - 1)
            out.append((node, node_id, fixed_scale(spec, period)))
    return out


def fixed_tau_step(
    spec: FixedTauSpec,
    state: FixedTauState,
    bands: Sequence[Sequence[int]],
    noise: NoiseSource,
) -> tuple[FixedTauState, BaselineRelease]:
    """Tick t = state.t + 1: keep the bands 0..log2 tau of the report, advance, release.

    Args:
        spec: the baseline's parameters.
        state: the state after tick t - 1.
        bands: this tick's ``bands[b][r]`` (signed units for distinct count).
        noise: the NoiseSource.

    Returns:
        (new state, release of F(Truncate(D_t, tau)) + noise, per bin).
    """
    rows = _rows("bands", bands, spec.bins, spec.statistic == "distinct_count")
    leaf = _kept(rows, spec.tau.bit_length() - 1, spec.bins)
    tree = ul.exact_tree_advance(
        ul.ExactTreeState(t=state.t, alpha=state.alpha, periods=state.periods), leaf
    )
    nodes = fixed_release_nodes(spec, tree.t)
    exact = [0] * spec.bins
    for node, _, _ in nodes:
        for r, value in enumerate(ul.exact_node(tree, node)):
            exact[r] += value
    # Every bin uses the same public scales, so bin 0's error bar serves them all.
    first = noisy_release(tree.t, exact[0], [(nid + (0,), s, 1) for _, nid, s in nodes], noise)
    releases = (first,) + tuple(
        TreeRelease(
            t=tree.t,
            value=exact[r] + sum(noise.discrete_laplace(nid + (r,), s) for _, nid, s in nodes),
            std=first.std,
            ci95=first.ci95,
        )
        for r in range(1, spec.bins)
    )
    new_state = FixedTauState(t=tree.t, alpha=tree.alpha, periods=tree.periods)
    return new_state, BaselineRelease(t=tree.t, bins=releases, tau=spec.tau)


# ---------------------------------------------------------------------------------------
# Fixed-tau k-selection


@dataclass(frozen=True, slots=True)
class FixedTauKSelectionSpec:
    """Alg. 6 on fixed-tau histograms (``k_selection`` for the selection itself).

    Attributes: as in ``k_selection.KSelectionSpec``, with ``tau`` fixed and ``levels``
    the fixed-tau histograms (epsilon/(LOG R + 1) each, or one with epsilon).
    """

    name: str
    domain: int
    R: int
    k: int
    epsilon: Fraction
    beta: Fraction
    tau: int
    dyadic: bool
    levels: tuple[FixedTauSpec, ...]
    delta_mode: str
    delta_factor: Fraction
    search: str


@dataclass(frozen=True, slots=True)
class FixedTauKSelectionState:
    """Per level (index = level - 1) the exact tree's fields."""

    t: int = 0
    alpha: tuple[tuple[ul.Vector, ...], ...] = ()
    periods: tuple[tuple[ul.Vector, ...], ...] = ()


def make_fixed_tau_k_selection(
    name: str,
    domain: int,
    epsilon: float | Fraction,
    beta: float | Fraction,
    tau: int,
    *,
    k: int = 1,
    dyadic: bool = True,
    halve_delta: bool = False,
    delta_mode: str = "eq3",
    search: str = "scan",
    any_subset: bool = False,
) -> FixedTauKSelectionSpec:
    """Validate and build a FixedTauKSelectionSpec (see ``k_selection.make_k_selection``).

    Privacy:
        Each level histogram is epsilon/(LOG R + 1)-DP (fixed-tau truncation by total
        rank, group privacy); basic composition gives epsilon.
    """
    _validate.check_int_ge("domain", domain, 1)
    _validate.check_int_ge("k", k, 1)
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    b = _validate.exact_fraction("beta", beta)
    _validate.check_probability("beta", b)
    if delta_mode not in ks.DELTA_MODES:
        raise _validate.invalid("delta_mode", f"one of {ks.DELTA_MODES}", delta_mode)
    if search not in ks.SEARCHES:
        raise _validate.invalid("search", f"one of {ks.SEARCHES}", search)
    for flag_name, flag in (("dyadic", dyadic), ("halve_delta", halve_delta)):
        if not isinstance(flag, bool):
            raise _validate.invalid(flag_name, "a bool", flag)
    R = ks.padded_domain(domain) if dyadic else domain  # noqa: N806
    count = ks.num_levels(R) if dyadic else 1
    levels = tuple(
        make_fixed_tau(
            f"{name}/L{i}",
            "histogram",
            eps / count,
            tau,
            bins=ks.level_bins(R, i),
            any_subset=any_subset,
        )
        for i in range(1, count + 1)
    )
    return FixedTauKSelectionSpec(
        name=name,
        domain=domain,
        R=R,
        k=k,
        epsilon=eps,
        beta=b,
        tau=tau,
        dyadic=dyadic,
        levels=levels,
        delta_mode=delta_mode,
        delta_factor=Fraction(1, 2) if halve_delta else Fraction(1),
        search=search,
    )


def fixed_tau_k_selection_init(spec: FixedTauKSelectionSpec) -> FixedTauKSelectionState:
    n = len(spec.levels)
    return FixedTauKSelectionState(alpha=((),) * n, periods=((),) * n)


def fixed_tau_k_selection_step(
    spec: FixedTauKSelectionSpec,
    state: FixedTauKSelectionState,
    bands: Sequence[Sequence[int]],
    noise: NoiseSource,
) -> tuple[FixedTauKSelectionState, ks.KSelectionRelease]:
    """Tick t: step every fixed-tau level histogram, then the k-selection scan.

    Args:
        spec: the baseline's parameters.
        state: the state after tick t - 1.
        bands: the finest-level report ``bands[b][x - 1]``.
        noise: the NoiseSource.
    """
    per_level = ks.aggregate_bands(bands, spec.domain, spec.R, len(spec.levels))
    alphas, periods, hists = [], [], []
    t = state.t + 1
    for index, level in enumerate(spec.levels):
        level_state = FixedTauState(
            t=state.t, alpha=state.alpha[index], periods=state.periods[index]
        )
        new, rel = fixed_tau_step(level, level_state, per_level[index], noise)
        alphas.append(new.alpha)
        periods.append(new.periods)
        hists.append(rel.values)
    delta = _fixed_delta(spec, t)
    factor = float(spec.delta_factor)
    value = ks.select(
        spec.search,
        ks.suffix_function(hists, spec.dyadic),
        spec.domain,
        lambda r: spec.k + factor * delta(r),
    )
    new_state = FixedTauKSelectionState(t=t, alpha=tuple(alphas), periods=tuple(periods))
    return new_state, ks.KSelectionRelease(
        t=t,
        value=value,
        k=spec.k,
        margin=factor * delta(max(value, 1)),
        taus=(spec.tau,) * len(spec.levels),
        histograms=tuple(hists),
    )


def _fixed_delta(spec: FixedTauKSelectionSpec, t: int) -> Callable[[int], float]:
    if spec.delta_mode == "zero":
        return lambda r: 0.0
    level = spec.levels[0]
    if spec.delta_mode == "eq3":
        # Lemma III.1's Noise_E(t, epsilon_level / (m tau), beta / R) per bin.
        per_bin = ul.noise_e(t, level.epsilon / (level.multiplier * spec.tau), spec.beta / spec.R)
        if spec.dyadic:
            constant = math.sqrt(len(spec.levels)) * per_bin
            return lambda r: constant
        return lambda r: math.sqrt(spec.domain - r + 1) * per_bin
    level_scales = [tuple(s for _, _, s in fixed_release_nodes(lv, t)) for lv in spec.levels]
    return ks.chernoff_margin(level_scales, spec.domain, spec.dyadic, float(spec.beta) / spec.R)
