"""Kind histogram (``tau: auto``): Dong-Luo-Yi Alg. 5 over R bins, the count of each
integer value 1..R, with its max frequency (Sec. IV-B), and an insert/delete stream where
``deletions: true`` (Sec. VI).

Stage 1 counts each user's events by rank band in the column of the event's value
(``HistogramBounding``); stage 2 steps the user-level counter with R bins
(``user_level.UserLevelStatistic``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import deletions

from .bounding import UnitBounding, clamped_units, rank_band_weights
from .events import Event
from .fixed_tau import least_value
from .releases import HistogramFields
from .user_level import (
    UserLevelStatistic,
    algorithm,
    counter_spec,
    post_processing,
    series_fields,
    shown_bins,
)
from .user_level import describe as describe

RELEASE_FIELDS = HistogramFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


@dataclass(frozen=True, slots=True)
class HistogramBounding(UnitBounding):
    """Each event is one unit of its user, in the column of its value: rank bands per bin
    (Dong-Luo-Yi Alg. 5); values are clipped into [1, R] and rounded to the nearest bin."""

    bins: int = 1

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        assert event.value is not None  # ``stream`` checked it
        column = clamped_units(event.value, 1, self.bins) - 1
        return 1, rank_band_weights(stream, used, 1, column)


@dataclass(frozen=True)
class HistogramStatistic(UserLevelStatistic):
    """A tau: auto histogram: per-bin values, their std and intervals, the max frequency."""

    @property
    def bounding(self) -> HistogramBounding:
        stat = self.stat
        return HistogramBounding(stat.name, stat.key, stat.deletions, bins=_bins(stat))

    def values(
        self, rel: Any, previous: list[int] | None
    ) -> tuple[dict[str, Any], list[int] | None]:
        inserts = rel.inserts if self.stat.deletions else rel
        out = series_fields(inserts, rel.deletes if self.stat.deletions else None)
        bins = rel.bins
        seen = shown_bins(bins, previous, least_value(self.stat), self.noisy)
        out["values"] = [s.value for s in seen]
        out["std"] = [b.std for b in bins]
        out["intervals"] = [list(s.interval) for s in seen]
        out["unbiased_values"] = [b.value for b in bins]
        # Post-processing (Dong-Luo-Yi Sec. IV-B): no extra privacy cost; of the values shown.
        out["max_frequency"] = max(s.value for s in seen)
        return out, [s.value for s in seen]

    def planned_std(self, t: int, instance: int, tau: int) -> float | None:
        if isinstance(self.spec, deletions.DeletionsSpec):
            return deletions.release_std(self.spec, t, instance, tau)
        return ul.release_std(self.spec, t, instance, tau)


def _bins(stat: StatisticConfig) -> int:
    if stat.bins is None:  # the config schema requires it of a histogram
        raise ValueError("bins: required for kind histogram")
    return stat.bins


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> HistogramStatistic:
    """A tau: auto histogram over ``bins`` values (with deletions: Sec. VI)."""
    return HistogramStatistic(
        stat, *counter_spec(stat, cfg, bins=_bins(stat)), **post_processing(stat, cfg)
    )


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism and its algorithms' versions
    (``user_level.algorithm``)."""
    return {"algorithm": algorithm(make_statistic(stat, cfg))}
