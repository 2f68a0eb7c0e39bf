"""Stage 1's time from a tick marker to its reports, by the number of users held.

Before release deadlines (docs/design.md section 1) a release left as soon as stage 2 had
every partition's report, and stage 1 walked every user entry the worker held at each
cell-mean slot close and each tick a continual mean's median might be due: the time from
marker to report, and so to the release, grew with the data. This times
``Stage1Driver.on_marker`` (what the worker does between a marker and its reports, less
the changelog flush and the sends) with N users held and one active user:

* ``cell_mean``: a strict cell mean (noisy ratio over 4 listed cells, 2-tick slots); the N
  users sent one event each in slot 0, which is sent; then one user sends an event per
  tick, and each slot close is timed;
* ``mean``: George et al.'s continual mean (public counts, max_users 400 over 4
  partitions); the N users sent one sample each (the first 100 per partition admitted),
  so level 2's median may be due at every tick; one user sends a sample per tick, and
  each marker is timed.

One worker holds all 4 partitions' users (every partition's entries in one table, as
after a rebalance onto one worker); partition 0's markers are timed. Median and maximum
over ``--closes`` markers, in ms.

    .venv/bin/python -m bench.marker_scan [--users 1000,30000,100000] [--closes 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.pipeline.stages.drivers import Stage1Driver
from dpstream.pipeline.stages.stage1_state import (
    PartitionEntry,
    UserEntry,
    new_partition_state,
)
from dpstream.pipeline.wire.records import partition_for
from dpstream.statistics.events import Event

PARTITIONS = 4
CELLS = ["A", "B", "C", "D"]


def cell_mean_config() -> PipelineConfig:
    cells = {
        "field": "h3",
        "slot_ticks": 2,
        "lower": 0,
        "upper": 120,
        "step": 0.5,
        "mechanism": "noisy_ratio",
        "contribution_cap": 3,
        "keys": CELLS,
        "epoch_slots": 4,
        "epoch_cap": 2.0,
    }
    return parse_config(
        {
            "input": {"partitions": PARTITIONS},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 2.0},
            "statistics": [{"name": "speed", "kind": "cell_mean", "epsilon": 1.0, "cells": cells}],
        }
    )


def mean_config() -> PipelineConfig:
    mean = {"lower": 0, "upper": 120, "max_users": 400, "max_samples_per_user": 64}
    return parse_config(
        {
            "input": {"partitions": PARTITIONS},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 1.0, "public_counts": True},
            "statistics": [{"name": "latency", "kind": "mean", "epsilon": 1.0, "mean": mean}],
        }
    )


class Run:
    """One worker's stage 1 over all partitions, record by record."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self.driver = Stage1Driver(cfg)
        self.users: dict[str, UserEntry] = {}
        self.pstates: list[PartitionEntry] = [new_partition_state() for _ in range(PARTITIONS)]
        self.offset = 0

    def events(self, events: list[Event]) -> None:
        self.offset += 1
        for p, pstate in enumerate(self.pstates):
            mine = [e for e in events if partition_for(e.user_id, PARTITIONS) == p]
            self.driver.stage1.add_events(pstate, self.users, mine, self.offset, p)
            self.driver.done(pstate, self.offset)

    def marker(self, tick: int, timed: list[float] | None = None) -> None:
        self.offset += 1
        value = orjson.dumps({"tick": tick})
        for p, pstate in enumerate(self.pstates):
            start = time.perf_counter()
            self.driver.on_marker(pstate, self.users, p, value, None)
            if p == 0 and timed is not None:
                timed.append((time.perf_counter() - start) * 1000)
            self.driver.done(pstate, self.offset)


def scenario(
    cfg: PipelineConfig, held: int, closes: int, make: Callable[[str, int], Event], every: int
) -> list[float]:
    """Markers of partition 0 timed (ms): ``held`` users' events, then one active user
    (on partition 0) per tick; every ``every``-th marker timed."""
    run = Run(cfg)
    for start in range(0, held, 2000):
        run.events([make(f"held-{u:06d}", u) for u in range(start, min(held, start + 2000))])
    run.marker(1)  # slot 0 closes: the held users' data is sent
    active = next(f"active-{i}" for i in range(100) if partition_for(f"active-{i}", 4) == 0)
    timed: list[float] = []
    tick = 2
    while len(timed) < closes:
        run.events([make(active, tick)])
        run.marker(tick, timed if tick % every == every - 1 else None)
        tick += 1
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", default="1000,30000,100000")
    parser.add_argument("--closes", type=int, default=20)
    args = parser.parse_args()
    kinds: dict[str, tuple[PipelineConfig, Callable[[str, int], Event], int]] = {
        "cell_mean": (
            cell_mean_config(),
            lambda user, n: Event(user, None, float(30 + n % 50), cells=(("h3", CELLS[n % 4]),)),
            2,
        ),
        "mean": (mean_config(), lambda user, n: Event(user, None, float(30 + n % 50)), 1),
    }
    print("| kind | users held | median ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for kind, (cfg, make, every) in kinds.items():
        for held in (int(n) for n in args.users.split(",")):
            timed = scenario(cfg, held, args.closes, make, every)
            print(f"| {kind} | {held:,} | {statistics.median(timed):.2f} | {max(timed):.2f} |")


if __name__ == "__main__":
    main()
