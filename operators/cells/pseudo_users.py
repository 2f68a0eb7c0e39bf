"""Grouping users' samples into pseudo-users (arrays): WrapAround and BestFit, Rameshwar et al. Sec.
III-A.

Input is a cell's public count vector {user: m_l}. Users are sorted by non-increasing m_l,
ties by ascending user id (our choice); each user offers r_l = min(m_l, m_UB) samples,
their FIRST r_l in the value-independent order stage 1 keeps (event time, partition,
offset; never sorted by value). An array has capacity m_UB; its fill is w(A).

* ``wrap_around`` (Alg. 1): concatenate the r_l-prefixes in sorted order and cut into
  K = floor(sum r_l / m_UB) full chunks; the partial tail is dropped with its samples. A user
  can straddle two consecutive arrays, so the user-level sensitivity of an average of array
  means is 2U/K.
* ``best_fit`` (Alg. 2): each user goes whole into the fullest array that still fits
  (lowest index on ties), opening a new one when none fits. Every user sits in exactly one
  array and no sample beyond r_l is dropped; sensitivity U/K_bar, with K_bar >= K.

Everything here is a function of the counts only, which Rameshwar et al. (Sec. II-D) treat as public
(neighbours share the count matrix); the grouping therefore costs no privacy there. It must
not be used on private counts (strict mode, docs/papers.md).

An array is a tuple of segments (user, start, stop): the user's samples [start, stop) in
their value-independent order (0-based).

References:
    Rameshwar et al. Sec. III-A, III-C (Lemmas III.1, III.2), III-D (eq. 10): "Mean Estimation with
    User-Level Privacy on Multi-Dimensional IoT Datasets" (companion arXiv:2401.15906),
    Algorithms 1 and 2.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from fractions import Fraction

from .. import _validate

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

Segment = tuple[str, int, int]
"""(user, start, stop): samples start..stop-1 of that user, in value-independent order."""

PseudoUser = tuple[Segment, ...]
"""One array A_i, its segments in fill order."""

GROUPINGS = ("best_fit", "wrap_around")


def _check_counts(counts: Mapping[str, int]) -> dict[str, int]:
    if not counts:
        raise _validate.invalid("counts", "non-empty", dict(counts))
    for user, m in counts.items():
        if not isinstance(user, str):
            raise _validate.invalid("user id", "a str", type(user).__name__)
        _validate.check_int_ge("count", m, 1)
    return dict(counts)


def sorted_users(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """Users by non-increasing count, ties by ascending user id (deterministic, our choice).

    Args:
        counts: {user: m_l}, every m_l >= 1.

    Returns:
        [(user, m_l), ...] in grouping order.
    """
    return sorted(_check_counts(counts).items(), key=lambda um: (-um[1], um[0]))


def median_m_ub(counts: Mapping[str, int]) -> int:
    """The ceil(L/2)-th largest count: an integer median (Sec. III-C, Lemma III.2; the integer
    choice is ours).

    Args:
        counts: {user: m_l}.

    Returns:
        m_UB.
    """
    ms = sorted(_check_counts(counts).values(), reverse=True)
    return ms[(len(ms) + 1) // 2 - 1]


def eq10_objective(counts: Mapping[str, int], m: int) -> Fraction:
    """Square of the eq. (10) objective, (sum_l min(m_l, m))^2 / m, exactly.

    Eq. (10) maximises sum_l min(m_l, m) / sqrt(m); squaring keeps the order (the sum is
    >= 0) and makes the comparison exact.
    """
    _validate.check_int_ge("m", m, 1)
    total = sum(min(c, m) for c in counts.values())
    return Fraction(total * total, m)


def eq10_m_ub(counts: Mapping[str, int]) -> int:
    """m_UB of eq. (10): argmax over integers m in [m_*, m^*] of sum min(m_l, m) / sqrt(m).

    On each segment between consecutive distinct counts the objective is (a m + b)/sqrt(m)
    with a, b >= 0, convex or increasing, so the maximum over the segment sits at an end:
    only the distinct counts need a look (our derivation from eq. (10)). Ties go to the smallest m
    (our choice).

    Args:
        counts: {user: m_l}.

    Returns:
        m_UB, one of the m_l.
    """
    checked = _check_counts(counts)
    best, best_value = 0, Fraction(-1)
    for m in sorted(set(checked.values())):
        value = eq10_objective(checked, m)
        if value > best_value:
            best, best_value = m, value
    return best


def clipped_counts(counts: Mapping[str, int], m_ub: int) -> dict[str, int]:
    """r_l = min(m_l, m_UB) for every user."""
    _validate.check_int_ge("m_ub", m_ub, 1)
    return {user: min(m, m_ub) for user, m in _check_counts(counts).items()}


def wrap_count(counts: Mapping[str, int], m_ub: int) -> int:
    """K = floor(sum_l min(m_l, m_UB) / m_UB), the number of WrapAround arrays."""
    return sum(clipped_counts(counts, m_ub).values()) // m_ub


def wrap_around(counts: Mapping[str, int], m_ub: int) -> tuple[PseudoUser, ...]:
    """Algorithm 1 (WrapAround): the K full m_UB-chunks of the concatenated prefixes.

    Args:
        counts: {user: m_l}, every m_l >= 1.
        m_ub: array capacity m_UB >= 1.

    Returns:
        K arrays, each of fill exactly m_UB; the samples of a partial last chunk are
        dropped (a user can lose all of them).
    """
    _validate.check_int_ge("m_ub", m_ub, 1)
    arrays: list[PseudoUser] = []
    current: list[Segment] = []
    fill = 0
    for user, m in sorted_users(counts):
        start, r = 0, min(m, m_ub)
        while start < r:
            take = min(r - start, m_ub - fill)
            current.append((user, start, start + take))
            start += take
            fill += take
            if fill == m_ub:
                arrays.append(tuple(current))
                current, fill = [], 0
    return tuple(arrays)


def best_fit(counts: Mapping[str, int], m_ub: int) -> tuple[PseudoUser, ...]:
    """Algorithm 2 (BestFit): each user whole into the fullest array that fits.

    Candidates are the arrays with m_UB - w >= r_l; among those of largest fill, the lowest
    index wins. Arrays are opened in index order, so an empty candidate is always the next
    unopened array. Implementation: a min-heap of array indices per fill level, scanned
    from the fullest admissible fill down, O(m_UB) per user.

    Args:
        counts: {user: m_l}, every m_l >= 1.
        m_ub: array capacity m_UB >= 1.

    Returns:
        The K_bar non-empty arrays, in index order; each holds whole users.
    """
    _validate.check_int_ge("m_ub", m_ub, 1)
    members: list[list[Segment]] = []
    fills: list[int] = []
    by_fill: dict[int, list[int]] = {}
    for user, m in sorted_users(counts):
        r = min(m, m_ub)
        target = None
        for w in range(m_ub - r, 0, -1):
            heap = by_fill.get(w)
            if heap:
                target = heapq.heappop(heap)
                break
        if target is None:
            target = len(members)
            members.append([])
            fills.append(0)
        members[target].append((user, 0, r))
        fills[target] += r
        heapq.heappush(by_fill.setdefault(fills[target], []), target)
    return tuple(tuple(a) for a in members)


def group(counts: Mapping[str, int], m_ub: int, grouping: str) -> tuple[PseudoUser, ...]:
    """``best_fit`` or ``wrap_around`` by name."""
    if grouping == "best_fit":
        return best_fit(counts, m_ub)
    if grouping == "wrap_around":
        return wrap_around(counts, m_ub)
    raise _validate.invalid("grouping", f"one of {GROUPINGS}", grouping)


def fill(array: PseudoUser) -> int:
    """w(A): the number of samples in an array."""
    return sum(stop - start for _, start, stop in array)


def users_of(arrays: Sequence[PseudoUser]) -> tuple[str, ...]:
    """The users with at least one sample in ``arrays``, sorted."""
    return tuple(sorted({user for array in arrays for user, _, _ in array}))


def rank_sensitivity(grouping: str) -> int:
    """How many array means one user can move: 1 for BestFit, 2 for WrapAround (docs/papers.md)."""
    if grouping not in GROUPINGS:
        raise _validate.invalid("grouping", f"one of {GROUPINGS}", grouping)
    return 1 if grouping == "best_fit" else 2


# ---------------------------------------------------------------------------------------
# Quantities of Lemmas III.1 and III.2 (Sec. III-C), for tests and experiments


def baseline_sensitivity(counts: Mapping[str, int], value_range: Fraction) -> Fraction:
    """Delta_f = U m^* / N of the Baseline mean (Sec. III-B), with the cell-local m^* and N."""
    checked = _check_counts(counts)
    return Fraction(value_range) * max(checked.values()) / sum(checked.values())


def proxy_sensitivity(counts: Mapping[str, int], m_ub: int, value_range: Fraction) -> Fraction:
    """Delta~_arr = U m_UB / sum_l min(m_l, m_UB) (Sec. III-C)."""
    return Fraction(value_range) * m_ub / sum(clipped_counts(counts, m_ub).values())


def opt_gain(counts: Mapping[str, int]) -> Fraction:
    """OPT = m^* L / N, the best gain Delta_f / Delta~_arr over m_UB (Sec. III-C)."""
    checked = _check_counts(counts)
    return Fraction(max(checked.values()) * len(checked), sum(checked.values()))
