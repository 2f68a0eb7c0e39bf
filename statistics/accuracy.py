"""The accuracy plan ``dpstream check-config`` prints: per statistic, the std of a release
at ticks 10, 10^3, 10^5 and at the horizon (where there is one), in the statistic's units,
from the mechanism's exact per-tick variance (``Statistic.accuracy``), with what its
interval covers and its mechanism, accounting and noise as its releases state them
(``releases``). Public parameters only: planning reads no data.
"""

from __future__ import annotations

from dpstream.config.schema import PipelineConfig

from .registry import statistic_for
from .releases import accounting_and_noise

PLANNED_TICKS = (10, 1_000, 100_000)


def planned_ticks(horizon: int | None) -> tuple[int, ...]:
    """The ticks a plan gives the std at: ``PLANNED_TICKS`` and the horizon, if any."""
    return PLANNED_TICKS if horizon is None else (*PLANNED_TICKS, horizon)


def plan_lines(cfg: PipelineConfig) -> list[str]:
    """The plan of every statistic of ``cfg``, as check-config prints it."""
    lines = ["accuracy plan (std of a release at tick t; 95% intervals are about 2-3 std):"]
    for stat in cfg.statistics:
        statistic = statistic_for(stat, cfg)
        ticks = planned_ticks(stat.horizon_ticks)
        accuracy = statistic.accuracy(ticks)
        tree = "" if statistic.tree is None else f", tree {statistic.tree[0]} k={statistic.tree[1]}"
        accounting, noise = accounting_and_noise(stat)
        lines.append(
            f"  {stat.name}: {statistic.mechanism}{tree}, {accounting}, noise {noise}; "
            f"interval of {statistic.interval_of}"
        )
        header = ", ".join(f"t={t:,}" for t in ticks)
        for what, stds in accuracy.rows:
            shown = ", ".join("-" if s is None else f"{s:,.1f}" for s in stds)
            lines.append(f"    std in {accuracy.unit} {what}: {shown}  ({header})")
        lines.append(f"    the interval covers {accuracy.covers}")
    return lines
