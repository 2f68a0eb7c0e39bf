"""Stage 1's closes read only the users they need (``stages._ScanIndex``): a cell mean's
slot close the users with data no close has sent, a continual mean's median the admitted
users in rank order; never every user entry held. And the index rebuilt after a recovery
(new state objects, a new process) gives the reports an uninterrupted run gives."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import orjson

from dpstream.config.schema import parse_config
from dpstream.pipeline.stages.stage1 import Stage1
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.wire.records import partition_for
from dpstream.statistics.continual_mean import ContinualMeanStatistic
from dpstream.statistics.events import Event

CELLS = ["A", "B", "C"]


def strict_cells(partitions: int = 1) -> Any:
    return parse_config(
        {
            "input": {"partitions": partitions},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 5.0},
            "statistics": [
                {
                    "name": "speed",
                    "kind": "cell_mean",
                    "epsilon": 1.0,
                    "cells": {
                        "field": "cell",
                        "slot_ticks": 2,
                        "lower": 0,
                        "upper": 100,
                        "step": 1,
                        "mechanism": "noisy_ratio",
                        "contribution_cap": 3,
                        "keys": CELLS,
                        "epoch_slots": 4,
                        "epoch_cap": 2.0,
                    },
                }
            ],
        }
    )


def public_counts(partitions: int = 1, max_users: int = 4) -> Any:
    return parse_config(
        {
            "input": {"partitions": partitions},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 11.0, "public_counts": True},
            "statistics": [
                {
                    "name": "latency",
                    "kind": "mean",
                    "epsilon": 1.0,
                    "mean": {"max_users": max_users, "max_samples_per_user": 16},
                },
                {
                    "name": "speed",
                    "kind": "cell_mean",
                    "epsilon": 1.0,
                    "cells": {
                        "field": "cell",
                        "slot_ticks": 3,
                        "lower": 0,
                        "upper": 100,
                        "step": 1,
                        "mechanism": "baseline",
                        "counts_public": True,
                        "epoch_slots": 4,
                        "epoch_cap": 10,
                    },
                },
            ],
        }
    )


def event(user: str, value: float, cell: str = "A") -> Event:
    return Event(user, None, value, cells=(("cell", cell),))


class Watched(dict):
    """User entries that count how often a close reads them: ``get`` by user id, and
    every walk over all of them."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []
        self.walks = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.append(key)
        return super().get(key, default)

    def items(self) -> Any:
        self.walks += 1
        return super().items()

    def __iter__(self) -> Iterator[Any]:
        self.walks += 1
        return super().__iter__()


def test_a_slot_close_reads_the_users_with_unsent_data_only():
    cfg = strict_cells()
    stage1, pstate, users = Stage1(cfg), new_partition_state(), Watched()
    held = [event(f"user-{i:04d}", 50.0, CELLS[i % 3]) for i in range(1000)]
    stage1.add_events(pstate, users, held, 0)
    pstate["last_offset"] = 0
    assert users.walks == 1  # the index is built from the table once, at the first record
    (report,) = stage1.close_tick(pstate, 0, 1, users)  # slot 0 closes: all 1000 sent
    assert sum(len(row) for row in report.payload["slots"]["0"].values()) == 1000
    stage1.add_events(pstate, users, [event("user-0007", 20.0, "B")], 1)
    pstate["last_offset"] = 1
    users.read.clear()
    assert stage1.close_tick(pstate, 0, 2, users)[0].payload is None  # slot 1 still open
    (report,) = stage1.close_tick(pstate, 0, 3, users)  # slot 1 closes
    assert report.payload == {"slots": {"1": {"B": {"user-0007": [1, 20, [20]]}}}}
    assert users.read == ["user-0007", "user-0007"]  # its scan, then its prune
    assert users.walks == 1
    # Nothing left unsent: the next slot's close reads no one.
    users.read.clear()
    assert stage1.close_tick(pstate, 0, 5, users)[0].payload is None
    assert users.read == [] and users.walks == 1


def test_a_median_reads_the_admitted_users_in_rank_order_only(monkeypatch):
    # 4 users admitted of 40 (max_users 4 on one partition); each median scan of the
    # continual mean gets exactly those, in rank order, never the other 36.
    cfg = public_counts(max_users=4)
    stage1, pstate, users = Stage1(cfg), new_partition_state(), Watched()
    close_tick = ContinualMeanStatistic.close_tick
    scans: list[list[int]] = []

    def recorded(self: Any, pstate: Any, partition: int, from_tick: int, tick: int, scan: Any):
        scans.append([state["rank"] for _, state in scan()])
        return close_tick(self, pstate, partition, from_tick, tick, scan)

    monkeypatch.setattr(ContinualMeanStatistic, "close_tick", recorded)
    order = [f"u{i:02d}" for i in random.Random(3).sample(range(40), 40)]
    for offset, user in enumerate(order):
        stage1.add_events(pstate, users, [event(user, 10.0)], offset)
        pstate["last_offset"] = offset
    users.read.clear()
    stage1.close_tick(pstate, 0, 1, users)
    assert scans == [[0, 1, 2, 3]]
    assert set(users.read) == set(order[:4]) and users.walks == 1  # its scan, its prune


def _run(cfg: Any, lines: list[list[Event] | int], crashes: dict[int, int]) -> dict:
    """Stage 1 over ``lines`` (an int: a marker) on every partition. A crash at line c
    (``crashes``: c -> k < c) brings back the states as stored after line k (a recovery:
    new objects, from their JSON), in the same Stage1 (its index, now stale) or a new one
    (a new process), and the lines after k come again. The reports by (statistic,
    partition, tick): a report sent again must be the same."""
    parts = cfg.input.partitions
    stage1, users = Stage1(cfg), {}
    pstates = [new_partition_state() for _ in range(parts)]
    stored = {-1: orjson.dumps([pstates, users])}
    reports: dict[tuple, Any] = {}
    offset = 0
    while offset < len(lines):
        if offset in crashes:
            back = crashes.pop(offset)
            stage1 = Stage1(cfg) if back % 2 else stage1
            pstates, users = orjson.loads(stored[back])
            offset = back + 1
            continue
        line = lines[offset]
        for p, pstate in enumerate(pstates):
            if isinstance(line, int):
                for report in stage1.close_tick(pstate, p, line, users):
                    got = report.to_json()
                    key = (report.statistic, p, report.tick)
                    assert reports.setdefault(key, got) == got, key
            else:
                mine = [e for e in line if partition_for(e.user_id, parts) == p]
                stage1.add_events(pstate, users, mine, offset, p)
            pstate["last_offset"] = offset
        stored[offset] = orjson.dumps([pstates, users])
        offset += 1
    return reports


def test_the_index_rebuilt_after_a_recovery_gives_the_reports_of_an_uninterrupted_run():
    rng = random.Random(5)
    for cfg in (strict_cells(partitions=2), public_counts(partitions=2, max_users=30)):
        lines: list[list[Event] | int] = []
        for tick in range(30):
            for _ in range(rng.randint(0, 4)):
                batch = [
                    event(f"u{rng.randrange(40)}", rng.uniform(0, 100), rng.choice(CELLS))
                    for _ in range(rng.randint(1, 5))
                ]
                lines.append(batch)
            lines.append(tick)
        straight = _run(cfg, lines, {})
        assert sum(1 for r in straight.values() if r.get("payload")) > 20
        for _ in range(30):
            crashes = {}
            for at in sorted(rng.sample(range(1, len(lines)), 3)):
                crashes[at] = rng.randrange(-1, at)
            assert _run(cfg, lines, dict(crashes)) == straight, crashes
