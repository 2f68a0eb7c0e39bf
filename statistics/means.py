"""kind mean, glue only: its two modes, chosen by the pipeline's ``privacy.public_counts``.

* Default: the whole-user mean (``operators.whole_user_mean``), which flows like a sum
  with a fixed tau. Stage 1 (``pipeline.counting``) keeps each user's sample count and
  adds, per kept sample, 1 sample and its grid units to the tick's weights
  (``weight_keys.MEAN_SAMPLES``, ``MEAN_UNITS``); stage 2 steps the two counters
  (``WholeUserMeanStatistic``).
* ``public_counts: true``: George et al.'s continual mean (``operators.continual_mean``)
  with per-user state (``ContinualMeanStatistic``): states to and from JSON, the
  partition's users handed over in rank order. Stage 1 keeps each user's ``UserState``
  in the user's entry and the partition's ``PartitionState`` in the partition state; at
  a marker it sends the partition's ``TickMessage``; stage 2 merges the partitions'
  messages and steps the ``MeanState``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpstream.config.schema import PipelineConfig, StatisticConfig
from dpstream.operators import accounting, state_codec
from dpstream.operators.means import continual_mean as cm
from dpstream.operators.means import whole_user_mean as wum
from dpstream.operators.noise import NoiseSource, interval, snapping
from dpstream.operators.selection import private_median
from dpstream.operators.state_codec import from_json, to_json
from dpstream.operators.trees import binary_mechanism, tree_counter

from .contract import Report, Step, WeightsStage2, own_caps
from .counting import UnitCounting
from .events import Event
from .weights import MEAN_SAMPLES, MEAN_UNITS


def whole_user_mean_spec(stat: StatisticConfig, cfg: PipelineConfig) -> wum.WholeUserMeanSpec:
    """The operator spec of a default ``kind: mean`` (stage 1 and stage 2 share it)."""
    mean = stat.mean
    assert mean is not None
    return wum.make_whole_user_mean(
        Fraction(repr(stat.epsilon)),  # the decimal the user wrote
        mean.max_samples_per_user,
        Fraction(repr(mean.lower)),
        Fraction(repr(mean.upper)),
        mean.resolution,
        (stat.name, 0),
        accounting.sensitivity_multiplier(cfg.privacy.neighbours.value),
    )


@dataclass(frozen=True)
class WholeUserMeanStatistic(WeightsStage2):
    """A default ``kind: mean``: stage 1 counts each user's first m samples like a sum,
    stage 2 steps the two counters once per tick (no exact data-dependent number among
    the release's fields)."""

    name: str
    spec: wum.WholeUserMeanSpec
    counting: UnitCounting
    mechanism: str = wum.MECHANISM
    neighbours: str | None = None

    @classmethod
    def of(cls, stat: StatisticConfig, cfg: PipelineConfig) -> WholeUserMeanStatistic:
        spec = whole_user_mean_spec(stat, cfg)
        return cls(stat.name, spec, UnitCounting(stat.name, stat.key, stat.kind, None, False, spec))

    def step(self, state_json: Any, pending: Any, tick: int, noise: NoiseSource) -> Step:
        spec, weights = self.spec, pending or {}
        state = (
            wum.init(spec)
            if state_json is None
            else state_codec.from_json(wum.WholeUserMeanState, state_json)
        )
        samples, units = weights.get(MEAN_SAMPLES, 0), weights.get(MEAN_UNITS, 0)
        state, rel = wum.step(spec, state, samples, units, noise)
        count = rel.samples
        fields = {
            "step": rel.t,
            "value": rel.value,  # None while the noisy count is below 1
            "std": rel.std,
            "interval": rel.interval,
            "samples": count.value,  # noisy
            "samples_std": count.std,
            "samples_interval": interval(count.value, count.ci95),
            "max_samples_per_user": spec.max_samples,
            "bounds": [float(spec.lower), float(spec.upper)],
        }
        return Step(state_codec.to_json(state), (fields,))

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        spec = self.spec
        start = {
            "note": (
                "whole-user mean over the whole infinite stream: a kept-samples counter "
                "and a grid-units counter at epsilon/2 each (basic composition)"
            ),
            "split": {
                "samples": float(spec.samples.epsilon),
                "units": float(spec.units.epsilon),
            },
            "sensitivities": [spec.samples.sensitivity, spec.units.sensitivity],
            "max_samples_per_user": spec.max_samples,
            "resolution": spec.resolution,
        }
        return own_caps(entry, start)


@dataclass(frozen=True, slots=True)
class MeanRedo:
    """What one record did to the partition's state, to do again (``Statistic.redo``):
    whether it admitted the user, and its samples' effects. Stored as JSON in the user's
    entry; ``to_json``/``from_json`` are the only code that knows that form."""

    admitted: bool
    effects: tuple[cm.SampleEffect, ...]

    def to_json(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "effects": [to_json(e) for e in self.effects]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeanRedo:
        effects = tuple(from_json(cm.SampleEffect, e) for e in data["effects"])
        return cls(data["admitted"], effects)


@dataclass(frozen=True)
class ContinualMeanStatistic:
    """A ``kind: mean`` statistic under ``public_counts: true`` (George et al.), with
    per-user state (``pipeline.statistic.Statistic``)."""

    name: str
    key: str | None
    spec: cm.ContinualMeanSpec
    mechanism: str = cm.MECHANISM
    # George et al.'s neighbours: one user's samples change, the arrival pattern (who sent a
    # sample when) is public. Stated on every release instead of the pipeline's setting.
    neighbours: str = "user_values_same_arrivals"
    counting: None = None

    @classmethod
    def of(cls, stat: StatisticConfig, cfg: PipelineConfig) -> ContinualMeanStatistic:
        mean = stat.mean
        assert mean is not None
        if mean.max_users is None:  # PipelineConfig requires it with public_counts
            raise ValueError(
                f"{stat.name}: mean.max_users: required with privacy.public_counts: true"
            )
        spec = cm.make_continual_mean(
            Fraction(repr(stat.epsilon)),
            mean.delta,
            mean.max_users,
            mean.max_samples_per_user,
            lower=Fraction(repr(mean.lower)),
            upper=Fraction(repr(mean.upper)),
            resolution=mean.resolution,
            partitions=cfg.input.partitions,
            node_prefix=(stat.name, 0),
        )
        return cls(stat.name, stat.key, spec)

    def counts(self, event: Event) -> bool:
        return not event.delete and (self.key is None or event.key == self.key)

    def _partition(self, pstate: Any, partition: int) -> cm.PartitionState:
        if pstate is None:
            return cm.init_partition(self.spec, partition)
        return from_json(cm.PartitionState, pstate)

    def apply(
        self, pstate: Any, ustate: Any, events: list[Event], partition: int
    ) -> tuple[Any, Any, Any]:
        part = self._partition(pstate, partition)
        admitted = ustate is None
        if admitted:
            part, user = cm.admit(self.spec, part)
        else:
            user = from_json(cm.UserState, ustate)
        effects = []
        for event in events:
            user, effect = cm.observe(self.spec, part, user, event.value)  # type: ignore[arg-type]
            effects.append(effect)
        part = cm.absorb(self.spec, part, effects)
        return to_json(part), to_json(user), MeanRedo(admitted, tuple(effects)).to_json()

    def redo(self, pstate: Any, redo: Any, partition: int) -> Any:
        part = self._partition(pstate, partition)
        record = MeanRedo.from_json(redo)
        if record.admitted:
            part, _ = cm.admit(self.spec, part)
        return to_json(cm.absorb(self.spec, part, record.effects))

    def scan_order(self, pstate: Any, ustate: Any) -> int | None:
        """The user's admission rank: a median histogram packs the admitted users' samples
        in rank order (``continual_mean.median_histograms``); None for a user over the cap."""
        rank: int = ustate["rank"]  # state_codec's form of a UserState: its fields by name
        return rank if rank >= 0 else None

    def close_tick(
        self, pstate: Any, partition: int, from_tick: int, tick: int, users: Any
    ) -> tuple[Any, Any]:
        def by_rank() -> Iterable[cm.UserState]:
            states = (from_json(cm.UserState, s) for _, s in users())
            return sorted((u for u in states if u.rank >= 0), key=lambda u: u.rank)

        part, msg = cm.close_tick(self.spec, self._partition(pstate, partition), by_rank)
        empty = msg == cm.empty_message(self.spec)
        return to_json(part), None if empty else to_json(msg)

    def parts(self, report: Report) -> list[tuple[int, Any]]:
        return [] if report.payload is None else [(report.tick, report.payload)]

    def merge(self, a: Any, b: Any) -> Any:
        return to_json(cm.merge(from_json(cm.TickMessage, a), from_json(cm.TickMessage, b)))

    def step(self, sstate: Any, payload: Any, tick: int, noise: NoiseSource) -> Step:
        state = cm.init(self.spec) if sstate is None else from_json(cm.MeanState, sstate)
        msg = cm.empty_message(self.spec) if payload is None else from_json(cm.TickMessage, payload)
        state, rel = cm.step(self.spec, state, msg, noise)
        fields = {
            "step": rel.t,
            "value": rel.value,
            "std": rel.std,
            # Around the exact mean of the covered samples (noise only) ...
            "interval": interval(rel.value, rel.ci95),
            # ... and around the population mean (noise, sampling and snapping).
            "mean_interval": interval(rel.value, rel.mean_ci95),
            "samples_covered": rel.total,
            "samples": rel.samples,
            "samples_over_cap": rel.dropped,
            "users": state.users,
            "users_over_cap": state.users_over_cap,
            "active_levels": rel.active,
            "medians": [[level, value] for level, value in rel.medians],
            "bounds": [float(self.spec.lower), float(self.spec.upper)],
        }
        return Step(to_json(state), (fields,))

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        split = cm.privacy_budget(self.spec)
        start = {
            "neighbours": self.neighbours,
            "note": (
                "George et al. Alg. 6 over the whole stream: medians and binary mechanisms "
                "by basic composition, at most epsilon"
            ),
            "split": {name: float(value) for name, value in split.items()},
            "max_users": self.spec.n,
            "max_samples_per_user": self.spec.m,
        }
        return own_caps(entry, start)


def make_statistic(
    stat: StatisticConfig, cfg: PipelineConfig
) -> ContinualMeanStatistic | WholeUserMeanStatistic:
    """kind mean: George et al.'s continual mean when the pipeline's counts are public
    (``privacy.public_counts: true``), else the whole-user mean."""
    if cfg.privacy.public_counts:
        return ContinualMeanStatistic.of(stat, cfg)
    return WholeUserMeanStatistic.of(stat, cfg)


def algorithm(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism and its algorithms' versions."""
    if cfg.privacy.public_counts:
        modules = [cm, private_median, binary_mechanism]
    else:
        modules = [wum, snapping, tree_counter]
    return {
        "mechanism": make_statistic(stat, cfg).mechanism,
        "versions": {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules},
    }


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What a mean computes, in one line (``dpstream check-config``)."""
    m = stat.mean
    assert m is not None
    if not cfg.privacy.public_counts:
        return (
            f"whole-user mean of values in [{m.lower:g}, {m.upper:g}] on {m.resolution} grid "
            f"units, epsilon={stat.epsilon:g} (half to the noisy count of kept samples, half to "
            f"their noisy sum), each user's first {m.max_samples_per_user} samples; releases "
            "no exact count"
        )
    return (
        f"continual mean (George et al., Alg. 6) of values in [{m.lower:g}, {m.upper:g}], "
        f"epsilon={stat.epsilon:g}, at most {m.max_users} users x {m.max_samples_per_user} "
        "samples"
    )
