"""Kind mean under ``privacy.public_counts: true``: George et al.'s continual mean
(``operators.means.continual_mean``, Alg. 6), a statistic with per-user state.

Stage 1 keeps each user's ``UserState`` in the user's entry and the partition's
``PartitionState`` in the partition state (their JSON); at a marker it sends the
partition's ``TickMessage``, the users handed over in rank order; stage 2 merges the
partitions' messages and steps the ``MeanState``. Private only when who sent how many
samples when is public: every release says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators.means import continual_mean
from dpstream.operators.noise import NoiseSource, interval
from dpstream.operators.selection import private_median
from dpstream.operators.state_codec import from_json, to_json
from dpstream.operators.trees import binary_mechanism

from .contract import MEAN_COVERS, Accuracy, Report, Step, own_caps
from .events import Event
from .releases import ContinualMeanFields

RELEASE_FIELDS = ContinualMeanFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


@dataclass(frozen=True, slots=True)
class MeanRedo:
    """What one record did to the partition's state, to do again (``Statistic.redo``):
    whether it admitted the user, and its samples' effects. Stored as JSON in the user's
    entry; ``to_json``/``from_json`` are the only code that knows that form."""

    admitted: bool
    effects: tuple[continual_mean.SampleEffect, ...]

    def to_json(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "effects": [to_json(e) for e in self.effects]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeanRedo:
        effects = tuple(from_json(continual_mean.SampleEffect, e) for e in data["effects"])
        return cls(data["admitted"], effects)


@dataclass(frozen=True)
class ContinualMeanStatistic:
    """A ``kind: mean`` statistic under ``public_counts: true`` (George et al.), with
    per-user state (``pipeline.statistic.Statistic``)."""

    name: str
    key: str | None
    spec: continual_mean.ContinualMeanSpec
    mechanism: str = continual_mean.MECHANISM
    # George et al.'s neighbours: one user's samples change, the arrival pattern (who sent a
    # sample when) is public. Stated on every release instead of the pipeline's setting.
    neighbours: str = "user_values_same_arrivals"
    bounding: None = None
    lifetime_steps: int | None = None
    tree: None = None  # per-level binary mechanisms, not one counting tree
    interval_of: str = "clipped"

    @classmethod
    def of(cls, stat: StatisticConfig, cfg: PipelineConfig) -> ContinualMeanStatistic:
        mean = stat.mean
        assert mean is not None
        if mean.max_users is None:  # PipelineConfig requires it with public_counts
            raise ValueError(
                f"{stat.name}: mean.max_users: required with privacy.public_counts: true"
            )
        spec = continual_mean.make_continual_mean(
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
        return (
            not event.delete
            and (self.key is None or event.key == self.key)
            and event.value is not None  # else its rule failure: others may count it
        )

    def _partition(self, pstate: Any, partition: int) -> continual_mean.PartitionState:
        if pstate is None:
            return continual_mean.init_partition(self.spec, partition)
        return from_json(continual_mean.PartitionState, pstate)

    def apply(
        self, pstate: Any, ustate: Any, events: list[Event], partition: int
    ) -> tuple[Any, Any, Any]:
        part = self._partition(pstate, partition)
        admitted = ustate is None
        if admitted:
            part, user = continual_mean.admit(self.spec, part)
        else:
            user = from_json(continual_mean.UserState, ustate)
        effects = []
        for event in events:
            user, effect = continual_mean.observe(self.spec, part, user, event.value)  # type: ignore[arg-type]
            effects.append(effect)
        part = continual_mean.absorb(self.spec, part, effects)
        return to_json(part), to_json(user), MeanRedo(admitted, tuple(effects)).to_json()

    def redo(self, pstate: Any, redo: Any, partition: int) -> Any:
        part = self._partition(pstate, partition)
        record = MeanRedo.from_json(redo)
        if record.admitted:
            part, _ = continual_mean.admit(self.spec, part)
        return to_json(continual_mean.absorb(self.spec, part, record.effects))

    def scan_order(self, pstate: Any, ustate: Any) -> int | None:
        """The user's admission rank: a median histogram packs the admitted users' samples
        in rank order (``continual_mean.median_histograms``); None for a user over the cap."""
        rank: int = ustate["rank"]  # state_codec's form of a UserState: its fields by name
        return rank if rank >= 0 else None

    def close_tick(
        self, pstate: Any, partition: int, from_tick: int, tick: int, users: Any
    ) -> tuple[Any, Any]:
        def by_rank() -> Iterable[continual_mean.UserState]:
            states = (from_json(continual_mean.UserState, s) for _, s in users())
            return sorted((u for u in states if u.rank >= 0), key=lambda u: u.rank)

        part, msg = continual_mean.close_tick(
            self.spec, self._partition(pstate, partition), by_rank
        )
        empty = msg == continual_mean.empty_message(self.spec)
        return to_json(part), None if empty else to_json(msg)

    def parts(self, report: Report) -> list[tuple[int, Any]]:
        return [] if report.payload is None else [(report.tick, report.payload)]

    def merge(self, a: Any, b: Any) -> Any:
        return to_json(
            continual_mean.merge(
                from_json(continual_mean.TickMessage, a), from_json(continual_mean.TickMessage, b)
            )
        )

    def step(self, sstate: Any, payload: Any, tick: int, noise: NoiseSource) -> Step:
        state = (
            continual_mean.init(self.spec)
            if sstate is None
            else from_json(continual_mean.MeanState, sstate)
        )
        msg = (
            continual_mean.empty_message(self.spec)
            if payload is None
            else from_json(continual_mean.TickMessage, payload)
        )
        state, rel = continual_mean.step(self.spec, state, msg, noise)
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

    def accuracy(self, ticks: Sequence[int]) -> Accuracy:
        """Nothing planned: a mean's std depends on how many samples it covers (data)."""
        return Accuracy("value", (), MEAN_COVERS)

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        split = continual_mean.privacy_budget(self.spec)
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


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> ContinualMeanStatistic:
    """George et al.'s continual mean of ``stat``."""
    return ContinualMeanStatistic.of(stat, cfg)


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What shapes ``stat`` beyond its config, for its fingerprint: the partitions (its cap
    on users is split over them), the mechanism and its algorithms' versions."""
    modules = [continual_mean, private_median, binary_mechanism]
    versions = {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}
    return {
        "partitions": cfg.input.partitions,
        "algorithm": {"mechanism": continual_mean.MECHANISM, "versions": versions},
    }


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (``dpstream check-config``)."""
    m = stat.mean
    assert m is not None
    return (
        f"continual mean (George et al., Alg. 6) of values in [{m.lower:g}, {m.upper:g}], "
        f"epsilon={stat.epsilon:g}, at most {m.max_users} users x {m.max_samples_per_user} "
        "samples"
    )
