"""User-level private mean of one cell: Baseline, Array-Averaging, Levy, Quantile (Rameshwar et
al.).

A cell is (key, time slot), e.g. (H3 index, hour). At the cell's close the pipeline hands
over one ``UserCellAggregate`` per user present (count, total and the first values in
a value-independent order, in grid units) and gets back the released mean, its error bar,
and the users whose data entered it (for ``cell_accountant``).

Mechanisms (Rameshwar et al. Sec. III; U = upper - lower; eps the cell's total budget):

=================  ===========================================  =========================
mechanism           statistic f                                  noise on f
=================  ===========================================  =========================
baseline (III-B)    pooled mean of all samples                   Lap(U m^* / (N eps))
array_averaging     unweighted mean of the array means (III-C)   Lap(U / (K_bar eps)) best,
                                                                 Lap(2U / (K eps)) wrap
levy (III-D)        mean of array means projected on [a, b],     Lap(2 s (b - a)/(K_bar eps))
                    [a, b] = PrivateInterval at eps / 2
quantile (III-E)    mean of array means projected on [a', b'],   Lap(2 s (b'-a')/(K_bar eps))
                    a', b' private quantiles at eps / 4 each
noisy_ratio (ours)  capped mean: noisy sum / noisy count,        Lap(c U / eps) on the sum
                    eps / 2 each                                 (2 c U / eps any-subset),
                                                                 Lap(2c / eps) on the count
=================  ===========================================  =========================

(s = 1 for BestFit, 2 for WrapAround; K_bar is K under WrapAround.)

**Privacy model.** The first four are the paper's: neighbours share the count matrix and
differ in one user's values (Rameshwar et al. Sec. II-D), so N, m^*, m_UB, the grouping and the
number of arrays are functions of public counts. They are available only with
``counts_public=True``, which must come from the configuration. Otherwise (the default) the
mechanism must be ``noisy_ratio``, our strict mode (docs/papers.md): add/remove-user neighbours, a
fixed public cap c of samples per (cell, user), noisy sum and noisy count. With ``any_subset``
(neighbours drop any subset of one user's events) the first-c cap can promote a user's
later values when earlier ones are dropped, so the sum's sensitivity and noise double
(``sum_sensitivity``); the count's stays c.

**Grid units and sensitivity.** Values are reals in [lower, upper], both multiples of the
public grid step g. Stage 1 clips every value to [lower, upper] and snaps it to the nearest
grid point (``snapping.to_units``), a per-record transformation with no privacy cost and
at most g/2 of error per value. From there on everything is exact integer/rational
arithmetic in grid units: U_units = (upper - lower) / g, and every sensitivity above is
the paper's, in units, with no rounding (the grid only bounds the data error by g/2).

**Exact discrete noise.** f (a rational) is rounded to the lattice of step rho = Delta / D
(D = ``lattice``, default 1024): F = round(f / rho). F moves by at most
ceil(Delta / rho) = D between neighbours (``snapping`` lemma), so F + Z with Z discrete
Laplace of scale D / eps_mean is eps_mean-DP, and the release is (F + Z) rho: a Laplace of
scale Delta / eps_mean sampled on a lattice D times finer than itself, with rounding error
at most rho / 2. No floating-point noise is ever added; private interval and quantile
choices are sampled exactly too (``exponential_mechanism``).

**Error bar.** ``std`` is the exact standard deviation of the added noise (discrete
Laplace variance times rho^2); ``ci95`` is a guaranteed half-width: P(|value - f| > ci95)
<= 0.05 (the noise's exact 95% quantile plus rho / 2 of rounding). Both are about the
mechanism's own statistic f. For Baseline f is the cell's mean (of the snapped values);
for the array mechanisms f also differs from the pooled mean by the bias of equal array
weights, sample clipping and projection, which the paper does not bound (Sec. III), so
the bar covers the noise only. For noisy_ratio the std is the delta-method value at the
released sum and count, and ci95 the widest distance to the capped mean compatible with
both noises inside their exact 97.5% quantiles (all computed from released values; a
union bound, so conservative).

**Determinism and node ids.** Given the aggregates (in any order: users are sorted
internally), the spec and the noise source, the outcome is fixed. Every random quantity
has a public node id under the cell's id ``cell`` (e.g. (statistic, key, slot)):
``(*cell, "mean")``; bits ``(*cell, "interval", j)``, ``(*cell, "quantile", "lower", j)``,
``(*cell, "quantile", "upper", j)``; strict mode ``(*cell, "sum")``, ``(*cell, "count")``.
With the keyed source a replay re-emits the same release instead of drawing again.

Choices where the paper is silent are marked [C] (our choice) in the docstrings below and
listed in docs/cell-means.md.

References:
    Rameshwar et al., "Mean Estimation with User-Level Privacy on Multi-Dimensional IoT
    Datasets" (arXiv:2405.06261; companion arXiv:2401.15906): Sec. II-D, III, Baseline,
    Algorithms 1-3, eqs. (6)-(10); the strict mode is ours (docs/papers.md).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..errors import DpStreamError
from ..noise import (
    Grid,
    NodeId,
    NoiseBits,
    NoiseSource,
    discrete_laplace_variance,
    exact_half_width,
    make_grid,
    node_bytes,
    ratio_bounds,
    to_units,
)
from ..selection import private_interval as pi
from ..selection import private_quantile as pq
from . import pseudo_users as pu
from .cell_accountant import CellCharge

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "cell_mean"
MECHANISMS = ("baseline", "array_averaging", "levy", "quantile", "noisy_ratio")
PAPER_MECHANISMS = MECHANISMS[:4]
M_UB_RULES = ("median", "eq10")
DEFAULT_M_UB = {"array_averaging": "median", "levy": "eq10", "quantile": "eq10"}
"""Rameshwar et al. Sec. III-C to III-E: Array-Averaging uses the median, Levy and Quantile eq.
(10)."""

DEFAULT_LATTICE = 1024
DEFAULT_HEAD_CAP = 4096


class MalformedAggregates(DpStreamError, ValueError):
    """The per-user aggregates break their contract (a pipeline bug, not bad data)."""


@dataclass(frozen=True, slots=True)
class CellMeanSpec:
    """Public parameters of a per-cell mean.

    Attributes:
        mechanism: one of MECHANISMS.
        epsilon: the total budget of one cell release (what each kept user is charged).
        lower: a, lower bound of the values (value units, a multiple of ``step``).
        upper: b > a, upper bound (a multiple of ``step``).
        step: the public grid step g of the values.
        counts_public: the Rameshwar et al. model (Sec. II-D; True, from configuration) or strict.
        grouping: "best_fit" or "wrap_around" (array mechanisms).
        m_ub: "median", "eq10" or a fixed integer (array mechanisms).
        gamma: Levy's failure probability in eq. (8) (0.2 in the paper).
        quantile: "fixed" or "optimized".
        quantile_step: output grid step of the private quantiles (value units).
        head_cap: M_cap, the most values stage 1 keeps per (cell, user); m_UB <= M_cap.
        contribution_cap: c, the strict mode's samples per (cell, user) (0 when unused).
        lattice: D, the release lattice is Delta / D.
        any_subset: strict mode's relation: False for add/remove-user neighbours, True for
            neighbours that drop any subset of one user's events (the sum's scale doubles).
    """

    mechanism: str
    epsilon: Fraction
    lower: Fraction
    upper: Fraction
    step: Fraction
    counts_public: bool
    grouping: str
    m_ub: str | int
    gamma: Fraction
    quantile: str
    quantile_step: Fraction
    head_cap: int
    contribution_cap: int
    lattice: int
    any_subset: bool = False

    @property
    def lo(self) -> int:
        """lower in grid units."""
        return int(self.lower / self.step)

    @property
    def hi(self) -> int:
        """upper in grid units."""
        return int(self.upper / self.step)

    @property
    def value_range(self) -> int:
        """U in grid units: (upper - lower) / step."""
        return self.hi - self.lo


@dataclass(frozen=True, slots=True)
class UserCellAggregate:
    """What stage 1 keeps of one user in one cell, all in grid units.

    Attributes:
        user: opaque user id (hashed).
        count: m_l, the user's number of values in the cell, >= 1.
        total: the sum of all m_l values.
        head: the first min(m_l, head_cap) values in the value-independent order (event
            time, partition, offset): the arrays take prefixes of it. Never sort by value.
    """

    user: str
    count: int
    total: int
    head: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PreparedCell:
    """The deterministic part of a release: everything computed from the data before noise.

    Never publish it: it holds exact statistics. Attributes (grid units):
        n_users: L, users in the cell.
        n_samples: N, their values.
        total: sum of all values (exact; the pooled mean is total / N).
        m_star: largest count m^*.
        m_ub: array capacity used (array mechanisms), else 0.
        n_arrays: K (wrap) or K_bar (best fit), else 0.
        sorted_means: array means in ascending order.
        prefix: prefix sums of sorted_means (length n_arrays + 1).
        used_samples: values that enter the statistic.
        kept_users: users with at least one value in the statistic (sorted).
        capped_count: strict mode, sum of min(m_l, c).
        centered_sum: strict mode, sum over kept values of 2 x - (lo + hi).
    """

    n_users: int
    n_samples: int
    total: int
    m_star: int
    m_ub: int
    n_arrays: int
    sorted_means: tuple[Fraction, ...]
    prefix: tuple[Fraction, ...]
    used_samples: int
    kept_users: tuple[str, ...]
    capped_count: int
    centered_sum: int


@dataclass(frozen=True, slots=True)
class CellRelease:
    """The public result of one cell (safe to publish).

    Attributes:
        cell: the cell's public id.
        mechanism: the mechanism name (and grouping, for array mechanisms).
        epsilon: the cell's total budget.
        value: the released mean, value units.
        std: exact std of the added noise, value units.
        ci95: guaranteed 95% half-width around the mechanism's statistic (see module doc).
        noise_scale: Laplace scale b = Delta / eps_mean of the mean's noise, value units.
        interval: the private clipping interval [a, b] (levy, quantile), value units.
        n_users: kept users (public counts only; None in strict mode).
        n_samples: values in the statistic (None in strict mode).
        m_ub: array capacity (array mechanisms).
        n_arrays: K or K_bar (array mechanisms).
        noisy_count: strict mode's released noisy count.
    """

    cell: NodeId
    mechanism: str
    epsilon: float
    value: float
    std: float
    ci95: float
    noise_scale: float
    interval: tuple[float, float] | None = None
    n_users: int | None = None
    n_samples: int | None = None
    m_ub: int | None = None
    n_arrays: int | None = None
    noisy_count: int | None = None


@dataclass(frozen=True, slots=True)
class CellOutcome:
    """A release plus what the accountant needs.

    Attributes:
        release: the public release; None when the cell has no user (public counts only:
            a cell's emptiness is then public).
        kept_users: users whose values entered the release. NEVER publish or log them.
        charge: the privacy event for ``cell_accountant.charge`` (None if no release).
    """

    release: CellRelease | None
    kept_users: tuple[str, ...]
    charge: CellCharge | None


# ---------------------------------------------------------------------------------------
# Spec


def make_cell_mean(
    mechanism: str,
    epsilon: float | int | str | Fraction,
    lower: float | int | str | Fraction,
    upper: float | int | str | Fraction,
    step: float | int | str | Fraction,
    *,
    counts_public: bool = False,
    grouping: str = "best_fit",
    m_ub: str | int | None = None,
    gamma: float | str | Fraction = "0.2",
    quantile: str = "fixed",
    quantile_step: float | int | str | Fraction | None = None,
    head_cap: int = DEFAULT_HEAD_CAP,
    contribution_cap: int | None = None,
    lattice: int = DEFAULT_LATTICE,
    any_subset: bool = False,
) -> CellMeanSpec:
    """Validate every parameter and build a CellMeanSpec.

    Args:
        mechanism: "baseline", "array_averaging", "levy", "quantile" or "noisy_ratio".
        epsilon: total budget of one cell release, > 0 (exact rational).
        lower: a, a multiple of ``step``.
        upper: b > a, a multiple of ``step``.
        step: grid step g > 0.
        counts_public: True only where the configuration declares counts public (Rameshwar et al.
            Sec. II-D); required by the paper's four mechanisms.
        grouping: "best_fit" (default, preferred by the paper) or "wrap_around".
        m_ub: "median", "eq10" or an integer >= 1; default per mechanism (DEFAULT_M_UB).
        gamma: Levy's gamma in (0, 1).
        quantile: "fixed" (levels 0.1, 0.9) or "optimized" (t / K_bar, t = ceil(2 / eps)).
        quantile_step: output grid of the private quantiles; default ``step``; must divide
            upper - lower.
        head_cap: M_cap >= 1, values kept per (cell, user) by stage 1 (m_UB <= M_cap [C]).
        contribution_cap: c >= 1 for noisy_ratio (required there), <= head_cap.
        lattice: D >= 1.
        any_subset: the neighbouring relation of noisy_ratio: False (default) for
            add/remove-user neighbours, True for neighbours that may drop any subset of
            one user's events. Only with counts_public False (the paper mechanisms' relation
            is fixed by the public counts).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range, or a paper mechanism is asked
            for without counts_public.

    Privacy:
        Paper mechanisms: eps-DP per cell for user-level value neighbours with a fixed,
        public count matrix (Rameshwar et al. Sec. II-D). noisy_ratio: eps-DP per cell for
        add/remove-user neighbours, or for any-subset neighbours when ``any_subset`` (sum scale
        2cU/(eps/2)). Across cells see ``cell_accountant``.
    """
    if mechanism not in MECHANISMS:
        raise _validate.invalid("mechanism", f"one of {MECHANISMS}", mechanism)
    if not isinstance(counts_public, bool):
        raise _validate.invalid("counts_public", "a bool", counts_public)
    if not isinstance(any_subset, bool):
        raise _validate.invalid("any_subset", "a bool", any_subset)
    if any_subset and counts_public:
        raise _validate.invalid("any_subset", "False when counts_public is True", any_subset)
    if mechanism in PAPER_MECHANISMS and not counts_public:
        raise _validate.invalid(
            "mechanism", "'noisy_ratio' unless counts_public is True (strict mode)", mechanism
        )
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    grid = make_grid(step)
    g = grid.step
    a = _validate.exact_fraction("lower", lower)
    b = _validate.exact_fraction("upper", upper)
    for name, value in (("lower", a), ("upper", b)):
        if (value / g).denominator != 1:
            raise _validate.invalid(name, f"a multiple of the grid step {g}", value)
    if not b > a:
        raise _validate.invalid("upper", f"> lower = {a}", b)
    if grouping not in pu.GROUPINGS:
        raise _validate.invalid("grouping", f"one of {pu.GROUPINGS}", grouping)
    rule: str | int = DEFAULT_M_UB.get(mechanism, "median") if m_ub is None else m_ub
    if isinstance(rule, str):
        if rule not in M_UB_RULES:
            raise _validate.invalid("m_ub", f"one of {M_UB_RULES} or an integer", rule)
    else:
        _validate.check_int_ge("m_ub", rule, 1)
    gam = _validate.exact_fraction("gamma", gamma)
    _validate.check_probability("gamma", gam)
    if quantile not in pq.QUANTILE_RULES:
        raise _validate.invalid("quantile", f"one of {pq.QUANTILE_RULES}", quantile)
    qstep = g if quantile_step is None else _validate.exact_fraction("quantile_step", quantile_step)
    _validate.check_positive("quantile_step", qstep)
    if ((b - a) / qstep).denominator != 1:
        raise _validate.invalid("quantile_step", f"a divisor of upper - lower = {b - a}", qstep)
    _validate.check_int_ge("head_cap", head_cap, 1)
    if mechanism == "noisy_ratio":
        if contribution_cap is None:
            raise _validate.invalid("contribution_cap", "an integer for noisy_ratio", None)
        _validate.check_int_ge("contribution_cap", contribution_cap, 1)
        if contribution_cap > head_cap:
            raise _validate.invalid(
                "contribution_cap", f"<= head_cap = {head_cap}", contribution_cap
            )
    elif contribution_cap is not None:
        _validate.check_int_ge("contribution_cap", contribution_cap, 1)
    _validate.check_int_ge("lattice", lattice, 1)
    return CellMeanSpec(
        mechanism=mechanism,
        epsilon=eps,
        lower=a,
        upper=b,
        step=g,
        counts_public=counts_public,
        grouping=grouping,
        m_ub=rule,
        gamma=gam,
        quantile=quantile,
        quantile_step=qstep,
        head_cap=head_cap,
        contribution_cap=contribution_cap or 0,
        lattice=lattice,
        any_subset=any_subset,
    )


def grid_of(spec: CellMeanSpec) -> Grid:
    return Grid(step=spec.step)


def add_value(
    spec: CellMeanSpec, aggregate: UserCellAggregate | None, user: str, value: float
) -> UserCellAggregate:
    """Stage 1's step for one (cell, user): fold in one value (clip, snap, count, sum, head).

    Call it in the value-independent order (event time, partition, offset): the head keeps
    the first ``head_cap`` values in that order. Clipping to [lower, upper] and snapping to
    the grid are per-record transformations (no privacy cost, at most g/2 error each).

    Args:
        spec: the cell mean's spec (bounds, grid, head_cap).
        aggregate: the user's aggregate so far in this cell, or None for the first value.
        user: the user id (must match ``aggregate``).
        value: a finite real (values outside [lower, upper] are clipped).

    Returns:
        The new aggregate.
    """
    if not math.isfinite(value):
        raise _validate.invalid("value", "finite (reject it at ingest)", value)
    units = to_units(grid_of(spec), min(max(float(value), float(spec.lower)), float(spec.upper)))
    units = min(max(units, spec.lo), spec.hi)
    if aggregate is None:
        return UserCellAggregate(user=user, count=1, total=units, head=(units,))
    if aggregate.user != user:
        raise _validate.invalid("user", "the aggregate's user", "<redacted>")
    head = aggregate.head if len(aggregate.head) >= spec.head_cap else (*aggregate.head, units)
    return UserCellAggregate(
        user=user, count=aggregate.count + 1, total=aggregate.total + units, head=head
    )


def aggregate(spec: CellMeanSpec, user: str, values: Iterable[float]) -> UserCellAggregate:
    """All of one user's values in a cell, folded with ``add_value`` (tests, experiments).

    Args:
        spec: the cell mean's spec.
        user: the user id.
        values: the user's values in the cell, in value-independent (arrival) order.

    Returns:
        The aggregate.
    """
    result: UserCellAggregate | None = None
    for value in values:
        result = add_value(spec, result, user, value)
    if result is None:
        raise _validate.invalid("values", "non-empty", [])
    return result


# ---------------------------------------------------------------------------------------
# The deterministic part


def _sanitize(
    spec: CellMeanSpec, aggregates: Iterable[UserCellAggregate]
) -> list[UserCellAggregate]:
    """Sorted by user; values clamped to [lo, hi]; contract checked."""
    lo, hi = spec.lo, spec.hi
    out: dict[str, UserCellAggregate] = {}
    for agg in aggregates:
        if not isinstance(agg, UserCellAggregate):
            raise MalformedAggregates(
                f"aggregates must be UserCellAggregate, got {type(agg).__name__}"
            )
        if agg.count < 1:
            continue  # a user with no value is not in the cell
        if agg.user in out:
            raise MalformedAggregates(f"aggregates must have distinct users ({len(out)} read)")
        if len(agg.head) != min(agg.count, spec.head_cap):
            raise MalformedAggregates(
                f"head must hold min(count, head_cap) = {min(agg.count, spec.head_cap)} values, "
                f"got {len(agg.head)}"
            )
        head = tuple(min(max(int(v), lo), hi) for v in agg.head)
        total = min(max(int(agg.total), agg.count * lo), agg.count * hi)
        out[agg.user] = UserCellAggregate(agg.user, agg.count, total, head)
    return [out[user] for user in sorted(out)]


def resolve_m_ub(spec: CellMeanSpec, counts: dict[str, int]) -> int:
    """m_UB from the rule, then min(m_UB, m^*, head_cap) [C]: the arrays need prefixes that
    stage 1 kept, and m_UB > m^* would only empty WrapAround."""
    if spec.m_ub == "median":
        rule = pu.median_m_ub(counts)
    elif spec.m_ub == "eq10":
        rule = pu.eq10_m_ub(counts)
    else:
        rule = int(spec.m_ub)
    return max(1, min(rule, max(counts.values()), spec.head_cap))


def _prefix_sums(values: Sequence[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def prepare(spec: CellMeanSpec, aggregates: Iterable[UserCellAggregate]) -> PreparedCell:
    """Everything before noise: sanitize, group into arrays, compute array means.

    Order-independent (users are sorted by id, then by the grouping's own order). Raises
    only MalformedAggregates (a broken pipeline contract), never for a data value.

    Args:
        spec: the cell mean's spec.
        aggregates: one per user present in the cell.

    Returns:
        The PreparedCell (secret: exact statistics).
    """
    users = _sanitize(spec, aggregates)
    n_samples = sum(a.count for a in users)
    total = sum(a.total for a in users)
    m_star = max((a.count for a in users), default=0)
    kept = tuple(a.user for a in users)
    empty = PreparedCell(
        n_users=len(users), n_samples=n_samples, total=total, m_star=m_star, m_ub=0,
        n_arrays=0, sorted_means=(), prefix=(Fraction(0),), used_samples=n_samples,
        kept_users=kept, capped_count=0, centered_sum=0,
    )  # fmt: skip
    if spec.mechanism == "noisy_ratio":
        c, mid2 = spec.contribution_cap, spec.lo + spec.hi
        counts = [min(a.count, c) for a in users]
        sums = [sum(a.head[:n]) for a, n in zip(users, counts, strict=True)]
        return PreparedCell(
            n_users=len(users), n_samples=n_samples, total=total, m_star=m_star, m_ub=0,
            n_arrays=0, sorted_means=(), prefix=(Fraction(0),), used_samples=sum(counts),
            kept_users=kept, capped_count=sum(counts),
            centered_sum=sum(2 * s - n * mid2 for s, n in zip(sums, counts, strict=True)),
        )  # fmt: skip
    if spec.mechanism == "baseline" or not users:
        return empty
    counts_map = {a.user: a.count for a in users}
    m_ub = resolve_m_ub(spec, counts_map)
    arrays = pu.group(counts_map, m_ub, spec.grouping)
    prefixes = {a.user: _prefix_sums(a.head) for a in users}
    means = []
    for array in arrays:
        s = sum(prefixes[user][stop] - prefixes[user][start] for user, start, stop in array)
        means.append(Fraction(s, pu.fill(array)))
    means.sort()
    prefix = [Fraction(0)]
    for m in means:
        prefix.append(prefix[-1] + m)
    return PreparedCell(
        n_users=len(users), n_samples=n_samples, total=total, m_star=m_star, m_ub=m_ub,
        n_arrays=len(arrays), sorted_means=tuple(means), prefix=tuple(prefix),
        used_samples=sum(pu.fill(a) for a in arrays), kept_users=pu.users_of(arrays),
        capped_count=0, centered_sum=0,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# Statistics and sensitivities (grid units)


def projected_mean(prepared: PreparedCell, a: Fraction, b: Fraction) -> Fraction:
    """(1 / K_bar) sum_i Pi_[a, b](A_i) in O(log K_bar), from the sorted means."""
    means = prepared.sorted_means
    below = bisect_left(means, a)
    above = len(means) - bisect_right(means, b)
    middle = prepared.prefix[len(means) - above] - prepared.prefix[below]
    return (below * a + above * b + middle) / len(means)


def statistic(
    spec: CellMeanSpec, prepared: PreparedCell, interval: tuple[Fraction, Fraction] | None = None
) -> Fraction:
    """The exact f the mechanism adds noise to, in grid units.

    Args:
        spec: the spec.
        prepared: the cell's PreparedCell (non-empty).
        interval: [a, b] for levy and quantile (their private choice).

    Returns:
        f; for noisy_ratio the capped mean (sum / count, or the midpoint if no value).
    """
    if spec.mechanism == "baseline":
        return Fraction(prepared.total, prepared.n_samples)
    if spec.mechanism == "array_averaging":
        return prepared.prefix[-1] / prepared.n_arrays
    if spec.mechanism in ("levy", "quantile"):
        if interval is None:
            raise _validate.invalid("interval", "given for levy and quantile", None)
        return projected_mean(prepared, Fraction(interval[0]), Fraction(interval[1]))
    if prepared.capped_count == 0:
        return Fraction(spec.lo + spec.hi, 2)
    mid = Fraction(spec.lo + spec.hi, 2)
    return mid + Fraction(prepared.centered_sum, 2 * prepared.capped_count)


def sensitivity(
    spec: CellMeanSpec, prepared: PreparedCell, interval: tuple[Fraction, Fraction] | None = None
) -> Fraction:
    """User-level L1 sensitivity Delta of ``statistic`` (grid units), Rameshwar et al. Sec. III.

    baseline U m^*/N; array_averaging U/K_bar (best) or 2U/K (wrap, a user straddles two
    arrays); levy and quantile s (b - a) / K_bar; noisy_ratio: not a single sensitivity
    (sum c U, count c), raises.
    """
    u = spec.value_range
    s = pu.rank_sensitivity(spec.grouping)
    if spec.mechanism == "baseline":
        return Fraction(u * prepared.m_star, prepared.n_samples)
    if spec.mechanism == "array_averaging":
        return Fraction(s * u, prepared.n_arrays)
    if spec.mechanism in ("levy", "quantile"):
        if interval is None:
            raise _validate.invalid("interval", "given for levy and quantile", None)
        return s * (Fraction(interval[1]) - Fraction(interval[0])) / prepared.n_arrays
    raise _validate.invalid("mechanism", "not noisy_ratio (two sensitivities)", spec.mechanism)


def sum_sensitivity(spec: CellMeanSpec) -> int:
    """noisy_ratio: L1 sensitivity of the centred sum (doubled grid units) under the statistic's
    relation: c U for add/remove-user neighbours, 2 c U for any-subset neighbours."""
    return (2 if spec.any_subset else 1) * spec.contribution_cap * spec.value_range


def count_sensitivity(spec: CellMeanSpec) -> int:
    """noisy_ratio: L1 sensitivity of the capped count sum_l min(m_l, c): c under both
    relations (one user's min(m, c) stays in [0, c])."""
    return spec.contribution_cap


def mean_budget(spec: CellMeanSpec) -> Fraction:
    """The part of eps that the noise on f gets: eps, or eps / 2 for levy and quantile."""
    return spec.epsilon / 2 if spec.mechanism in ("levy", "quantile") else spec.epsilon


# ---------------------------------------------------------------------------------------
# Release


def _units_to_value(spec: CellMeanSpec, units: Fraction | int) -> float:
    return float(units * spec.step)


def _noisy_on_lattice(
    spec: CellMeanSpec,
    f: Fraction,
    delta: Fraction,
    eps: Fraction,
    node: NodeId,
    noise: NoiseSource,
) -> tuple[Fraction, float, float, float]:
    """(F + Z) rho with rho = Delta / D: (value, std, ci95, Laplace scale), grid units."""
    if delta == 0:
        return f, 0.0, 0.0, 0.0  # f is then a public constant (e.g. a' = b')
    rho = delta / spec.lattice
    lattice_value = math.floor(f / rho + Fraction(1, 2))
    scale = Fraction(spec.lattice) / eps
    z = noise.discrete_laplace(node, scale)
    std = math.sqrt(discrete_laplace_variance(scale)) * float(rho)
    ci95 = (exact_half_width([scale], 0.05) + 0.5) * float(rho)
    return (lattice_value + z) * rho, std, ci95, float(delta / eps)


def release_cell(
    spec: CellMeanSpec,
    cell: NodeId,
    aggregates: Iterable[UserCellAggregate],
    noise: NoiseSource,
) -> CellOutcome:
    """Release one cell's mean at its close.

    Args:
        spec: the cell mean's spec.
        cell: the cell's public id, e.g. (statistic, h3 key, slot); prefixes every node.
        aggregates: one UserCellAggregate per user kept in the cell (after the epoch cap and
            any Clip-User suppression), any order.
        noise: the noise source (keyed in production).

    Returns:
        The CellOutcome: release (None if no user and counts are public), kept users and
        the charge for the accountant.

    Raises:
        MalformedAggregates: the aggregates break their contract (pipeline bug).

    Privacy:
        eps-DP for the cell (see the module table); composition across cells is the
        accountant's (Thm II.3 over kept users).
    """
    node_bytes(cell)
    return release_prepared(spec, tuple(cell), prepare(spec, aggregates), noise)


def release_prepared(
    spec: CellMeanSpec, cell: NodeId, prepared: PreparedCell, noise: NoiseSource
) -> CellOutcome:
    """The random part of ``release_cell``, from a PreparedCell (experiments reuse it)."""
    cell = tuple(cell)
    if spec.mechanism == "noisy_ratio":
        return _release_noisy_ratio(spec, cell, prepared, noise)
    if prepared.n_users == 0:
        return CellOutcome(release=None, kept_users=(), charge=None)
    lo, hi = Fraction(spec.lo), Fraction(spec.hi)
    s = pu.rank_sensitivity(spec.grouping)
    interval: tuple[Fraction, Fraction] | None = None
    if spec.mechanism == "levy":
        radius = pi.tau(Fraction(spec.value_range), prepared.n_arrays, prepared.m_ub, spec.gamma)
        bits = NoiseBits(noise, (*cell, "interval"))
        chosen = pi.private_interval(prepared.sorted_means, lo, hi, radius, spec.epsilon, s, bits)
        interval = (chosen.lower, chosen.upper)
    elif spec.mechanism == "quantile":
        q_lo, q_hi = pq.levels(spec.quantile, spec.epsilon, prepared.n_arrays)
        step = spec.quantile_step / spec.step
        eps_q = spec.epsilon / 4
        ends = [
            pq.private_quantile(
                prepared.sorted_means, level, eps_q, s, lo, hi, step,
                NoiseBits(noise, (*cell, "quantile", side)),
            )
            for level, side in ((q_lo, "lower"), (q_hi, "upper"))
        ]  # fmt: skip
        interval = (min(ends), max(ends))  # the two ends are independent and may cross [C]
    f = statistic(spec, prepared, interval)
    delta = sensitivity(spec, prepared, interval)
    value, std, ci95, scale = _noisy_on_lattice(
        spec, f, delta, mean_budget(spec), (*cell, "mean"), noise
    )
    arrays = spec.mechanism != "baseline"
    g = float(spec.step)
    release = CellRelease(
        cell=cell,
        mechanism=f"{spec.mechanism}/{spec.grouping}" if arrays else spec.mechanism,
        epsilon=float(spec.epsilon),
        value=_units_to_value(spec, value),
        std=std * g,
        ci95=ci95 * g,
        noise_scale=scale * g,
        interval=None
        if interval is None
        else (_units_to_value(spec, interval[0]), _units_to_value(spec, interval[1])),
        n_users=len(prepared.kept_users),
        n_samples=prepared.used_samples,
        m_ub=prepared.m_ub if arrays else None,
        n_arrays=prepared.n_arrays if arrays else None,
    )
    charge = CellCharge(cell=cell, epsilon=spec.epsilon, users=prepared.kept_users)
    return CellOutcome(release=release, kept_users=prepared.kept_users, charge=charge)


def _release_noisy_ratio(
    spec: CellMeanSpec, cell: NodeId, prepared: PreparedCell, noise: NoiseSource
) -> CellOutcome:
    """Strict mode (ours, docs/papers.md): noisy centred sum and noisy count, eps / 2 each.

    Values are centred on the midpoint m = (lo + hi) / 2 and doubled to stay integers:
    each kept value adds 2x - (lo + hi) in [-U, U], and a user adds at most c of them, so
    adding or removing a user moves the sum by <= c U and the count by <= c. Under
    any-subset neighbours (``spec.any_subset``) dropping some of a user's first events
    promotes later ones into the first-c cap, so the user's kept part of the sum goes from
    one value in [-c U, c U] to another: it moves by <= 2 c U (tight: c values at lo
    dropped, c at hi promoted) and its scale doubles; the count min(m, c) still moves by
    <= c (it stays in [0, c]). The estimate
    is m + S~ / (2 N~) clamped to [lo, hi], or m when N~ < 1 [C]. It is released for every
    scheduled cell, empty or not.
    """
    u = spec.value_range
    half = spec.epsilon / 2
    sum_scale = Fraction(sum_sensitivity(spec)) / half
    count_scale = Fraction(count_sensitivity(spec)) / half
    noisy_sum = prepared.centered_sum + noise.discrete_laplace((*cell, "sum"), sum_scale)
    noisy_count = prepared.capped_count + noise.discrete_laplace((*cell, "count"), count_scale)
    lo, hi = Fraction(spec.lo), Fraction(spec.hi)
    mid = (lo + hi) / 2
    var_s = discrete_laplace_variance(sum_scale)
    var_n = discrete_laplace_variance(count_scale)
    if noisy_count >= 1:
        estimate = min(max(mid + Fraction(noisy_sum, 2 * noisy_count), lo), hi)
        ratio = noisy_sum / (2 * noisy_count)
        std = math.sqrt(var_s / (4 * noisy_count**2) + ratio**2 * var_n / noisy_count**2)
    else:
        estimate, std = mid, float(u) / 2
    ci95 = _ratio_interval(spec, estimate, noisy_sum, noisy_count, sum_scale, count_scale)
    g = float(spec.step)
    release = CellRelease(
        cell=cell,
        mechanism=spec.mechanism,
        epsilon=float(spec.epsilon),
        value=_units_to_value(spec, estimate),
        std=min(std, float(u)) * g,
        ci95=ci95 * g,
        noise_scale=float(sum_scale) / 2 * g,  # the sum's Laplace scale, in value units
        noisy_count=noisy_count,
    )
    charge = CellCharge(cell=cell, epsilon=spec.epsilon, users=prepared.kept_users)
    return CellOutcome(release=release, kept_users=prepared.kept_users, charge=charge)


def _ratio_interval(
    spec: CellMeanSpec,
    estimate: Fraction,
    noisy_sum: int,
    noisy_count: int,
    sum_scale: Fraction,
    count_scale: Fraction,
) -> float:
    """Widest |estimate - mu| over the box of (sum, count) inside both 97.5% bounds."""
    h_s = exact_half_width([sum_scale], 0.025)
    h_n = exact_half_width([count_scale], 0.025)
    lo, hi = float(spec.lo), float(spec.hi)
    box = ratio_bounds(noisy_sum, noisy_count, h_s, h_n)
    if box is None:
        return float(spec.value_range)
    mid = (lo + hi) / 2
    # mid + s / (2n) is monotone in s / n: its extremes are the box's.
    low, high = max(mid + box[0] / 2, lo), min(mid + box[1] / 2, hi)
    e = float(estimate)
    return max(e - low, high - e, 0.0)
