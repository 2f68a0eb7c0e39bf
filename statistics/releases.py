"""Releases and ledger entries: the one place their common fields are built.

Every release of every statistic is the kind's own fields (``Step.releases``) inside the
common ones (``ReleaseHeader``); every ledger entry of a statistic likewise
(``LedgerHeader``), its first one (``"event": "start"``) with the statistic's charge and
identity. Stage 2 builds them all through ``Records``; the key order is part of the
published bytes and is fixed here.

Schema versions: releases 4 (every release says what its interval covers, its counting
tree, its accounting and its noise: ``interval_of``, ``tree``, ``accounting``, ``noise``;
a count's, sum's, histogram's and distinct count's ``value`` is post-processed and the
operator's estimate is ``unbiased``: docs/design.md section 5c), ledger records 4
(every record names its app id and is authenticated; statements carry runs, sources and
the user id field; a statistic's first entry is ``"event": "start"`` with its run:
docs/design.md sections 4a and 4b).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from dpstream.config.schema import PipelineConfig
from dpstream.operators.accounting import Charge

from .contract import Statistic

log = logging.getLogger(__name__)

SCHEMA_VERSION = 4
CONFIDENCE = 0.95  # of every interval a release carries
# What every statistic's guarantee is accounted in and what its noise is drawn from today:
# pure epsilon-DP (basic composition) and the discrete Laplace (operators.noise; a
# continual mean's private medians are exponential-mechanism picks on top of it).
ACCOUNTING = "pure_dp"
NOISE = "discrete_laplace"
# What a release's interval can cover (``Statistic.interval_of``; README, release schema):
# "truncated": the statistic of the truncated data (each user's first tau contributions);
# "clipped": the mean of the samples the mechanism covered, clipped to the bounds;
# "none": the release has no interval (a k-selection's one-way margin).
INTERVAL_OF = ("truncated", "clipped", "none")
LEDGER_SCHEMA_VERSION = 4


class TreeField(TypedDict):
    """A release's counting tree as ``mechanism`` names it in the config, and its arity."""

    name: str
    k: int


class ReleaseHeader(TypedDict):
    """The fields every release has, around its kind's own (``Step.releases``), in this
    order: the first six before them, the others after."""

    schema_version: int
    statistic: str
    kind: str
    tick: int
    tick_end: str  # ISO 8601, UTC
    tick_end_unix: float
    confidence: float
    epsilon: float
    neighbours: str
    mechanism: str
    tree: TreeField | None  # the counting tree (None: the mechanism is not one tree)
    interval_of: str  # one of INTERVAL_OF
    accounting: str  # ACCOUNTING
    noise: str  # NOISE
    public_counts: NotRequired[bool]  # only in a public-counts pipeline, and then true
    insecure: NotRequired[str]  # only with noise.mode other than keyed: that mode


class LedgerHeader(TypedDict):
    """The fields every ledger entry of a statistic has (its first one: ``start``)."""

    schema_version: int
    app_id: str
    statistic: str
    tick: int
    total_epsilon: float


def tree_field(tree: tuple[str, int]) -> TreeField:
    """The ``tree`` field of a release: (name, k) as an object."""
    name, k = tree
    return {"name": name, "k": k}


@dataclass(frozen=True)
class Identity:
    """What a statistic's first ledger entry says of its identity."""

    fingerprint: str
    run_id: str
    start_tick: int


@dataclass(frozen=True)
class Records:
    """The releases and ledger entries of one pipeline's statistics."""

    cfg: PipelineConfig
    statistics: Mapping[str, Statistic]
    charges: Mapping[str, Charge]

    def tick_end(self, tick: int) -> float:
        return (tick + 1) * self.cfg.ticks.interval_seconds

    def neighbours(self, name: str) -> str:
        """The neighbouring relation the statistic's guarantee is stated for."""
        return self.statistics[name].neighbours or self.cfg.privacy.neighbours.value

    def release(self, name: str, tick: int, fields: Mapping[str, Any]) -> dict[str, Any]:
        """A release of statistic ``name`` at ``tick``: the common fields around the kind's."""
        stat = next(s for s in self.cfg.statistics if s.name == name)
        statistic = self.statistics[name]
        end = self.tick_end(tick)
        record = {
            "schema_version": SCHEMA_VERSION,
            "statistic": name,
            "kind": stat.kind,
            "tick": tick,
            "tick_end": datetime.fromtimestamp(end, UTC).isoformat(),
            "tick_end_unix": end,
            **fields,
            "confidence": CONFIDENCE,
            "epsilon": stat.epsilon,
            "neighbours": self.neighbours(name),
            "mechanism": statistic.mechanism,
            "tree": None if statistic.tree is None else tree_field(statistic.tree),
            "interval_of": statistic.interval_of,
            "accounting": ACCOUNTING,
            "noise": NOISE,
        }
        if self.cfg.privacy.public_counts:
            record["public_counts"] = True  # the statement: counts are not protected
        if self.cfg.noise.mode.value != "keyed":
            record["insecure"] = self.cfg.noise.mode.value
        return record

    def ledger(self, name: str, tick: int, fields: Mapping[str, Any]) -> dict[str, Any]:
        """A ledger entry of a statistic after its first: the common fields around the
        entry's own (an expenditure, the budget spent)."""
        return {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "app_id": self.cfg.app_id,
            "statistic": name,
            "tick": tick,
            **fields,
            "total_epsilon": self.cfg.privacy.total_epsilon,
        }

    def start(self, name: str, identity: Identity) -> dict[str, Any]:
        """The statistic's first ledger entry, at its first closed tick: what it charges
        and its identity (the run's start, which the worker checks a recreated state
        against), completed by the kind (``Statistic.ledger_start``)."""
        stat = next(s for s in self.cfg.statistics if s.name == name)
        statistic = self.statistics[name]
        entry = {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "app_id": self.cfg.app_id,
            "event": "start",
            "statistic": name,
            "instance": 0,
            "tick": identity.start_tick,
            "epsilon": stat.epsilon,
            "mechanism": statistic.mechanism,
            "tau": stat.tau,
            "neighbours": self.neighbours(name),
            "note": "whole infinite stream (parallel composition over periods)",
            "total_epsilon": self.cfg.privacy.total_epsilon,
            "charged": float(self.charges[name].epsilon),
            "fingerprint": identity.fingerprint,
            "run_id": identity.run_id,
            "start_tick": identity.start_tick,
        }
        return statistic.ledger_start(entry)

    def exhausted(self, name: str, tick: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the release, the ledger entry) of a statistic whose lifetime budget is spent at
        ``tick`` (``Statistic.lifetime_steps``): it releases nothing more, ever."""
        stat = next(s for s in self.cfg.statistics if s.name == name)
        log.warning(
            "statistic %s: lifetime budget spent at tick %s (horizon_ticks=%s); "
            "no further releases",
            name,
            tick,
            stat.horizon_ticks,
        )
        release = self.release(
            name,
            tick,
            {
                "exhausted": True,
                "value": None,
                "note": "lifetime budget spent: this statistic releases nothing more",
            },
        )
        entry = self.ledger(
            name,
            tick,
            {
                "event": "exhausted",
                "epsilon_spent": float(self.charges[name].epsilon),
                "horizon_ticks": stat.horizon_ticks,
            },
        )
        return release, entry
