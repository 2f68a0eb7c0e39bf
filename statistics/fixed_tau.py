"""Kinds count and sum with a fixed tau: Dong-Luo-Yi Alg. 3 in stage 1 (each user's first
tau units are kept, the rest dropped), a continual tree counter over the kept units in
stage 2 (the binary tree, a k-ary tree with or without subtraction, or an expiring tree),
or under ``privacy.accounting: zcdp`` the square-root factorization counter with discrete
Gaussian noise (``operators.trees.sqrt_factorization``, built as the accountant charges
it: ``accounting.sqrt_counter``).

Stage 1 is a ``ColumnarBounding`` with the truncation spec (``bounding.py``: a whole batch
at a time in numpy); stage 2 steps the operator module the config names
(``operators.trees``) and releases its value, std and interval. An expiring counter is
charged epsilon g(horizon) (``operators.accounting``), so it releases nothing after
``horizon_ticks`` steps (``lifetime_steps``).

What a release shows is post-processed at no privacy cost (``noise.post_processing``):
``value`` never below 0 and moving at a tick only as far as the tick's release requires,
``interval`` raised to 0 likewise; the operator's unbiased estimate is ``unbiased``, its
noise's std ``std``. The stage-2 state is the operator's with the value shown last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from types import ModuleType
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import KINDS, StatisticConfig
from dpstream.operators import accounting, state_codec
from dpstream.operators.noise import (
    NoiseSource,
    Shown,
    TreeRelease,
    discrete_gaussian,
    interval,
    settle,
)
from dpstream.operators.trees import expiring_tree, kary_tree, sqrt_factorization, tree_counter
from dpstream.operators.user_level import truncation

from .bounding import (
    ColumnarBounding,
    GridSumBounding,
    UnitBounding,
    ValueGrid,
    grid_fields,
    value_grid,
)
from .contract import Accuracy, Step, WeightsStage2
from .releases import CounterFields
from .weights import KEPT_UNITS

RELEASE_FIELDS = CounterFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


def shown_state(state_json: Any) -> tuple[Any, Any]:
    """(the operator's state JSON, what was shown last) of a stage-2 state: the wrapped
    form ``{"operator": ..., "shown": ...}``, or the operator's state alone as states
    written before post-processing hold it (nothing shown yet)."""
    if isinstance(state_json, dict) and "operator" in state_json:
        return state_json["operator"], state_json.get("shown")
    return state_json, None


def least_value(stat: StatisticConfig) -> int | None:
    """The least value a release of ``stat`` can be about: 0 for counts, for sums of
    ``max_value`` values (integers in [1, R]), for sums on a grid whose ``lower`` is not
    negative and for histograms' bins, without deletions; None (no floor) where the
    truncated insertions minus the truncated deletions can be negative and for sums whose
    values may be negative."""
    if stat.deletions:
        return None
    if KINDS[stat.kind].values == "max_value" and stat.max_value is None:
        return 0 if stat.value_bounds[0] >= 0 else None  # a sum on a grid
    return 0


def unit_of(stat: StatisticConfig) -> str:
    """What a release of ``stat`` counts (check-config's plan)."""
    if KINDS[stat.kind].values != "max_value":
        return "events"
    return "units of value" if stat.max_value is not None else "the value's own units"


@dataclass(frozen=True)
class FixedTauStatistic(WeightsStage2):
    """A fixed-tau count or sum: its stage-1 bounding (the kept units of each user's first
    tau), its tree counter's operator module, spec and state class."""

    name: str
    tau: int
    bounding: UnitBounding
    mechanism: str  # the releases' "mechanism" field
    module: ModuleType
    spec: Any
    state_cls: type
    # For expiring mechanisms: the privacy loss eps*g(d) of an item d ticks old
    # (Andersson et al. (expiration) Def. 1.1), and the steps its charge covers.
    privacy_loss: Callable[[int], float] | None = None
    lifetime_steps: int | None = None
    neighbours: str | None = None
    tree: tuple[str, int] | None = None
    # What the releases show (noise.post_processing): the floor, and whether the noise is
    # real (with noise.mode insecure_zero the estimate is exact and shown as it is).
    floor: int | None = 0
    noisy: bool = True
    unit: str = "events"
    interval_of: str = "truncated"

    @property
    def grid(self) -> ValueGrid | None:
        """A grid sum's ``GridSumBounding.grid`` (its values' grid and bound), else None."""
        return self.bounding.grid if isinstance(self.bounding, GridSumBounding) else None

    def step(self, state_json: Any, pending: Any, tick: int, noise: NoiseSource) -> Step:
        operator, previous = shown_state(state_json)
        state = (
            self.module.init(self.spec)
            if operator is None
            else state_codec.from_json(self.state_cls, operator)
        )
        weight = (pending or {}).get(KEPT_UNITS, 0)
        state, rel = self.module.step(self.spec, state, weight, noise)
        seen = shown(previous, rel, self.floor, self.noisy)
        grid = self.grid
        fields = {
            "step": rel.t,
            "value": seen.value,
            "std": rel.std,
            "interval": list(seen.interval),
            "unbiased": rel.value,
            "tau": self.tau,
        }
        if grid is not None:
            fields.update(grid_fields(grid, seen, rel.std, rel.value))
        return Step({"operator": state_codec.to_json(state), "shown": seen.value}, (fields,))

    def accuracy(self, ticks: Sequence[int]) -> Accuracy:
        last = self.lifetime_steps
        grid = self.grid
        step = 1.0 if grid is None else float(grid.grid.step)  # a grid sum's std in its units
        stds = tuple(
            None if last is not None and t > last else float(self.module.std(self.spec, t)) * step
            for t in ticks
        )
        if grid is None:
            kept = f"each user's first {self.tau} {self.unit} (the true value can only be larger)"
        else:
            kept = f"each user's first {self.tau} events, each value clipped into its bounds"
        covers = f"the truncated value: {kept}"
        return Accuracy(self.unit, (("release", stds),), covers)

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        curve = self._loss_by_age()
        if not curve:
            return entry
        return {
            **entry,
            "note": "loss of an item decays with its age (Andersson et al. 2024); see expiration",
            "expiration": curve,
        }

    def _loss_by_age(self, max_age: int = 1 << 20) -> list[dict[str, float]]:
        """Privacy loss by age at ages 1, 2, 4, ..., max_age (none unless expiring)."""
        if self.privacy_loss is None:
            return []
        ages = [1 << i for i in range(max_age.bit_length())]
        return [{"age_ticks": d, "epsilon": self.privacy_loss(d)} for d in ages]


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> FixedTauStatistic:
    """The tree counter of ``stat`` over the kept units; under ``any_subset`` each leaf's
    sensitivity doubles (``accounting.sensitivity_multiplier``)."""
    relation = cfg.privacy.neighbours.value
    multiplier = accounting.sensitivity_multiplier(relation)
    grid = value_grid(stat)
    # A sum on a grid keeps a user's first tau events, each at most grid.bound units.
    sensitivity = multiplier * stat.fixed_tau * (1 if grid is None else grid.bound)
    counter = (
        gaussian_counter_for(stat, relation, sensitivity)
        if stat.zcdp
        else counter_for(stat, sensitivity)
    )
    return replace(
        counter,
        floor=least_value(stat),
        noisy=cfg.noise.mode.value == "keyed",
        unit=unit_of(stat),
    )


def kept_units(stat: StatisticConfig) -> UnitBounding:
    """Stage 1 of ``stat``: each user's first tau units (a grid sum's first tau events)."""
    grid = value_grid(stat)
    if grid is not None:
        return GridSumBounding(stat.name, stat.key, False, grid=grid, tau=stat.fixed_tau)
    return ColumnarBounding(
        stat.name,
        stat.key,
        stat.deletions,
        fixed=truncation.make_truncation(stat.fixed_tau),
        max_value=stat.max_value,
    )


def gaussian_counter_for(
    stat: StatisticConfig, relation: str, sensitivity: int
) -> FixedTauStatistic:
    """The square-root factorization counter of a zCDP ``stat``: the accountant's own
    (``accounting.sqrt_counter``: the rho, leaf sensitivity and design horizon it charges),
    whose leaf sensitivity must be the ``sensitivity`` stage 1's bounding allows."""
    spec = accounting.sqrt_counter(stat.terms(), relation)
    if spec.sensitivity != sensitivity:  # pragma: no cover - config and bounding agree
        raise AssertionError(
            f"{stat.name}: charged sensitivity {spec.sensitivity} != {sensitivity}"
        )
    return FixedTauStatistic(
        stat.name,
        stat.fixed_tau,
        kept_units(stat),
        sqrt_factorization.MECHANISM,
        sqrt_factorization,
        spec,
        sqrt_factorization.SqrtFactorizationState,
    )


def counter_for(stat: StatisticConfig, sensitivity: int, instance: int = 0) -> FixedTauStatistic:
    """The counter of ``stat`` whose leaves have per-level L1 sensitivity ``sensitivity``."""
    epsilon = Fraction(repr(stat.pure_epsilon))  # the decimal the user wrote
    prefix = (stat.name, instance)
    common = (stat.name, stat.fixed_tau, kept_units(stat))
    mechanism, k = stat.mechanism, stat.k
    if mechanism == "auto":
        # Public parameters only: choosing costs no privacy (docs/papers.md).
        horizon = _required(stat.horizon_ticks, "horizon_ticks", "mechanism auto")
        mechanism, k = kary_tree.choose_tree(epsilon, sensitivity, horizon, prefix)
    if mechanism == "binary":
        binary = tree_counter.make_binary_tree(epsilon, sensitivity, prefix)
        return FixedTauStatistic(
            *common,
            tree_counter.MECHANISM,
            tree_counter,
            binary,
            tree_counter.BinaryTreeState,
            tree=("binary", 2),
        )
    if mechanism in ("kary", "kary_subtract"):
        kary = kary_tree.make_kary_tree(
            epsilon,
            sensitivity,
            prefix,
            _required(k, "k", f"mechanism {mechanism}"),
            subtract=mechanism == "kary_subtract",
        )
        return FixedTauStatistic(
            *common,
            kary_tree.mechanism(kary),
            kary_tree,
            kary,
            kary_tree.KaryTreeState,
            tree=(mechanism, kary.k),
        )
    if mechanism == "expiring":
        expiring = expiring_tree.make_expiring_tree(
            epsilon,
            sensitivity,
            prefix,
            Fraction(repr(_required(stat.lam, "lambda", "mechanism expiring"))),
            stat.delay,
        )
        return FixedTauStatistic(
            *common,
            expiring_tree.MECHANISM,
            expiring_tree,
            expiring,
            expiring_tree.ExpiringTreeState,
            privacy_loss=lambda d: expiring_tree.privacy_loss(expiring, d),
            lifetime_steps=accounting.lifetime_steps(stat.terms()),
            tree=("expiring", 2),
        )
    raise ValueError(f"unknown mechanism {mechanism!r}")  # the config schema rules this out


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the tree as resolved (``mechanism: auto``
    names the tree and k it chose) and the version of every algorithm it uses."""
    counter = make_statistic(stat, cfg)
    out: dict[str, object] = {"mechanism": counter.mechanism}
    if isinstance(counter.spec, kary_tree.KaryTreeSpec):
        out["k"] = counter.spec.k
    modules = [truncation, tree_counter, kary_tree, expiring_tree]
    if stat.zcdp:
        # Under zCDP: the accounting, the BLT's design horizon (its decays) and the
        # Gaussian sampler (rho and the rest are in the statistic's definition).
        out["accounting"] = "zcdp"
        out["design_horizon"] = stat.horizon_ticks or sqrt_factorization.DEFAULT_HORIZON
        modules = [truncation, sqrt_factorization, discrete_gaussian]
    out["versions"] = {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}
    return {"algorithm": out}


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (``dpstream check-config``)."""
    tree = make_statistic(stat, cfg).tree
    k = tree[1] if tree is not None and tree[0].startswith("kary") else None
    params = "".join(
        f", {name}={value}"
        for name, value in (
            ("k", k),
            ("lambda", stat.lam),
            ("horizon_ticks", stat.horizon_ticks),
            ("key", stat.key),
        )
        if value is not None
    )
    via = (
        stat.mechanism
        if tree is None or stat.mechanism == tree[0]
        else f"{stat.mechanism}: {tree[0]}"
    )
    budget = f"rho={stat.rho:g}" if stat.rho is not None else f"epsilon={stat.epsilon:g}"
    return f"{stat.kind} via {via}, {budget}, tau={stat.tau}{params}"


def shown(previous: int | None, rel: TreeRelease, floor: int | None, noisy: bool) -> Shown:
    """What release ``rel`` shows (``noise.post_processing.settle``): its value moved from
    the one shown before only as far as it requires, raised to ``floor``; with exact
    (zero) noise, its value as it is (the deadband would only lag behind the truth)."""
    low, high = interval(rel.value, rel.ci95)
    return settle(previous, rel.value, rel.std if noisy else 0.0, (low, high), floor)


def _required(value: Any, name: str, needed_by: str) -> Any:
    """A parameter the config schema requires for ``needed_by`` (a kind or mechanism), so
    never None in a validated config."""
    if value is None:
        raise ValueError(f"{name}: required for {needed_by}")
    return value
