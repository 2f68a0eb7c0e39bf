"""kinds count, sum, histogram, kselect and distinct: which operator counts a statistic
(config -> module and spec), as a ``pipeline.statistic.Statistic``. Glue only, no DP math.

A fixed tau is a ``Counter`` (Dong-Luo-Yi Alg. 3 in stage 1, a tree counter in stage 2),
tau: auto a ``UserLevelCounter`` (Alg. 5 and its sum, histogram, k-selection and distinct
count). Every operator module offers ``init(spec)``, ``step(spec, state, ..., noise)``
and a frozen state class; stage 2 stores the state as JSON through ``state_codec``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any, TypeVar

from dpstream.config.schema import Neighbours, PipelineConfig, StatisticConfig
from dpstream.operators import accounting, state_codec
from dpstream.operators.noise import NoiseSource, interval
from dpstream.operators.trees import expiring_tree, kary_tree, tree_counter
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import (
    deletions,
    distinct_count,
    k_selection,
    svt,
    truncation,
)

from .contract import Statistic, Step, WeightsStage2
from .counting import UnitCounting
from .weights import DELETES, INSERTS, KEPT_UNITS, distinct_values, parse_weights

Param = TypeVar("Param")


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> Statistic:
    """The statistic of a counting kind: a tree counter over the kept units for a fixed
    tau, the user-level mechanisms for tau: auto."""
    relation = cfg.privacy.neighbours.value
    if stat.user_level:
        return user_level_counter_for(stat, relation == Neighbours.any_subset)
    return counter_for(stat, accounting.sensitivity_multiplier(relation) * stat.fixed_tau)


def algorithm(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism as resolved (``mechanism:
    auto`` names the tree and k it chose) and the version of every algorithm it uses."""
    relation = cfg.privacy.neighbours.value
    out: dict[str, object]
    if stat.user_level:
        built = user_level_counter_for(stat, relation == Neighbours.any_subset)
        out = {"mechanism": built.mechanism}
        modules = [ul, svt, deletions, distinct_count, k_selection, tree_counter]
    else:
        counter = counter_for(stat, accounting.sensitivity_multiplier(relation) * stat.fixed_tau)
        out = {"mechanism": counter.mechanism}
        if isinstance(counter.spec, kary_tree.KaryTreeSpec):
            out["k"] = counter.spec.k
        modules = [truncation, tree_counter, kary_tree, expiring_tree]
    out["versions"] = {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}
    return out


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What a counting statistic computes, in one line (``dpstream check-config``)."""
    params = "".join(
        f", {name}={value}"
        for name, value in (
            ("k", stat.k),
            ("lambda", stat.lam),
            ("horizon_ticks", stat.horizon_ticks),
            ("key", stat.key),
        )
        if value is not None
    )
    return f"{stat.kind} via {stat.mechanism}, epsilon={stat.epsilon:g}, tau={stat.tau}{params}"


@dataclass(frozen=True)
class Counter(WeightsStage2):
    """A fixed-tau statistic's continual counter: its operator module, spec and state
    class; stage 1 keeps the units of each user's first tau (``UnitCounting``)."""

    name: str
    tau: int
    counting: UnitCounting
    mechanism: str  # the releases' "mechanism" field
    module: ModuleType
    spec: Any
    state_cls: type
    # For expiring mechanisms: the privacy loss eps*g(d) of an item d ticks old
    # (Andersson et al. (expiration) Def. 1.1).
    privacy_loss: Callable[[int], float] | None = None
    neighbours: str | None = None

    def step(self, state_json: Any, pending: Any, tick: int, noise: NoiseSource) -> Step:
        state = (
            self.module.init(self.spec)
            if state_json is None
            else state_codec.from_json(self.state_cls, state_json)
        )
        weight = (pending or {}).get(KEPT_UNITS, 0)
        state, rel = self.module.step(self.spec, state, weight, noise)
        fields = {
            "step": rel.t,
            "value": rel.value,
            "std": rel.std,
            "interval": interval(rel.value, rel.ci95),
            "tau": self.tau,
        }
        return Step(state_codec.to_json(state), (fields,))

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        curve = expiration_curve(self)
        if not curve:
            return entry
        return {
            **entry,
            "note": "loss of an item decays with its age (Andersson et al. 2024); see expiration",
            "expiration": curve,
        }


def counter_for(stat: StatisticConfig, sensitivity: int, instance: int = 0) -> Counter:
    """The counter of ``stat`` whose leaves have per-level L1 sensitivity ``sensitivity``."""
    epsilon = Fraction(repr(stat.epsilon))  # the decimal the user wrote
    prefix = (stat.name, instance)
    common = (
        stat.name,
        stat.fixed_tau,
        UnitCounting(
            stat.name,
            stat.key,
            stat.kind,
            truncation.make_truncation(stat.fixed_tau),
            stat.deletions,
            max_value=_value_bound(stat),
        ),
    )
    mechanism, k = stat.mechanism, stat.k
    if mechanism == "auto":
        # Public parameters only: choosing costs no privacy (docs/papers.md).
        horizon = _required(stat.horizon_ticks, "horizon_ticks", "mechanism auto")
        mechanism, k = kary_tree.choose_tree(epsilon, sensitivity, horizon, prefix)
    if mechanism == "binary":
        binary = tree_counter.make_binary_tree(epsilon, sensitivity, prefix)
        return Counter(
            *common, tree_counter.MECHANISM, tree_counter, binary, tree_counter.BinaryTreeState
        )
    if mechanism in ("kary", "kary_subtract"):
        kary = kary_tree.make_kary_tree(
            epsilon,
            sensitivity,
            prefix,
            _required(k, "k", f"mechanism {mechanism}"),
            subtract=mechanism == "kary_subtract",
        )
        return Counter(*common, kary_tree.mechanism(kary), kary_tree, kary, kary_tree.KaryTreeState)
    if mechanism == "expiring":
        expiring = expiring_tree.make_expiring_tree(
            epsilon,
            sensitivity,
            prefix,
            Fraction(repr(_required(stat.lam, "lambda", "mechanism expiring"))),
            stat.delay,
        )
        return Counter(
            *common,
            expiring_tree.MECHANISM,
            expiring_tree,
            expiring,
            expiring_tree.ExpiringTreeState,
            privacy_loss=lambda d: expiring_tree.privacy_loss(expiring, d),
        )
    raise ValueError(f"unknown mechanism {mechanism!r}")  # the config schema rules this out


def _value_bound(stat: StatisticConfig) -> int | None:
    """R of a kind whose values are integers in [1, R] (``max_value`` or ``bins``)."""
    return stat.max_value if stat.max_value is not None else stat.bins


def _required(value: Param | None, name: str, needed_by: str) -> Param:
    """A parameter the config schema requires for ``needed_by`` (a kind or mechanism), so
    never None in a validated config."""
    if value is None:
        raise ValueError(f"{name}: required for {needed_by}")
    return value


def expiration_curve(counter: Counter, max_age: int = 1 << 20) -> list[dict[str, float]]:
    """Privacy loss by age at ages 1, 2, 4, ..., max_age (empty for non-expiring counters)."""
    if counter.privacy_loss is None:
        return []
    ages = [1 << i for i in range(max_age.bit_length())]
    return [{"age_ticks": d, "epsilon": counter.privacy_loss(d)} for d in ages]


# ---------------------------------------------------------------------------------------
# User-level statistics (tau: auto): Dong-Luo-Yi Alg. 5 and its sum, histogram and distinct
# count, from stage 1's rank-band weights (``pipeline.weight_keys``).


@dataclass(frozen=True, slots=True)
class UserLevelState:
    """Stage 2's state of a tau: auto statistic: the operator state's JSON, what its
    tracker and instance series had spent after the last tick (epsilon, as floats), and,
    for distinct, m(v): the band of each value's first occurrence. ``to_json`` and
    ``from_json`` are the only code that knows its JSON form."""

    operator: dict[str, Any] | None = None
    spent: dict[str, float] | None = None
    min_band: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.min_band is None else {"min_band": self.min_band}
        out["operator"] = self.operator
        out["spent"] = self.spent
        return out

    @classmethod
    def from_json(cls, data: Any) -> UserLevelState:
        if data is None:
            return cls()
        return cls(data["operator"], data["spent"], data.get("min_band"))


@dataclass(frozen=True)
class UserLevelCounter(WeightsStage2):
    """A tau: auto statistic: its operator module and spec; its state in stage 2 is a
    ``UserLevelState``. Stage 1 counts each user's units by rank band (``UnitCounting``)."""

    stat: StatisticConfig
    module: ModuleType
    spec: Any
    state_cls: type
    mechanism: str
    neighbours: str | None = None

    @property
    def name(self) -> str:
        return self.stat.name

    @property
    def counting(self) -> UnitCounting:
        stat = self.stat
        return UnitCounting(
            stat.name, stat.key, stat.kind, None, stat.deletions, max_value=_value_bound(stat)
        )

    def step(self, state: Any, pending: Any, tick: int, noise: NoiseSource) -> Step:
        """Advance one tick: the release and, when the tracker or instance series spent
        more this tick, a budget entry with what both have spent so far."""
        weights = pending or {}
        old = UserLevelState.from_json(state)
        op_state = self.module.init(self.spec) if old.operator is None else self._load(old.operator)
        bands, crossings = parse_weights(weights, INSERTS)
        min_band = old.min_band
        rel: ul.UserLevelRelease | deletions.DeletionsRelease | k_selection.KSelectionRelease
        if self.stat.kind == "distinct":
            min_band = dict(min_band or {})
            updates, units = distinct_count.first_occurrence_units(
                min_band, distinct_values(weights)
            )
            min_band.update(updates)
            op_state, rel = distinct_count.step(self.spec, op_state, units, crossings, noise)
        elif self.stat.deletions:
            del_bands, del_crossings = parse_weights(weights, DELETES)
            op_state, rel = deletions.step(
                self.spec, op_state, bands, crossings, del_bands, del_crossings, noise
            )
        else:
            op_state, rel = self.module.step(self.spec, op_state, bands, crossings, noise)
        tracker, instances = self.series_spent(op_state)
        fields: dict[str, Any] = {"step": rel.t, **self._values(rel)}
        fields["epsilon_spent"] = float(tracker + instances)
        spent = {"tracker_epsilon": float(tracker), "instances_epsilon": float(instances)}
        state = UserLevelState(state_codec.to_json(op_state), spent, min_band).to_json()
        if spent == old.spent:
            return Step(state, (fields,))
        # The accountant: what the tracker and instance series have committed so far.
        entry = {
            "event": "budget",
            **spent,
            "epsilon_spent": spent["tracker_epsilon"] + spent["instances_epsilon"],
            "epsilon": self.stat.epsilon,
            "tau": fields["tau"],
            "svt_index": fields.get("svt_index"),
            "instance": fields.get("instance"),
        }
        return Step(state, (fields,), (entry,))

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        note = (
            "Dong-Luo-Yi Alg. 5 over the whole infinite stream: tracker series below "
            "epsilon/2, instance series below epsilon/2; budget entries follow"
        )
        return {**entry, "note": note}

    def _load(self, data: dict) -> Any:
        return state_codec.from_json(self.state_cls, data)

    def _values(self, rel: Any) -> dict[str, Any]:
        if self.stat.kind == "kselect":
            full = self.spec.delta_factor == 1
            return {
                "value": rel.value,  # 0: no value passes (fewer than k items, privately)
                "k": rel.k,
                "margin": rel.margin,
                # Threshold k + Delta (full) or k + Delta/2 (half, halve_margin: true). Only
                # the full Delta keeps value <= the true k-th with probability >= 1 - beta.
                "margin_mode": "full" if full else "half",
                "one_way": full and self.spec.delta_mode != "zero",
                "tau": max(rel.taus),
                "taus": list(rel.taus),
            }
        inserts = rel.inserts if self.stat.deletions else rel
        out: dict[str, Any] = {
            "tau": inserts.tau,
            "instance": inserts.instance,
            "svt_index": inserts.svt_index,
        }
        if self.stat.deletions:
            out["tau_deletions"] = rel.deletes.tau
        bins = rel.bins
        if self.stat.kind == "histogram":
            out["values"] = [b.value for b in bins]
            out["std"] = [b.std for b in bins]
            out["intervals"] = [interval(b.value, b.ci95) for b in bins]
            # Post-processing (Dong-Luo-Yi Sec. IV-B): no extra privacy cost.
            out["max_frequency"] = max(b.value for b in bins)
        else:
            out["value"] = bins[0].value
            out["std"] = bins[0].std
            out["interval"] = interval(bins[0].value, bins[0].ci95)
        return out

    def series_spent(self, op_state: Any) -> tuple[Fraction, Fraction]:
        """Exact epsilon committed so far by the tracker series and the instance series,
        summed over the operator's user-level mechanisms (each below half its budget)."""
        if self.stat.kind == "kselect":
            parts = [
                (level, k_selection.level_state(op_state, i))
                for i, level in enumerate(self.spec.levels)
            ]
        elif self.stat.deletions:
            parts = [
                (self.spec.inserts, deletions.side_state(op_state, "ins")),
                (self.spec.deletes, deletions.side_state(op_state, "del")),
            ]
        elif self.stat.kind == "distinct":
            parts = [(self.spec.mechanism, op_state)]
        else:
            parts = [(self.spec, op_state)]
        tracker = sum((ul.tracker_spent_epsilon(sp, st.svt_index) for sp, st in parts), Fraction(0))
        instances = sum(
            (ul.instance_spent_epsilon(sp, st.instance) for sp, st in parts), Fraction(0)
        )
        return tracker, instances


def user_level_counter_for(stat: StatisticConfig, any_subset: bool) -> UserLevelCounter:
    """The operator of a tau: auto statistic (Dong-Luo-Yi Alg. 5, Sec. IV, Sec. VI)."""
    eps, beta, theta = (Fraction(repr(x)) for x in (stat.epsilon, stat.beta, stat.theta))
    options: dict[str, Any] = {
        "practical": stat.practical,
        "practical_instances": stat.practical_instances,
    }
    kind = stat.kind
    if kind == "distinct":
        distinct = distinct_count.make_distinct_count(
            stat.name, eps, beta, theta, any_subset=any_subset, **options
        )
        return UserLevelCounter(
            stat, distinct_count, distinct, ul.UserLevelState, distinct_count.MECHANISM
        )
    if kind == "kselect":
        named: dict[object, dict[str, Any]] = {
            "max": {"k": 1},
            "median": {"quantile": Fraction(1, 2)},
        }
        rank = named.get(stat.rank, {"k": stat.rank})
        # Chernoff: the guaranteed bound of S(r)'s actual noise; eq. (3) is far looser.
        kselect = k_selection.make_k_selection(
            stat.name,
            _required(stat.bins, "bins", "kind kselect"),
            eps,
            beta,
            theta,
            delta_mode="chernoff",
            halve_delta=stat.halve_margin,
            any_subset=any_subset,
            **rank,
            **options,
        )
        return UserLevelCounter(
            stat, k_selection, kselect, k_selection.KSelectionState, "k_selection"
        )
    bins = _required(stat.bins, "bins", "kind histogram") if kind == "histogram" else 1
    if stat.deletions:
        with_deletions = deletions.make_deletions(
            stat.name, kind, eps, beta, theta, bins=bins, any_subset=any_subset, **options
        )
        return UserLevelCounter(
            stat, deletions, with_deletions, deletions.DeletionsState, deletions.MECHANISM
        )
    spec = ul.make_user_level(
        stat.name, eps, beta, theta, bins=bins, multiplier=2 if any_subset else 1, **options
    )
    return UserLevelCounter(stat, ul, spec, ul.UserLevelState, ul.MECHANISM)
