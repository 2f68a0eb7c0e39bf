"""User-level continual count, sum and histogram with efficient restart: Dong-Luo-Yi
Alg. 5, Sec. IV-A (sum) and IV-B (histogram).

F_cnt UserDP runs the contribution tracker (``svt``, Alg. 4) with epsilon/2 and beta/2. Each
time its output tau~ changes (always at t = 1) a new truncation instance j starts: the
binary tree on an infinite stream (Dong-Luo-Yi Alg. 2, ``tree_counter``) over
Truncate(D, tau~) for the WHOLE prefix, with node noise Lap((l+1) m tau~ / epsilon_inst_j)
and epsilon_inst_j = epsilon theta / (2 (j+1)^(1+theta)). Only the newest instance
releases; released values are never changed. With ``tree`` = ("kary", k) or
("kary_subtract", k) every instance runs that k-ary tree of ``kary_tree`` instead (same
period scale, its own node ids ``instance_tree``): a k-ary release needs only the exact
running total of its leaves and their L1 sensitivity, both of which the re-admission
below provides (docs/design.md, section 5a).

Design: rank bands instead of per-user overflow FIFOs
-----------------------------------------------------
tau~ is always a power of two, tau~ = 2^i. Stage 1 of the pipeline (partitioned by user)
keeps each user's exact c_u (count, histogram) or S_u (sum) and reports, for every tick,
the units it saw split by RANK BAND:

* band 0 holds rank 1, band b >= 1 holds ranks (2^(b-1), 2^b];
* a count or histogram item of rank c = the user's new c_u lies in band ``rank_band(c)``;
* a sum item x of a user with running sum S before it occupies unit positions S+1..S+x,
  split over the bands those positions fall in (``band_units``), so an item straddling a
  power of two splits exactly: the partial clipping of our batched Sec. IV-A at tau = 2^i.

``bands[b][r]`` is this tick's units in band b and bin r. Truncate(D, 2^i) keeps exactly
the units of bands 0..i. This module keeps, for every node of the tree (completed-period
totals P[p] and live nodes alpha[level]), its EXACT units per band and bin. The bands above
the current tau are the overflow. When tau grows to 2^i', the kept value of every node
becomes the sum of its bands 0..i': exactly the overflowed items with rank <= the new tau
re-enter the nodes of their ORIGINAL ticks, and no others (the restart of Alg. 5). Then every node
in use gets fresh noise at the new scale, because its noise id contains the new instance
number j. This is, node for node, a per-user FIFO re-admission (our streaming form of the restart),
and the exact nodes equal a from-scratch build on Truncate(D_t, tau~_t); the tests
check both on random streams with forced tau schedules. Stage 1 needs no overflow queue,
and this state is O(log t * bands * bins), whatever the overflow of heavy users.

``crossings[j]`` is the number of users whose c_u (or S_u) went from <= 2^j to > 2^j in the
tick (``crossed_powers``); the mechanism adds them to G, G[j] = Count(D_t, 2^j) on the
ORIGINAL stream, which the tracker reads. Reports of several stage-1 partitions add up
elementwise (``merge_reports``).

Order inside a step: G += crossings; the tracker decides tau~_t from D_t; if
tau~ changed, a new instance j (re-admission is implicit in the bands); the tree advances
with the tick's leaf; release.

Noise ids (public):

* tracker: ``(name, "svt", i, "eta")`` and ``(name, "svt", i, "q", t)`` (see ``svt``);
* completed period p, bin r, instance j: ``(name, "inst", j, "P", p, r)``, scale
  (p+1) m tau~/epsilon_inst_j. The top node of period l is only ever used as P[l]: it
  completes at the step that closes the period;
* live node of period l at ``level`` with index q = (k >> level) - 1, bin r:
  ``(name, "inst", j, l, level, q, r)``, scale (l+1) m tau~/epsilon_inst_j.

A node keeps its id (its noise is never redrawn) while the instance lives; every node used
after a restart has a NEW id. Noise is never stored: releases re-derive it from the keyed
NoiseSource: released noise is never redrawn.

Reusable pieces for statistics whose leaves are not band-based (distinct count):
``ExactTreeState`` with ``exact_tree_advance`` / ``exact_tree_add`` (add w at a past tick,
any sign, into the node that covers it) and the tracker+instance skeleton ``BoundState`` /
``advance_bound`` / ``release_bins``.

Example (our worked example: users a,a,a,b,a,b,-,a; tau forced from 2 to 4 at t = 8):
    >>> from dpstream.operators.user_level import counter as ul
    >>> from dpstream.operators.noise import ZeroNoise
    >>> spec = ul.make_user_level("clicks", 2, 0.1, forced_schedule=[(8, 4)])
    >>> state, totals, out = ul.init(spec), {}, []
    >>> for user in "aaaba_ba":
    ...     items = [] if user == "_" else [(user, 0, 1)]
    ...     bands, crossings, totals = ul.split_tick(totals, items)
    ...     state, release = ul.step(spec, state, bands, crossings, ZeroNoise())
    ...     out.append((release.value, release.tau, release.instance))
    >>> out[6:]  # t = 7 keeps ranks <= 2; t = 8 re-admits a's items of rank 3 and 4
    [(4, 2, 1), (6, 4, 2)]
    >>> [ul.kept_bins(spec, p, 4)[0] for p in state.periods]
    [1, 2, 3]

Privacy:
    User-level neighbours. The tracker spends < epsilon/2 (sensitivity 1 of Count). Each
    instance j is the tree of Alg. 2 over Truncate(D, tau~), whose per-level L1 node
    vector changes by <= tau~ when one user's items are all removed (<= 2 tau~ for the
    "any subset" relation, docs/papers.md: pass multiplier=2; distinct count uses 2, or 4); the
    node scale (l+1) m tau~/epsilon_inst_j makes it epsilon_inst_j-DP, and the instance
    series sums to < epsilon/2. Adaptive basic composition: < epsilon in total, for the
    whole infinite output sequence. Histograms: one truncation by the user's TOTAL rank,
    so the L1 over all bins per level is still <= tau~ (Sec. IV-B); empty bins get noise.

References:
    W. Dong, Q. Luo, K. Yi. Continual Observation under User-level Differential Privacy.
    IEEE S&P 2023. Alg. 2, 3, 5, Remark on efficient restart, Thm III.3, Sec. IV-A/B.
    The restart bookkeeping (rank bands) is our streaming form, docs/papers.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import _validate
from ..noise import NodeId, NoiseSource, Term, TreeRelease, noise_std, noisy_release
from ..trees import kary_tree
from ..trees.tree_counter import period_of
from .svt import (
    LOG,
    SERIES,
    SERIES_DLY,
    ContributionTrackerSpec,
    ContributionTrackerState,
    make_contribution_tracker,
    spent,
    term,
    tracker_step,
)
from .svt import beta_spent as _beta_spent
from .svt import guaranteed_stop_level as _guaranteed_stop_level
from .svt import spent_epsilon as _tracker_spent

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "user_level"

BINARY: tuple[kary_tree.ChosenTree, int] = ("binary", 2)
"""The instances' tree unless the spec names another: Dong-Luo-Yi's binary tree."""

Vector = tuple[int, ...]
"""A node's exact content: flat index ``band * bins + bin`` (trailing zeros trimmed)."""

TreeNode = tuple[str, int]
"""An exact node of the tree: ("P", p) for completed period p, ("alpha", level) for a live
node of the current period."""


# ---------------------------------------------------------------------------------------
# Spec


@dataclass(frozen=True, slots=True)
class UserLevelSpec:
    """Public parameters of one user-level count / sum / histogram.

    Attributes:
        name: public identity; prefix of every noise node id.
        epsilon: total budget (tracker epsilon/2, instances < epsilon/2).
        beta: total failure probability (tracker beta/2).
        theta: theta > 0 of both series.
        bins: R, the number of histogram bins (1 for count and sum).
        multiplier: m in the node scale (l+1) m tau~/epsilon_inst_j: 1 for whole-user
            neighbours, 2 for "any subset" (docs/papers.md); distinct count 2 (4 with any subset).
        practical_instances: use the shifted practical series for the instances too
            (App. C-A leaves it open; default: the original series).
        tracker: the tracker's spec (epsilon/2, beta/2, practical mode, test hook).
        tree: the counter every instance runs, as ``kary_tree.choose_tree`` names it:
            ``BINARY`` (Dong-Luo-Yi Alg. 2, the default), ("kary", k) or
            ("kary_subtract", k) (Andersson-Pagh-Torkamani Alg. 1 or 2 under
            ``kary_tree``'s period scheme; docs/design.md, section 5a).
        tracker_share: the share s of epsilon the tracker gets (s epsilon); the instances
            get (1 - s) epsilon. Alg. 5: 1/2.
        instance_series: the instances' epsilon series over (1 - s) epsilon (``svt.SERIES``):
            Dong-Luo-Yi's (theta, ``practical_instances``) or the telescoping one.
    """

    name: str
    epsilon: Fraction
    beta: Fraction
    theta: Fraction
    bins: int
    multiplier: int
    practical_instances: bool
    tracker: ContributionTrackerSpec
    tree: tuple[kary_tree.ChosenTree, int] = BINARY
    tracker_share: Fraction = Fraction(1, 2)
    instance_series: str = SERIES_DLY


def make_user_level(
    name: str,
    epsilon: float | Fraction,
    beta: float | Fraction,
    theta: float | Fraction = 1,
    *,
    bins: int = 1,
    multiplier: int = 1,
    practical: bool = False,
    practical_instances: bool = False,
    forced_schedule: Sequence[tuple[int, int]] = (),
    tree: tuple[kary_tree.ChosenTree, int] = BINARY,
    tracker_share: float | Fraction = Fraction(1, 2),
    tracker_series: str = SERIES_DLY,
    instance_series: str = SERIES_DLY,
    start_exponent: int = 0,
    growth: int = 1,
    discount_scale: float | Fraction = 1,
) -> UserLevelSpec:
    """Validate and build a UserLevelSpec.

    Args:
        name: public identity (prefix of every node id).
        epsilon: total budget > 0.
        beta: failure probability in (0, 1).
        theta: theta > 0 (rational, denominator <= 1000).
        bins: R >= 1.
        multiplier: m >= 1 (see UserLevelSpec).
        practical: App. C-A tracker (tau starts at 64, shifted series).
        practical_instances: shifted series for the instances as well.
        forced_schedule: TEST HOOK forcing tau~: change points ((t, tau), ...), powers of
            two >= the start, non-decreasing. NOT private.
        tree: the instances' counter (see UserLevelSpec): ``BINARY``, ("kary", k >= 2)
            or ("kary_subtract", k >= 3).
        tracker_share: s in (0, 1): the tracker gets s epsilon, the instances (1 - s) epsilon.
        tracker_series, instance_series: the two epsilon series (``svt.SERIES``).
        start_exponent, growth, discount_scale: the tracker's (``svt.make_contribution_tracker``).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        epsilon-DP under whole-user neighbours with multiplier 1, and under "any subset"
        neighbours with multiplier 2 (Alg. 5; any-subset neighbours, docs/papers.md),
        whichever tree the instances run: each is epsilon_inst_j-DP for leaf streams whose
        L1 distance is at most m tau~ (docs/design.md, section 5a).
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    b = _validate.exact_fraction("beta", beta)
    _validate.check_probability("beta", b)
    _validate.check_int_ge("bins", bins, 1)
    _validate.check_int_ge("multiplier", multiplier, 1)
    if not isinstance(practical_instances, bool):
        raise _validate.invalid("practical_instances", "a bool", practical_instances)
    _check_tree(tree, eps)
    share = _validate.exact_fraction("tracker_share", tracker_share)
    if not 0 < share < 1:
        raise _validate.invalid("tracker_share", "in (0, 1)", tracker_share)
    if instance_series not in SERIES:
        raise _validate.invalid("instance_series", " or ".join(SERIES), instance_series)
    tracker = make_contribution_tracker(
        name,
        eps * share,
        b / 2,
        theta,
        practical=practical,
        forced_schedule=forced_schedule,
        series=tracker_series,
        start_exponent=start_exponent,
        growth=growth,
        discount_scale=discount_scale,
    )
    return UserLevelSpec(
        name=name,
        epsilon=eps,
        beta=b,
        theta=tracker.theta,
        bins=bins,
        multiplier=multiplier,
        practical_instances=practical_instances,
        tracker=tracker,
        tree=(tree[0], tree[1]),
        tracker_share=share,
        instance_series=instance_series,
    )


def _check_tree(tree: tuple[kary_tree.ChosenTree, int], epsilon: Fraction) -> None:
    expected = '("binary", 2), ("kary", k) or ("kary_subtract", k)'
    if not isinstance(tree, (tuple, list)) or len(tree) != 2:
        raise _validate.invalid("tree", expected, tree)
    name, k = tree
    if (name, k) == BINARY:
        return
    if name not in ("kary", "kary_subtract"):
        raise _validate.invalid("tree", expected, tree)
    kary_tree.make_kary_tree(epsilon, 1, ("tree",), k, subtract=name == "kary_subtract")


# ---------------------------------------------------------------------------------------
# Budgets (Dong-Luo-Yi Algs. 4 and 5)


def instance_budget(spec: UserLevelSpec) -> Fraction:
    """(1 - s) epsilon: what the instance series sums to below (epsilon/2 in Alg. 5)."""
    return spec.epsilon * (1 - spec.tracker_share)


def epsilon_instance(spec: UserLevelSpec, j: int) -> Fraction:
    """epsilon_inst_j = epsilon theta / (2 (j+1)^(1+theta)) (or the practical shift),
    rounded down when theta is not an integer; with the telescoping series
    (1 - s) epsilon / (j (j+1))."""
    series = spec.instance_series
    return term(instance_budget(spec), spec.theta, j, spec.practical_instances, series)


def instance_spent_epsilon(spec: UserLevelSpec, instances: int) -> Fraction:
    """Exact epsilon of the instance series after ``instances`` instances (< (1 - s) epsilon)."""
    budget, series = instance_budget(spec), spec.instance_series
    return spent(budget, spec.theta, instances, spec.practical_instances, series)


def tracker_spent_epsilon(spec: UserLevelSpec, svts: int) -> Fraction:
    """Exact epsilon of the tracker series after ``svts`` SVTs were started (< s epsilon)."""
    tracker = spec.tracker
    return spent(tracker.epsilon, tracker.theta, svts, tracker.practical, tracker.series)


def tracker_spent_beta(spec: UserLevelSpec, svts: int) -> Fraction:
    """Exact failure probability of the tracker series after ``svts`` SVTs (< beta/2)."""
    return _beta_spent(spec.tracker.beta, svts)


# ---------------------------------------------------------------------------------------
# Rank bands (stage-1 helpers)


def rank_band(rank: int) -> int:
    """Band of rank c >= 1: 0 for c = 1, b for c in (2^(b-1), 2^b].

    Example:
        >>> [rank_band(c) for c in range(1, 10)]
        [0, 1, 2, 2, 3, 3, 3, 3, 4]
        >>> [band_range(b) for b in range(4)]
        [(1, 1), (2, 2), (3, 4), (5, 8)]
    """
    _validate.check_int_ge("rank", rank, 1)
    return (rank - 1).bit_length()


def band_range(band: int) -> tuple[int, int]:
    """The ranks (lo, hi) inclusive of ``band``: (1, 1), (2, 2), (3, 4), (5, 8), ..."""
    _validate.check_int_ge("band", band, 0)
    return (1, 1) if band == 0 else ((1 << (band - 1)) + 1, 1 << band)


def band_units(before: int, units: int) -> list[tuple[int, int]]:
    """Split unit positions before+1 .. before+units over the rank bands.

    A sum item x of a user whose running sum was ``before`` (Sec. IV-A); a count item is
    ``band_units(c_u, 1)``.

    Example:
        >>> band_units(3, 6)  # positions 4..9: 4 in band 2, 5..8 in band 3, 9 in band 4
        [(2, 1), (3, 4), (4, 1)]

    Returns:
        [(band, units in it), ...] in increasing band order, units > 0 each.
    """
    _validate.check_int_ge("before", before, 0)
    _validate.check_int_ge("units", units, 0)
    out: list[tuple[int, int]] = []
    pos, end = before + 1, before + units
    while pos <= end:
        band = rank_band(pos)
        hi = min(end, band_range(band)[1])
        out.append((band, hi - pos + 1))
        pos = hi + 1
    return out


def crossed_powers(before: int, after: int) -> list[int]:
    """The j >= 0 with before <= 2^j < after: the powers of two a user's c_u (or S_u)
    crossed going from ``before`` to ``after`` (its +1 entries in ``crossings``)."""
    _validate.check_int_ge("before", before, 0)
    _validate.check_int_ge("after", after, before)
    if after <= 1:
        return []
    low = 0 if before <= 1 else (before - 1).bit_length()  # smallest j with 2^j >= before
    return list(range(low, (after - 1).bit_length()))


def bit_lengths(values: np.ndarray) -> np.ndarray:
    """``int.bit_length`` of each entry of a non-negative int64 array (exact below 2^53:
    frexp's exponent of v > 0 is its bit length, of 0 is 0)."""
    return np.frexp(values.astype(np.float64))[1].astype(np.int64)


def band_units_many(before: np.ndarray, units: np.ndarray) -> np.ndarray:
    """``band_units`` of many users at once: entry [i, b] is how many of unit positions
    before[i]+1 .. before[i]+units[i] fall in rank band b (columns 0 .. the last band
    any row reaches)."""
    after = before + units
    bands = int(bit_lengths(np.maximum(after - 1, 0)).max(initial=0)) + 1 if len(after) else 0
    band = np.arange(bands)
    lo = np.where(band == 0, 1, (1 << np.maximum(band - 1, 0)) + 1)  # band_range, vectorised
    hi = 1 << band
    first = np.maximum(before[:, None] + 1, lo[None, :])
    last = np.minimum(after[:, None], hi[None, :])
    return np.maximum(last - first + 1, 0)


def crossed_powers_many(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """``crossed_powers`` of many users at once: entry [i, j] is True when
    before[i] <= 2^j < after[i] (columns 0 .. the last power any row crosses)."""
    low = np.where(before <= 1, 0, bit_lengths(np.maximum(before - 1, 0)))
    high = np.where(after <= 1, 0, bit_lengths(np.maximum(after - 1, 0)))
    j = np.arange(int(high.max(initial=0)))
    return (low[:, None] <= j[None, :]) & (j[None, :] < high[:, None])


def split_tick(
    totals: Mapping[Hashable, int],
    items: Iterable[tuple[Hashable, int, int]],
    bins: int = 1,
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...], dict[Hashable, int]]:
    """Reference stage 1 for one tick: per-user ranks, bands and crossings.

    Args:
        totals: each user's c_u (or S_u) before the tick; not modified.
        items: the tick's items (user, bin r in [0, bins), units >= 1) in each user's own
            order (count and histogram items have 1 unit, a sum item x has x).
        bins: R.

    Returns:
        (bands, crossings, new totals) for ``step``.
    """
    new_totals = dict(totals)
    bands: list[list[int]] = []
    crossings: list[int] = []
    before: dict[Hashable, int] = {}
    for user, r, units in items:
        if not 0 <= r < bins:
            raise _validate.invalid("bin", f"in [0, {bins})", r)
        used = new_totals.get(user, 0)
        before.setdefault(user, used)
        for band, n in band_units(used, units):
            while len(bands) <= band:
                bands.append([0] * bins)
            bands[band][r] += n
        new_totals[user] = used + units
    for user, used in before.items():
        for j in crossed_powers(used, new_totals[user]):
            while len(crossings) <= j:
                crossings.append(0)
            crossings[j] += 1
    return tuple(tuple(row) for row in bands), tuple(crossings), new_totals


def merge_reports(
    reports: Iterable[tuple[Sequence[Sequence[int]], Sequence[int]]],
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Sum several partitions' (bands, crossings) for the same tick, elementwise."""
    bands: list[list[int]] = []
    crossings: list[int] = []
    for part_bands, part_crossings in reports:
        for b, row in enumerate(part_bands):
            while len(bands) <= b:
                bands.append([])
            acc = bands[b]
            for r, value in enumerate(row):
                if r < len(acc):
                    acc[r] += value
                else:
                    acc.append(value)
        for j, value in enumerate(part_crossings):
            if j < len(crossings):
                crossings[j] += value
            else:
                crossings.append(value)
    return tuple(tuple(row) for row in bands), tuple(crossings)


# ---------------------------------------------------------------------------------------
# Exact tree with vector nodes (reusable)


def _vadd(a: Sequence[int], b: Sequence[int], sign: int = 1) -> Vector:
    """a + sign * b elementwise (missing entries are 0), trailing zeros trimmed."""
    n = max(len(a), len(b))
    out = [(a[i] if i < len(a) else 0) + sign * (b[i] if i < len(b) else 0) for i in range(n)]
    while out and out[-1] == 0:
        out.pop()
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ExactTreeState:
    """EXACT node contents of the infinite-stream binary tree (Alg. 2), no noise.

    Attributes:
        t: ticks taken so far.
        alpha: node vectors alpha_0..alpha_l of the current period (empty right after a
            period closed; levels whose bit of k is 0 hold ()).
        periods: totals P_0..P_(c-1) of the completed periods.
    """

    t: int = 0
    alpha: tuple[Vector, ...] = ()
    periods: tuple[Vector, ...] = ()


def exact_tree_advance(tree: ExactTreeState, leaf: Sequence[int]) -> ExactTreeState:
    """Advance one tick with leaf vector ``leaf`` (Alg. 2: exact children sums, never noisy ones).

    The node completing at local step k sits at level lsb(k) and holds the EXACT sum of its
    children plus the leaf; when k = 2^l it is the period's total and moves to ``periods``.
    """
    t = tree.t + 1
    period, k = period_of(t)
    alpha: list[Vector] = list(tree.alpha) if tree.alpha else [()] * (period + 1)
    level = (k & -k).bit_length() - 1
    node = _vadd(leaf, ())
    for child in alpha[:level]:
        node = _vadd(node, child)
    alpha[level] = node
    alpha[:level] = [()] * level
    periods = tree.periods
    if k == 1 << period:
        periods, alpha = (*periods, alpha[period]), []
    return ExactTreeState(t=t, alpha=tuple(alpha), periods=periods)


def covering_node(t: int, s: int) -> TreeNode:
    """The exact node that holds tick s <= t after t ticks: ("P", p) if s lies in a
    completed period p, else ("alpha", level) for the live node covering it (walk the set
    bits of k from high to low; level j covers 2^j consecutive ticks)."""
    _validate.check_int_ge("s", s, 1)
    if s > t:
        raise _validate.invalid("s", f"<= t = {t}", s)
    period, k = period_of(t)
    completed = period + 1 if k == 1 << period else period
    s_period = s.bit_length() - 1
    if s_period < completed:
        return ("P", s_period)
    local = s - (1 << period) + 1
    start = 1
    for level in range(period, -1, -1):
        if k >> level & 1:
            if local < start + (1 << level):
                return ("alpha", level)
            start += 1 << level
    raise AssertionError("unreachable: live nodes tile [1, k]")  # pragma: no cover


def exact_node(tree: ExactTreeState, node: TreeNode) -> Vector:
    """The exact vector of ``node``."""
    kind, index = node
    return tree.periods[index] if kind == "P" else tree.alpha[index]


def exact_tree_add(tree: ExactTreeState, s: int, delta: Sequence[int]) -> ExactTreeState:
    """Add ``delta`` (any sign) at past tick s <= t into the node that covers s.

    Distinct count's re-admission moves a value's first occurrence earlier: -1 at the old
    tick, +1 at the new one (our streaming form of the restart).
    """
    kind, index = covering_node(tree.t, s)
    if kind == "P":
        periods = list(tree.periods)
        periods[index] = _vadd(periods[index], delta)
        return ExactTreeState(t=tree.t, alpha=tree.alpha, periods=tuple(periods))
    alpha = list(tree.alpha)
    alpha[index] = _vadd(alpha[index], delta)
    return ExactTreeState(t=tree.t, alpha=tuple(alpha), periods=tree.periods)


def tree_nodes(t: int) -> list[TreeNode]:
    """The exact nodes whose sum is the running total at t: floor(log2 t) period totals
    (period+1 when t closes its period) then popcount(k) live nodes, high level first."""
    period, k = period_of(t)
    if k == 1 << period:
        return [("P", p) for p in range(period + 1)]
    nodes: list[TreeNode] = [("P", p) for p in range(period)]
    nodes.extend(("alpha", level) for level in range(period, -1, -1) if k >> level & 1)
    return nodes


def exact_tree_total(tree: ExactTreeState) -> Vector:
    """Sum of the vectors of ``tree_nodes(t)``: the exact running total (() at t = 0)."""
    total: Vector = ()
    if tree.t:
        for node in tree_nodes(tree.t):
            total = _vadd(total, exact_node(tree, node))
    return total


# ---------------------------------------------------------------------------------------
# Tracker + instance skeleton (reusable)


@dataclass(frozen=True, slots=True)
class BoundState:
    """The tracker + instance part of Alg. 5 (no tree).

    Attributes:
        t: ticks taken (0 before the first).
        crossings: cumulative G, G[j] = Count(D_t, 2^j) on the original stream.
        svt_index: i, the tracker's running SVT.
        instance: j, the current truncation instance (0 before t = 1).
        tau: tau~_t (0 before t = 1).
    """

    t: int = 0
    crossings: tuple[int, ...] = ()
    svt_index: int = 1
    instance: int = 0
    tau: int = 0


def advance_bound(
    spec: UserLevelSpec, bound: BoundState, crossings: Sequence[int], noise: NoiseSource
) -> tuple[BoundState, bool]:
    """Steps 1-3 of a tick (our streaming form) for tick bound.t + 1: G += crossings; the tracker
    decides tau~_t; a new instance iff tau~ changed (always at t = 1, at most once per tick).

    Args:
        spec: the mechanism's parameters.
        bound: the state after the previous tick.
        crossings: this tick's crossings (non-negative ints, missing = 0).
        noise: the NoiseSource.

    Returns:
        (new bound state, restarted).
    """
    _check_counts("crossings", crossings)
    t = bound.t + 1
    cumulative = _vadd(bound.crossings, crossings)
    tracker, tau = tracker_step(
        spec.tracker,
        ContributionTrackerState(t=bound.t, svt_index=bound.svt_index),
        t,
        cumulative,
        noise,
    )
    restarted = tau != bound.tau
    return (
        BoundState(
            t=t,
            crossings=cumulative,
            svt_index=tracker.svt_index,
            instance=bound.instance + 1 if restarted else bound.instance,
            tau=tau,
        ),
        restarted,
    )


def period_scale(spec: UserLevelSpec, instance: int, tau: int, period: int) -> Fraction:
    """(period+1) m tau / epsilon_inst_j: the scale of every node of ``period`` in instance j."""
    _validate.check_int_ge("period", period, 0)
    scales = _instance_scales(spec, instance, tau)
    while len(scales) <= period:
        scales.append(
            Fraction((len(scales) + 1) * spec.multiplier * tau) / epsilon_instance(spec, instance)
        )
    return scales[period]


_SCALES: dict[int, tuple[UserLevelSpec, dict[tuple[int, int], list[Fraction]]]] = {}
_MAX_CACHED_SPECS = 64


def _instance_scales(spec: UserLevelSpec, instance: int, tau: int) -> list[Fraction]:
    # Keyed by identity (hashing a spec hashes its Fractions, the release's hot spot); the
    # entry holds the spec itself, so its id cannot be reused while the entry exists.
    entry = _SCALES.get(id(spec))
    if entry is None or entry[0] is not spec:
        if len(_SCALES) >= _MAX_CACHED_SPECS:
            del _SCALES[next(iter(_SCALES))]
        entry = (spec, {})
        _SCALES[id(spec)] = entry
    return entry[1].setdefault((instance, tau), [])


def release_nodes(
    spec: UserLevelSpec, t: int, instance: int, tau: int
) -> list[tuple[TreeNode, NodeId, Fraction]]:
    """The binary tree's nodes the release at t uses: (exact node, noise id WITHOUT the bin
    suffix, scale); ``noise_terms`` gives any tree's.

    Append the bin r to the id: ``(*node_id, r)``.
    """
    period, k = period_of(t)
    out: list[tuple[TreeNode, NodeId, Fraction]] = []
    for node in tree_nodes(t):
        kind, index = node
        if kind == "P":
            out.append(
                (
                    node,
                    (spec.name, "inst", instance, "P", index),
                    period_scale(spec, instance, tau, index),
                )
            )
        else:
            node_id = (spec.name, "inst", instance, period, index, (k >> index) - 1)
            out.append((node, node_id, period_scale(spec, instance, tau, period)))
    return out


def instance_tree(spec: UserLevelSpec, instance: int, tau: int) -> kary_tree.KaryTreeSpec:
    """The k-ary counter instance j runs when ``spec.tree`` is not ``BINARY``: over the
    whole truncated prefix, epsilon_inst_j, leaf sensitivity m tau~ (node scale
    (p+1) m tau~ / epsilon_inst_j, as the binary tree's), nodes under (name, "inst", j)."""
    name, k = spec.tree
    return kary_tree.KaryTreeSpec(
        epsilon=epsilon_instance(spec, instance),
        sensitivity=spec.multiplier * tau,
        node_prefix=(spec.name, "inst", instance),
        k=k,
        subtract=name == "kary_subtract",
    )


def noise_terms(spec: UserLevelSpec, t: int, instance: int, tau: int) -> list[Term]:
    """(node id WITHOUT the bin suffix, scale, sign) of every noise the release at t adds in
    instance j: the binary tree's ``release_nodes``, else ``kary_tree.release_terms``."""
    if spec.tree == BINARY:
        return [(node_id, scale, 1) for _, node_id, scale in release_nodes(spec, t, instance, tau)]
    return kary_tree.release_terms(instance_tree(spec, instance, tau), t)


def release_terms(spec: UserLevelSpec, t: int, instance: int, tau: int, r: int) -> list[Term]:
    """The noise terms (node id, scale, sign) of bin r's release at t in instance j."""
    return [
        ((*node_id, r), scale, sign) for node_id, scale, sign in noise_terms(spec, t, instance, tau)
    ]


def release_scales(spec: UserLevelSpec, t: int, instance: int, tau: int) -> list[Fraction]:
    """The scales of the noises every bin's release at t adds in instance j (public)."""
    return [scale for _, scale, _ in noise_terms(spec, t, instance, tau)]


def release_std(spec: UserLevelSpec, t: int, instance: int, tau: int) -> float:
    """Exact std of every bin's release at t in instance j with bound tau~ (public: what
    ``dpstream check-config`` plans with; the release carries the same number)."""
    return noise_std(noise_terms(spec, t, instance, tau))


def release_bins(
    spec: UserLevelSpec,
    bound: BoundState,
    tree: ExactTreeState,
    node_values: Callable[[Vector], Sequence[int]],
    noise: NoiseSource,
) -> tuple[TreeRelease, ...]:
    """Release every bin at tick bound.t: exact kept value plus the current instance's noise.

    Args:
        spec: the mechanism's parameters.
        bound: the skeleton's state at this tick (instance j, tau~).
        tree: the exact tree at this tick (tree.t == bound.t).
        node_values: maps a node's exact vector to its per-bin values (length <= bins,
            missing = 0), e.g. ``lambda v: kept_bins(spec, v, tau)``.
        noise: the NoiseSource.

    Returns:
        One TreeRelease per bin (empty bins too, Sec. IV-B).
    """
    if tree.t != bound.t:
        raise _validate.invalid("tree.t", f"bound.t = {bound.t}", tree.t)
    # The sum of the exact nodes is the running total; node_values is linear in it.
    exact = [0] * spec.bins
    for r, value in enumerate(node_values(exact_tree_total(tree))):
        exact[r] += value
    terms = noise_terms(spec, bound.t, bound.instance, bound.tau)
    # Every bin uses the same public scales, so bin 0's error bar serves them all.
    first = noisy_release(bound.t, exact[0], [((*n, 0), b, sign) for n, b, sign in terms], noise)
    out = [first]
    for r in range(1, spec.bins):
        value = exact[r] + sum(sign * noise.discrete_laplace((*n, r), b) for n, b, sign in terms)
        out.append(TreeRelease(t=bound.t, value=value, std=first.std, ci95=first.ci95))
    return tuple(out)


# ---------------------------------------------------------------------------------------
# The band-based mechanism (count, sum, histogram)


def kept_bins(spec: UserLevelSpec, vector: Sequence[int], tau: int) -> tuple[int, ...]:
    """Per-bin units of a band vector kept by Truncate(., tau): bands 0..log2 tau."""
    keep = tau.bit_length() * spec.bins  # bands 0..i, i = log2 tau: i + 1 bands
    out = [0] * spec.bins
    for index in range(min(keep, len(vector))):
        out[index % spec.bins] += vector[index]
    return tuple(out)


@dataclass(frozen=True, slots=True)
class UserLevelState:
    """Plain-data state (JSON round-trip through ``state_codec``).

    Attributes:
        t, crossings, svt_index, instance, tau: the skeleton (see BoundState).
        alpha, periods: the exact tree (see ExactTreeState); node vectors are indexed
            ``band * bins + bin``.
    """

    t: int = 0
    crossings: tuple[int, ...] = ()
    svt_index: int = 1
    instance: int = 0
    tau: int = 0
    alpha: tuple[Vector, ...] = ()
    periods: tuple[Vector, ...] = ()


@dataclass(frozen=True, slots=True)
class UserLevelRelease:
    """What one tick releases.

    Attributes:
        t: the tick.
        bins: one TreeRelease (value, std, ci95) per bin r = 0..R-1.
        tau: tau~_t (itself DP).
        instance: j, the truncation instance that produced the values.
        svt_index: i, the tracker's running SVT.
    """

    t: int
    bins: tuple[TreeRelease, ...]
    tau: int
    instance: int
    svt_index: int

    @property
    def values(self) -> tuple[int, ...]:
        """The noisy value of every bin."""
        return tuple(rel.value for rel in self.bins)

    @property
    def value(self) -> int:
        """The noisy value of bin 0 (the count or sum when bins == 1)."""
        return self.bins[0].value


def init(spec: UserLevelSpec) -> UserLevelState:
    return UserLevelState()


def bound_of(state: UserLevelState) -> BoundState:
    """The skeleton part of ``state``."""
    return BoundState(
        t=state.t,
        crossings=state.crossings,
        svt_index=state.svt_index,
        instance=state.instance,
        tau=state.tau,
    )


def tree_of(state: UserLevelState) -> ExactTreeState:
    """The exact tree of ``state``."""
    return ExactTreeState(t=state.t, alpha=state.alpha, periods=state.periods)


def flatten_bands(spec: UserLevelSpec, bands: Sequence[Sequence[int]]) -> Vector:
    """``bands[b][r]`` as the flat leaf vector (index b * bins + r), trailing zeros trimmed."""
    flat: list[int] = []
    for b, row in enumerate(bands):
        if len(row) > spec.bins:
            raise _validate.invalid(f"bands[{b}] length", f"<= bins = {spec.bins}", len(row))
        _check_counts(f"bands[{b}]", row)
        flat.extend(row)
        flat.extend([0] * (spec.bins - len(row)))
    return _vadd(flat, ())


def step(
    spec: UserLevelSpec,
    state: UserLevelState,
    bands: Sequence[Sequence[int]],
    crossings: Sequence[int],
    noise: NoiseSource,
) -> tuple[UserLevelState, UserLevelRelease]:
    """One public tick t = state.t + 1 (empty ticks too: ``step(spec, s, (), (), noise)``).

    Args:
        spec: the mechanism's parameters.
        state: the state after tick t - 1.
        bands: ``bands[b][r]`` = this tick's units in rank band b and bin r (non-negative
            ints; short rows and missing bands are 0).
        crossings: ``crossings[j]`` = users whose c_u (S_u) went from <= 2^j to > 2^j.
        noise: the NoiseSource (keyed in production).

    Returns:
        (new state, release).

    Raises:
        InvalidOperatorConfig: a report is malformed (negative or non-int entries, a row
            longer than ``bins``): a stage-1 bug, not a data-dependent condition.
    """
    leaf = flatten_bands(spec, bands)
    bound, _ = advance_bound(spec, bound_of(state), crossings, noise)
    tree = exact_tree_advance(tree_of(state), leaf)
    tau = bound.tau
    releases = release_bins(spec, bound, tree, lambda v: kept_bins(spec, v, tau), noise)
    new_state = UserLevelState(
        t=bound.t,
        crossings=bound.crossings,
        svt_index=bound.svt_index,
        instance=bound.instance,
        tau=bound.tau,
        alpha=tree.alpha,
        periods=tree.periods,
    )
    return new_state, UserLevelRelease(
        t=bound.t,
        bins=releases,
        tau=bound.tau,
        instance=bound.instance,
        svt_index=bound.svt_index,
    )


def exact_values(spec: UserLevelSpec, state: UserLevelState) -> tuple[int, ...]:
    """F(Truncate(D_t, tau~_t)) per bin: what a release is unbiased for (with noise 0 it equals the
    release)."""
    if not state.t:
        return (0,) * spec.bins
    return kept_bins(spec, exact_tree_total(tree_of(state)), state.tau)


def spent_split(spec: UserLevelSpec, state: UserLevelState) -> tuple[Fraction, Fraction]:
    """Exact epsilon committed so far by (the tracker's SVTs 1..i, instances 1..j), each
    below epsilon / 2 (Dong-Luo-Yi Alg. 5: half the budget to each series)."""
    tracker = ContributionTrackerState(t=state.t, svt_index=state.svt_index)
    return _tracker_spent(spec.tracker, tracker), instance_spent_epsilon(spec, state.instance)


def spent_epsilon(spec: UserLevelSpec, state: UserLevelState) -> Fraction:
    """Exact epsilon committed so far: tracker SVTs 1..i plus instances 1..j (< epsilon)."""
    return sum(spent_split(spec, state), Fraction(0))


def _check_counts(name: str, values: Sequence[int]) -> None:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _validate.invalid(f"{name} entries", "integers", type(value).__name__)
        if value < 0:
            raise _validate.invalid(f"{name} entries", ">= 0", "a negative entry")


# ---------------------------------------------------------------------------------------
# Utility bounds (Lemma II.11, Thm III.3)


def noise_e(t: int, epsilon: float | Fraction, beta: float | Fraction) -> float:
    """Noise_E(t, epsilon, beta) = (4/epsilon) ceil(LOG t)^1.5 LOG(1/beta) (Lemma II.11)."""
    return 4 / float(epsilon) * math.ceil(LOG(t)) ** 1.5 * LOG(1 / Fraction(beta))


def noise_u(
    tau: int, t: int, epsilon: float | Fraction, beta: float | Fraction, theta: float | Fraction
) -> float:
    """Noise_U(tau, t, epsilon, beta, theta) of Thm III.3:
    Noise_E(t, epsilon theta / (2 tau (LOG tau + 2)^(1+theta)), beta/2)."""
    th = float(theta)
    eff = float(epsilon) * th / (2 * tau * (LOG(tau) + 2) ** (1 + th))
    return noise_e(t, eff, Fraction(beta) / 2)


def bias_bound(spec: UserLevelSpec, kappa: int, tau: int, t: int, svt_index: int) -> float:
    """Concrete bias bound of Thm III.3: (kappa - tau)^+ [12 LOG(2/beta_i) + 16 LOG(t+1)]/eps_i
    with the tracker's current SVT i (epsilon/2, beta/2 series). kappa is private: for
    documentation and tests only."""
    return max(kappa - tau, 0) * _guaranteed_stop_level(spec.tracker, svt_index, t)
