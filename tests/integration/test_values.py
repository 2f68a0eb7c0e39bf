"""Real values, field mapping and filters against a real broker (issue 26, deliverables 1
and 2): a shop's own events, as a new user has them (a nested user id ``actor.id``, an
``event_type`` of page_view or purchase, a float ``amount``), read by four statistics of
one pipeline with zero noise: every release equals the exact truncated, clipped and
snapped value computed here from the exported log, and the worker's releases equal the
replay's byte for byte."""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal

import orjson
import pytest
from confluent_kafka import Producer

from dpstream.pipeline.tools.export import export_log
from tests.integration.support import (
    assert_equal_to_replay,
    collected,
    readers,
    wait_for_first_release,
    wait_for_tick,
)

pytestmark = pytest.mark.integration

TICK = 0.5
USERS = 300
ROUNDS = 12
PURCHASE = {"event_type": "purchase"}
CONFIG = {
    "input": {"partitions": 2, "user_id_field": "actor.id"},
    "ticks": {"interval_seconds": TICK},
    "noise": {"mode": "insecure_zero"},  # exact releases: for tests only
    "privacy": {"total_epsilon": 4.0},
    "statistics": [
        {"name": "views", "epsilon": 1.0, "tau": 16, "where": {"event_type": "page_view"}},
        {"name": "purchases", "epsilon": 1.0, "tau": 8, "where": PURCHASE},
        {
            "name": "revenue",
            "kind": "sum",
            "epsilon": 1.0,
            "tau": 5,
            "lower": 0,
            "upper": 200,
            "resolution": 20000,  # a 0.01 grid
            "value_field": "amount",
            "where": PURCHASE,
        },
        {
            "name": "basket",
            "kind": "mean",
            "epsilon": 1.0,
            "value_field": "amount",
            "where": PURCHASE,
            "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4, "resolution": 20000},
        },
    ],
}


def shop_events(rng: random.Random, n: int) -> list[dict]:
    """Zipf activity over USERS users; a fifth are purchases with a float amount (some
    above 200, a few not a number)."""
    # First purchases of rare users outside [0, 200]: clipped, within every user's tau.
    out: list[dict] = [
        {"actor": {"id": f"user-{u:04d}"}, "event_type": "purchase", "amount": amount}
        for u, amount in zip(
            range(290, 296), [250.5, 999.99, 200.01, -5.0, 201.0, 1e6], strict=True
        )
    ]
    for _ in range(n - len(out)):
        user = f"user-{int(rng.paretovariate(1.1)) % USERS:04d}"
        if rng.random() < 0.8:
            out.append({"actor": {"id": user}, "event_type": "page_view"})
            continue
        amount: object = round(rng.lognormvariate(3.5, 1.0), 2)
        if rng.random() < 0.03:
            amount = "n/a"  # the purchase still counts; the sum and the mean skip it
        out.append({"actor": {"id": user}, "event_type": "purchase", "amount": amount})
    return out


def cents(value: float) -> int:
    """The value clipped into [0, 200] in whole cents, ties upward (exact, by Decimal)."""
    clipped = min(max(value, 0.0), 200.0)
    return int((Decimal(clipped) * 100).to_integral_value(rounding=ROUND_HALF_UP))


def exact(log: list[bytes]) -> dict[str, dict[int, float]]:
    """Each statistic's exact value at each tick of the exported log, from scratch: each
    user's first tau views and purchases, the first 5 purchases' amounts and the first 4
    samples of the mean, clipped and snapped to cents."""
    taus = {"views": 16, "purchases": 8}
    used: dict[tuple[str, str], int] = defaultdict(int)
    counts = dict.fromkeys(taus, 0)
    revenue = samples = basket = 0
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for line in log:
        obj = orjson.loads(line)
        if "tick" in obj and "user_id" not in obj:
            tick = obj["tick"]
            out["views"][tick], out["purchases"][tick] = counts["views"], counts["purchases"]
            out["revenue"][tick] = revenue / 100
            if samples:
                out["basket"][tick] = basket / samples / 100
            continue
        if "user_id" not in obj:
            continue  # the header
        user, kind = obj["user_id"], obj["event_type"]
        name = "views" if kind == "page_view" else "purchases"
        used[name, user] += 1
        counts[name] += used[name, user] <= taus[name]
        amount = obj.get("amount")
        if kind != "purchase" or type(amount) not in (int, float):
            continue
        used["amounts", user] += 1
        if used["amounts", user] <= 5:
            revenue += cents(amount)
        if used["amounts", user] <= 4:
            samples, basket = samples + 1, basket + cents(amount)
    return out


def test_a_shops_events_feed_counts_a_sum_and_a_mean_by_field_and_filter(bootstrap, worker_factory):
    worker = worker_factory(CONFIG)
    cfg = worker.cfg
    rd = readers(bootstrap, worker)
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    events = shop_events(random.Random(26), ROUNDS * 100)
    try:
        wait_for_first_release(worker, rd["views"])
        for i in range(ROUNDS):
            for event in events[i * 100 : (i + 1) * 100]:
                key = event["actor"]["id"].encode()
                producer.produce(cfg.input.topics[0], key=key, value=orjson.dumps(event))
            assert producer.flush(10) == 0
            time.sleep(TICK)
        wait_for_tick(worker, rd, math.floor(time.time() / TICK) + 1)
        pipeline, _, dead = collected(rd, cfg)
    finally:
        for r in rd.values():
            r.close()
    assert dead == []  # a bad amount fails the sum and the mean, not the purchase
    log = list(export_log(cfg, bootstrap))
    truth = exact(log)
    produced = defaultdict(int)
    for event in events:
        produced[event["event_type"]] += 1
    released = {name: [orjson.loads(r) for r in raw] for name, raw in pipeline.items()}
    checked = 0
    for name, releases in released.items():
        for release in releases:
            if release["tick"] not in truth[name]:
                continue  # before the first event or the mean's first sample
            checked += 1
            if name == "basket":
                assert release["value"] == pytest.approx(truth[name][release["tick"]], rel=1e-12)
            else:
                assert release["value"] == truth[name][release["tick"]], (name, release)
    assert checked >= 4 * ROUNDS
    # Every produced event is in the log: none was lost for a statistic it did not feed.
    assert max(truth["views"].values()) + max(truth["purchases"].values()) <= len(events)
    assert sum(1 for line in log if b'"user_id"' in line) == len(events)
    assert released["revenue"][-1]["grid_step"] == 0.01
    assert_equal_to_replay(cfg, bootstrap, pipeline, least=ROUNDS)
