"""Kinds count and sum with a fixed tau: Dong-Luo-Yi Alg. 3 in stage 1 (each user's first
tau units are kept, the rest dropped), a continual tree counter over the kept units in
stage 2 (the binary tree, a k-ary tree with or without subtraction, or an expiring tree).

Stage 1 is a ``ColumnarBounding`` with the truncation spec (``bounding.py``: a whole batch
at a time in numpy); stage 2 steps the operator module the config names
(``operators.trees``) and releases its value, std and interval. An expiring counter is
charged epsilon g(horizon) (``operators.accounting``), so it releases nothing after
``horizon_ticks`` steps (``lifetime_steps``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any

from dpstream.config.schema import PipelineConfig, StatisticConfig
from dpstream.operators import accounting, state_codec
from dpstream.operators.noise import NoiseSource, interval
from dpstream.operators.trees import expiring_tree, kary_tree, tree_counter
from dpstream.operators.user_level import truncation

from .bounding import ColumnarBounding, GridSumBounding, UnitBounding, grid_fields, value_grid
from .contract import Step, WeightsStage2
from .releases import CounterFields
from .weights import KEPT_UNITS

RELEASE_FIELDS = CounterFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


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

    def step(self, state_json: Any, pending: Any, tick: int, noise: NoiseSource) -> Step:
        state = (
            self.module.init(self.spec)
            if state_json is None
            else state_codec.from_json(self.state_cls, state_json)
        )
        weight = (pending or {}).get(KEPT_UNITS, 0)
        state, rel = self.module.step(self.spec, state, weight, noise)
        grid = self.bounding.grid if isinstance(self.bounding, GridSumBounding) else None
        fields = {
            "step": rel.t,
            "value": rel.value,
            "std": rel.std,
            "interval": interval(rel.value, rel.ci95),
            "tau": self.tau,
        }
        if grid is not None:
            fields.update(grid_fields(grid, rel.value, rel.std, rel.ci95))
        return Step(state_codec.to_json(state), (fields,))

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
    multiplier = accounting.sensitivity_multiplier(cfg.privacy.neighbours.value)
    grid = value_grid(stat)
    # A sum on a grid keeps a user's first tau events, each at most grid.bound units.
    return counter_for(stat, multiplier * stat.fixed_tau * (1 if grid is None else grid.bound))


def counter_for(stat: StatisticConfig, sensitivity: int, instance: int = 0) -> FixedTauStatistic:
    """The counter of ``stat`` whose leaves have per-level L1 sensitivity ``sensitivity``."""
    epsilon = Fraction(repr(stat.epsilon))  # the decimal the user wrote
    prefix = (stat.name, instance)
    grid = value_grid(stat)
    bounding: UnitBounding
    if grid is not None:
        bounding = GridSumBounding(stat.name, stat.key, False, grid=grid, tau=stat.fixed_tau)
    else:
        bounding = ColumnarBounding(
            stat.name,
            stat.key,
            stat.deletions,
            fixed=truncation.make_truncation(stat.fixed_tau),
            max_value=stat.max_value,
        )
    common = (stat.name, stat.fixed_tau, bounding)
    mechanism, k = stat.mechanism, stat.k
    if mechanism == "auto":
        # Public parameters only: choosing costs no privacy (docs/papers.md).
        horizon = _required(stat.horizon_ticks, "horizon_ticks", "mechanism auto")
        mechanism, k = kary_tree.choose_tree(epsilon, sensitivity, horizon, prefix)
    if mechanism == "binary":
        binary = tree_counter.make_binary_tree(epsilon, sensitivity, prefix)
        return FixedTauStatistic(
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
        return FixedTauStatistic(
            *common, kary_tree.mechanism(kary), kary_tree, kary, kary_tree.KaryTreeState
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
    out["versions"] = {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}
    return {"algorithm": out}


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (``dpstream check-config``)."""
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


def _required(value: Any, name: str, needed_by: str) -> Any:
    """A parameter the config schema requires for ``needed_by`` (a kind or mechanism), so
    never None in a validated config."""
    if value is None:
        raise ValueError(f"{name}: required for {needed_by}")
    return value
