"""User-level statistics (tau: auto, Dong-Luo-Yi Alg. 5) on the real broker.

400 users whose contributions grow tick after tick, so the private contribution trackers
double tau several times mid-stream; count, sum, histogram, distinct count, k-selection
and a count with deletions run side by side with keyed noise. The pipeline's releases
must equal ``dpstream replay`` of the exported log byte for byte, and the ledger must
show the tracker and instance series below each statistic's epsilon.
"""

from __future__ import annotations

import math
import random
import time

import numpy as np
import orjson
import pytest

from dpstream.statistics.registry import resolved
from tests.integration.support import (
    assert_equal_to_replay,
    collected,
    produce_rounds,
    readers,
    wait_for_first_release,
    wait_for_tick,
)

pytestmark = pytest.mark.integration

TICK = 0.5
USERS = 400
ROUNDS = 16
KEY_ENV = "DPSTREAM_TEST_KEY"


def user_level_config() -> dict:
    common = {"epsilon": 8.0, "practical": False}  # tau starts at 2 and must double
    return {
        "input": {"partitions": 4},
        "ticks": {"interval_seconds": TICK},
        "noise": {"mode": "keyed", "key_env": KEY_ENV},
        "privacy": {"total_epsilon": 50.0},
        "statistics": [
            {"name": "views", "key": "view", **common},
            {"name": "amount", "key": "view", "kind": "sum", "max_value": 8, **common},
            {"name": "levels", "key": "view", "kind": "histogram", "bins": 8, **common},
            {"name": "kinds", "key": "view", "kind": "distinct", **common},
            {"name": "top", "key": "view", "kind": "kselect", "bins": 8, "rank": "max", **common},
            {"name": "cart", "key": "cart", "deletions": True, **common},
        ],
    }


def traffic(round_: int, rng: random.Random) -> list[dict]:
    """Round r: every user sends about r/2 views (values 1..8) and a cart event."""
    events = []
    for u in range(USERS):
        user = f"user-{u:05d}"
        for _ in range(rng.randint(0, round_)):
            events.append({"user_id": user, "key": "view", "value": rng.randint(1, 8)})
        op = "delete" if rng.random() < 0.3 else "insert"
        events.append({"user_id": user, "key": "cart", "op": op})
    rng.shuffle(events)
    return events


def test_user_level_pipeline_equals_replay_while_tau_doubles(
    bootstrap, worker_factory, monkeypatch
):
    key = np.random.default_rng(8).bytes(32).hex()
    worker = worker_factory(user_level_config(), env={KEY_ENV: key})
    cfg = worker.cfg
    rd = readers(bootstrap, worker)
    rng = random.Random(8)
    try:
        wait_for_first_release(worker, rd["views"])
        rounds = (traffic(r, rng) for r in range(ROUNDS))
        produce_rounds(bootstrap, cfg, rounds, batch=100, pause=TICK)
        wait_for_tick(worker, rd, math.floor(time.time() / TICK) + 1)
        pipeline, ledger, dead = collected(rd, cfg)
    finally:
        for r in rd.values():
            r.close()
    assert dead == []
    monkeypatch.setenv(KEY_ENV, key)
    assert_equal_to_replay(cfg, bootstrap, pipeline, least=ROUNDS)
    views = [orjson.loads(r) for r in pipeline["views"]]
    taus = sorted({v["tau"] for v in views})
    assert taus[0] == 2 and taus[-1] >= 8, taus  # doubled at least twice
    assert [v["instance"] for v in views] == sorted(v["instance"] for v in views)
    budget = [e for e in ledger if e.get("event") == "budget"]
    for s in cfg.statistics:
        entries = [e for e in budget if e["statistic"] == s.name]
        assert entries, s.name
        # A new count, sum or histogram gives the tracker a quarter (docs/user-level.md
        # section 6); distinct and kselect keep Alg. 5's half.
        share = resolved(s).tracker_share or 0.5
        for e in entries:
            assert e["tracker_epsilon"] < s.epsilon * share
            assert e["instances_epsilon"] < s.epsilon * (1 - share)
            assert e["epsilon_spent"] < s.epsilon
