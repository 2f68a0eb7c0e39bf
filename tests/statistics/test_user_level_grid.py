"""Kinds count and sum with tau: auto (statistics/user_level.py): a sum's real values in
grid units by rank band, released in the user's units."""

from __future__ import annotations

import orjson

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.tools.replay import replay
from dpstream.statistics.bounding import GridSumBounding
from dpstream.statistics.registry import statistic_for


def test_a_tau_auto_sum_counts_grid_units_and_releases_user_units():
    cfg = parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 1},
            "statistics": [
                {"name": "s", "kind": "sum", "epsilon": 1, "upper": 10, "resolution": 1000}
            ],
        }
    )
    (stat,) = cfg.statistics
    bounding = statistic_for(stat, cfg).bounding
    assert isinstance(bounding, GridSumBounding) and bounding.tau is None
    # 1.25 is 125 units of 0.01 (by rank band, Alg. 5); 12 is clipped to 10: 1000 units.
    _, weights = bounding.contribution("+", 0, _event(1.25))
    assert sum(n for k, n in weights.items() if k.startswith("+b")) == 125
    assert bounding.contribution("+", 0, _event(12.0))[0] == 1000
    lines = [orjson.dumps({"user_id": f"u{i}", "value": 1.25}) for i in range(3)]
    (release,) = replay(cfg, [*lines, b'{"tick": 0}'], ZeroNoise())
    assert release["grid_step"] == 0.01
    cents = release["value"] * 100
    assert cents == round(cents) and 0 <= release["value"] <= 3 * 1.25


def _event(value: float):
    from dpstream.statistics.events import Event

    return Event("u", None, value)
