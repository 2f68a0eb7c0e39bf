"""Kind mean, the default (``privacy.public_counts: false``): the whole-user mean
(``operators.means.whole_user_mean``), which flows like a sum with a fixed bound.

Stage 1 keeps each user's sample count and adds, for each of the user's first m samples,
1 sample and its grid units to the tick's weights (``MeanBounding``; keys
``weights.MEAN_SAMPLES``, ``MEAN_UNITS``); stage 2 steps the two tree counters (kept
samples and their units, epsilon / 2 each) and releases the noisy sum over the noisy
count: every number in the release is noised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators import accounting, state_codec
from dpstream.operators.means import whole_user_mean as wum
from dpstream.operators.noise import NoiseSource, interval, snapping
from dpstream.operators.trees import tree_counter

from .bounding import UnitBounding
from .contract import MEAN_COVERS, Accuracy, Step, WeightsStage2, own_caps
from .events import Event
from .releases import WholeUserMeanFields
from .weights import MEAN_SAMPLES, MEAN_UNITS

RELEASE_FIELDS = WholeUserMeanFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


@dataclass(frozen=True, slots=True)
class MeanBounding(UnitBounding):
    """Each sample is one unit of its user (units count samples); one of the user's first
    m gives 1 kept sample and its grid units, clipped and snapped (``wum.admit``)."""

    spec: wum.WholeUserMeanSpec | None = None

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        assert self.spec is not None and event.value is not None  # stage 1 checked the value
        samples, units = wum.admit(self.spec, used, event.value)
        return 1, {k: v for k, v in ((MEAN_SAMPLES, samples), (MEAN_UNITS, units)) if v}


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
    bounding: MeanBounding
    mechanism: str = wum.MECHANISM
    neighbours: str | None = None
    lifetime_steps: int | None = None
    tree: tuple[str, int] = ("binary", 2)  # both counters
    interval_of: str = "clipped"

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

    def accuracy(self, ticks: Sequence[int]) -> Accuracy:
        """Nothing planned: a mean's std depends on how many samples it covers (data)."""
        return Accuracy("value", (), MEAN_COVERS)

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


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> WholeUserMeanStatistic:
    """The whole-user mean of ``stat``."""
    spec = whole_user_mean_spec(stat, cfg)
    return WholeUserMeanStatistic(stat.name, spec, MeanBounding(stat.name, stat.key, False, spec))


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What shapes ``stat`` beyond its config, for its fingerprint: its mechanism, the
    sensitivities of its two counters, and its algorithms' versions."""
    spec = whole_user_mean_spec(stat, cfg)
    modules = [wum, snapping, tree_counter]
    versions = {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}
    return {
        "mechanism": wum.MECHANISM,
        "sensitivities": [spec.samples.sensitivity, spec.units.sensitivity],
        "algorithm": {"mechanism": wum.MECHANISM, "versions": versions},
    }


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What ``stat`` computes, in one line (``dpstream check-config``)."""
    m = stat.mean
    assert m is not None
    return (
        f"whole-user mean of values in [{m.lower:g}, {m.upper:g}] on {m.resolution} grid "
        f"units, epsilon={stat.epsilon:g} (half to the noisy count of kept samples, half to "
        f"their noisy sum), each user's first {m.max_samples_per_user} samples; releases "
        "no exact count"
    )
