"""Kinds count and sum with a fixed tau (statistics/fixed_tau.py): real values on a grid,
clipped into [lower, upper], a user's first tau events kept; worked examples with zero
noise through the worker's code (``replay``)."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.tools.replay import replay
from dpstream.statistics import fixed_tau, identity
from dpstream.statistics.registry import resolved

REVENUE = {
    "name": "revenue",
    "kind": "sum",
    "epsilon": 1.0,
    "tau": 3,
    "lower": 0,
    "upper": 200,
    "resolution": 20000,  # a 0.01 grid
    "key": "buy",
}


def pipeline(*statistics: dict):
    return parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": float(len(statistics))},
            "statistics": list(statistics),
        }
    )


def released(cfg, events: list[dict], rejected: list | None = None) -> dict[str, dict]:
    """Each statistic's release at tick 0 of ``events``, by name."""
    lines = [orjson.dumps(e) for e in events] + [b'{"tick": 0}']
    return {r["statistic"]: r for r in replay(cfg, lines, ZeroNoise(), rejected)}


def cents(value: float) -> int:
    """``value`` in whole cents, ties upward, from its exact binary value (not the grid's
    code: Decimal's)."""
    return int((Decimal(value) * 100).to_integral_value(rounding=ROUND_HALF_UP))


def test_a_float_sum_is_the_snapped_sum_of_each_users_first_tau_events_clipped():
    a = [19.99, 250.0, 0.004, 5.005, 7.0]  # 250 clipped to 200; the last two past tau 3
    b = [10.015, -3.0]  # -3 clipped to 0
    events = [{"user_id": "a", "key": "buy", "value": v} for v in a]
    events += [{"user_id": "b", "key": "buy", "value": v} for v in b]
    release = released(pipeline(REVENUE), events)["revenue"]
    exact = sum(cents(min(max(v, 0.0), 200.0)) for v in a[:3] + b[:3])
    # 10.015 is 10.0150000000000005684... as a double: 1002 cents.
    assert exact == 1999 + 20000 + 0 + 1002 + 0
    assert release["value"] == exact / 100 == 230.01
    assert release["grid_step"] == 0.01 and release["tau"] == 3


def test_the_sensitivity_is_tau_times_the_largest_bound_in_grid_units():
    cfg = pipeline(REVENUE, {**REVENUE, "name": "net", "lower": -500, "upper": 200})
    revenue, net = (fixed_tau.make_statistic(resolved(s), cfg) for s in cfg.statistics)
    assert revenue.spec.sensitivity == 3 * 20000  # 200 / 0.01
    # [-500, 200] in 20000 units: a 0.035 grid; |-500| is 14286 units (14285.71 rounded).
    assert net.spec.sensitivity == 3 * 14286


def test_a_sum_with_a_negative_lower_bound_releases_the_signed_sum():
    refunds = {**REVENUE, "name": "net", "lower": -50, "upper": 50, "resolution": 100, "tau": 2}
    events = [
        {"user_id": "u", "key": "buy", "value": -80.0},  # clipped to -50
        {"user_id": "u", "key": "buy", "value": 30.0},
        {"user_id": "u", "key": "buy", "value": 10.0},  # u's third: past tau 2
        {"user_id": "v", "key": "buy", "value": -20.4},  # the nearest unit: -20
    ]
    assert released(pipeline(refunds), events)["net"]["value"] == -50 + 30 - 20


def test_a_purchase_feeds_a_count_a_sum_and_a_mean_and_a_bad_amount_only_fails_the_sum():
    purchases = {"name": "purchases", "epsilon": 1.0, "tau": 4, "key": "buy"}
    basket = {
        "name": "basket",
        "kind": "mean",
        "epsilon": 1.0,
        "key": "buy",
        "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4, "resolution": 20000},
    }
    cfg = pipeline(purchases, REVENUE, basket)
    events = [
        {"user_id": "a", "key": "buy", "value": 19.99},
        {"user_id": "a", "key": "buy", "value": "12,50"},  # not a number: the count's only
        {"user_id": "b", "key": "buy", "value": 250},  # clipped to 200
    ]
    rejected: list = []
    out = released(cfg, events, rejected)
    assert rejected == []
    assert out["purchases"]["value"] == 3
    assert out["revenue"]["value"] == 219.99
    assert out["basket"]["value"] == pytest.approx((19.99 + 200) / 2)
    assert out["basket"]["samples"] == 2


def test_an_event_no_statistic_can_use_is_dead_lettered_naming_them():
    basket = {
        "name": "basket",
        "kind": "mean",
        "epsilon": 1.0,
        "key": "buy",
        "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4},
    }
    rejected: list = []
    released(pipeline(REVENUE, basket), [{"user_id": "a", "key": "buy"}], rejected)
    assert [reason for _, _, reason in rejected] == ["missing value (statistics revenue, basket)"]


def test_the_old_form_keeps_its_fingerprint():
    """``max_value``, ``key``: the fingerprints before real values and grids (the ledger
    refuses a statistic whose fingerprint changed under its name), for statistics that ran
    the binary tree before a statistic naming no mechanism got the least-error one."""
    cfg = parse_config(
        {
            "app_id": "shop",
            "privacy": {"total_epsilon": 3},
            "statistics": [
                {"name": "views", "epsilon": 1, "tau": 4, "key": "view"},
                {
                    "name": "revenue",
                    "epsilon": 1,
                    "kind": "sum",
                    "tau": 10,
                    "max_value": 200,
                    "key": "buy",
                },
                {
                    "name": "basket",
                    "epsilon": 1,
                    "kind": "mean",
                    "key": "buy",
                    "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4},
                },
            ],
        }
    )
    ran = {"mechanism": "binary"}
    assert [identity.fingerprint(resolved(s, ran), cfg) for s in cfg.statistics] == [
        "234aedfbb770eb126621127be4d10a91",
        "56031c97a18ab7a52c78a8b4d390f96f",
        "d59031ad0005b98f37ad4a1111716d12",
    ]


def test_bounds_grid_value_field_and_filter_are_part_of_the_identity():
    cfg = pipeline(REVENUE)
    (stat,) = cfg.statistics
    fingerprints = {identity.fingerprint(stat, cfg)}
    changes = [
        {"upper": 300},
        {"lower": -10},
        {"resolution": 2000},
        {"value_field": "order.total"},
        {"where": {"event_type": "purchase"}},
        {"where": {"event_type": ["purchase", "refund"]}},
    ]
    for change in changes:
        other = pipeline({**REVENUE, **change})
        fingerprints.add(identity.fingerprint(other.statistics[0], other))
    assert len(fingerprints) == 1 + len(changes)
    # The default value field spelled out is the same statistic.
    spelled = pipeline({**REVENUE, "value_field": "value"})
    assert identity.fingerprint(spelled.statistics[0], spelled) == identity.fingerprint(stat, cfg)


def test_a_grid_sum_is_shown_never_below_0_only_when_no_value_can_be_negative():
    cfg = pipeline(REVENUE, {**REVENUE, "name": "net", "lower": -50, "upper": 50})
    revenue, net = cfg.statistics
    assert fixed_tau.least_value(revenue) == 0
    assert fixed_tau.least_value(net) is None
    assert fixed_tau.unit_of(revenue) == "the value's own units"


def test_a_grid_sums_plan_is_in_the_values_units():
    cfg = pipeline(REVENUE)
    (stat,) = cfg.statistics
    grid_units = fixed_tau.make_statistic(resolved(stat), cfg)
    (name, stds), *_ = grid_units.accuracy([10]).rows
    assert stds[0] == grid_units.module.std(grid_units.spec, 10) * 0.01
