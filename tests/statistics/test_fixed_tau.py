"""A fixed-tau count or sum's stage 2 (statistics/fixed_tau.py): what its releases show
(post-processed: never below 0, the unbiased estimate kept), the state written before
post-processing still read, and its accuracy plan from the operator's exact std."""

from __future__ import annotations

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise, ZeroNoise, interval
from dpstream.operators.trees import expiring_tree
from dpstream.statistics.fixed_tau import least_value
from dpstream.statistics.registry import statistic_for
from dpstream.statistics.weights import KEPT_UNITS

KEY = bytes(range(32))


def config(stat: dict, mode: str = "keyed"):
    noise = {"mode": mode} if mode != "keyed" else {"mode": "keyed", "key_env": "X"}
    return parse_config(
        {
            "noise": noise,
            "privacy": {"total_epsilon": 10.0},
            "statistics": [{"name": "s", "epsilon": 1.0, "tau": 2, **stat}],
        }
    )


def steps(statistic, weights, noise, state=None):
    out = []
    for tick, w in enumerate(weights):
        step = statistic.step(state, {KEPT_UNITS: w} if w else None, tick, noise)
        state = step.state
        out.append(step.releases[0])
    return out, state


def test_releases_show_a_count_never_below_zero_and_keep_the_unbiased_estimate():
    cfg = config({})
    statistic = statistic_for(cfg.statistics[0], cfg)
    releases, _ = steps(statistic, [1, 0, 0, 2] + [0] * 60, KeyedNoise(KEY))
    # The operator's releases on the same input and noise: the unbiased estimates.
    module, spec = statistic.module, statistic.spec
    state, expected = module.init(spec), []
    for w in [1, 0, 0, 2] + [0] * 60:
        state, rel = module.step(spec, state, w, KeyedNoise(KEY))
        expected.append(rel)
    assert [r["unbiased"] for r in releases] == [rel.value for rel in expected]
    assert any(rel.value < 0 for rel in expected)  # the case the floor is for
    for r, rel in zip(releases, expected, strict=True):
        low, high = interval(rel.value, rel.ci95)
        assert r["value"] >= 0 and r["interval"] == [max(low, 0.0), max(high, 0.0)]
        assert r["interval"][0] <= r["value"] <= r["interval"][1]
        assert abs(r["value"] - rel.value) <= rel.std or r["value"] == 0
        assert r["std"] == rel.std


def test_zero_noise_shows_the_exact_value():
    # With noise.mode insecure_zero no band applies: the exact counts, tick by tick.
    cfg = config({}, mode="insecure_zero")
    releases, _ = steps(statistic_for(cfg.statistics[0], cfg), [1, 0, 3, 0], ZeroNoise())
    assert [(r["value"], r["unbiased"]) for r in releases] == [(1, 1), (1, 1), (4, 4), (4, 4)]


def test_a_state_written_before_post_processing_is_read():
    # Before, the stage-2 state was the operator's state alone: a worker that restarts on
    # it goes on with the same estimates (the value shown starts again from the estimate).
    cfg = config({})
    statistic = statistic_for(cfg.statistics[0], cfg)
    _, wrapped = steps(statistic, [2, 0, 1], KeyedNoise(KEY))
    later_new, _ = steps(statistic, [0, 4], KeyedNoise(KEY), wrapped)
    later_old, _ = steps(statistic, [0, 4], KeyedNoise(KEY), wrapped["operator"])
    assert [r["unbiased"] for r in later_old] == [r["unbiased"] for r in later_new]
    assert later_old[0]["value"] == max(later_old[0]["unbiased"], 0)


def test_the_floor_is_zero_only_where_no_value_is_below_it():
    assert least_value(config({}).statistics[0]) == 0
    assert least_value(config({"kind": "sum", "max_value": 5}).statistics[0]) == 0
    assert least_value(config({"tau": "auto", "deletions": True}).statistics[0]) is None


def test_the_accuracy_plan_is_the_operators_exact_std():
    cfg = config({"mechanism": "expiring", "lambda": 0.5, "horizon_ticks": 500})
    statistic = statistic_for(cfg.statistics[0], cfg)
    plan = statistic.accuracy((10, 500, 1000))
    ((what, stds),) = plan.rows
    assert stds[:2] == tuple(expiring_tree.std(statistic.spec, t) for t in (10, 500))
    assert stds[2] is None  # past the horizon: it releases nothing
    assert plan.unit == "events" and "truncated value" in plan.covers
    cfg = config({"kind": "sum", "max_value": 5})
    statistic = statistic_for(cfg.statistics[0], cfg)
    ((_, stds),) = statistic.accuracy((10,)).rows
    assert stds == (statistic.module.std(statistic.spec, 10),) and stds[0] > 0
    assert statistic.accuracy((10,)).unit == "units of value"
