"""Releases and ledger entries: the one place their common fields are built.

Every release of every statistic is the kind's own fields (``Step.releases``) inside the
common ones (``ReleaseHeader``); every ledger entry of a statistic likewise
(``LedgerHeader``), its first one (``"event": "start"``) with the statistic's charge and
identity. Stage 2 builds them all through ``Records``; the key order is part of the
published bytes and is fixed here.

Schema versions: releases 5 (every release says what its interval covers, its counting
tree, its accounting and its noise: ``interval_of``, ``tree``, ``accounting``, ``noise``;
a count's, sum's, histogram's and distinct count's ``value`` is post-processed and the
operator's estimate is ``unbiased``: docs/design.md section 5c; 5 adds the zCDP mode's
``rho`` and ``delta``, with ``accounting: zcdp`` and ``noise: discrete_gaussian``),
ledger records 5 (every record names its app id and is authenticated; statements carry
runs, sources and the user id field; a statistic's first entry is ``"event": "start"``
with its run: docs/design.md sections 4a and 4b; 5 adds the zCDP statement's and
charges' ``rho``, ``total_rho`` and ``delta``).

The shapes of what is published are declared here too, as ``TypedDict``\ s: the header
of every release (``ReleaseHeader``) around each kind's own fields (``CounterFields``, ...;
a kind's module names its shape as ``RELEASE_FIELDS``, the registry which kinds share
one), and every ledger entry (``StartEntry``, ``LedgerHeader`` with ``BudgetFields``,
``CellsFields`` or ``ExhaustedEntryFields``, ``StatementEntry``, each signed with
``Signature``). The JSON Schemas published in docs/schemas/ are generated from them
(``python -m dpstream.client.schemas``); a change of shape is a new schema version.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, NotRequired, TypedDict, get_origin, get_type_hints

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators.accounting import Charge, PrivacyStatement

from .contract import Statistic

log = logging.getLogger(__name__)

SCHEMA_VERSION = 5
CONFIDENCE = 0.95  # of every interval a release carries
# What a statistic's guarantee is accounted in and what its noise is drawn from: pure
# epsilon-DP (basic composition) and the discrete Laplace (operators.noise; a continual
# mean's private medians are exponential-mechanism picks on top of it), or under
# privacy.accounting: zcdp rho-zCDP and the discrete Gaussian (the square-root
# factorization counter).
ACCOUNTING = "pure_dp"
NOISE = "discrete_laplace"
ZCDP_ACCOUNTING = "zcdp"
ZCDP_NOISE = "discrete_gaussian"
# What a release's interval can cover (``Statistic.interval_of``; README, release schema):
# "truncated": the statistic of the truncated data (each user's first tau contributions);
# "clipped": the mean of the samples the mechanism covered, clipped to the bounds;
# "none": the release has no interval (a k-selection's one-way margin).
INTERVAL_OF = ("truncated", "clipped", "none")
LEDGER_SCHEMA_VERSION = 5


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
    accounting: str  # ACCOUNTING or ZCDP_ACCOUNTING
    noise: str  # NOISE or ZCDP_NOISE
    rho: NotRequired[float]  # zCDP: the statistic's rho; epsilon is then what it implies
    delta: NotRequired[float]  # zCDP: at this delta (Canonne-Kamath-Steinke)
    public_counts: NotRequired[bool]  # only in a public-counts pipeline, and then true
    insecure: NotRequired[str]  # only with noise.mode other than keyed: that mode


@dataclass(frozen=True)
class Items:
    """How many items a list holds, exactly (the schemas' ``minItems`` and ``maxItems``)."""

    count: int


Interval = Annotated[list[float], Items(2)]
"""[low, high]: a 95% interval, or bounds."""


class CounterFields(TypedDict):
    """A count or sum with a fixed tau (``fixed_tau.py``): the tree counter's running
    value, its noise's std and 95% interval, and the bound tau."""

    step: int
    value: int | float  # post-processed (section 5c); a sum on a grid: units times grid_step
    std: float
    interval: Interval
    unbiased: int | float  # the operator's unbiased estimate
    tau: int
    grid_step: NotRequired[float]  # a sum on a grid (lower/upper/resolution): its step


class TrackedBound(TypedDict):
    """The bound a ``tau: auto`` statistic tracks privately (``user_level.series_fields``):
    tau, the truncation instance and the SVT index (and the deletion stream's tau), after
    the release's step (declared here, first, because its releases write it first: the
    key order the Avro schemas follow)."""

    step: int
    tau: int
    instance: int
    svt_index: int
    tau_deletions: NotRequired[int]


class UserLevelFields(TrackedBound):
    """A ``tau: auto`` count, sum or distinct count (Dong-Luo-Yi Alg. 5), and the epsilon
    its tracker and instances have spent so far (below its epsilon)."""

    value: int | float  # post-processed (section 5c); a sum on a grid: units times grid_step
    std: float
    interval: Interval
    unbiased: int | float  # the operator's unbiased estimate
    epsilon_spent: float
    grid_step: NotRequired[float]  # a sum on a grid (lower/upper/resolution): tau in its units


class HistogramFields(TrackedBound):
    """A ``tau: auto`` histogram: per bin (values 1..R) its value, std and interval, and
    the max frequency (post-processing)."""

    values: list[int]  # post-processed (docs/design.md section 5c)
    std: list[float]
    intervals: list[Interval]
    unbiased_values: list[int]  # the operator's unbiased estimates
    max_frequency: int
    epsilon_spent: float


class KSelectFields(TypedDict):
    """A k-selection (Dong-Luo-Yi Alg. 6): the value (0: fewer than k items), the rank k,
    the margin in ranks and whether the value is one-way (never above the true k-th)."""

    step: int
    value: int
    k: int
    margin: float
    margin_mode: Literal["full", "half"]
    one_way: bool
    tau: int
    taus: list[int]
    epsilon_spent: float


class WholeUserMeanFields(TypedDict):
    """A whole-user mean (the default ``kind: mean``): every number noised; ``value`` and
    ``std`` null while the noisy count of kept samples is below 1."""

    step: int
    value: float | None
    std: float | None
    interval: Interval
    samples: int
    samples_std: float
    samples_interval: Interval
    max_samples_per_user: int
    bounds: Interval


class ContinualMeanFields(TypedDict):
    """George et al.'s continual mean (``privacy.public_counts: true``): exact counts."""

    step: int
    value: float
    std: float
    interval: Interval
    mean_interval: Interval
    samples_covered: int
    samples: int
    samples_over_cap: int
    users: int
    users_over_cap: int
    active_levels: int
    medians: list[Interval]
    bounds: Interval


class CellMeanFields(TypedDict):
    """One cell's mean (Rameshwar et al.), released when its slot closes."""

    cell: str
    slot: int
    slot_ticks: Annotated[list[int], Items(2)]
    epoch: int
    value: float
    std: float
    interval: Interval
    noise_scale: float
    cell_mechanism: str
    bounds: Interval
    clip_interval: NotRequired[Interval]
    n_users: NotRequired[int]
    n_samples: NotRequired[int]
    m_ub: NotRequired[int]
    n_arrays: NotRequired[int]
    noisy_count: NotRequired[int]


class ExhaustedFields(TypedDict):
    """The last release of a statistic whose lifetime budget is spent (``exhausted``)."""

    exhausted: Literal[True]
    value: None
    note: str


class LedgerHeader(TypedDict):
    """The fields every ledger entry of a statistic has after its first (``start``)."""

    schema_version: int
    app_id: str
    statistic: str
    tick: int
    total_epsilon: float
    total_rho: NotRequired[float]  # zCDP: total_epsilon is what it implies at the delta


class Signature(TypedDict):
    """What the worker adds to every ledger entry it writes: the key's commitment and a MAC
    under the pipeline's key (``pipeline.worker.keys``)."""

    key_commitment: str
    mac: str


class LossAtAge(TypedDict):
    age_ticks: int
    epsilon: float


class StartEntry(TypedDict):
    """A statistic's first ledger entry (``Records.start``), with what its kind adds
    (``Statistic.ledger_start``: the fields below ``start_tick``)."""

    schema_version: int
    app_id: str
    event: Literal["start"]
    statistic: str
    instance: int
    tick: int
    epsilon: float
    mechanism: str
    tau: NotRequired[int | Literal["auto"]]
    neighbours: str
    note: str
    total_epsilon: float
    charged: float
    rho: NotRequired[float]  # zCDP: charged in rho; epsilon and charged at delta
    delta: NotRequired[float]
    fingerprint: str
    run_id: str
    start_tick: int
    expiration: NotRequired[list[LossAtAge]]
    split: NotRequired[dict[str, float]]
    sensitivities: NotRequired[list[int]]
    max_samples_per_user: NotRequired[int]
    resolution: NotRequired[int]
    max_users: NotRequired[int]
    counts_public: NotRequired[bool]
    cell_field: NotRequired[str]
    slot_ticks: NotRequired[int]
    epoch_slots: NotRequired[int]
    epoch_cap: NotRequired[float]
    on_cap: NotRequired[str]
    clip_user: NotRequired[bool]
    bounds: NotRequired[Interval]
    step: NotRequired[float]


class BudgetFields(TypedDict):
    """A ``tau: auto`` statistic's tracker or instance series spent more this tick."""

    event: Literal["budget"]
    tracker_epsilon: float
    instances_epsilon: float
    epsilon_spent: float
    epsilon: float
    tau: int
    svt_index: int | None
    instance: int | None


class DroppedAtCap(TypedDict):
    users: int
    pairs: int
    cells_not_released: int


class ClipUserOutcome(TypedDict):
    pairs_suppressed: int
    loss_before: float
    loss_after: float
    rounds: int
    error_bound_e0: float
    cells_above_e0: int


class CellsFields(TypedDict):
    """A ``cell_mean`` statistic released a slot (with public counts: who was charged)."""

    event: Literal["cells"]
    epoch: int
    slot: int
    cells_released: int
    epsilon_per_cell: float
    epoch_cap: float
    note: NotRequired[str]
    users_charged: NotRequired[int]
    epoch_max_loss: NotRequired[float]
    dropped_at_cap: NotRequired[DroppedAtCap]
    clip_user: NotRequired[ClipUserOutcome]


class ExhaustedEntryFields(TypedDict):
    """A statistic's lifetime budget is spent (``Records.exhausted``)."""

    event: Literal["exhausted"]
    epsilon_spent: float
    horizon_ticks: int | None


class ChargeRecord(TypedDict):
    """One statistic's charge in a statement (``accounting.Charge.to_json``)."""

    statistic: str
    relation: str
    epsilon: float
    per_epoch: bool
    exact_counts: bool
    basis: str
    run_id: NotRequired[str]
    rho: NotRequired[float]  # zCDP: its rho; epsilon what it implies alone at delta
    delta: NotRequired[float]


class RunIdentity(TypedDict):
    """A statistic's identity and run, as a statement states it."""

    fingerprint: str
    parameters: dict[str, Any]
    run_id: str


class StatementEntry(TypedDict):
    """The ledger record of a worker start (``statement_entry``): the privacy statement
    (``accounting.PrivacyStatement.to_json``), each statistic's identity and run, the runs
    begun anew, the source topics and the privacy unit."""

    schema_version: int
    event: Literal["statement"]
    app_id: str
    relation: str
    public_counts: bool
    composition: str
    per_user_total: float
    per_epoch: bool
    total_epsilon: float
    statistics: list[ChargeRecord]
    retired: list[ChargeRecord]
    accounting: NotRequired[str]  # "zcdp" (absent: pure epsilon-DP)
    rho_total: NotRequired[float]  # zCDP: what one user can lose, in rho
    total_rho: NotRequired[float]
    delta: NotRequired[float]  # the delta of per_user_total's and total_epsilon's epsilon
    identities: dict[str, RunIdentity]
    new_runs: list[str]
    sources: list[str]
    user_id_field: str


LEDGER_ENTRIES: tuple[tuple[type, ...], ...] = (
    (StatementEntry,),
    (StartEntry,),
    (LedgerHeader, BudgetFields),
    (LedgerHeader, CellsFields),
    (LedgerHeader, ExhaustedEntryFields),
)
"""Every ledger entry, as the fields it is made of (each signed: ``Signature``)."""


def fields_of(parts: tuple[type, ...]) -> list[tuple[str, Any, bool]]:
    """(name, annotation, always present) of each field of the ``TypedDict``\\ s ``parts``
    merged, in order: the one walk of the record shapes that the JSON Schemas and the Avro
    schemas (``dpstream.client``) are both made from."""
    return [
        # Read from the annotation: under ``from __future__ import annotations``,
        # Python 3.11's ``__required_keys__`` does not see NotRequired.
        (name, hint, get_origin(hint) is not NotRequired)
        for part in parts
        for name, hint in get_type_hints(part, include_extras=True).items()
    ]


def accounting_and_noise(stat: StatisticConfig) -> tuple[str, str]:
    """What ``stat``'s releases state as their ``accounting`` and ``noise``."""
    return (ZCDP_ACCOUNTING, ZCDP_NOISE) if stat.zcdp else (ACCOUNTING, NOISE)


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
            "epsilon": self.epsilon(name),
            "neighbours": self.neighbours(name),
            "mechanism": statistic.mechanism,
            "tree": None if statistic.tree is None else tree_field(statistic.tree),
            "interval_of": statistic.interval_of,
            **self.accounting(name),
        }
        if self.cfg.privacy.public_counts:
            record["public_counts"] = True  # the statement: counts are not protected
        if self.cfg.noise.mode.value != "keyed":
            record["insecure"] = self.cfg.noise.mode.value
        return record

    def epsilon(self, name: str) -> float:
        """The epsilon a release and a start entry state: the configured one, or under
        zCDP the epsilon the statistic's rho implies alone at the statement's delta."""
        stat = next(s for s in self.cfg.statistics if s.name == name)
        return stat.epsilon if stat.epsilon is not None else float(self.charges[name].epsilon)

    def accounting(self, name: str) -> dict[str, Any]:
        """A release's accounting and noise, and under zCDP its rho and delta."""
        charge = self.charges[name]
        if charge.rho is None:
            return {"accounting": ACCOUNTING, "noise": NOISE}
        return {
            "accounting": ZCDP_ACCOUNTING,
            "noise": ZCDP_NOISE,
            "rho": float(charge.rho),
            "delta": charge.delta,
        }

    def ledger(self, name: str, tick: int, fields: Mapping[str, Any]) -> dict[str, Any]:
        """A ledger entry of a statistic after its first: the common fields around the
        entry's own (an expenditure, the budget spent)."""
        out = {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "app_id": self.cfg.app_id,
            "statistic": name,
            "tick": tick,
            **fields,
            "total_epsilon": self.cfg.privacy.stated_total_epsilon,
        }
        if self.cfg.privacy.total_rho is not None:
            out["total_rho"] = self.cfg.privacy.total_rho
        return out

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
            "epsilon": self.epsilon(name),
            "mechanism": statistic.mechanism,
            "tau": stat.tau,
            "neighbours": self.neighbours(name),
            "note": "whole infinite stream (parallel composition over periods)",
            "total_epsilon": self.cfg.privacy.stated_total_epsilon,
            "charged": float(self.charges[name].epsilon),
            **self._rho_charged(name),
            "fingerprint": identity.fingerprint,
            "run_id": identity.run_id,
            "start_tick": identity.start_tick,
        }
        return statistic.ledger_start(entry)

    def _rho_charged(self, name: str) -> dict[str, Any]:
        charge = self.charges[name]
        return {} if charge.rho is None else {"rho": float(charge.rho), "delta": charge.delta}

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


def statement_entry(
    cfg: PipelineConfig,
    statement: PrivacyStatement,
    identities: Mapping[str, RunIdentity],
    new_runs: Sequence[str],
) -> dict[str, Any]:
    """The ledger record of a worker start, unsigned (``StatementEntry``)."""
    return {
        "schema_version": LEDGER_SCHEMA_VERSION,
        "event": "statement",
        **statement.to_json(),
        "identities": dict(identities),
        "new_runs": list(new_runs),
        "sources": sorted(cfg.input.topics),
        "user_id_field": cfg.input.user_id_field,
    }
