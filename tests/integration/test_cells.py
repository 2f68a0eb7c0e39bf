"""Per-cell means (kind cell_mean, Rameshwar et al.) on the real broker.

60 users send speeds in four cells for about ten 1-second slots (ticks of 0.5 s, two per
slot) with keyed noise, to one of two pipelines: Levy with Clip-User under public counts
(beside a continual mean, the other public-counts kind), or the strict mode's noisy ratio
over a listed cell domain. Both epoch caps are small enough to bite. The pipeline's
releases must equal ``dpstream replay`` of the exported log byte for byte, and the ledger
must carry no user id.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict

import numpy as np
import orjson
import pytest

from tests.integration.support import (
    assert_equal_to_replay,
    collected,
    produce_rounds,
    readers,
    wait_until,
)

pytestmark = pytest.mark.integration

TICK = 0.5
SLOT_TICKS = 2
USERS = 60
ROUNDS = 20  # one round per tick: 10 s of traffic, about 10 slots
KEY_ENV = "DPSTREAM_TEST_KEY"
CELLS = ["A", "B", "C", "D"]


def cells_config(public_counts: bool) -> dict:
    """Levy with Clip-User beside a continual mean (public counts), or the strict noisy
    ratio: the two relations never share a pipeline (operators.accounting). Each has a
    statistic that releases every tick (the mean, the strict cells), which the test
    follows."""
    common = {"field": "h3", "slot_ticks": SLOT_TICKS, "lower": 0, "upper": 120, "step": 0.5}
    public = [
        {
            "name": "speed",
            "kind": "cell_mean",
            "epsilon": 1.0,
            "cells": {
                **common,
                "mechanism": "levy",
                "counts_public": True,
                "clip_user": True,
                "epoch_slots": 4,
                "epoch_cap": 3.0,
            },
        },
        {
            "name": "speed_mean",
            "kind": "mean",
            "epsilon": 1.0,
            "mean": {"lower": 0, "upper": 120, "max_users": 100, "max_samples_per_user": 64},
        },
    ]
    strict = [
        {
            "name": "speed_strict",
            "kind": "cell_mean",
            "epsilon": 1.0,
            "cells": {
                **common,
                "mechanism": "noisy_ratio",
                "contribution_cap": 3,
                "keys": CELLS,
                "epoch_slots": 4,
                "epoch_cap": 2.0,
            },
        },
    ]
    return {
        "input": {"partitions": 4},
        "ticks": {"interval_seconds": TICK},
        "noise": {"mode": "keyed", "key_env": KEY_ENV},
        "privacy": {"total_epsilon": 5.0, "public_counts": public_counts},
        "statistics": public if public_counts else strict,
    }


def traffic(rng: random.Random) -> list[dict]:
    """One round: every user sends 0-3 speeds, mostly in their home cell."""
    events = []
    for u in range(USERS):
        home = CELLS[u % len(CELLS)]
        for _ in range(rng.randint(0, 3)):
            cell = home if rng.random() < 0.7 else rng.choice(CELLS)
            speed = round(rng.gauss(30 + 10 * CELLS.index(cell), 12), 2)  # some outside [0, U]
            events.append({"user_id": f"car-{u:03d}", "value": speed, "h3": cell})
    rng.shuffle(events)
    return events


@pytest.mark.parametrize("public_counts", [True, False], ids=["public", "strict"])
def test_cell_means_pipeline_equals_replay(bootstrap, worker_factory, monkeypatch, public_counts):
    key = np.random.default_rng(11).bytes(32).hex()
    worker = worker_factory(cells_config(public_counts), env={KEY_ENV: key})
    cfg = worker.cfg
    rd = readers(bootstrap, worker)
    clock = "speed_mean" if public_counts else "speed_strict"  # releases every tick
    rng = random.Random(11)
    try:
        wait_until(lambda: rd[clock].drain() != [], 90, "a first release", worker)
        rounds = (traffic(rng) for _ in range(ROUNDS))
        produce_rounds(bootstrap, cfg, rounds, batch=50, pause=TICK)
        # Every slot with traffic has closed once the releases pass the next slot.
        done = (math.floor(time.time() / TICK) // SLOT_TICKS + 1) * SLOT_TICKS
        wait_until(
            lambda: (rel := rd[clock].drain()) and rel[-1]["tick"] >= done + 1,
            60,
            f"releases up to tick {done + 1}",
            worker,
        )
        for r in rd.values():
            r.drain()
        pipeline, ledger, dead = collected(rd, cfg)
    finally:
        for r in rd.values():
            r.close()
    assert dead == []
    monkeypatch.setenv(KEY_ENV, key)
    assert_equal_to_replay(cfg, bootstrap, pipeline)
    entries = [e for e in ledger if e.get("event") == "cells"]
    assert "car-" not in orjson.dumps(ledger).decode()
    if public_counts:
        public = [orjson.loads(r) for r in pipeline["speed"]]
        assert len({r["slot"] for r in public}) >= 6
        assert all(r["n_users"] >= 1 and "clip_interval" in r for r in public)
        assert all(r["public_counts"] is True for r in public)
        # B = 3 at 1 per cell over 4 slots: the most active users reach the cap.
        assert any(e["dropped_at_cap"]["users"] for e in entries)
        assert all(e["epoch_max_loss"] <= 3.0 for e in entries)
        return
    strict = [orjson.loads(r) for r in pipeline["speed_strict"]]
    by_slot: dict[int, list[str]] = defaultdict(list)
    for r in strict:
        by_slot[r["slot"]].append(r["cell"])
        assert "n_users" not in r and "insecure" not in r and "public_counts" not in r
    assert all(cells == CELLS for cells in by_slot.values())  # every cell, every slot
    assert entries and {e["statistic"] for e in entries} == {"speed_strict"}
    assert all("dropped_at_cap" not in e for e in entries)  # user counts stay private
