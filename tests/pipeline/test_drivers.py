"""The stage drivers the worker and replay share (pipeline/drivers.py), record by record."""

from __future__ import annotations

import random

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.drivers import Stage1Driver, Stage2Driver
from dpstream.pipeline.records import Batch, Envelope, Event, encode_envelope, partition_for
from dpstream.pipeline.stage1_state import new_partition_state
from dpstream.pipeline.stages import Stage2
from dpstream.pipeline.statistic import Report

CFG = parse_config(
    {
        "input": {"partitions": 2},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 1.0},
        "statistics": [{"name": "events", "epsilon": 1.0, "tau": 2}],
    }
)
RULES = Stage1Driver(CFG).rules
ON_0 = next(f"u{i}" for i in range(100) if partition_for(f"u{i}", 2) == 0)
ON_1 = next(f"u{i}" for i in range(100) if partition_for(f"u{i}", 2) == 1)
ALSO_ON_0 = next(f"v{i}" for i in range(100) if partition_for(f"v{i}", 2) == 0)


def envelope(*users: str, source: str = "src/0", first: int = 0) -> bytes:
    """An ingest envelope of one event per user, at source offsets first, first + 1, ..."""
    events = [Event(u, None, None) for u in users]
    offsets = list(range(first, first + len(users)))
    return encode_envelope(source, offsets, [0] * len(users), events, rules=RULES)


def test_a_redelivered_envelope_counts_once():
    driver, pstate, users = Stage1Driver(CFG), new_partition_state(), {}
    value = envelope(ON_0, ON_0, ON_0)  # tau 2: the third is truncated
    for _ in range(2):  # the second: after a crash before the offset was committed
        assert driver.on_envelope(pstate, users, 0, 7, value) == ([], [])
        driver.done(pstate, 7)
    assert pstate["pending"] == {"events": {"w": 2}} and pstate["last_offset"] == 7


def test_an_ingest_resend_counts_once():
    # The ingest crashed after its envelope reached the topic, before it committed: a new
    # owner re-sends from the committed offset, in a new envelope at a new offset.
    driver, pstate, users = Stage1Driver(CFG), new_partition_state(), {}
    driver.on_envelope(pstate, users, 0, 1, envelope(ON_0, source="s/3", first=10))
    driver.on_envelope(pstate, users, 0, 2, envelope(ON_1, ON_0, ON_0, source="s/3", first=9))
    assert pstate["pending"] == {"events": {"w": 2}}  # 10 once, 11 new; 9 was before
    assert pstate["sources"] == {"s/3": [11, 0]}
    # Another source partition's positions are its own.
    driver.on_envelope(pstate, users, 0, 3, envelope(ALSO_ON_0, source="s/4", first=0))
    assert pstate["pending"] == {"events": {"w": 3}}


def test_what_is_not_an_envelope_is_dead_lettered_once():
    driver, pstate = Stage1Driver(CFG), new_partition_state()
    for value in (b"[1]", b'{"s": "a/0", "o": [2, 1], "u": ["a", "b"]}', b'{"s": 1}'):
        assert driver.on_envelope(pstate, {}, 0, 4, value) == ([(None, "malformed envelope")], [])
    driver.done(pstate, 4)
    assert driver.on_envelope(pstate, {}, 0, 4, b"[1]") == ([], [])


def test_holes_and_redelivered_markers():
    driver, pstate, users = Stage1Driver(CFG), new_partition_state(), {}
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
    driver, pstate = Stage1Driver(CFG), new_partition_state()
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
        releases, _ = driver.on_report(sstate, report, 10 + partition)
    assert [r["value"] for r in releases] == [2]
    # Partition 0 reports tick 7 next: its ticks 5-6 are missing; read after offset 10,
    # its own last report (not after 11, partition 1's).
    assert driver.missing_reports(sstate, Report("events", 0, 7, 7, {})) == 11
    assert driver.missing_reports(sstate, Report("events", 0, 5, 7, {})) is None
    # A re-delivered copy (an older tick, at a later offset) moves nothing.
    driver.on_report(sstate, Report("events", 0, 4, 4, {"w": 1}), 15)
    assert driver.missing_reports(sstate, Report("events", 0, 7, 7, {})) == 11


def test_a_hole_before_another_partitions_report_is_read_back():
    """The consumer skips partition 0's report of tick 5 (offset 12), then hands over
    partition 1's (13): stage 2 must still find 12 when partition 0's tick 6 comes, or
    tick 5 closes without partition 0's units and is released twice, differently."""
    driver, sstate = Stage2Driver(CFG, ZeroNoise(), 2), Stage2.new_state()
    log = [
        Report("events", 0, 4, 4, {"w": 1}),
        Report("events", 1, 4, 4, {"w": 1}),
        Report("events", 0, 5, 5, {"w": 10}),
        Report("events", 1, 5, 5, {"w": 1}),
        Report("events", 0, 6, 6, {"w": 1}),
        Report("events", 1, 6, 6, {"w": 1}),
    ]
    assert _stage2_releases(driver, sstate, log, delivered=[0, 1, 3, 4, 5]) == [
        (4, 2),
        (5, 13),
        (6, 15),
    ]


def _stage2_releases(
    driver: Stage2Driver, sstate: dict, log: list[Report], delivered: list[int]
) -> list[tuple[int, int]]:
    """What pipeline/app.py's handle_report does when its consumer hands over only the
    ``delivered`` offsets of the stage-2 ``log``: a report after missing ones makes it
    read the log from ``missing_reports`` on, first. (tick, value) of each release."""
    out: list[tuple[int, int]] = []

    def handle(offset: int, in_gap: bool = False) -> None:
        report = log[offset]
        start = None if in_gap else driver.missing_reports(sstate, report)
        if start is not None:
            for earlier in range(start, offset):
                handle(earlier, in_gap=True)
        releases, _ = driver.on_report(sstate, report, offset)
        out.extend((r["tick"], r["value"]) for r in releases)

    for offset in delivered:
        handle(offset)
    return out


def test_stage2_releases_the_same_whatever_its_consumer_skips():
    # Random interleavings of 3 partitions' reports (some covering caught-up ticks, some
    # re-sent from a restart on), delivered with random holes: every tick is released
    # once, as without holes.
    rng = random.Random(11)
    for _ in range(300):
        partitions = 3
        cfg = parse_config(
            {
                "input": {"partitions": partitions},
                "noise": {"mode": "insecure_zero"},
                "privacy": {"total_epsilon": 1.0},
                "statistics": [{"name": "events", "epsilon": 1.0, "tau": 2}],
            }
        )
        queues = []
        for p in range(partitions):
            reports, tick = [], 0
            while tick < 12:
                start, tick = tick + 1, tick + rng.choice([1, 1, 1, 2])
                reports.append(Report("events", p, start, tick, {"w": rng.randint(0, 9)}))
                if rng.random() < 0.1:  # stage 1 restarted from older state: a re-sent tail
                    reports += reports[rng.randrange(len(reports)) :]
            queues.append(reports)
        log = []
        while any(queues):
            log.append(rng.choice([q for q in queues if q]).pop(0))
        expected = _stage2_releases(
            Stage2Driver(cfg, ZeroNoise(), partitions),
            Stage2.new_state(),
            log,
            list(range(len(log))),
        )
        # Faust's holes come at rebalances, once the partition was fetched: each stage-1
        # partition's first report arrives (before it, stage 2 cannot know one is missing).
        firsts = {next(i for i, r in enumerate(log) if r.partition == p) for p in range(partitions)}
        delivered = [i for i in range(len(log)) if i in firsts or rng.random() > 0.3]
        got = _stage2_releases(
            Stage2Driver(cfg, ZeroNoise(), partitions), Stage2.new_state(), log, delivered
        )
        # A hole at the end is read when the next report comes: a prefix of the releases.
        assert got == expected[: len(got)], (log, delivered)


def test_a_report_of_a_removed_statistic_is_skipped_and_logged_once(caplog):
    """A rolling change removed statistic ``gone``: a stage 1 still under the old
    configuration reports it. Stage 2 raised KeyError (exit 70), and read the same report
    again on restart: a crash loop. It skips such reports now, with one warning."""
    driver, sstate = Stage2Driver(CFG, ZeroNoise(), 2), Stage2.new_state()
    for tick in (4, 5):
        report = Report("gone", 0, tick, tick, {"w": 1})
        assert not driver.configured(report)
        assert driver.on_report(sstate, report, tick) == ([], [])
    assert sstate == Stage2.new_state()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "stage 2: skipping reports of statistic gone, which this configuration does not "
        "have (its spend stays charged as retired)"
    ]
    # The configured statistic goes on as before.
    for partition in (0, 1):
        releases, _ = driver.on_report(sstate, Report("events", partition, 4, 4, {"w": 1}), 9)
    assert [r["value"] for r in releases] == [2]
