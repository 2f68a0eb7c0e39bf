"""The stage drivers the worker and replay share (pipeline/drivers.py), record by record."""

from __future__ import annotations

import orjson

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.drivers import MISROUTED, Stage1Driver, Stage2Driver
from dpstream.pipeline.records import BATCH, partition_for
from dpstream.pipeline.stages import Stage1, Stage2
from dpstream.pipeline.statistic import Report

CFG = parse_config(
    {
        "input": {"partitions": 2},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 1.0},
        "statistics": [{"name": "events", "epsilon": 1.0, "tau": 2}],
    }
)
ON_0 = next(f"u{i}" for i in range(100) if partition_for(f"u{i}", 2) == 0)
ON_1 = next(f"u{i}" for i in range(100) if partition_for(f"u{i}", 2) == 1)


def envelope(*events: dict) -> bytes:
    return orjson.dumps(list(events))


def test_a_redelivered_record_counts_once_and_is_dead_lettered_once():
    driver, pstate, users = Stage1Driver(CFG), Stage1.new_partition_state(), {}
    value = envelope({"user_id": ON_0}, {"user_id": ""}, {"user_id": ON_1})
    for attempt in range(2):  # the second: after a crash before the offset was committed
        events, rejected = driver.decode(value, BATCH, 0)
        out = driver.on_events(pstate, users, 0, 7, events, rejected)
        assert out == ([(1, "empty user_id"), (None, MISROUTED)] if attempt == 0 else [])
        driver.done(pstate, 7)
    assert pstate["pending"] == {"events": {"w": 1}} and pstate["last_offset"] == 7


def test_holes_and_redelivered_markers():
    driver, pstate, users = Stage1Driver(CFG), Stage1.new_partition_state(), {}
    assert driver.skipped(pstate, 5) is None  # nothing processed yet: nothing skipped
    events, rejected = driver.decode(orjson.dumps({"user_id": ON_0}), None, 0)
    driver.on_events(pstate, users, 0, 5, events, rejected)
    driver.done(pstate, 5)
    assert driver.skipped(pstate, 6) is None and driver.skipped(pstate, 9) == (6, 9)
    reports, rejected = driver.on_marker(pstate, users, 0, b'{"tick": 3}', None)
    assert [(r.tick, r.weights) for r in reports] == [(3, {"w": 1})] and rejected == []
    driver.done(pstate, 6)
    assert driver.is_redelivered(pstate, 6) and not driver.is_redelivered(pstate, 7)


def test_a_bad_or_forged_marker_is_dead_lettered_and_closes_nothing():
    driver, pstate = Stage1Driver(CFG), Stage1.new_partition_state()
    assert driver.on_marker(pstate, {}, 0, b'{"tick": -1}', None) == (
        [],
        [(None, "malformed tick marker")],
    )
    # Tick 10**9 of 1 s ends in 2001; a broker stamp of 1970 says it came from the future.
    assert driver.on_marker(pstate, {}, 0, b'{"tick": 1000000000}', 1000) == (
        [],
        [(None, "tick marker from the future")],
    )
    assert pstate["last_tick"] is None


def test_stage2_finds_missing_reports_and_where_to_read_them():
    driver, sstate = Stage2Driver(CFG, ZeroNoise(), 2), Stage2.new_state()
    for partition in (0, 1):
        report = Report("events", partition, 4, 4, {"w": 1})
        assert driver.missing_reports(sstate, report) is None
        releases, _ = driver.on_report(sstate, report)
        driver.done(sstate, 10 + partition)
    assert [r["value"] for r in releases] == [2]
    # Partition 0 reports tick 7 next: its ticks 5-6 are missing; read after offset 11.
    assert driver.missing_reports(sstate, Report("events", 0, 7, 7, {})) == 12
    assert driver.missing_reports(sstate, Report("events", 0, 5, 7, {})) is None
