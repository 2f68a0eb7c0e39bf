"""Releases leave at public deadlines, on the real broker, whatever the load.

Tick t's releases and ledger entries are published at its deadline D(t) = tick end +
``ticks.release_delay_seconds``, with D(t) as their Kafka timestamp; a tick that misses
its deadline goes out at a later one, D(t) + k ticks, never at a time its own processing
sets (docs/design.md section 1). Two workers with keyed noise, a count and a strict
cell mean (counts_public: false): one holds 100 users, the other 30,000 in the cell mean
(each stage-1 slot close used to walk them all: 59 ms of data-dependent work before
every slot's report). Then one user sends one event per tick. Every release's and ledger
entry's timestamp must be D(t) + k ticks with k >= 0 (k printed), a consumer reading
all along must see none before that timestamp, and the releases must equal the replay.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np
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
KEY_ENV = "DPSTREAM_TEST_KEY"
CELLS = ["A", "B", "C", "D"]
ACTIVE_TICKS = 12


def deadlines_config() -> dict:
    return {
        "input": {"partitions": 4},
        "ticks": {"interval_seconds": TICK},  # the default delay: 0.125 s + 1 s
        "noise": {"mode": "keyed", "key_env": KEY_ENV},
        "privacy": {"total_epsilon": 3.0},
        "statistics": [
            {"name": "events", "epsilon": 1.0, "tau": 5},
            {
                "name": "speed",
                "kind": "cell_mean",
                "epsilon": 1.0,
                "cells": {
                    "field": "h3",
                    "slot_ticks": SLOT_TICKS,
                    "lower": 0,
                    "upper": 120,
                    "step": 0.5,
                    "mechanism": "noisy_ratio",
                    "contribution_cap": 3,
                    "keys": CELLS,
                    "epoch_slots": 4,
                    "epoch_cap": 2.0,
                },
            },
        ],
    }


def lateness(tick_end: float, timestamp_ms: int, delay: float) -> int:
    """k, from a record's Kafka timestamp: its tick's deadline plus k ticks."""
    deadline_ms = round((tick_end + delay) * 1000)
    k, rest = divmod(timestamp_ms - deadline_ms, round(TICK * 1000))
    assert rest == 0 and k >= 0, (tick_end, timestamp_ms, deadline_ms)
    return k


@pytest.mark.parametrize("held", [100, 30_000], ids=["100-users", "30000-users"])
def test_release_timestamps_equal_the_deadlines_under_very_different_loads(
    bootstrap, worker_factory, monkeypatch, held
):
    key = np.random.default_rng(7).bytes(32).hex()
    worker = worker_factory(deadlines_config(), env={KEY_ENV: key})
    cfg = worker.cfg
    delay = cfg.ticks.release_delay
    rd = readers(bootstrap, worker)
    for reader in rd.values():
        reader.follow()
    try:
        wait_until(lambda: rd["events"].drain() != [], 90, "a first release", worker)
        load = [
            {"user_id": f"held-{u:05d}", "h3": CELLS[u % 4], "value": 30 + u % 50}
            for u in range(held)
        ]
        produce_rounds(bootstrap, cfg, [load], batch=1000, pause=TICK)
        # Stage 1 holds them all once their slot is released.
        loaded = math.floor(time.time() / TICK)
        wait_until(
            lambda: any(r["tick"] >= loaded + SLOT_TICKS for r in rd["speed"].drain()),
            120,
            "the load's slot released",
            worker,
        )
        active = math.floor(time.time() / TICK)
        rounds = [[{"user_id": "active", "h3": "B", "value": 40 + t}] for t in range(ACTIVE_TICKS)]
        produce_rounds(bootstrap, cfg, rounds, batch=1, pause=TICK)
        last = (math.floor(time.time() / TICK) // SLOT_TICKS + 1) * SLOT_TICKS + 1
        wait_until(
            lambda: all(
                (rel := rd[s.name].drain()) and rel[-1]["tick"] >= last for s in cfg.statistics
            ),
            90,
            f"releases up to tick {last}",
            worker,
        )
        worker.assert_running()
        pipeline, ledger, dead = collected(rd, cfg)
        timed = {
            name: list(zip(rd[name].drain(), rd[name].timestamps, rd[name].seen, strict=False))
            for name in [*(s.name for s in cfg.statistics), "_ledger"]
        }
    finally:
        for reader in rd.values():
            reader.close()
    assert dead == []
    late: Counter[tuple[str, int]] = Counter()
    for name, records in timed.items():
        for record, timestamp_ms, seen in records:
            if name == "_ledger" and "tick" not in record:
                continue  # the statement, written at start
            k = lateness((record["tick"] + 1) * TICK, timestamp_ms, delay)
            late["active" if record["tick"] >= active else "loading", k] += 1
            assert seen >= timestamp_ms / 1000 - 0.001, (name, record["tick"], k)
            if name != "_ledger":
                assert record["tick_end_unix"] == (record["tick"] + 1) * TICK
    print(f"\n{held} users held: records by (phase, ticks late k): {dict(sorted(late.items()))}")
    assert sum(late.values()) >= 2 * ACTIVE_TICKS
    monkeypatch.setenv(KEY_ENV, key)
    assert_equal_to_replay(cfg, bootstrap, pipeline, least=ACTIVE_TICKS)
