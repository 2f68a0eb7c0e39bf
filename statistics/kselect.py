"""Kind kselect (``tau: auto``): the rank-th largest value in [1, R] (max, median or an
integer k), Dong-Luo-Yi Alg. 6 over their user-level histograms.

Stage 1 counts each user's events like a histogram's (``histogram.HistogramBounding``: the
algorithm runs on the histograms); stage 2 steps ``operators.user_level.k_selection``. By
default the threshold is k + Delta (full Delta), so that the released value is never
above the true k-th with probability at least 1 - beta; ``halve_margin`` opts into
k + Delta/2 (Appendix C-A), and each release says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators import accounting
from dpstream.operators.noise import NoiseSource
from dpstream.operators.user_level import k_selection

from .histogram import HistogramBounding
from .releases import KSelectFields
from .user_level import UserLevelState, UserLevelStatistic, post_processing, versions
from .user_level import describe as describe
from .weights import INSERTS, parse_weights

RELEASE_FIELDS = KSelectFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


@dataclass(frozen=True)
class KSelectStatistic(UserLevelStatistic):
    """A tau: auto k-selection."""

    @property
    def bounding(self) -> HistogramBounding:
        stat = self.stat
        return HistogramBounding(stat.name, stat.key, stat.deletions, bins=self.spec.domain)

    def advance(
        self, op_state: Any, weights: dict[str, int], old: UserLevelState, noise: NoiseSource
    ) -> tuple[Any, Any, dict[str, int] | None]:
        bands, crossings = parse_weights(weights, INSERTS)
        op_state, rel = k_selection.step(self.spec, op_state, bands, crossings, noise)
        return op_state, rel, None

    def values(
        self, rel: Any, previous: list[int] | None
    ) -> tuple[dict[str, Any], list[int] | None]:
        full = self.spec.delta_factor == 1
        own = {
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
        return own, None  # a rank, not a count: nothing to floor or settle

    def planned_std(self, t: int, instance: int, tau: int) -> float | None:
        return None  # a one-way bound with its margin, no std


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> KSelectStatistic:
    """A tau: auto k-selection (Dong-Luo-Yi Alg. 6)."""
    eps, beta, theta = (Fraction(repr(x)) for x in (stat.epsilon, stat.beta, stat.theta))
    named: dict[object, dict[str, Any]] = {"max": {"k": 1}, "median": {"quantile": Fraction(1, 2)}}
    if stat.bins is None:  # the config schema requires it of a kselect
        raise ValueError("bins: required for kind kselect")
    # Chernoff: the guaranteed bound of S(r)'s actual noise; eq. (3) is far looser.
    spec = k_selection.make_k_selection(
        stat.name,
        stat.bins,
        eps,
        beta,
        theta,
        delta_mode="chernoff",
        halve_delta=stat.halve_margin,
        any_subset=accounting.sensitivity_multiplier(cfg.privacy.neighbours.value) == 2,
        practical=stat.practical,
        practical_instances=stat.practical_instances,
        **named.get(stat.rank, {"k": stat.rank}),
    )
    return KSelectStatistic(
        stat,
        k_selection,
        spec,
        k_selection.KSelectionState,
        "k_selection",
        **post_processing(stat, cfg),
        interval_of="none",
    )


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism and its algorithms' versions."""
    return {"algorithm": {"mechanism": make_statistic(stat, cfg).mechanism, "versions": versions()}}
