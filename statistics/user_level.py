"""Kinds count and sum with ``tau: auto``: Dong-Luo-Yi Alg. 5, the user-level counter that
tracks its own contribution bound, with an insert/delete stream where ``deletions: true``
(Sec. VI).

Stage 1 counts each user's units by rank band and the users crossing each power of two
(a ``ColumnarBounding`` without a fixed tau: a whole batch at a time in numpy). Stage 2
steps the operator (``operators.user_level.counter``, or ``deletions`` for the two
streams) and writes a budget entry whenever its tracker or instance series spends more.

``UserLevelStatistic`` is the stage 2 every ``tau: auto`` kind shares (this module's, and
``histogram``, ``kselect`` and ``distinct``): the state's JSON form, the step around the
operator, the budget entry. Each kind says how its operator advances (``advance``), what
its release holds (``values``) and how its spend splits (``spent``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any

from dpstream.config.schema import PipelineConfig, StatisticConfig
from dpstream.operators import accounting, state_codec
from dpstream.operators.noise import NoiseSource, interval
from dpstream.operators.trees import tree_counter
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import deletions, distinct_count, k_selection, svt

from .bounding import ColumnarBounding, GridSumBounding, UnitBounding, grid_fields, value_grid
from .contract import Step, WeightsStage2
from .releases import UserLevelFields
from .weights import DELETES, INSERTS, parse_weights

RELEASE_FIELDS = UserLevelFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


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
class UserLevelStatistic(WeightsStage2, ABC):
    """A tau: auto statistic's stage 2 around its operator module and spec."""

    stat: StatisticConfig
    module: ModuleType
    spec: Any
    state_cls: type
    mechanism: str
    neighbours: str | None = None
    lifetime_steps: int | None = None

    @property
    def name(self) -> str:
        return self.stat.name

    @property
    @abstractmethod
    def bounding(self) -> UnitBounding:
        """Stage 1 of the kind."""

    @abstractmethod
    def advance(
        self, op_state: Any, weights: dict[str, int], old: UserLevelState, noise: NoiseSource
    ) -> tuple[Any, Any, dict[str, int] | None]:
        """(the operator's state after the tick, its release, the kind's own part of the
        state (distinct's m(v)) or None)."""

    @abstractmethod
    def values(self, rel: Any) -> dict[str, Any]:
        """The release's own fields."""

    def spent(self, op_state: Any) -> tuple[Fraction, Fraction]:
        """Exact epsilon committed so far by (the tracker series, the instance series)."""
        split: tuple[Fraction, Fraction] = self.module.spent_split(self.spec, op_state)
        return split

    def step(self, state: Any, pending: Any, tick: int, noise: NoiseSource) -> Step:
        """Advance one tick: the release and, when the tracker or instance series spent
        more this tick, a budget entry with what both have spent so far."""
        old = UserLevelState.from_json(state)
        op_state = self.module.init(self.spec) if old.operator is None else self._load(old.operator)
        op_state, rel, min_band = self.advance(op_state, pending or {}, old, noise)
        tracker, instances = self.spent(op_state)
        fields: dict[str, Any] = {"step": rel.t, **self.values(rel)}
        fields["epsilon_spent"] = float(tracker + instances)
        spent = {"tracker_epsilon": float(tracker), "instances_epsilon": float(instances)}
        new = UserLevelState(state_codec.to_json(op_state), spent, min_band).to_json()
        if spent == old.spent:
            return Step(new, (fields,))
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
        return Step(new, (fields,), (entry,))

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        note = (
            "Dong-Luo-Yi Alg. 5 over the whole infinite stream: tracker series below "
            "epsilon/2, instance series below epsilon/2; budget entries follow"
        )
        return {**entry, "note": note}

    def _load(self, data: dict) -> Any:
        return state_codec.from_json(self.state_cls, data)


def series_fields(rel: Any, deletes: Any | None) -> dict[str, Any]:
    """The tracked bound of a release: tau, instance, SVT index (and the deletion
    stream's tau)."""
    out: dict[str, Any] = {"tau": rel.tau, "instance": rel.instance, "svt_index": rel.svt_index}
    if deletes is not None:
        out["tau_deletions"] = deletes.tau
    return out


def advance_streams(
    module: ModuleType, spec: Any, op_state: Any, weights: dict[str, int], noise: NoiseSource
) -> tuple[Any, Any]:
    """One tick of a user-level counter, or of its insert/delete pair (``module`` is
    ``operators.user_level.deletions``): (its state, its release)."""
    bands, crossings = parse_weights(weights, INSERTS)
    if module is deletions:
        del_bands, del_crossings = parse_weights(weights, DELETES)
        return deletions.step(spec, op_state, bands, crossings, del_bands, del_crossings, noise)
    return module.step(spec, op_state, bands, crossings, noise)


def counter_spec(
    stat: StatisticConfig, cfg: PipelineConfig, bins: int
) -> tuple[ModuleType, Any, type, str]:
    """(operator module, spec, state class, mechanism name) of a user-level count, sum or
    histogram with ``bins`` bins: Alg. 5, or its insert/delete pair with deletions."""
    eps, beta, theta = (Fraction(repr(x)) for x in (stat.epsilon, stat.beta, stat.theta))
    options: dict[str, Any] = {
        "practical": stat.practical,
        "practical_instances": stat.practical_instances,
    }
    multiplier = accounting.sensitivity_multiplier(cfg.privacy.neighbours.value)
    if stat.deletions:
        pair = deletions.make_deletions(
            stat.name, stat.kind, eps, beta, theta, bins=bins, any_subset=multiplier == 2,
            **options,
        )  # fmt: skip
        return deletions, pair, deletions.DeletionsState, deletions.MECHANISM
    spec = ul.make_user_level(
        stat.name, eps, beta, theta, bins=bins, multiplier=multiplier, **options
    )
    return ul, spec, ul.UserLevelState, ul.MECHANISM


@dataclass(frozen=True)
class UserLevelCount(UserLevelStatistic):
    """A tau: auto count or sum."""

    @property
    def bounding(self) -> UnitBounding:
        stat = self.stat
        grid = value_grid(stat)
        if grid is not None:  # units of the grid, by rank band
            return GridSumBounding(stat.name, stat.key, stat.deletions, grid=grid)
        return ColumnarBounding(stat.name, stat.key, stat.deletions, max_value=stat.max_value)

    def advance(
        self, op_state: Any, weights: dict[str, int], old: UserLevelState, noise: NoiseSource
    ) -> tuple[Any, Any, dict[str, int] | None]:
        op_state, rel = advance_streams(self.module, self.spec, op_state, weights, noise)
        return op_state, rel, None

    def values(self, rel: Any) -> dict[str, Any]:
        inserts = rel.inserts if self.stat.deletions else rel
        out = series_fields(inserts, rel.deletes if self.stat.deletions else None)
        (only,) = rel.bins
        out["value"] = only.value
        out["std"] = only.std
        out["interval"] = interval(only.value, only.ci95)
        grid = value_grid(self.stat)
        if grid is not None:  # tau stays in grid units: the tracker's bound
            out.update(grid_fields(grid, only.value, only.std, only.ci95))
        return out


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> UserLevelCount:
    """A tau: auto count or sum (Dong-Luo-Yi Alg. 5, Sec. VI with deletions)."""
    return UserLevelCount(stat, *counter_spec(stat, cfg, bins=1))


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism and its algorithms' versions."""
    return {"algorithm": {"mechanism": make_statistic(stat, cfg).mechanism, "versions": versions()}}


def versions() -> dict[str, int]:
    """The versions of the algorithms of the tau: auto kinds (one list for all of them)."""
    modules = [ul, svt, deletions, distinct_count, k_selection, tree_counter]
    return {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (``dpstream check-config``)."""
    key = f", key={stat.key}" if stat.key is not None else ""
    return f"{stat.kind} via {stat.mechanism}, epsilon={stat.epsilon:g}, tau={stat.tau}{key}"
