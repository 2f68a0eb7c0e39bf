"""Insert/delete streams (the fully dynamic case), Dong-Luo-Yi Sec. VI.

Every item is an insertion or a deletion of a value. Split the stream into an insertion
stream D_ins and a deletion stream D_del (in each, the events of the other kind become
dummies), run the user-level mechanism (``counter``, Alg. 5) on each with epsilon/2 and
beta/2, and release F~_ins - F~_del. Supported: count, sum and histogram (a deletion
removes one unit from its bin). Distinct count is NOT supported (an open problem in the
paper, Sec. VI): ``make_deletions`` raises for it.

Each side has its own tracker and truncation, on the ranks of that side only: a user's
c_u^ins counts their insertions, c_u^del their deletions. The error stays O~(kappa) where
kappa now counts all events of a user (O~(phi) for sum); it is no longer
down-neighbourhood optimal (Thm VI.1 lower bound Omega(T^(1/3) / epsilon^(2/3))).

Stage 1 -> stage 2, per tick: the ``counter`` report TWICE, once per side:
``insert_bands[b][r]`` / ``insert_crossings[j]`` with ranks among the user's insertions, and
``delete_bands[b][r]`` / ``delete_crossings[j]`` with ranks among their deletions (for sum,
units of the inserted / deleted values, split over bands as in ``user_level.band_units``).

Noise ids: the two sides are ``counter`` mechanisms named ``f"{name}/ins"`` and
``f"{name}/del"``, so their noises are independent.

Privacy:
    User-level neighbours (removing all, or any subset with multiplier 2, of one user's
    items, insertions and deletions alike). D_ins and D_del each change by one user's
    items, so each side's epsilon/2-DP guarantee applies, and basic composition gives
    epsilon for the infinite output sequence of F~_ins - F~_del (post-processing).

References:
    W. Dong, Q. Luo, K. Yi. Continual Observation under User-level Differential Privacy.
    IEEE S&P 2023. Sec. VI, Thm VI.1, Appendix B.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .. import _validate
from ..errors import InvalidOperatorConfig
from ..noise import NoiseSource, TreeRelease, exact_half_width
from ..trees import kary_tree
from . import counter as ul

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

MECHANISM = "deletions"

STATISTICS = ("count", "sum", "histogram")
UNSUPPORTED = ("distinct_count",)


@dataclass(frozen=True, slots=True)
class DeletionsSpec:
    """Public parameters of an insert/delete statistic.

    Attributes:
        statistic: "count", "sum" or "histogram".
        inserts: the insertion side's mechanism (epsilon/2, beta/2).
        deletes: the deletion side's mechanism (epsilon/2, beta/2).
    """

    statistic: str
    inserts: ul.UserLevelSpec
    deletes: ul.UserLevelSpec


@dataclass(frozen=True, slots=True)
class DeletionsState:
    """Plain-data state: the two ``counter`` states, field by field (ins_*, del_*)."""

    ins_t: int = 0
    ins_crossings: tuple[int, ...] = ()
    ins_svt_index: int = 1
    ins_instance: int = 0
    ins_tau: int = 0
    ins_alpha: tuple[ul.Vector, ...] = ()
    ins_periods: tuple[ul.Vector, ...] = ()
    del_t: int = 0
    del_crossings: tuple[int, ...] = ()
    del_svt_index: int = 1
    del_instance: int = 0
    del_tau: int = 0
    del_alpha: tuple[ul.Vector, ...] = ()
    del_periods: tuple[ul.Vector, ...] = ()


@dataclass(frozen=True, slots=True)
class DeletionsRelease:
    """What one tick releases.

    Attributes:
        t: the tick.
        bins: per bin, value = F~_ins - F~_del with the exact std of the difference's
            noise and its exact 95% half-width (the quantile of both sides' terms together).
        inserts: the insertion side's release (tau~, instance, per-bin values).
        deletes: the deletion side's release.
    """

    t: int
    bins: tuple[TreeRelease, ...]
    inserts: ul.UserLevelRelease
    deletes: ul.UserLevelRelease

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(rel.value for rel in self.bins)

    @property
    def value(self) -> int:
        return self.bins[0].value


def make_deletions(
    name: str,
    statistic: str,
    epsilon: float | Fraction,
    beta: float | Fraction,
    theta: float | Fraction = 1,
    *,
    bins: int = 1,
    any_subset: bool = False,
    practical: bool = False,
    practical_instances: bool = False,
    forced_schedule: Sequence[tuple[int, int]] = (),
    tree: tuple[kary_tree.ChosenTree, int] = ul.BINARY,
    **tuning: Any,
) -> DeletionsSpec:
    """Validate and build a DeletionsSpec.

    Args:
        name: public identity (the sides are ``name/ins`` and ``name/del``).
        statistic: "count", "sum" or "histogram".
        epsilon: total budget > 0 (epsilon/2 per side).
        beta: failure probability in (0, 1) (beta/2 per side).
        theta: theta > 0.
        bins: R for a histogram (must be 1 for count and sum).
        any_subset: node multiplier 2 (docs/papers.md).
        practical: App. C-A tracker on both sides.
        practical_instances: shifted instance series on both sides.
        forced_schedule: TEST HOOK forcing tau~ on both sides (not private).
        tree: the counter both sides' instances run (``counter.make_user_level``).
        **tuning: both sides' tracker share, series, start and growth
            (``counter.make_user_level``'s keyword arguments of those names).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range, or ``statistic`` is
            "distinct_count" (not supported with deletions: Dong-Luo-Yi Sec. VI).

    Privacy:
        epsilon-DP under user-level neighbours (module docstring).
    """
    if statistic in UNSUPPORTED:
        raise InvalidOperatorConfig(
            "statistic must be one of ('count', 'sum', 'histogram'), got 'distinct_count': "
            "distinct count with deletions is not supported (open problem in Dong, Luo, Yi "
            "2023, Sec. VI)"
        )
    if statistic not in STATISTICS:
        raise _validate.invalid("statistic", f"one of {STATISTICS}", statistic)
    _validate.check_int_ge("bins", bins, 1)
    if statistic != "histogram" and bins != 1:
        raise _validate.invalid("bins", f"1 for {statistic}", bins)
    if not isinstance(any_subset, bool):
        raise _validate.invalid("any_subset", "a bool", any_subset)
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    b = _validate.exact_fraction("beta", beta)
    _validate.check_probability("beta", b)
    sides = tuple(
        ul.make_user_level(
            f"{name}/{side}",
            eps / 2,
            b / 2,
            theta,
            bins=bins,
            multiplier=2 if any_subset else 1,
            practical=practical,
            practical_instances=practical_instances,
            forced_schedule=forced_schedule,
            tree=tree,
            **tuning,
        )
        for side in ("ins", "del")
    )
    return DeletionsSpec(statistic=statistic, inserts=sides[0], deletes=sides[1])


def init(spec: DeletionsSpec) -> DeletionsState:
    return DeletionsState()


def side_state(state: DeletionsState, side: str) -> ul.UserLevelState:
    """The ``counter`` state of side "ins" or "del"."""
    return ul.UserLevelState(
        t=getattr(state, f"{side}_t"),
        crossings=getattr(state, f"{side}_crossings"),
        svt_index=getattr(state, f"{side}_svt_index"),
        instance=getattr(state, f"{side}_instance"),
        tau=getattr(state, f"{side}_tau"),
        alpha=getattr(state, f"{side}_alpha"),
        periods=getattr(state, f"{side}_periods"),
    )


def step(
    spec: DeletionsSpec,
    state: DeletionsState,
    insert_bands: Sequence[Sequence[int]],
    insert_crossings: Sequence[int],
    delete_bands: Sequence[Sequence[int]],
    delete_crossings: Sequence[int],
    noise: NoiseSource,
) -> tuple[DeletionsState, DeletionsRelease]:
    """One public tick: step both sides, release F~_ins - F~_del per bin.

    Args:
        spec: the statistic's parameters.
        state: the state after tick t - 1.
        insert_bands, insert_crossings: this tick's ``counter`` report of insertions.
        delete_bands, delete_crossings: the same for deletions.
        noise: the NoiseSource (keyed in production).

    Returns:
        (new state, release).

    Raises:
        InvalidOperatorConfig: a malformed report (a stage-1 bug).
    """
    ins_state, ins = ul.step(
        spec.inserts, side_state(state, "ins"), insert_bands, insert_crossings, noise
    )
    del_state, dele = ul.step(
        spec.deletes, side_state(state, "del"), delete_bands, delete_crossings, noise
    )
    t = ins.t
    # Every bin of one side carries the same multiset of scales at a tick.
    scales = tuple(
        scale
        for side_spec, rel in ((spec.inserts, ins), (spec.deletes, dele))
        for scale in ul.release_scales(side_spec, t, rel.instance, rel.tau)
    )
    ci95 = exact_half_width(scales, 0.05)
    bins = tuple(
        TreeRelease(
            t=t,
            value=a.value - d.value,
            std=math.sqrt(a.std**2 + d.std**2),
            ci95=ci95,
        )
        for a, d in zip(ins.bins, dele.bins, strict=True)
    )
    new_state = DeletionsState(
        ins_t=ins_state.t,
        ins_crossings=ins_state.crossings,
        ins_svt_index=ins_state.svt_index,
        ins_instance=ins_state.instance,
        ins_tau=ins_state.tau,
        ins_alpha=ins_state.alpha,
        ins_periods=ins_state.periods,
        del_t=del_state.t,
        del_crossings=del_state.crossings,
        del_svt_index=del_state.svt_index,
        del_instance=del_state.instance,
        del_tau=del_state.tau,
        del_alpha=del_state.alpha,
        del_periods=del_state.periods,
    )
    return new_state, DeletionsRelease(t=t, bins=bins, inserts=ins, deletes=dele)


def release_std(spec: DeletionsSpec, t: int, instance: int, tau: int) -> float:
    """Exact std of every bin's F~_ins - F~_del at t when both sides run instance j with
    bound tau~ (public: what ``dpstream check-config`` plans with): the sides' noises are
    independent, so their variances add."""
    ins = ul.release_std(spec.inserts, t, instance, tau)
    dele = ul.release_std(spec.deletes, t, instance, tau)
    return math.sqrt(ins**2 + dele**2)


def exact_values(spec: DeletionsSpec, state: DeletionsState) -> tuple[int, ...]:
    """F(Truncate(D_ins, tau~_ins)) - F(Truncate(D_del, tau~_del)) per bin (noise 0)."""
    ins = ul.exact_values(spec.inserts, side_state(state, "ins"))
    dele = ul.exact_values(spec.deletes, side_state(state, "del"))
    return tuple(a - d for a, d in zip(ins, dele, strict=True))


def spent_split(spec: DeletionsSpec, state: DeletionsState) -> tuple[Fraction, Fraction]:
    """Exact epsilon committed so far by (both sides' trackers, both sides' instances)."""
    ins = ul.spent_split(spec.inserts, side_state(state, "ins"))
    dels = ul.spent_split(spec.deletes, side_state(state, "del"))
    return ins[0] + dels[0], ins[1] + dels[1]


def spent_epsilon(spec: DeletionsSpec, state: DeletionsState) -> Fraction:
    """Exact epsilon committed by both sides so far (< epsilon)."""
    return sum(spent_split(spec, state), Fraction(0))
