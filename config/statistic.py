"""One statistic of a pipeline: ``statistics[i]``, its kind (``KINDS``: what validation
needs to know of each), its bounds, mechanism and budget, and the sections of the kinds
that have one (``mean:``, ``cells:``)."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from dpstream.operators.accounting import StatisticTerms
from dpstream.operators.accounting.accountant import Form
from dpstream.operators.cells import cell_accountant, cell_mean
from dpstream.operators.cells.cell_accountant import CellAccountantSpec
from dpstream.operators.cells.cell_mean import CellMeanSpec
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import snapping

from .base import Model, identifier

log = logging.getLogger(__name__)


class Neighbours(StrEnum):
    # Neighbouring streams differ by all events of one user (the paper's constants).
    whole_user = "whole_user"
    # Neighbours may drop ANY subset of one user's events; truncation then moves up to
    # 2*tau leaf units (Dong-Luo-Yi Alg. 3; docs/papers.md), so the per-level sensitivity doubles.
    any_subset = "any_subset"


# sqrt_factorization: the square-root factorization counter with discrete Gaussian noise,
# the one mechanism of privacy.accounting: zcdp (operators/trees/sqrt_factorization.py).
Mechanism = Literal["binary", "kary", "kary_subtract", "expiring", "auto", "sqrt_factorization"]

# The delta check-config and the ledger state a zCDP pipeline's (epsilon, delta) at when
# privacy.delta is not given (docs/security.md).
DEFAULT_DELTA = 1e-6


@dataclass(frozen=True, slots=True)
class KindEntry:
    """What config validation and the event checks need to know of one kind.

    ``needs_value``: its events must carry a value. ``section``: the kind is bounded by
    the caps of its own section (``mean``, ``cells``), which it requires and no other kind
    takes; tau and the tree parameters do not apply. ``values``: its event values are
    integers in [1, R], R given by this field (``max_value``, ``bins``). ``rank``: it takes
    ``rank`` and ``halve_margin``. ``fixed_tau``: an integer tau (Alg. 3) is allowed besides
    tau: auto. ``deletions``: ``deletions: true`` is supported (tau: auto). ``trees``: with
    tau: auto its instances may run the k-ary trees (``kary``, ``kary_subtract``) besides
    Dong-Luo-Yi's binary tree. ``zcdp``: with a fixed tau it runs under ``privacy.accounting:
    zcdp`` (the square-root factorization counter).
    """

    needs_value: bool = True
    section: str | None = None
    values: str | None = None
    rank: bool = False
    fixed_tau: bool = False
    deletions: bool = True
    trees: bool = False
    zcdp: bool = False


# The kinds the schema accepts, with the parameters each takes. Their implementations are
# the statistics layer's registry (dpstream.statistics.registry), which checks at import
# that it names the same kinds: adding a kind is its module, one line there and one here.
KINDS: dict[str, KindEntry] = {
    "count": KindEntry(needs_value=False, fixed_tau=True, trees=True, zcdp=True),
    "sum": KindEntry(values="max_value", fixed_tau=True, trees=True, zcdp=True),
    "histogram": KindEntry(values="bins", trees=True),
    "kselect": KindEntry(values="bins", rank=True, deletions=False),
    "distinct": KindEntry(deletions=False),
    "mean": KindEntry(section="mean"),
    "cell_mean": KindEntry(section="cells"),
}
if TYPE_CHECKING:
    # A Literal built from KINDS at run time is no type to a checker: a kind is a str there.
    Kind = str
else:
    Kind = Literal[tuple(KINDS)]


def kinds_with(test: Callable[[KindEntry], bool]) -> list[str]:
    return [kind for kind, params in KINDS.items() if test(params)]


def _only(field: str, kinds: list[str], kind: str) -> str:
    """The message for ``field`` set on ``kind``, which only ``kinds`` take."""
    which = f"kind {kinds[0]}" if len(kinds) == 1 else " and ".join(kinds)
    return f"{field}: only applies to {which}, not {kind}"


FilterScalar = StrictStr | StrictBool | StrictInt | StrictFloat  # a JSON scalar, as written


def _check_condition(stat: StatisticConfig, path: str, wanted: Sequence[object]) -> None:
    """One ``where`` field: a dotted path, values some event could hold there."""
    name = f"where.{path}"
    if any(not part for part in path.split(".")):
        raise ValueError(f"{name}: must be a field name or a dotted path of field names")
    if not wanted:
        raise ValueError(f"{name}: an empty list matches no event")
    # A field compared with a value holds no fields of its own: a filter or value field
    # below it could never be met.
    read = [*(stat.where or {}), stat.value_field or "value"]
    below = [p for p in read if p.startswith(path + ".")]
    if below:
        raise ValueError(
            f"{name}: {below[0]} is read below it, but it is compared with a value: "
            "no event could match"
        )
    if path == (stat.value_field or "value") and KINDS[stat.kind].needs_value:
        text = [w for w in wanted if type(w) not in (int, float)]
        if text:
            raise ValueError(
                f"{name}: the statistic's own value field holds numbers; {text[0]!r} never matches"
            )
    if path == "key" and stat.key is not None and stat.key not in wanted:
        raise ValueError(f"{name}: contradicts key: {stat.key}; no event could match both")


def _check_interval(lower: float, upper: float) -> None:
    """A value range [lower, upper] of a mean: finite, and not empty."""
    for name, bound in (("lower", lower), ("upper", upper)):
        if not math.isfinite(bound):
            raise ValueError(f"{name}: must be a finite number")
    if not upper > lower:
        raise ValueError(f"upper: must be greater than lower ({lower:g})")


class MeanConfig(Model):
    """kind mean: a user-level running mean of values clipped to [lower, upper].

    By default (``privacy.public_counts: false``) the whole-user mean
    (operators.whole_user_mean): each user's first ``max_samples_per_user`` (m) samples
    are kept, snapped to ``resolution`` grid units, and two tree counters (samples, units)
    release a noisy count and a noisy sum at epsilon / 2 each; every released number is
    noised. ``max_users`` and ``delta`` do not apply (no cap on users: the noise does not
    depend on their number) and are refused.

    With ``privacy.public_counts: true``: the continual mean of George et al. Alg. 6
    (private only when who sent how many samples when is public). Values are clipped
    (and counted); ``max_users`` (n, required) and m are declared caps: the noise is
    calibrated to them, and a user or sample beyond them is not used, and is counted. The
    cap on users is split evenly over the events topic's partitions
    (operators.continual_mean.user_quota).
    """

    lower: float = 0.0
    upper: float = 1.0
    max_users: int | None = Field(None, ge=1, le=1 << 40)  # public counts only
    max_samples_per_user: int = Field(ge=2, le=1 << 30)
    # Public counts only: utility failure probability of the clipping intervals (not a
    # privacy parameter).
    delta: float = Field(0.1, gt=0, le=1)
    resolution: int = Field(1024, ge=1, le=1 << 20)  # grid units per (upper - lower)

    @model_validator(mode="after")
    def _bounds(self) -> MeanConfig:
        _check_interval(self.lower, self.upper)
        return self


# Event attributes with a meaning of their own: a cell key cannot live in one of them.
RESERVED_EVENT_FIELDS = ("user_id", "key", "value", "ts", "op", "tick")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class CellConfig(Model):
    """kind cell_mean: a user-level mean per cell = (cell key, slot), Rameshwar et al.

    An event's cell key is its attribute ``field`` (a string, e.g. an H3 index); its slot
    is ``tick // slot_ticks``. The statistic's ``epsilon`` is what one cell release costs
    each user it keeps; ``epoch_cap`` (B) is the most one user may lose through this
    statistic in one accounting epoch of ``epoch_slots`` slots (operators.cell_accountant).

    ``counts_public: false`` (default, our strict mode, docs/papers.md): add/remove-user
    neighbours; only ``noisy_ratio`` with a ``contribution_cap``, no Clip-User, and the
    public cell domain ``keys`` is released in every slot, empty or not (which cells have
    data is itself private). ``counts_public: true``: the paper's model (Rameshwar
    et al. Sec. II-D), where who is in which cell and how often is public and only values are
    protected; every mechanism, Clip-User and ``on_cap: skip_cell`` become available.
    """

    field: str
    slot_ticks: int = Field(ge=1, le=1 << 30)
    lower: float
    upper: float
    step: float = Field(gt=0)
    mechanism: Literal["baseline", "array_averaging", "levy", "quantile", "noisy_ratio"] = (
        "noisy_ratio"
    )
    grouping: Literal["best_fit", "wrap_around"] = "best_fit"
    # Array capacity: "median", "eq10" or an integer; None: the mechanism's default.
    m_ub: Literal["median", "eq10"] | int | None = None
    gamma: float = Field(0.2, gt=0, lt=1)  # levy: failure probability of eq. (8)
    quantile: Literal["fixed", "optimized"] = "fixed"
    quantile_step: float | None = Field(None, gt=0)
    # Values stage 1 keeps per (cell, user) for the array mechanisms (m_UB <= head_cap).
    head_cap: int = Field(256, ge=1, le=1 << 16)
    contribution_cap: int | None = Field(None, ge=1, le=1 << 16)  # noisy_ratio: c
    counts_public: bool = False
    clip_user: bool = False
    clip_kappa: float = Field(1.0, ge=0, le=1000)
    epoch_slots: int = Field(ge=1, le=1 << 30)
    epoch_cap: float = Field(gt=0)
    on_cap: Literal["drop_user", "skip_cell"] = "drop_user"
    # The public cell domain: required in strict mode; with public counts it restricts
    # the accepted cells. An event whose cell is not listed is dead-lettered.
    keys: list[str] | None = Field(None, min_length=1, max_length=1 << 20)

    @field_validator("field")
    @classmethod
    def _field_name(cls, v: str) -> str:
        if not _FIELD.match(v):
            raise ValueError("must be an attribute name ([A-Za-z_][A-Za-z0-9_]*, <= 64 chars)")
        if v in RESERVED_EVENT_FIELDS:
            raise ValueError(f"{v!r} is an event attribute of its own; name another one")
        return v

    @field_validator("keys")
    @classmethod
    def _keys(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        for i, key in enumerate(v):
            if not key.strip():
                raise ValueError(f"keys[{i}] is empty")
        if len(set(v)) != len(v):
            raise ValueError("has duplicate cell keys")
        return v

    @model_validator(mode="after")
    def _modes(self) -> CellConfig:
        _check_interval(self.lower, self.upper)
        if not self.counts_public:
            if self.mechanism != "noisy_ratio":
                raise ValueError(
                    f"counts_public: mechanism {self.mechanism} treats who is in which cell as "
                    "public (Rameshwar et al. Sec. II-D); set counts_public: true, or use "
                    "noisy_ratio (strict mode)"
                )
            if self.clip_user:
                raise ValueError("clip_user: needs counts_public: true (it reads all counts)")
            if self.on_cap == "skip_cell":
                raise ValueError(
                    "on_cap: skip_cell needs counts_public: true (skipping a cell for one "
                    "user's history would reveal that user to the others' release)"
                )
            if self.keys is None:
                raise ValueError(
                    "keys: required when counts_public is false: every slot releases every "
                    "listed cell, empty or not (which cells have data is private)"
                )
        if self.mechanism == "noisy_ratio" and self.contribution_cap is None:
            raise ValueError(
                "contribution_cap: required for mechanism noisy_ratio (c values per cell and user)"
            )
        if self.mechanism != "noisy_ratio" and self.contribution_cap is not None:
            raise ValueError(f"contribution_cap: only applies to noisy_ratio, not {self.mechanism}")
        if "clip_kappa" in self.model_fields_set and not self.clip_user:
            raise ValueError("clip_kappa: only applies with clip_user: true")
        try:  # what only the operators check (grid multiples, ...), named as here
            self.operator_spec(1.0)
            self.accountant_spec()
        except InvalidOperatorConfig as exc:
            name, _, rest = str(exc).partition(" must be ")
            raise ValueError(f"{name}: must be {rest}" if rest else str(exc)) from None
        return self

    def head_cap_used(self) -> int:
        """Values stage 1 keeps per (cell, user): Baseline needs none beyond count and sum
        (1), noisy_ratio its first c, the array mechanisms ``head_cap``."""
        if self.mechanism == "baseline":
            return 1
        if self.mechanism == "noisy_ratio":
            assert self.contribution_cap is not None
            return self.contribution_cap
        return self.head_cap

    def operator_spec(self, epsilon: float, any_subset: bool = False) -> CellMeanSpec:
        """The ``operators.cell_mean`` spec of one cell release at ``epsilon``; ``any_subset``
        is the strict mode's neighbouring relation (privacy.neighbours)."""

        def exact(x: float) -> str:
            return repr(x)  # the decimal the user wrote: 0.1 is 1/10 (exact_fraction)

        return cell_mean.make_cell_mean(
            self.mechanism,
            exact(epsilon),
            exact(self.lower),
            exact(self.upper),
            exact(self.step),
            counts_public=self.counts_public,
            grouping=self.grouping,
            m_ub=self.m_ub,
            gamma=exact(self.gamma),
            quantile=self.quantile,
            quantile_step=None if self.quantile_step is None else exact(self.quantile_step),
            head_cap=self.head_cap_used(),
            contribution_cap=self.contribution_cap,
            any_subset=any_subset,
        )

    def accountant_spec(self) -> CellAccountantSpec:
        """The ``operators.cell_accountant`` spec: B per epoch, the mode, on_cap."""
        return cell_accountant.make_cell_accountant(
            repr(self.epoch_cap), self.counts_public, self.on_cap
        )


_NOT_FOR_OWN_CAPS = (
    "tau",
    "beta",
    "theta",
    "practical",
    "practical_instances",
    "tracker_share",
    "series",
    "tau_start",
    "deletions",
    "mechanism",
    "k",
    "lam",
    "delay",
    "horizon_ticks",
)


class StatisticConfig(Model):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str
    # count: events; sum: integer values in [1, max_value]; histogram: counts of integer
    # values in [1, bins] (and their max frequency); kselect: the rank-th largest value
    # in [1, bins] (max, median or an integer k); distinct: distinct event values.
    kind: Kind = "count"
    # Its budget: epsilon under privacy.accounting: pure, rho (zCDP) under zcdp; one of them.
    epsilon: float | None = Field(None, gt=0)
    rho: float | None = Field(None, gt=0)
    # auto: the user-level mechanism (Dong-Luo-Yi Alg. 5): no contribution bound to guess;
    # an SVT tracker finds it. An integer: fixed truncation (Alg. 3), count and sum only.
    tau: int | Literal["auto"] = "auto"
    # User-level (tau: auto) parameters, Dong-Luo-Yi Algs. 4-5 and App. C-A.
    beta: float = Field(0.1, gt=0, lt=1)
    theta: float = Field(1.0, gt=0, le=4)
    practical: bool = True  # tracker starts at tau = 64 with the shifted series (App. C-A)
    practical_instances: bool = False  # the shifted series for the instances too
    # tau: auto count, sum, histogram (docs/user-level.md section 6): the tracker's share
    # of epsilon (Alg. 5: 0.5), the epsilon series of both the tracker's SVTs and the
    # instances ("dly": Dong-Luo-Yi's, with theta; "telescoping": x / (i (i+1))), and
    # tau_1, the tracker's first bound (a power of two; App. C-A: 64). None (not named):
    # resolved before anything runs it (statistics.registry.resolved): a statistic the
    # ledger ran keeps Alg. 5's (0.5, dly, 64 or 2), a new one gets 0.25, telescoping and
    # 256 (a histogram 64; 2 with practical: false).
    tracker_share: float | None = Field(None, gt=0, lt=1)
    series: Literal["dly", "telescoping"] | None = None
    tau_start: int | None = Field(None, ge=2, le=1 << 40)
    max_value: int | None = Field(None, ge=1, le=1 << 20)  # sum: R (values in [0, R], tau in units)
    # sum: real values clipped into [lower, upper] and snapped to a grid of ``resolution``
    # units over that range (the mean's words); a fixed tau then counts a user's events.
    lower: float | None = None
    upper: float | None = None
    resolution: int | None = Field(None, ge=1, le=1 << 30)
    bins: int | None = Field(None, ge=1, le=4096)  # histogram, kselect: R
    rank: Literal["max", "median"] | int | None = None  # kselect
    # kselect: threshold k + Delta/2 (Dong-Luo-Yi, Appendix C-A) instead of k + Delta.
    # Opt-in: the release is then no longer <= the true k-th with probability >= 1 - beta.
    halve_margin: bool = False
    # Events with "op": "delete" form a second stream; count, sum and histogram release
    # F_ins - F_del, each at epsilon / 2 (Dong-Luo-Yi Sec. VI).
    deletions: bool = False
    # binary: Dong-Luo-Yi Alg. 2; kary / kary_subtract: Andersson-Pagh-Torkamani (k-ary
    # tree, with balanced negative digits); expiring: Andersson et al. (expiration) Alg. 3
    # (lambda, delay B); auto: the tree with the least exact MSE over horizon_ticks
    # (choosing costs no privacy). None (not named): resolved before anything runs it
    # (statistics.registry.resolved): a statistic the ledger ran keeps the tree it ran, a
    # new fixed-tau count or sum without a horizon gets the least-error unbounded tree,
    # any other the binary tree (docs/design.md section 5a).
    mechanism: Mechanism | None = None
    k: int | None = Field(None, ge=2, le=1024)
    lam: float | None = Field(None, alias="lambda", ge=0, le=16)
    delay: int = Field(0, ge=0, description="the delay B: no privacy loss for B steps")
    horizon_ticks: int | None = Field(None, ge=1)
    # kind mean: its bounds and caps (George et al.).
    mean: MeanConfig | None = None
    # kind cell_mean: cells, slots, mechanism and the epoch cap (Rameshwar et al.).
    cells: CellConfig | None = None
    # Count only events whose ``key`` equals this; None counts every event.
    key: str | None = None
    # The event field holding its value, a dotted path for a nested field (None: "value");
    # a histogram's or kselect's bin, a distinct count's item.
    value_field: str | None = None
    # Which events it counts: {field: value} (equality) or {field: [values]} (one of
    # them), fields ANDed, dotted paths for nested fields; beside ``key``, if given.
    where: dict[str, FilterScalar | list[FilterScalar]] | None = None

    _name = field_validator("name")(identifier)

    @field_validator("value_field")
    @classmethod
    def _value_field(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(not part for part in v.split("."))):
            raise ValueError("must be a field name or a dotted path of field names")
        return None if v == "value" else v  # the default, spelled out: the same statistic

    @model_validator(mode="after")
    def _fields(self) -> StatisticConfig:
        """What it reads of an event: a value where its kind takes one, and a filter that
        some event could match."""
        if self.value_field is not None and not KINDS[self.kind].needs_value:
            raise ValueError(f"value_field: kind {self.kind} takes no value")
        where = self.where
        if where is None:
            return self
        if not where:
            raise ValueError("where: an empty filter; leave it out to count every event")
        for path, wanted in where.items():
            _check_condition(self, path, wanted if isinstance(wanted, list) else [wanted])
        return self

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, v: float | None) -> float | None:
        if v is not None and v > 5:
            log.warning("epsilon=%s is large; the privacy guarantee is weak", v)
        return v

    @model_validator(mode="after")
    def _budget(self) -> StatisticConfig:
        """One budget: epsilon (pure DP) or rho (zCDP); which one the pipeline's
        ``privacy.accounting`` allows is checked there (``PipelineConfig``)."""
        if self.epsilon is None and self.rho is None:
            raise ValueError("epsilon: required (rho instead under privacy.accounting: zcdp)")
        if self.epsilon is not None and self.rho is not None:
            raise ValueError("rho: give epsilon (pure DP) or rho (zCDP), not both")
        return self

    @property
    def zcdp(self) -> bool:
        """Accounted in rho-zCDP (``privacy.accounting: zcdp``; its budget is ``rho``)."""
        return self.rho is not None

    @property
    def pure_epsilon(self) -> float:
        """Its epsilon, for the mechanisms that run under pure accounting only."""
        assert self.epsilon is not None, "a pure-DP statistic has an epsilon (validated)"
        return self.epsilon

    @field_validator("tau")
    @classmethod
    def _tau(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1_000_000:
            raise ValueError("must be 'auto' or an integer in [1, 1000000]")
        return v

    @property
    def own_caps(self) -> bool:
        """Bounded by its own section's caps (a mean, per-cell means), not by tau."""
        return KINDS[self.kind].section is not None

    @property
    def user_level(self) -> bool:
        """The contribution bound is tracked privately (Dong-Luo-Yi Alg. 5), not configured."""
        return self.tau == "auto" and not self.own_caps

    @property
    def fixed_tau(self) -> int:
        assert isinstance(self.tau, int)
        return self.tau

    @model_validator(mode="after")
    def _kind_parameters(self) -> StatisticConfig:
        kind = self.kind
        params = KINDS[kind]
        for section in ("mean", "cells"):
            (owner,) = [k for k, p in KINDS.items() if p.section == section]
            if (kind == owner) != (getattr(self, section) is not None):
                raise ValueError(
                    f"{section}: required for kind {owner}"
                    if kind == owner
                    else _only(section, [owner], kind)
                )
        if self.cells is not None:
            self._check_cells(self.cells)
        self._check_sum_grid()
        for field in ("max_value", "bins"):
            owners = [k for k, p in KINDS.items() if p.values == field]
            if field == "max_value" and self.upper is not None:
                continue  # a sum on a grid (_check_sum_grid)
            if params.values == field and getattr(self, field) is None:
                grid = (
                    " or upper and resolution (real values on a grid)"
                    if field == "max_value"
                    else ""
                )
                raise ValueError(f"{field}: required for kind {kind} (values 1..R){grid}")
            if params.values != field and getattr(self, field) is not None:
                raise ValueError(_only(field, owners, kind))
        ranked = kinds_with(lambda p: p.rank)
        if params.rank and self.rank is None:
            raise ValueError(f"rank: required for kind {kind} (max, median or an integer k)")
        if not params.rank and self.rank is not None:
            raise ValueError(_only("rank", ranked, kind))
        if isinstance(self.rank, int) and self.rank < 1:
            raise ValueError("rank: an integer rank must be >= 1")
        if not params.rank and self.halve_margin:
            raise ValueError(_only("halve_margin", ranked, kind))
        if self.own_caps:
            # Its own mechanism bounds each user's contribution; none of these apply.
            for name in _NOT_FOR_OWN_CAPS:
                if name in self.model_fields_set:
                    raise ValueError(f"{name}: does not apply to kind {kind}")
            return self
        if not self.user_level and not params.fixed_tau:
            fixed = " and ".join(kinds_with(lambda p: p.fixed_tau))
            raise ValueError(f"tau: kind {kind} needs tau: auto (fixed tau: {fixed})")
        trees = ("binary", "kary", "kary_subtract") if params.trees else ("binary",)
        if self.user_level and self.mechanism not in (None, *trees):
            raise ValueError(
                f"mechanism: tau: auto runs kind {kind}'s instances on {' or '.join(trees)}"
            )
        if not self.user_level and (self.deletions or self.practical_instances):
            raise ValueError("deletions: only with tau: auto")
        for name in ("tracker_share", "series", "tau_start"):
            if getattr(self, name) is not None and not (self.user_level and params.trees):
                tuned = " and ".join(kinds_with(lambda p: p.trees))
                raise ValueError(f"{name}: only with tau: auto, kinds {tuned}")
        if self.tau_start is not None and self.tau_start & (self.tau_start - 1):
            raise ValueError("tau_start: must be a power of two")
        if self.deletions and not params.deletions:
            # Distinct count with deletions is open (Dong-Luo-Yi Sec. VI).
            raise ValueError(f"deletions: not supported for kind {kind}")
        return self

    def _check_sum_grid(self) -> None:
        """``lower``/``upper``/``resolution``: a sum's real values on a grid; with tau:
        auto never below 0 (Alg. 5 ranks users by non-negative contributions)."""
        owners = kinds_with(lambda p: p.values == "max_value")
        given = [f for f in ("lower", "upper", "resolution") if getattr(self, f) is not None]
        if not given:
            return
        if KINDS[self.kind].values != "max_value":
            raise ValueError(_only(given[0], owners, self.kind))
        if self.max_value is not None:
            raise ValueError(f"{given[0]}: give either max_value or lower/upper/resolution")
        if self.upper is None:
            raise ValueError("upper: required with lower or resolution (a sum's values' bound)")
        if self.resolution is None:
            raise ValueError(
                "resolution: required with upper (grid units per (upper - lower): "
                "20000 for a 0.01 grid over [0, 200])"
            )
        lower = self.value_bounds[0]
        _check_interval(lower, self.upper)
        if lower < 0 and self.user_level:
            raise ValueError(
                "lower: tau: auto (Dong-Luo-Yi Alg. 5) ranks users by non-negative "
                "contributions; a negative lower needs a fixed tau"
            )

    @property
    def value_bounds(self) -> tuple[float, float]:
        """A sum's declared value range: [lower (default 0), upper], or [0, max_value]."""
        if self.upper is not None:
            return (0.0 if self.lower is None else self.lower), self.upper
        assert self.max_value is not None
        return 0.0, float(self.max_value)

    def _check_cells(self, cells: CellConfig) -> None:
        if self.epsilon is not None and cells.epoch_cap < self.epsilon:
            raise ValueError(
                f"cells.epoch_cap: B = {cells.epoch_cap:g} is below one cell's epsilon "
                f"({self.epsilon:g}), so no cell could ever be released"
            )

    @model_validator(mode="after")
    def _mechanism_parameters(self) -> StatisticConfig:
        m = self.mechanism or "the default tree"
        if m in ("kary", "kary_subtract") and self.k is None:
            raise ValueError(f"k: required for mechanism {m}")
        if m == "kary_subtract" and self.k is not None and self.k < 3:
            # Odd k: Andersson-Pagh-Torkamani Alg. 2; even k: its App. A.3 variant.
            raise ValueError(f"k: must be >= 3 for kary_subtract, got {self.k}")
        if m not in ("kary", "kary_subtract") and self.k is not None:
            raise ValueError(f"k: only applies to kary and kary_subtract, not {m}")
        if m == "expiring" and self.lam is None:
            raise ValueError("lambda: required for mechanism expiring")
        if m == "expiring" and self.horizon_ticks is None:
            # An item's loss grows with its age; the budget is charged at this age.
            raise ValueError("horizon_ticks: required for mechanism expiring")
        if m != "expiring" and (self.lam is not None or self.delay):
            raise ValueError(f"lambda: lambda and delay only apply to expiring, not {m}")
        if m == "auto" and self.horizon_ticks is None:
            raise ValueError("horizon_ticks: required for mechanism auto")
        return self

    def terms(self, public_counts: bool = False) -> StatisticTerms:
        """What the accountant (``operators.accounting``) needs to charge this statistic;
        ``public_counts`` is the pipeline's ``privacy.public_counts`` (a mean's algorithm)."""

        def exact(x: float) -> Fraction:
            return Fraction(repr(x))  # the decimal the user wrote: 0.1 is 1/10

        cells, mean = self.cells, self.mean
        form: Form = "tree_counter"
        if cells is not None:
            form = "per_cell_mean"
        elif mean is not None:
            form = "continual_mean" if public_counts else "whole_user_mean"
        return StatisticTerms(
            name=self.name,
            kind=self.kind,
            epsilon=exact(self.epsilon or 0.0),  # not charged under zcdp (rho is)
            form=form,
            # every tree counter is charged alike; under zcdp only the square-root
            # factorization runs (registry.resolved)
            mechanism="sqrt_factorization" if self.zcdp else self.mechanism or "binary",
            lam=None if self.lam is None else exact(self.lam),
            delay=self.delay,
            horizon_ticks=self.horizon_ticks,
            epoch_cap=None if cells is None else exact(cells.epoch_cap),
            counts_public=(
                cells.counts_public if cells is not None else mean is not None and public_counts
            ),
            max_samples=None if mean is None else mean.max_samples_per_user,
            resolution=None if mean is None else mean.resolution,
            rho=None if self.rho is None else exact(self.rho),
            sensitivity=self._leaf_sensitivity(),
        )

    def _leaf_sensitivity(self) -> int:
        """A fixed-tau count's or sum's bound on one user's leaves, sum_t |x_t|: tau units
        (a count's events, a ``max_value`` sum's value units), or on a grid tau events of
        at most the grid's largest magnitude in units each (``snapping``); 1 where it does
        not apply (tau: auto, own caps). Stage 2 builds the same (``fixed_tau.py``)."""
        if self.user_level or self.own_caps:
            return 1
        if KINDS[self.kind].values != "max_value" or self.max_value is not None:
            return self.fixed_tau
        lower, upper = self.value_bounds
        assert self.resolution is not None
        step = (Fraction(repr(upper)) - Fraction(repr(lower))) / self.resolution
        grid = snapping.make_grid(step)
        # statistics.bounding.ValueGrid.bound: the most grid units one event moves the sum
        units = max(abs(snapping.to_units(grid, lower)), abs(snapping.to_units(grid, upper)))
        return self.fixed_tau * units
