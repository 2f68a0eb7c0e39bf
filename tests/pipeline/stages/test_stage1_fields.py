"""Stage 1 with value fields and filters (``value_field``, ``where``): each statistic
sees the events it selects with its own field as their value; one source event counted by
several statistics is one source position. Zero noise, through the worker's code
(``replay``)."""

from __future__ import annotations

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.tools.replay import replay

PURCHASE = {"event_type": "purchase"}
STATISTICS = [
    {"name": "views", "epsilon": 1, "tau": 4, "where": {"event_type": "page_view"}},
    {"name": "purchases", "epsilon": 1, "tau": 4, "where": PURCHASE},
    {
        "name": "revenue",
        "epsilon": 1,
        "kind": "sum",
        "tau": 3,
        "upper": 200,
        "resolution": 20000,
        "value_field": "order.amount",
        "where": PURCHASE,
    },
    {
        "name": "basket",
        "epsilon": 1,
        "kind": "mean",
        "value_field": "order.amount",
        "where": PURCHASE,
        "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4, "resolution": 20000},
    },
    {
        "name": "items",
        "epsilon": 1,
        "kind": "histogram",
        "bins": 4,
        "value_field": "order.items",
        "where": PURCHASE,
    },
]


def released(events: list[dict], rejected: list) -> dict[str, dict]:
    cfg = parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 5},
            "statistics": STATISTICS,
        }
    )
    lines = [orjson.dumps(e) for e in events] + [b'{"tick": 0}']
    return {r["statistic"]: r for r in replay(cfg, lines, ZeroNoise(), rejected)}


def test_one_purchase_feeds_a_count_a_sum_a_mean_and_a_histogram_of_its_own_fields():
    events = [
        {"user_id": "a", "event_type": "page_view"},
        {"user_id": "a", "event_type": "page_view", "order": {"amount": 99}},  # not a purchase
        {"user_id": "a", "event_type": "purchase", "order": {"amount": 19.99, "items": 2}},
        {"user_id": "b", "event_type": "purchase", "order": {"amount": "n/a", "items": 9}},
        {"user_id": "b", "event_type": "purchase", "order": {"amount": 250}},  # no items
        {"user_id": "c", "event_type": "signup"},  # nobody's
    ]
    rejected: list = []
    out = released(events, rejected)
    assert [reason for _, _, reason in rejected] == ["no statistic's where matches"]
    assert out["views"]["value"] == 2
    assert out["purchases"]["value"] == 3
    assert out["revenue"]["value"] == 219.99  # 19.99 + 250 clipped to 200
    assert out["basket"]["value"] == pytest.approx((19.99 + 200) / 2)
    assert out["basket"]["samples"] == 2
    # a's 2 items in bin 2, b's 9 clipped into bin 4 (each user's 1 unit is below the
    # tracked bound, 64: zero noise releases the exact bins).
    assert out["items"]["values"] == [0, 1, 0, 1]
