"""The registry of statistic kinds: ``kind`` in a statistic's config -> its implementation.

Stage 1 and stage 2 (so the worker and ``dpstream replay``) build every statistic through
``statistic_for``, ``dpstream check-config`` describes it through ``describe``, and the
ingest, the worker and replay check event values by ``value_rule``; nothing else
dispatches on a kind. A new kind is its own module (a ``pipeline.statistic.Statistic``
and a one-line description) plus one line here, and one line in config/schema.py's
``KIND_PARAMETERS`` (which parameters it takes; the config package may not import this
one), in the same order (tests/pipeline/test_kinds.py checks the two agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpstream.config.schema import PipelineConfig, StatisticConfig

from . import cells, counters, means
from .records import ValueRule
from .statistic import Statistic


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind: how to build its statistic from the config, describe it in a line, and
    whether its events must carry a value."""

    make: Callable[[StatisticConfig, PipelineConfig], Statistic]
    describe: Callable[[StatisticConfig, PipelineConfig], str]
    needs_value: bool = True


COUNTING = Kind(counters.counter_statistic, counters.describe)

KINDS: dict[str, Kind] = {
    "count": Kind(counters.counter_statistic, counters.describe, needs_value=False),
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


def value_rule(stat: StatisticConfig) -> ValueRule:
    """Count ignores values; distinct needs one; sum, histogram and kselect need 1..R (R:
    max_value or bins, which the schema allows only for them); mean and cell_mean any
    finite number (clipped by the mechanism), and cell_mean the cell attribute (in
    ``cells.keys`` when that is given)."""
    cells = stat.cells
    return ValueRule(
        stat.name,
        stat.key,
        KINDS[stat.kind].needs_value,
        stat.max_value if stat.max_value is not None else stat.bins,
        stat.deletions,
        cell_field=None if cells is None else cells.field,
        cell_keys=None if cells is None or cells.keys is None else frozenset(cells.keys),
    )
