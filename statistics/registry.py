"""The registry of kinds: ``kind`` in a statistic's config -> the module that implements it.

One line per kind (``REGISTRY``). A kind's module holds its stage-1 bounding and its
stage-2 step and has three functions: ``make_statistic(stat, cfg)`` (its
``contract.Statistic``), ``describe(stat, cfg)`` (one line for ``dpstream check-config``)
and ``identity(stat, cfg)`` (what shapes the statistic beyond its config: the mechanism as
resolved, its algorithms' versions; ``identity.py``), and names the shape of its releases
(``RELEASE_FIELDS``, a ``TypedDict`` of ``releases.py``; ``release_shapes``). Where one
kind has two algorithms, the line says which setting chooses: a count or a sum is
Dong-Luo-Yi's Alg. 3 with a fixed tau or Alg. 5 with ``tau: auto`` (``ByTau``), a mean
the whole-user mean or, with public counts, George et al.'s (``ByCounts``).

The config schema lists the kinds and the parameters each takes (``config.statistic.KINDS``);
this registry and that list name the same kinds, and every module has every function:
both are checked when this module is imported, so a kind that misses one never runs.
Stage 1 and stage 2 (so the worker and ``dpstream replay``) build every statistic through
``statistic_for``, check-config describes it through ``describe``, the identity reads
``identity`` (``identity.py``), and the ingest's, stage 1's and replay's checks read
``value_rule``; nothing else dispatches on a kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import KINDS, StatisticConfig
from dpstream.operators.trees import kary_tree

from . import (
    cell_mean,
    continual_mean,
    distinct,
    fixed_tau,
    histogram,
    kselect,
    user_level,
    whole_user_mean,
)
from .contract import Statistic
from .events import ValueRule, Where, scalar_tag

# What every kind's module has (``contract.KindModule``).
KIND_FUNCTIONS = ("make_statistic", "describe", "identity")
KIND_ATTRIBUTES = ("RELEASE_FIELDS",)


@dataclass(frozen=True)
class One:
    """A kind with one algorithm."""

    module: ModuleType

    def module_for(self, stat: StatisticConfig, cfg: PipelineConfig) -> ModuleType:
        return self.module


@dataclass(frozen=True)
class ByTau:
    """A kind with a fixed tau (Dong-Luo-Yi Alg. 3) or ``tau: auto`` (Alg. 5)."""

    fixed: ModuleType
    auto: ModuleType

    def module_for(self, stat: StatisticConfig, cfg: PipelineConfig) -> ModuleType:
        return self.auto if stat.user_level else self.fixed


@dataclass(frozen=True)
class ByCounts:
    """A kind whose algorithm depends on ``privacy.public_counts``."""

    private: ModuleType
    public: ModuleType

    def module_for(self, stat: StatisticConfig, cfg: PipelineConfig) -> ModuleType:
        return self.public if cfg.privacy.public_counts else self.private


Implementation = One | ByTau | ByCounts

REGISTRY: dict[str, Implementation] = {
    "count": ByTau(fixed=fixed_tau, auto=user_level),
    "sum": ByTau(fixed=fixed_tau, auto=user_level),
    "histogram": One(histogram),
    "kselect": One(kselect),
    "distinct": One(distinct),
    "mean": ByCounts(private=whole_user_mean, public=continual_mean),
    "cell_mean": One(cell_mean),
}


def _modules(implementation: Implementation) -> list[ModuleType]:
    return [getattr(implementation, name) for name in implementation.__dataclass_fields__]


def check_registry() -> None:
    """The registry names the config's kinds, each module with every function.

    Raises:
        TypeError: a kind the config lists but the registry does not (or the reverse), or
            a module without one of ``KIND_FUNCTIONS`` or ``KIND_ATTRIBUTES``.
    """
    if set(REGISTRY) != set(KINDS):
        raise TypeError(
            f"the registry's kinds {sorted(REGISTRY)} are not the config's {sorted(KINDS)}"
        )
    for kind, implementation in REGISTRY.items():
        for module in _modules(implementation):
            missing = [f for f in KIND_FUNCTIONS if not callable(getattr(module, f, None))]
            missing += [a for a in KIND_ATTRIBUTES if not hasattr(module, a)]
            if missing:
                raise TypeError(f"kind {kind}: {module.__name__} has no {', '.join(missing)}")


check_registry()  # at import: a kind that misses a function never runs


def release_shapes() -> dict[type, list[str]]:
    """The shapes of the kinds' releases (each module's ``RELEASE_FIELDS``), each with the
    kinds that release in it, in the registry's order (the published schemas,
    ``dpstream.client.schemas``)."""
    out: dict[type, list[str]] = {}
    for kind, implementation in REGISTRY.items():
        for module in _modules(implementation):
            kinds = out.setdefault(module.RELEASE_FIELDS, [])
            if kind not in kinds:
                kinds.append(kind)
    return out


def release_fields(stat: StatisticConfig, cfg: PipelineConfig) -> type:
    """The shape of ``stat``'s releases (its module's ``RELEASE_FIELDS``): which of its
    kind's shapes, where the kind has two, is the config's choice (the Avro schema of its
    topic, ``dpstream.client.avro_schemas``)."""
    module: ModuleType = REGISTRY[stat.kind].module_for(stat, cfg)
    return module.RELEASE_FIELDS  # type: ignore[no-any-return]


def default_tree(stat: StatisticConfig) -> tuple[str, int | None]:
    """(mechanism, k) of a NEW statistic that names no mechanism: a count, sum or histogram
    without a horizon (fixed tau, or tau: auto's instances) runs the least-error tree for
    an unbounded stream (``kary_tree.choose_unbounded_tree``, public: choosing costs no
    privacy); every other statistic the binary tree, as before (distinct and k-selection,
    whose instances run only that, the kinds with their own caps, and a statistic with a
    horizon, which names ``auto`` to have its tree chosen)."""
    if stat.own_caps or stat.horizon_ticks is not None:
        return "binary", None
    if stat.user_level and not KINDS[stat.kind].trees:
        return "binary", None
    name, k = kary_tree.choose_unbounded_tree()
    return name, None if name == "binary" else k


def resolved(stat: StatisticConfig, ran: Mapping[str, Any] | None = None) -> StatisticConfig:
    """``stat`` with its mechanism (and a tau: auto count's, sum's or histogram's tracker
    tuning, ``TUNING_FIELDS``) named, as it runs and as its identity records it.

    Args:
        stat: a statistic of the config.
        ran: the statistic's parameters as the ledger recorded them when it ran
            (``identity_parameters``'s ``statistic``), None for a statistic the ledger
            has never seen.

    Returns:
        Under zCDP accounting ``sqrt_factorization``, its one counter. Else ``stat``
        itself if it names a mechanism; else with the mechanism and k it ran (a
        statistic that ran before the default changed recorded ``binary``, so it keeps
        its tree and its fingerprint), or for a new one with ``default_tree``'s. The
        same for ``TUNING_FIELDS`` (``_tracker_tuning``).
    """
    update: dict[str, Any] = {}
    if stat.zcdp and stat.mechanism != "sqrt_factorization":
        # zCDP accounting has one counter, which auto (and naming none) picks.
        update["mechanism"] = "sqrt_factorization"
    elif stat.mechanism is None:
        if ran is not None:
            update["mechanism"], update["k"] = ran.get("mechanism") or "binary", ran.get("k")
        else:
            update["mechanism"], update["k"] = default_tree(stat)
    update.update(_tracker_tuning(stat, ran))
    return stat.model_copy(update=update) if update else stat


TUNING_FIELDS = ("tracker_share", "series", "tau_start")
"""A tau: auto count's, sum's or histogram's tracker and series (docs/user-level.md 6)."""

NEW_TAU_START = {"count": 256, "sum": 256, "histogram": 64}
"""tau_1 of a NEW statistic in practical mode (docs/user-level.md section 6): a count's or
sum's best bound over a long stream is rarely below 256, and every restart costs; a
histogram's noise is per bin while its truncation bias spreads over the bins, so its best
bound is lower: App. C-A's 64."""


def new_tuning(stat: StatisticConfig) -> dict[str, Any]:
    """What a NEW statistic runs for ``TUNING_FIELDS`` it leaves unnamed (docs/user-level.md
    section 6): a quarter of epsilon to the tracker, the telescoping series, tau_1 of
    ``NEW_TAU_START`` (with ``practical: false``, Alg. 4's tau_1 = 2: that setting asks for
    the paper's tracker)."""
    start = NEW_TAU_START[stat.kind] if stat.practical else 2
    return {"tracker_share": 0.25, "series": "telescoping", "tau_start": start}


def tuned(stat: StatisticConfig) -> bool:
    """Whether ``TUNING_FIELDS`` apply: a tau: auto count, sum or histogram."""
    return stat.user_level and KINDS[stat.kind].trees


def legacy_tuning(stat: StatisticConfig) -> dict[str, Any]:
    """Dong-Luo-Yi Alg. 5's values of ``TUNING_FIELDS``, what every statistic ran before
    they existed: half of epsilon to the tracker, their series, tau_1 of App. C-A (64) or
    of Alg. 4 (2)."""
    return {"tracker_share": 0.5, "series": "dly", "tau_start": 64 if stat.practical else 2}


def _tracker_tuning(stat: StatisticConfig, ran: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``TUNING_FIELDS`` ``stat`` leaves unnamed: a statistic the ledger ran keeps what
    it recorded (Alg. 5's where it recorded none: it ran before they existed, and its
    fingerprint, which leaves Alg. 5's values out, stays), a new one ``new_tuning``'s."""
    if not tuned(stat):
        return {}
    chosen = new_tuning(stat) if ran is None else {**legacy_tuning(stat), **ran}
    return {name: chosen[name] for name in TUNING_FIELDS if getattr(stat, name) is None}


def with_mechanisms(cfg: PipelineConfig, ran: Mapping[str, Mapping[str, Any]]) -> PipelineConfig:
    """``cfg`` with every statistic ``resolved``: ``ran`` maps the names the ledger knows
    to their recorded parameters (``pipeline.worker.ledger.ran_statistics``)."""
    stats = [resolved(s, ran.get(s.name)) for s in cfg.statistics]
    return cfg.model_copy(update={"statistics": stats})


def implementation(stat: StatisticConfig, cfg: PipelineConfig) -> ModuleType:
    """The module that implements ``stat`` under the pipeline's settings."""
    return REGISTRY[stat.kind].module_for(stat, cfg)


def statistic_for(stat: StatisticConfig, cfg: PipelineConfig) -> Statistic:
    """``stat`` as both stages run it (a mechanism not named: a new statistic's unless
    the config was resolved against the ledger first, ``with_mechanisms``)."""
    stat = resolved(stat)
    statistic: Statistic = implementation(stat, cfg).make_statistic(stat, cfg)
    return statistic


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (its cost is the privacy statement's)."""
    stat = resolved(stat)
    line: str = implementation(stat, cfg).describe(stat, cfg)
    return line


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What shapes ``stat`` beyond its config (``identity.py``): the mechanism as resolved,
    its algorithms' versions, what else its kind depends on."""
    stat = resolved(stat)
    found: dict[str, object] = implementation(stat, cfg).identity(stat, cfg)
    return found


def value_rule(stat: StatisticConfig) -> ValueRule:
    """What ``stat`` needs of the events it counts: count ignores values; the other kinds
    need a finite one, clipped into their bounds (a sum's [lower, upper] or [0, max_value],
    a histogram's or kselect's bins [1, R], a mean's or cell mean's [lower, upper]); a
    distinct count uses values as they are; cell_mean needs the cell attribute (in
    ``cells.keys`` when that is given)."""
    cells, mean = stat.cells, stat.mean
    bounds: tuple[float, float] | None = None
    if stat.bins is not None:
        bounds = (1.0, float(stat.bins))
    elif stat.max_value is not None or stat.upper is not None:
        bounds = stat.value_bounds
    elif mean is not None:
        bounds = (mean.lower, mean.upper)
    elif cells is not None:
        bounds = (cells.lower, cells.upper)
    return ValueRule(
        stat.name,
        stat.key,
        KINDS[stat.kind].needs_value,
        stat.max_value if stat.max_value is not None else stat.bins,
        stat.deletions,
        cell_field=None if cells is None else cells.field,
        cell_keys=None if cells is None or cells.keys is None else frozenset(cells.keys),
        bounds=bounds,
        value_path=stat.value_field,
        where=None if stat.where is None else where_of(stat.where),
    )


def where_of(where: Mapping[str, object]) -> Where:
    """A ``where`` as the checks compare it (``events.Where``): sorted by path, each
    field's values as ``scalar_tag``s."""
    return tuple(
        (path, frozenset(filter(None, map(scalar_tag, v if isinstance(v, list) else [v]))))
        for path, v in sorted(where.items())
    )
