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

What a release shows is post-processed at no privacy cost, as a fixed-tau count's
(``fixed_tau.shown``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators import accounting, state_codec
from dpstream.operators.noise import NoiseSource, Shown
from dpstream.operators.trees import kary_tree, tree_counter
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import deletions, distinct_count, k_selection, svt

from .bounding import ColumnarBounding, GridSumBounding, UnitBounding, grid_fields, value_grid
from .contract import Accuracy, Step, WeightsStage2
from .fixed_tau import least_value, shown, unit_of
from .releases import UserLevelFields
from .weights import DELETES, INSERTS, parse_weights

# How many doublings of the tracked bound check-config plans for (tau~ = tau_1 * 8^i).
PLANNED_BOUNDS = 3

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
    shown: list[int] | None = None  # per bin, what the last release showed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.min_band is None else {"min_band": self.min_band}
        out["operator"] = self.operator
        out["spent"] = self.spent
        if self.shown is not None:
            out["shown"] = self.shown
        return out

    @classmethod
    def from_json(cls, data: Any) -> UserLevelState:
        if data is None:
            return cls()
        return cls(data["operator"], data["spent"], data.get("min_band"), data.get("shown"))


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
    tree: tuple[str, int] | None = ul.BINARY
    noisy: bool = True  # False with noise.mode insecure_zero: shown as it is (fixed_tau)
    interval_of: str = "truncated"

    @property
    def name(self) -> str:
        return self.stat.name

    @property
    @abstractmethod
    def bounding(self) -> UnitBounding:
        """Stage 1 of the kind."""

    def advance(
        self, op_state: Any, weights: dict[str, int], old: UserLevelState, noise: NoiseSource
    ) -> tuple[Any, Any, dict[str, int] | None]:
        """(the operator's state after the tick, its release, the kind's own part of the
        state (distinct's m(v)) or None): by default one tick of the counter, or of its
        insert/delete pair (``advance_streams``)."""
        op_state, rel = advance_streams(self.module, self.spec, op_state, weights, noise)
        return op_state, rel, None

    @abstractmethod
    def values(
        self, rel: Any, previous: list[int] | None
    ) -> tuple[dict[str, Any], list[int] | None]:
        """(the release's own fields, per bin the values it shows) from the operator's
        release and the values shown at the tick before (None: none yet)."""

    def planned_std(self, t: int, instance: int, tau: int) -> float | None:
        """The exact std of a release at tick t by instance j with bound tau~ (None: the
        kind releases no std)."""
        return ul.release_std(self.spec, t, instance, tau)

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
        own, shown_now = self.values(rel, old.shown)
        fields: dict[str, Any] = {"step": rel.t, **own}
        fields["epsilon_spent"] = float(tracker + instances)
        spent = {"tracker_epsilon": float(tracker), "instances_epsilon": float(instances)}
        new = UserLevelState(state_codec.to_json(op_state), spent, min_band, shown_now).to_json()
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
        share = self._tracker().epsilon / Fraction(repr(self.stat.epsilon))
        note = (
            "Dong-Luo-Yi Alg. 5 over the whole infinite stream: tracker series below "
            f"{share} epsilon, instance series below {1 - share} epsilon; budget entries follow"
        )
        return {**entry, "note": note}

    def accuracy(self, ticks: Sequence[int]) -> Accuracy:
        """The std of a release at ``ticks`` if its tracked bound is tau~, for tau~ the
        tracker's start and two larger powers of two: tau~ is chosen privately from the data
        (never assumed here), and a release's std is proportional to it. Reaching tau~ takes
        at most log2(tau~ / tau_1) + 1 instances (the bound at least doubles at each), and
        later instances have less epsilon, so the std is at most the one given."""
        start = svt.tau_start(self._tracker())
        grid = value_grid(self.stat)  # a sum on a grid tracks its bound in grid units
        step = 1.0 if grid is None else float(grid.grid.step)
        rows = []
        for i in range(PLANNED_BOUNDS):
            tau, instance = start << (3 * i), 3 * i + 1
            planned = (self.planned_std(t, instance, tau) for t in ticks)
            stds = tuple(None if std is None else std * step for std in planned)
            which = "instance 1" if instance == 1 else f"at most: instance <= {instance}"
            rows.append((f"if tau~ = {tau} ({which})", stds))
        unit = unit_of(self.stat) if self.stat.bins is None else "events per bin"
        if grid is None:
            kept = f"{unit} (tau~ is released with it; the true value can only be larger)"
        else:
            kept = f"grid units ({step:g} each) of values clipped into their bounds"
        covers = f"the truncated value: each user's first tau~ {kept}"
        return Accuracy(unit, tuple(rows), covers)

    def _tracker(self) -> svt.ContributionTrackerSpec:
        spec = self.spec
        if isinstance(spec, deletions.DeletionsSpec):
            return spec.inserts.tracker
        if isinstance(spec, distinct_count.DistinctCountSpec):
            return spec.mechanism.tracker
        if isinstance(spec, k_selection.KSelectionSpec):
            return spec.levels[0].tracker
        tracker: svt.ContributionTrackerSpec = spec.tracker
        return tracker

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
        "tree": instance_tree(stat),
        **tracker_options(stat),
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


def tracker_options(stat: StatisticConfig) -> dict[str, Any]:
    """The operator's tracker share, series and tau_1 from ``stat``'s resolved
    ``tracker_share``, ``series`` and ``tau_start`` (``registry.resolved``); a field left
    unnamed is Alg. 5's (1/2, Dong-Luo-Yi's series, App. C-A's or Alg. 4's tau_1)."""
    series = stat.series or svt.SERIES_DLY
    share = Fraction(1, 2) if stat.tracker_share is None else Fraction(repr(stat.tracker_share))
    start = 0 if stat.tau_start is None else stat.tau_start.bit_length() - 1
    return {
        "tracker_share": share,
        "tracker_series": series,
        "instance_series": series,
        "start_exponent": start,
    }


def instance_tree(stat: StatisticConfig) -> tuple[kary_tree.ChosenTree, int]:
    """The counter a tau: auto count's, sum's or histogram's instances run: the k-ary tree
    ``mechanism`` names (resolved: ``registry.resolved``), else Dong-Luo-Yi's binary tree
    (docs/design.md section 5a: why re-admission into original ticks allows any tree)."""
    if stat.mechanism in ("kary", "kary_subtract") and stat.k is not None:
        return (stat.mechanism, stat.k)
    return ul.BINARY


def post_processing(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, Any]:
    """The fields of a user-level statistic that say how its releases are shown and the
    tree its instances run: for ``UserLevelStatistic``'s constructor."""
    return {"noisy": cfg.noise.mode.value == "keyed", "tree": instance_tree(stat)}


def shown_bins(
    bins: Sequence[Any], previous: list[int] | None, floor: int | None, noisy: bool
) -> list[Shown]:
    """What each bin's release shows (``fixed_tau.shown``), from what it showed before."""
    before: Sequence[int | None] = previous or [None] * len(bins)
    return [shown(p, b, floor, noisy) for p, b in zip(before, bins, strict=True)]


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

    def values(
        self, rel: Any, previous: list[int] | None
    ) -> tuple[dict[str, Any], list[int] | None]:
        inserts = rel.inserts if self.stat.deletions else rel
        out = series_fields(inserts, rel.deletes if self.stat.deletions else None)
        (only,) = rel.bins
        (seen,) = shown_bins(rel.bins, previous, least_value(self.stat), self.noisy)
        out["value"] = seen.value
        out["std"] = only.std
        out["interval"] = list(seen.interval)
        out["unbiased"] = only.value
        grid = value_grid(self.stat)
        if grid is not None:  # tau stays in grid units: the tracker's bound
            out.update(grid_fields(grid, seen, only.std, only.value))
        return out, [seen.value]

    def planned_std(self, t: int, instance: int, tau: int) -> float | None:
        if isinstance(self.spec, deletions.DeletionsSpec):
            return deletions.release_std(self.spec, t, instance, tau)
        return ul.release_std(self.spec, t, instance, tau)


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> UserLevelCount:
    """A tau: auto count or sum (Dong-Luo-Yi Alg. 5, Sec. VI with deletions)."""
    return UserLevelCount(stat, *counter_spec(stat, cfg, bins=1), **post_processing(stat, cfg))


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism and its algorithms' versions
    (``algorithm``)."""
    return {"algorithm": algorithm(make_statistic(stat, cfg))}


def algorithm(statistic: UserLevelStatistic) -> dict[str, object]:
    """A tau: auto statistic's algorithm: its mechanism and versions, with the k-ary tree's
    version when its instances run one (on the binary tree it is what it always was, so
    such a statistic's fingerprint is unchanged)."""
    extra = {} if statistic.tree in (None, ul.BINARY) else {"kary_tree": kary_tree.VERSION}
    return {"mechanism": statistic.mechanism, "versions": {**versions(), **extra}}


def versions() -> dict[str, int]:
    """The versions of the algorithms of the tau: auto kinds (one list for all of them)."""
    modules = [ul, svt, deletions, distinct_count, k_selection, tree_counter]
    return {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (``dpstream check-config``)."""
    key = f", key={stat.key}" if stat.key is not None else ""
    tuning = ""
    if stat.tracker_share is not None:  # resolved (registry.describe)
        tuning = (
            f" (tracker {stat.tracker_share:g} of epsilon, {stat.series} series, "
            f"tau from {stat.tau_start})"
        )
    line = f"{stat.kind} via {stat.mechanism}, epsilon={stat.epsilon:g}, tau={stat.tau}{tuning}"
    return line + key
