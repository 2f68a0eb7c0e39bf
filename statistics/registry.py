"""Statistic kinds: ``kind`` in a statistic's config -> its implementation.

The registry itself is config/schema.py's ``KINDS``: one line per kind, naming the module
that implements it and the parameters config validation allows it. Every implementation
module (``counters``, ``means``, ``cells``) has the same two functions,
``make_statistic(stat, cfg)`` (its ``pipeline.statistic.Statistic``) and
``describe(stat, cfg)`` (one line); this module imports each by the name the registry
gives, once per kind. The registry names modules as strings because the config package
may not import the pipeline (tests/test_import_graph.py): an import there would be a
cycle, since the pipeline imports config.

Stage 1 and stage 2 (so the worker and ``dpstream replay``) build every statistic through
``statistic_for``, ``dpstream check-config`` describes it through ``describe``, and the
ingest, the worker and replay check event values by ``value_rule``; nothing else
dispatches on a kind. A new kind is its own module with those two functions plus one
line in ``KINDS`` (tests/statistics/test_registry.py checks every entry's module).
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType

from dpstream.config.schema import KINDS, PipelineConfig, StatisticConfig
from dpstream.operators import accounting
from dpstream.operators.noise import discrete_laplace

from .contract import Statistic
from .events import ValueRule


@cache
def implementation(kind: str) -> ModuleType:
    """The module that implements ``kind``, as the registry names it (imported once)."""
    return importlib.import_module(KINDS[kind].implementation)


def statistic_for(stat: StatisticConfig, cfg: PipelineConfig) -> Statistic:
    """The implementation of ``stat`` under the pipeline's settings."""
    return implementation(stat.kind).make_statistic(stat, cfg)


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (its cost is the privacy statement's)."""
    return implementation(stat.kind).describe(stat, cfg)


def identity_parameters(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """Everything that shapes ``stat``'s noise or what one user contributes: the config's
    part (``PipelineConfig.statistic_parameters``), the mechanism as its implementation
    resolves it (``mechanism: auto``'s tree and k) with the versions of the algorithms it
    runs, and the noise sampler's version. Its fingerprint is the statistic's identity."""
    params = cfg.statistic_parameters(stat)
    params["algorithm"] = implementation(stat.kind).algorithm(stat, cfg)
    params["noise_sampler"] = discrete_laplace.VERSION
    return params


def fingerprint(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """``stat``'s identity (``operators.accounting.fingerprint`` of its parameters)."""
    return accounting.fingerprint(identity_parameters(stat, cfg))


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
