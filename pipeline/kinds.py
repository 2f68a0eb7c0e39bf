"""The registry of statistic kinds: ``kind`` in a statistic's config -> its implementation.

Stage 1 and stage 2 (so the worker and ``dpstream replay``) build every statistic through
``statistic_for``, and ``dpstream check-config`` describes it through ``describe``; nothing
else dispatches on a kind. A new kind is its own module (a ``pipeline.statistic.Statistic``
and a one-line description) plus one line here; config/schema.py's ``Kind`` names it and
validates its parameters (tests/pipeline/test_kinds.py checks the two agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpstream.config.schema import PipelineConfig, StatisticConfig

from . import cells, counters, means
from .statistic import Statistic


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind: how to build its statistic from the config, and describe it in a line."""

    make: Callable[[StatisticConfig, PipelineConfig], Statistic]
    describe: Callable[[StatisticConfig, PipelineConfig], str]


COUNTING = Kind(counters.counter_statistic, counters.describe)

KINDS: dict[str, Kind] = {
    "count": COUNTING,
    "sum": COUNTING,
    "histogram": COUNTING,
    "kselect": COUNTING,
    "distinct": COUNTING,
    "mean": Kind(means.mean_statistic, means.describe),
    "cell_mean": Kind(cells.CellMeanStatistic.of, cells.describe),
}


def statistic_for(stat: StatisticConfig, cfg: PipelineConfig) -> Statistic:
    """The implementation of ``stat`` under the pipeline's settings."""
    return KINDS[stat.kind].make(stat, cfg)


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (its cost is the privacy statement's)."""
    return KINDS[stat.kind].describe(stat, cfg)
