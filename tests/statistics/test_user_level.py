"""tau: auto statistics' releases (statistics/user_level.py, histogram.py, distinct.py):
post-processed like a fixed-tau count's (never below 0, the unbiased estimate kept beside),
and the accuracy plan at a given tracked bound from the operator's exact std."""

from __future__ import annotations

import orjson

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise, ZeroNoise
from dpstream.operators.user_level import counter as ul
from dpstream.pipeline.tools.replay import replay
from dpstream.statistics.registry import statistic_for

KEY = bytes(range(32))
TREE = {"name": "kary_subtract", "k": 13}
STATS = [
    {"name": "count", "epsilon": 1.0, "tau": "auto"},
    {"name": "hist", "kind": "histogram", "epsilon": 1.0, "tau": "auto", "bins": 4},
    {"name": "distinct", "kind": "distinct", "epsilon": 1.0, "tau": "auto"},
]


def config(mode: str = "keyed", **named):
    """The three statistics, count and histogram with ``named`` (e.g. a mechanism)."""
    noise = {"mode": mode} if mode != "keyed" else {"mode": "keyed", "key_env": "X"}
    stats = [{**s, **named} if s["name"] != "distinct" else s for s in STATS]
    return parse_config({"noise": noise, "privacy": {"total_epsilon": 10.0}, "statistics": stats})


def log(ticks: int) -> list[bytes]:
    """A few users' events in the first ticks, then quiet ticks."""
    lines = []
    for tick in range(ticks):
        if tick < 3:
            for u in range(5):
                event = {"user_id": f"u{u}", "value": 1 + u % 4}
                lines.append(orjson.dumps(event))
        lines.append(orjson.dumps({"tick": tick}))
    return lines


def by_name(releases):
    out: dict[str, list[dict]] = {}
    for r in releases:
        out.setdefault(r["statistic"], []).append(r)
    return out


def test_tau_auto_releases_are_never_below_zero_and_keep_the_unbiased_estimate():
    out = by_name(replay(config(), log(60), KeyedNoise(KEY)))
    for name in ("count", "distinct"):
        assert len(out[name]) == 60
        assert any(r["unbiased"] < 0 for r in out[name])  # what the floor is for
        for r in out[name]:
            assert r["value"] >= 0 and r["interval"][0] >= 0
            assert r["interval"][0] <= r["value"] <= r["interval"][1]
            assert abs(r["value"] - r["unbiased"]) <= r["std"] or r["value"] == 0
            assert r["interval_of"] == "truncated"
            # New statistics naming no mechanism: count's instances run the default tree;
            # distinct runs only the binary tree (registry.default_tree).
            tree = {"name": "binary", "k": 2} if name == "distinct" else TREE
            assert r["tree"] == tree
    for r in out["hist"]:
        assert all(v >= 0 for v in r["values"]) and len(r["unbiased_values"]) == 4
        assert all(
            lo >= 0 and lo <= v <= hi
            for v, (lo, hi) in zip(r["values"], r["intervals"], strict=True)
        )
        assert r["max_frequency"] == max(r["values"])


def test_zero_noise_releases_show_the_exact_values_on_either_tree():
    out = by_name(replay(config("insecure_zero"), log(5), ZeroNoise()))
    assert all(r["value"] == r["unbiased"] for r in out["count"] + out["distinct"])
    assert all(r["values"] == r["unbiased_values"] for r in out["hist"])
    assert {r["tree"]["name"] for r in out["count"] + out["hist"]} == {"kary_subtract"}
    # The same truncated values as on the binary tree (the tree only changes the noise).
    binary = by_name(replay(config("insecure_zero", mechanism="binary"), log(5), ZeroNoise()))
    assert {r["tree"]["name"] for r in binary["count"] + binary["hist"]} == {"binary"}
    for name, field in (("count", "value"), ("hist", "values")):
        assert [r[field] for r in out[name]] == [r[field] for r in binary[name]]
        assert [r["tau"] for r in out[name]] == [r["tau"] for r in binary[name]]


def test_the_plan_is_the_exact_std_at_each_tracked_bound():
    cfg = config()
    statistic = statistic_for(cfg.statistics[0], cfg)
    plan = statistic.accuracy((10, 1000))
    first_bound = plan.rows[0]
    assert first_bound[0].startswith("if tau~ = ")
    tau = int(first_bound[0].split("= ")[1].split(" ")[0])
    assert first_bound[1] == tuple(ul.release_std(statistic.spec, t, 1, tau) for t in (10, 1000))
    # Larger bounds are reached at later instances, with less epsilon: larger stds.
    stds = [row[1][0] for row in plan.rows]
    assert stds == sorted(stds) and stds[0] > 0
    assert "tau~" in plan.covers and "truncated" in plan.covers
