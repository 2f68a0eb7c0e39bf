"""The soak's pure helpers (bench/soak.py), no broker: the exact truncated count, tick
ends, first copies of re-sent releases, the schedule, the per-life RSS growth."""

from __future__ import annotations

import argparse
from collections import Counter

import orjson
import pytest

from bench.soak import (
    PER_USER_BYTES,
    first_copies,
    percentile,
    rss_growth,
    schedule,
    tick_end,
    truncated_total,
    zipf_weights,
)


def test_truncated_total_caps_each_user_at_tau():
    sent = Counter({"a": 1, "b": 5, "c": 9})
    assert truncated_total(sent, 5) == 1 + 5 + 5
    assert truncated_total(sent, 1) == 3


def test_zipf_weights_sum_to_one_and_fall_as_one_over_k():
    w = zipf_weights(4, 1.0)
    assert sum(w) == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(2.0)
    assert w[0] / w[3] == pytest.approx(4.0)


def test_tick_t_ends_at_t_plus_one_intervals():
    assert tick_end(10, 0.5) == 5.5


def release(tick: int, value: int) -> bytes:
    return orjson.dumps({"tick": tick, "value": value})


def test_first_copies_keeps_one_per_tick_in_tick_order():
    records = [(release(2, 7), 300), (release(1, 3), 200), (release(2, 7), 900)]
    assert first_copies(records) == [(release(1, 3), 200), (release(2, 7), 300)]


def test_first_copies_refuses_a_tick_released_twice_differently():
    with pytest.raises(ValueError, match="tick 2"):
        first_copies([(release(2, 7), 1), (release(2, 8), 2)])


def test_schedule_kills_every_interval_and_the_broker_once():
    args = argparse.Namespace(minutes=30, kill_every=300, broker_at=0.4, broker_down=60)
    plan = schedule(args)
    kills = [t for t, a in plan if a == "kill-worker"]
    assert kills == [300, 600, 900, 1200, 1500]
    assert [(t, a) for t, a in plan if "broker" in a] == [
        (720, "kill-broker"),
        (780, "restart-broker"),
    ]


def test_rss_growth_per_life_after_warmup_with_the_users_first_seen_meanwhile():
    samples = [
        {"t": 0, "pid": 1, "rss": 100},
        {"t": 10, "pid": 1, "rss": 150},  # first after a 10 s warm-up
        {"t": 20, "pid": 1, "rss": 180},
        {"t": 30, "pid": 1, "rss": 190},
        {"t": 35, "pid": 2, "rss": 90},  # a life too short to count
        {"t": 40, "pid": 2, "rss": None},
    ]
    first_seen = {"a": 5, "b": 15, "c": 30, "d": 31}
    [life] = rss_growth(samples, 10, first_seen)
    assert (life["pid"], life["rss_from"], life["rss_to"], life["growth"]) == (1, 150, 190, 40)
    assert life["new_users"] == 2  # b and c: after the warm-up sample, up to the last
    assert life["allowed_by_users"] == 2 * PER_USER_BYTES


def test_percentile_is_the_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([4, 1, 3, 2], 0.5) == 2
    assert percentile(list(range(1, 101)), 0.99) == 99
