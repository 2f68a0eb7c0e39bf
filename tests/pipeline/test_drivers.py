"""The stage drivers the worker and replay share (pipeline/drivers.py), record by record."""

from __future__ import annotations

import random

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.drivers import Stage1Driver, Stage2Driver
from dpstream.pipeline.records import Batch, Envelope, Event, encode_envelope, partition_for
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


def envelope(*users: str, source: str = "src/0", first: int = 0) -> bytes:
    """An ingest envelope of one event per user, at source offsets first, first + 1, ..."""
    events = [Event(u, None, None) for u in users]
    offsets = list(range(first, first + len(users)))
    return encode_envelope(source, offsets, [0] * len(users), events)


def test_a_redelivered_envelope_counts_once():
    driver, pstate, users = Stage1Driver(CFG), Stage1.new_partition_state(), {}
    value = envelope(ON_0, ON_0, ON_0)  # tau 2: the third is truncated
    for _ in range(2):  # the second: after a crash before the offset was committed
        assert driver.on_envelope(pstate, users, 0, 7, value) == []
        driver.done(pstate, 7)
    assert pstate["pending"] == {"events": {"w": 2}} and pstate["last_offset"] == 7


def test_an_ingest_resend_counts_once():
    # The ingest crashed after its envelope reached the topic, before it committed: a new
    # owner re-sends from the committed offset, in a new envelope at a new offset.
    driver, pstate, users = Stage1Driver(CFG), Stage1.new_partition_state(), {}
    driver.on_envelope(pstate, users, 0, 1, envelope(ON_0, source="s/3", first=10))
    driver.on_envelope(pstate, users, 0, 2, envelope(ON_1, ON_0, ON_0, source="s/3", first=9))
    assert pstate["pending"] == {"events": {"w": 2}}  # 10 once, 11 new; 9 was before
    assert pstate["sources"] == {"s/3": [11, 0]}
    # Another source partition's positions are its own.
    driver.on_envelope(pstate, users, 0, 3, envelope(ON_1, source="s/4", first=0))
    assert pstate["pending"] == {"events": {"w": 3}}


def test_what_is_not_an_envelope_is_dead_lettered_once():
    driver, pstate = Stage1Driver(CFG), Stage1.new_partition_state()
    for value in (b"[1]", b'{"s": "a/0", "o": [2, 1], "u": ["a", "b"]}', b'{"s": 1}'):
        assert driver.on_envelope(pstate, {}, 0, 4, value) == [(None, "malformed envelope")]
    driver.done(pstate, 4)
    assert driver.on_envelope(pstate, {}, 0, 4, b"[1]") == []


def test_holes_and_redelivered_markers():
    driver, pstate, users = Stage1Driver(CFG), Stage1.new_partition_state(), {}
    assert driver.skipped(pstate, 5) is None  # nothing processed yet: nothing skipped
    driver.on_envelope(pstate, users, 0, 5, envelope(ON_0))
    driver.done(pstate, 5)
    assert driver.skipped(pstate, 6) is None and driver.skipped(pstate, 9) == (6, 9)
    reports, rejected = driver.on_marker(pstate, users, 0, b'{"tick": 3}', None)
    assert [(r.tick, r.weights) for r in reports] == [(3, {"w": 1})] and rejected == []
    driver.done(pstate, 6)
    assert driver.is_redelivered(pstate, 6) and not driver.is_redelivered(pstate, 7)


def _ingest_history(rng: random.Random, n: int, partitions: int) -> list[list[list[int]]]:
    """Random runs of ingests over one source partition of ``n`` events: each new owner
    starts at the committed offset and sends its events in order (per events partition,
    in envelopes of 1-3); only the newest owner commits (Kafka fences a stale member's
    commits), and only what was acknowledged; an owner may crash (what it had not sent is
    gone) or go on as a zombie beside its successor. Returns each partition's log."""
    route = [rng.randrange(partitions) for _ in range(n)]
    logs: list[list[list[int]]] = [[] for _ in range(partitions)]
    committed, owners, newest = 0, [], -1
    while True:
        live = [o for o in owners if o["next"] < n and not o["dead"]]
        if not live or rng.random() < 0.1:
            if committed >= n:
                return logs
            owners.append({"id": len(owners), "next": committed, "dead": False})
            newest = len(owners) - 1
            continue
        owner = rng.choice(live)
        start, end = owner["next"], min(n, owner["next"] + rng.randint(1, 6))
        for p in range(partitions):
            offsets = [o for o in range(start, end) if route[o] == p]
            while offsets:
                cut = rng.randint(1, 3)
                logs[p].append(offsets[:cut])
                offsets = offsets[cut:]
        owner["next"] = end
        if owner["id"] == newest and rng.random() < 0.7:
            committed = end
        owner["dead"] = rng.random() < 0.15


def test_every_source_event_is_counted_once_across_crashes_and_zombies():
    # The argument of docs/design.md ("Exactly once from the source"), on random
    # histories: whatever the interleaving, each partition counts each of its events once.
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(1, 40)
        counted: list[int] = []
        for log in _ingest_history(rng, n, rng.randint(1, 3)):
            pstate: dict = {}
            for offsets in log:
                events = [Event("u", None, None)] * len(offsets)
                fresh = Stage1Driver.unseen(
                    pstate, Envelope("s/0", offsets, [0] * len(offsets), Batch.of(events))
                )
                counted += offsets[len(offsets) - len(fresh) :]
        assert sorted(counted) == list(range(n))


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
