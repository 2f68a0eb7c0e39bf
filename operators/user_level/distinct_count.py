"""Distinct count F_0 under user-level DP, Dong-Luo-Yi Sec. IV-D.

The mechanism (Sec. IV-D): run the contribution tracker on the ORIGINAL stream D
(epsilon/2, beta/2: Count(D_t, tau) counts users by ALL their items), truncate D with tau~
to get D-hat, build D-bar from D-hat (first occurrence within the TRUNCATED stream), and
inside each truncation instance run the tree of Alg. 2 on D-bar with node noise
Lap((l+1) 2 tau~ / epsilon_inst_j) (4 tau~ with "any subset" neighbours, docs/papers.md).

Band form. Per value keep m(v), the smallest band v has arrived in so far (none yet:
absent). When v arrives at tick t with smallest band b this tick and b < m(v):

    +1 at (t, band b)        f_i(v) = t for every i in [b, m(v) - 1]
    -1 at (t, band m(v))     for i >= m(v), f_i(v) was already an earlier tick s

and m(v) = b. The leaf of D-bar at tick t for tau = 2^i is the sum of the signed units of
bands 0..i at t: exactly the first-occurrence leaf of Truncate(D, 2^i). A tree that keeps
its exact node counts per band (operators/user_level/counter.py) therefore holds D-bar for every
power of two at once, and a tau increase from 2^i to 2^i' "re-admits" by summing more
bands: per value this is the -1 at the old tick f_i(v) and +1 at the new tick f_i'(v) of
our streaming form of the restart, without any per-value work at restart time.

Why m(v) suffices (no earliest tick per band): ticks only grow, so the first arrival of v
in a band below m(v) IS the earliest tick for every threshold in [b, m(v) - 1]; later
arrivals in bands >= m(v) never change any f_i. ``readmission_moves`` gives the explicit
(old tick, new tick) moves from per-band earliest ticks, for a tree that only holds the
current tau's leaves (and for the tests).

Stage 1 -> stage 2, per tick (one report per stage-1 partition, merged by union):

* ``values_by_band[b]``: the set of values seen this tick with a rank in band b, where
  the rank of an item is its user's new c_u (stage 1 keeps c_u per user, like count);
* ``crossings[j]``: users whose c_u went from <= 2^j to > 2^j this tick (as for count).

Stage 2 keeps the table m(v) (keyed by value; the first occurrence time of v) and turns
the report into signed band units with ``first_occurrence_units``; ``step`` then advances
the tracker and the tree. Per-tick cost: O(#values in the tick + log t * bands).

Privacy:
    User-level neighbours. Removing one user changes Count(D_t, tau) by <= 1 (tracker,
    < epsilon/2). D-hat loses <= tau~ items, so D-bar's leaves change in <= 2 tau~
    positions (each removed item can delete its value's first occurrence and promote a
    later one): per-level L1 <= 2 tau~, node scale (l+1) 2 tau~/epsilon_inst_j, and
    4 tau~ if any subset of a user's items may be removed (docs/papers.md). The instance
    series sums to < epsilon/2: epsilon-DP in total for the infinite output sequence.
    The bound of Thm IV.3 is Noise_U(2 kappa, ...) + Bias_U: not down-neighbourhood
    optimal (Thm V.2), and deletions are NOT supported (Dong-Luo-Yi Sec. VI).

References:
    W. Dong, Q. Luo, K. Yi. Continual Observation under User-level Differential Privacy.
    IEEE S&P 2023. Sec. IV-D, Thm IV.3, Alg. 5 (efficient restart); the re-admission of first
    occurrences is our streaming form (docs/papers.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

from .. import _validate
from ..noise import NoiseSource
from . import counter as ul

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "distinct_count"

NO_TICK = 0
"""Placeholder tick for "no first occurrence yet" (ticks are 1-based)."""

Value = TypeVar("Value", bound=Hashable)
"""An item's value: anything hashable (only compared for equality)."""


def first_occurrence_units(
    min_band: Mapping[Value, int], values_by_band: Sequence[Iterable[Value]]
) -> tuple[dict[Value, int], tuple[int, ...]]:
    """Signed D-bar units of one tick, per band, and the updated m(v) entries.

    Args:
        min_band: m(v) for the values seen before this tick (absent: never seen). Only
            read; the caller applies the returned updates (a table keyed by value).
        values_by_band: ``values_by_band[b]`` = the values that arrived this tick with a
            rank in band b (stage 1's report; duplicates allowed).

    Returns:
        (updates, units): ``updates[v]`` = the new m(v) for the values whose m(v) dropped,
        ``units[b]`` = the signed number of D-bar units of band b at this tick (the leaf
        for tau = 2^i is sum(units[:i + 1])), trailing zero bands trimmed.
    """
    smallest: dict[Value, int] = {}
    for band, values in enumerate(values_by_band):
        for v in values:
            if v not in smallest:  # bands are visited in increasing order
                smallest[v] = band
    units = [0] * len(values_by_band)
    updates: dict[Value, int] = {}
    for v, band in smallest.items():
        old = min_band.get(v)
        if old is not None and old <= band:
            continue
        units[band] += 1
        if old is not None:
            units.extend([0] * (old + 1 - len(units)))
            units[old] -= 1
        updates[v] = band
    while units and units[-1] == 0:
        units.pop()
    return updates, tuple(units)


def leaf_at(units: Sequence[int], exponent: int) -> int:
    """The D-bar leaf of Truncate(D, 2^exponent): sum of the signed units of bands <= exponent."""
    _validate.check_int_ge("exponent", exponent, 0)
    return sum(units[: exponent + 1])


def first_ticks(earliest: Mapping[int, Sequence[int]], exponent: int) -> dict[int, int]:
    """f_i(v) for i = ``exponent`` from per-value earliest ticks per band (NO_TICK = none)."""
    out: dict[int, int] = {}
    for v, ticks in earliest.items():
        seen = [s for s in ticks[: exponent + 1] if s != NO_TICK]
        if seen:
            out[v] = min(seen)
    return out


def readmission_moves(
    earliest: Mapping[int, Sequence[int]], old_exponent: int, new_exponent: int
) -> list[tuple[int, int]]:
    """The explicit re-admission (our streaming form) for F_0 on a tau increase.

    Args:
        earliest: ``earliest[v][b]`` = the earliest tick v arrived with a rank in band b
            (NO_TICK if never).
        old_exponent: log2 of the old tau~.
        new_exponent: log2 of the new tau~, >= old_exponent.

    Returns:
        (old tick, new tick) per value whose first occurrence moves: -1 at the old tick
        (NO_TICK: the value had none) and +1 at the new, strictly earlier, tick.
    """
    _validate.check_int_ge("new_exponent", new_exponent, old_exponent)
    before = first_ticks(earliest, old_exponent)
    after = first_ticks(earliest, new_exponent)
    moves = []
    for v, new in after.items():
        old = before.get(v, NO_TICK)
        if old == NO_TICK or new < old:
            moves.append((old, new))
    return sorted(moves)


# ---------------------------------------------------------------------------------------
# Reference stage 1 (tests, experiments)


def split_values_tick(
    totals: Mapping[Hashable, int], items: Iterable[tuple[Hashable, int]]
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...], dict[Hashable, int]]:
    """Stage 1 for one tick: each (user, value) item's rank band and the crossings.

    Args:
        totals: each user's c_u before the tick (not modified).
        items: the tick's (user, value) items in each user's own order.

    Returns:
        (values_by_band, crossings, new totals): ``values_by_band[b]`` lists the values
        with a rank in band b this tick (sorted, without duplicates).
    """
    new_totals = dict(totals)
    by_band: list[set[int]] = []
    for user, value in items:
        rank = new_totals.get(user, 0) + 1
        new_totals[user] = rank
        band = ul.rank_band(rank)
        while len(by_band) <= band:
            by_band.append(set())
        by_band[band].add(value)
    crossings: list[int] = []
    for user, after in new_totals.items():
        for j in ul.crossed_powers(totals.get(user, 0), after):
            while len(crossings) <= j:
                crossings.append(0)
            crossings[j] += 1
    return tuple(tuple(sorted(v)) for v in by_band), tuple(crossings), new_totals


# ---------------------------------------------------------------------------------------
# The mechanism (Sec. IV-D)


@dataclass(frozen=True, slots=True)
class DistinctCountSpec:
    """Public parameters of the user-level distinct count.

    Attributes:
        mechanism: the Alg. 5 skeleton (tracker epsilon/2 and beta/2 on the original
            stream, instances with node multiplier 2, or 4 with ``any_subset``), one bin.
        any_subset: neighbours may remove any subset of a user's items (docs/papers.md).
    """

    mechanism: ul.UserLevelSpec
    any_subset: bool


def make_distinct_count(
    name: str,
    epsilon: float | Fraction,
    beta: float | Fraction,
    theta: float | Fraction = 1,
    *,
    any_subset: bool = False,
    practical: bool = False,
    practical_instances: bool = False,
    forced_schedule: Sequence[tuple[int, int]] = (),
) -> DistinctCountSpec:
    """Validate and build a DistinctCountSpec.

    Args:
        name: public identity (prefix of every noise node id).
        epsilon: total budget > 0.
        beta: failure probability in (0, 1).
        theta: theta > 0 of both series.
        any_subset: node multiplier 4 instead of 2 (docs/papers.md).
        practical: App. C-A tracker (tau~ starts at 64, shifted series).
        practical_instances: shifted series for the instances too.
        forced_schedule: TEST HOOK forcing tau~ (see ``user_level.make_user_level``).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        epsilon-DP under user-level neighbours (whole user; any subset with
        ``any_subset``): see the module docstring.
    """
    if not isinstance(any_subset, bool):
        raise _validate.invalid("any_subset", "a bool", any_subset)
    mechanism = ul.make_user_level(
        name,
        epsilon,
        beta,
        theta,
        bins=1,
        multiplier=4 if any_subset else 2,
        practical=practical,
        practical_instances=practical_instances,
        forced_schedule=forced_schedule,
    )
    return DistinctCountSpec(mechanism=mechanism, any_subset=any_subset)


def init(spec: DistinctCountSpec) -> ul.UserLevelState:
    """The state before the first tick: ``user_level.UserLevelState`` whose node vectors
    hold SIGNED D-bar units per band (index = band)."""
    return ul.UserLevelState()


def step(
    spec: DistinctCountSpec,
    state: ul.UserLevelState,
    units: Sequence[int],
    crossings: Sequence[int],
    noise: NoiseSource,
) -> tuple[ul.UserLevelState, ul.UserLevelRelease]:
    """One public tick t = state.t + 1 (empty ticks too: ``step(spec, s, (), (), noise)``).

    Order inside a step: G += crossings; the tracker decides tau~_t on the ORIGINAL stream;
    a new instance iff tau~ changed (the band sums re-admit: first occurrences move
    earlier); the tree advances with this tick's signed band units; release
    F_0(Truncate(D_t, tau~_t)) + noise of the current instance.

    Args:
        spec: the mechanism's parameters.
        state: the state after tick t - 1.
        units: ``units[b]`` = this tick's signed D-bar units of band b, from
            ``first_occurrence_units`` (any sign; missing bands are 0).
        crossings: ``crossings[j]`` = users whose c_u went from <= 2^j to > 2^j.
        noise: the NoiseSource (keyed in production).

    Returns:
        (new state, release): ``release.value`` is the noisy distinct count, with its
        std and ci95 in ``release.bins[0]``.

    Raises:
        InvalidOperatorConfig: a report entry is not an int (a stage-1 bug).
    """
    leaf = _signed_vector("units", units)
    mech = spec.mechanism
    bound, _ = ul.advance_bound(mech, ul.bound_of(state), crossings, noise)
    tree = ul.exact_tree_advance(ul.tree_of(state), leaf)
    tau = bound.tau
    releases = ul.release_bins(mech, bound, tree, lambda v: ul.kept_bins(mech, v, tau), noise)
    new_state = ul.UserLevelState(
        t=bound.t,
        crossings=bound.crossings,
        svt_index=bound.svt_index,
        instance=bound.instance,
        tau=tau,
        alpha=tree.alpha,
        periods=tree.periods,
    )
    return new_state, ul.UserLevelRelease(
        t=bound.t, bins=releases, tau=tau, instance=bound.instance, svt_index=bound.svt_index
    )


def exact_value(spec: DistinctCountSpec, state: ul.UserLevelState) -> int:
    """F_0(Truncate(D_t, tau~_t)): what the release is unbiased for (with noise 0 it equals the
    release)."""
    return ul.exact_values(spec.mechanism, state)[0]


def spent_split(spec: DistinctCountSpec, state: ul.UserLevelState) -> tuple[Fraction, Fraction]:
    """Exact epsilon committed so far by (the tracker, the instances)."""
    return ul.spent_split(spec.mechanism, state)


def spent_epsilon(spec: DistinctCountSpec, state: ul.UserLevelState) -> Fraction:
    """Exact epsilon committed so far (tracker SVTs plus instances, < epsilon)."""
    return ul.spent_epsilon(spec.mechanism, state)


def _signed_vector(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _validate.invalid(f"{name} entries", "integers", type(value).__name__)
        out.append(value)
    while out and out[-1] == 0:
        out.pop()
    return tuple(out)
