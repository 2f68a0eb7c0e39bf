"""The accuracy plan check-config prints (statistics/accuracy.py): per statistic its
mechanism, tree, accounting and noise as its releases state them, and the exact std at
ticks 10, 10^3, 10^5 and the horizon."""

from __future__ import annotations

from dpstream.config.schema import parse_config
from dpstream.operators.trees import kary_tree
from dpstream.statistics.accuracy import plan_lines, planned_ticks
from dpstream.statistics.registry import statistic_for


def test_the_plan_prints_each_statistics_exact_std_and_what_its_interval_covers():
    cfg = parse_config(
        {
            "privacy": {"total_epsilon": 10.0},
            "statistics": [
                {"name": "views", "epsilon": 1.0, "tau": 16},
                {
                    "name": "buys",
                    "kind": "sum",
                    "epsilon": 0.5,
                    "tau": 2,
                    "max_value": 100,
                    "mechanism": "kary_subtract",
                    "k": 5,
                    "horizon_ticks": 4000,
                },
                {"name": "views_auto", "epsilon": 1.0, "tau": "auto"},
                {
                    "name": "latency",
                    "kind": "mean",
                    "epsilon": 1.0,
                    "mean": {"max_samples_per_user": 8},
                },
            ],
        }
    )
    lines = plan_lines(cfg)
    text = "\n".join(lines)
    views, buys = (statistic_for(s, cfg) for s in cfg.statistics[:2])
    stds = ", ".join(f"{kary_tree.std(views.spec, t):,.1f}" for t in (10, 1000, 100_000))
    # No mechanism named, no horizon: a new statistic's default tree (registry.default_tree).
    assert "  views: kary_tree_subtract, tree kary_subtract k=13, pure_dp, noise " in text
    assert f"    std in events release: {stds}  (t=10, t=1,000, t=100,000)" in lines
    assert "each user's first 16 events (the true value can only be larger)" in text
    assert planned_ticks(4000) == (10, 1000, 100_000, 4000)
    stds = ", ".join(f"{kary_tree.std(buys.spec, t):,.1f}" for t in (10, 1000, 100_000, 4000))
    assert (
        f"    std in units of value release: {stds}  (t=10, t=1,000, t=100,000, t=4,000)" in lines
    )
    assert "tree kary_subtract k=5" in text
    assert "    std in events if tau~ = " in text and "tau~ is released with it" in text
    assert "  latency: whole_user_mean, tree binary k=2" in text
    assert "none is planned" in text
