"""Kind distinct (``tau: auto``): the number of distinct event values, Dong-Luo-Yi's
distinct count over user-level contributions.

Stage 1 sends each value at the rank band of the user's contribution that first carries it
(``DistinctBounding``); stage 2 keeps m(v), the band of each value's first occurrence,
and steps ``operators.user_level.distinct_count`` with the units that are first
occurrences (``distinct_count.first_occurrence_units``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators import accounting
from dpstream.operators.noise import NoiseSource
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import distinct_count

from .bounding import UnitBounding
from .events import Event
from .releases import UserLevelFields
from .user_level import (
    UserLevelState,
    UserLevelStatistic,
    post_processing,
    series_fields,
    shown_bins,
    versions,
)
from .user_level import describe as describe
from .weights import INSERTS, crossing_key, distinct_key, distinct_values, parse_weights

RELEASE_FIELDS = UserLevelFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


@dataclass(frozen=True, slots=True)
class DistinctBounding(UnitBounding):
    """Each event is one unit of its user: 1 for each 2^j the user's total passes, and the
    event's value at the rank band of that unit."""

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        out = {crossing_key(stream, j): 1 for j in ul.crossed_powers(used, used + 1)}
        out[distinct_key(ul.rank_band(used + 1), event.value)] = 1
        return 1, out


@dataclass(frozen=True)
class DistinctStatistic(UserLevelStatistic):
    """A tau: auto distinct count."""

    @property
    def bounding(self) -> DistinctBounding:
        return DistinctBounding(self.stat.name, self.stat.key, False)

    def advance(
        self, op_state: Any, weights: dict[str, int], old: UserLevelState, noise: NoiseSource
    ) -> tuple[Any, Any, dict[str, int] | None]:
        min_band = dict(old.min_band or {})
        updates, units = distinct_count.first_occurrence_units(min_band, distinct_values(weights))
        min_band.update(updates)
        _, crossings = parse_weights(weights, INSERTS)
        op_state, rel = distinct_count.step(self.spec, op_state, units, crossings, noise)
        return op_state, rel, min_band

    def values(
        self, rel: Any, previous: list[int] | None
    ) -> tuple[dict[str, Any], list[int] | None]:
        out = series_fields(rel, None)
        (only,) = rel.bins
        (seen,) = shown_bins(rel.bins, previous, 0, self.noisy)
        out["value"] = seen.value
        out["std"] = only.std
        out["interval"] = list(seen.interval)
        out["unbiased"] = only.value
        return out, [seen.value]

    def planned_std(self, t: int, instance: int, tau: int) -> float | None:
        return ul.release_std(self.spec.mechanism, t, instance, tau)


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> DistinctStatistic:
    """A tau: auto distinct count."""
    eps, beta, theta = (Fraction(repr(x)) for x in (stat.epsilon, stat.beta, stat.theta))
    spec = distinct_count.make_distinct_count(
        stat.name,
        eps,
        beta,
        theta,
        any_subset=accounting.sensitivity_multiplier(cfg.privacy.neighbours.value) == 2,
        practical=stat.practical,
        practical_instances=stat.practical_instances,
    )
    return DistinctStatistic(
        stat,
        distinct_count,
        spec,
        ul.UserLevelState,
        distinct_count.MECHANISM,
        **post_processing(stat, cfg),
    )


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism and its algorithms' versions."""
    return {"algorithm": {"mechanism": make_statistic(stat, cfg).mechanism, "versions": versions()}}
