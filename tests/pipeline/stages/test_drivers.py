"""The stage drivers the worker and replay share (pipeline/stages/drivers.py), record by record."""

from __future__ import annotations

import dataclasses
import random

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise, ZeroNoise
from dpstream.pipeline.stages.drivers import InputRecord, Stage1Driver, Stage1Outcome, Stage2Driver
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.stages.stage2 import Stage2
from dpstream.pipeline.stages.stage2_state import Stage2State
from dpstream.pipeline.wire.records import (
    ENVELOPE,
    HEADER,
    RELEASE,
    TICK,
    BadRecord,
    Envelope,
    encode_envelope,
    partition_for,
)
from dpstream.statistics.contract import Report
from dpstream.statistics.events import Batch, Event

ENVELOPE_HEADERS = [(HEADER, ENVELOPE)]
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


def test_holes_redelivered_markers_and_dead_letters_through_one_record_at_a_time():
    # ``handle`` is what the worker and replay both call with each record.
    driver, pstate, users = Stage1Driver(CFG), new_partition_state(), {}
    first = driver.handle(pstate, users, InputRecord(0, 5, ENVELOPE_HEADERS, envelope(ON_0)))
    assert first == Stage1Outcome(counted=1)  # nothing processed yet: nothing skipped
    driver.done(pstate, 5)
    marker = InputRecord(0, 6, [(HEADER, TICK)], b'{"tick": 3}')
    assert driver.handle(pstate, users, dataclasses.replace(marker, offset=9)).hole == (6, 9)
    out = driver.handle(pstate, users, marker)
    assert [(r.tick, r.weights) for r in out.reports] == [(3, {"w": 1})]
    driver.done(pstate, 6)
    assert driver.handle(pstate, users, marker) == Stage1Outcome()  # its reports went out
    stray = InputRecord(0, 7, None, b"x")
    out = driver.handle(pstate, users, stray)
    assert out.reasons == ["not a dpstream envelope or tick marker"]
    assert orjson.loads(out.dead_letters[0])["offset"] == 7
    driver.done(pstate, 7)
    assert driver.handle(pstate, users, stray) == Stage1Outcome()  # dead-lettered once
    # A record read from a hole is not asked for a hole again.
    late = InputRecord(0, 12, None, b"x")
    assert driver.handle(pstate, users, late).hole == (8, 12)
    assert driver.handle(pstate, users, late, in_gap=True).hole is None


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
        driver.on_report(sstate, report, 10 + partition)
    assert [r["value"] for r in driver.on_release(sstate, 4)[0]] == [2]
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
    """What pipeline/worker/app.py's handle_report does when its consumer hands over only the
    ``delivered`` offsets of the stage-2 ``log``: a report after missing ones makes it
    read the log from ``missing_reports`` on, first. (tick, value) of each release."""
    out: list[tuple[int, int]] = []

    def handle(offset: int, in_gap: bool = False) -> None:
        report = log[offset]
        start = None if in_gap else driver.missing_reports(sstate, report)
        if start is not None:
            for earlier in range(start, offset):
                handle(earlier, in_gap=True)
        driver.on_report(sstate, report, offset)
        releases, _ = driver.on_release(sstate, report.tick)  # all it closed
        out.extend((r["tick"], r["value"]) for r in releases)

    for offset in delivered:
        handle(offset)
    return out


PURE_ZERO = {
    "noise": {"mode": "insecure_zero"},
    "privacy": {"total_epsilon": 1.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 2}],
}
# The zCDP mode's counter with keyed noise: the worker (with holes) equals replay.
ZCDP_KEYED = {
    "noise": {"mode": "keyed", "key_env": "K"},
    "privacy": {"accounting": "zcdp", "total_rho": 0.5},
    "statistics": [{"name": "events", "rho": 0.5, "tau": 2}],
}


@pytest.mark.parametrize(
    ("pipeline", "noise", "runs"),
    [(PURE_ZERO, ZeroNoise(), 300), (ZCDP_KEYED, KeyedNoise(bytes(range(32))), 20)],
    ids=["pure-zero", "zcdp-keyed"],
)
def test_stage2_releases_the_same_whatever_its_consumer_skips(pipeline, noise, runs):
    # Random interleavings of 3 partitions' reports (some covering caught-up ticks, some
    # re-sent from a restart on), delivered with random holes: every tick is released
    # once, as without holes (with keyed noise: the same noisy values, never re-drawn).
    rng = random.Random(11)
    for _ in range(runs):
        partitions = 3
        cfg = parse_config({"input": {"partitions": partitions}, **pipeline})
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
            Stage2Driver(cfg, noise, partitions), Stage2.new_state(), log, list(range(len(log)))
        )
        # Faust's holes come at rebalances, once the partition was fetched: each stage-1
        # partition's first report arrives (before it, stage 2 cannot know one is missing).
        firsts = {next(i for i, r in enumerate(log) if r.partition == p) for p in range(partitions)}
        delivered = [i for i in range(len(log)) if i in firsts or rng.random() > 0.3]
        got = _stage2_releases(
            Stage2Driver(cfg, noise, partitions), Stage2.new_state(), log, delivered
        )
        # A hole at the end is read when the next report comes: a prefix of the releases.
        assert got == expected[: len(got)], (log, delivered)


def test_reports_alone_publish_nothing_a_release_marker_publishes_the_ready_ticks():
    # Ticks of 1 s, release delay 1.25 s (the default): tick t's deadline is t + 2.25 s.
    driver, sstate = Stage2Driver(CFG, ZeroNoise(), 2), Stage2.new_state()
    reports = [
        Report("events", 0, 4, 4, {"w": 1}),
        Report("events", 1, 4, 4, {"w": 2}),
        Report("events", 0, 5, 5, {"w": 4}),
        Report("events", 0, 6, 6, {"w": 8}),
    ]
    for offset, report in enumerate(reports):
        driver.on_report(sstate, report, offset)
    # Tick 4 closed, ticks 5 and 6 wait for partition 1: all held, nothing sent.
    assert sstate.last_closed == 4 and [r["tick"] for r in sstate.held_releases] == [4]
    assert driver.on_release(sstate, 3) == ([], [])
    releases, ledger = driver.on_release(sstate, 4)
    assert [(r["tick"], r["value"]) for r in releases] == [(4, 3)]
    assert [(e["tick"], e["start_tick"]) for e in ledger] == [(4, 4)]  # the first entry
    assert driver.deadline_ms(4) == 6_250
    # Partition 1's tick 5 comes after tick 5's release marker: tick 5 missed its
    # deadline, so the next marker (6) publishes it, at 6's deadline; tick 6 is not ready.
    assert driver.on_release(sstate, 5) == ([], [])
    driver.on_report(sstate, Report("events", 1, 5, 5, {"w": 16}), 4)
    releases, ledger = driver.on_release(sstate, 6)
    assert [(r["tick"], r["value"]) for r in releases] == [(5, 23)] and ledger == []
    assert driver.deadline_ms(6) == 8_250
    assert sstate.held_releases == [] and driver.on_release(sstate, 7) == ([], [])
    # Two late ticks go out at the one marker after their reports, in tick order
    # (partition 1 caught up: its units are in tick 7).
    driver.on_report(sstate, Report("events", 1, 6, 7, {"w": 32}), 5)
    driver.on_report(sstate, Report("events", 0, 7, 7, {"w": 64}), 6)
    releases, _ = driver.on_release(sstate, 9)
    assert [(r["tick"], r["value"]) for r in releases] == [(6, 31), (7, 127)]


def test_a_redelivered_release_marker_resends_identical_records():
    driver, sstate = Stage2Driver(CFG, ZeroNoise(), 2), Stage2.new_state()
    for offset, partition in enumerate((0, 1)):
        driver.on_report(sstate, Report("events", partition, 4, 4, {"w": 3}), offset)
    stored = orjson.dumps(sstate.to_json())  # what the table holds before the marker
    first = driver.on_release(sstate, 4)
    # A crash after the sends, before the state was stored: the marker comes again, to
    # the stored state, and sends the same bytes; once stored, it sends nothing.
    again = driver.on_release(Stage2State.from_json(orjson.loads(stored)), 4)
    assert first[0] and orjson.dumps(again) == orjson.dumps(first)
    assert driver.on_release(sstate, 4) == ([], [])


def test_a_bad_or_forged_release_marker_is_refused():
    # A release delay of 3 s: tick 4 ends at 5 s, its deadline is 8 s.
    data = CFG.model_dump(mode="json", exclude={"noise": {"key_env", "key_file"}})
    cfg = parse_config({**data, "ticks": {"interval_seconds": 1, "release_delay_seconds": 3}})
    driver = Stage2Driver(cfg, ZeroNoise(), 2)
    assert driver.release_tick(b'{"tick": 4}', 8_000) == 4  # appended at its deadline
    assert driver.release_tick(b'{"tick": 4}', None) == 4  # replay: no timestamps
    for value, stamp, reason in (
        (b'{"tick": -1}', 8_000, "malformed release marker"),
        (b"not json", 8_000, "malformed release marker"),
        # After the tick's end, but more than 2 s (the clock skew allowed) before its
        # deadline: a forged marker that would publish early.
        (b'{"tick": 4}', 5_500, "release marker from the future"),
        (b'{"tick": 4}', 8_000 + 300_001, "release marker too old"),
    ):
        with pytest.raises(BadRecord) as caught:
            driver.release_tick(value, stamp)
        assert caught.value.reason == reason


def test_a_release_marker_publishes_the_statistics_keyed_to_its_partition():
    # Faust sends a statistic's reports keyed by its name: Kafka's default partitioner.
    cfg = parse_config(
        {
            "input": {"partitions": 4},
            "privacy": {"total_epsilon": 8.0},
            "statistics": [{"name": f"s{i}", "epsilon": 1.0, "tau": 1} for i in range(8)],
        }
    )
    driver = Stage2Driver(cfg, ZeroNoise(), 4)
    faust_partitioner = DefaultPartitioner()
    for stat in cfg.statistics:
        at = faust_partitioner(stat.name.encode(), [0, 1, 2, 3], [0, 1, 2, 3])
        assert [q for q in range(4) if stat.name in driver.statistics_of(q)] == [at]


def test_a_report_of_a_removed_statistic_is_skipped_and_logged_once(caplog):
    """A rolling change removed statistic ``gone``: a stage 1 still under the old
    configuration reports it. Stage 2 raised KeyError (exit 70), and read the same report
    again on restart: a crash loop. It skips such reports now, with one warning."""
    driver, sstate = Stage2Driver(CFG, ZeroNoise(), 2), Stage2.new_state()
    for tick in (4, 5):
        report = Report("gone", 0, tick, tick, {"w": 1})
        assert not driver.configured(report)
        driver.on_report(sstate, report, tick)
    assert sstate == Stage2.new_state()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "stage 2: skipping reports of statistic gone, which this configuration does not "
        "have (its spend stays charged as retired)"
    ]
    # The configured statistic goes on as before.
    for partition in (0, 1):
        driver.on_report(sstate, Report("events", partition, 4, 4, {"w": 1}), 9)
    releases, _ = driver.on_release(sstate, 4)
    assert [r["value"] for r in releases] == [2]


def test_stage1_says_how_many_events_it_counted_each_once():
    # What the worker's metrics count as stage 1's events in (docs/operations.md).
    driver, pstate, users = Stage1Driver(CFG), new_partition_state(), {}

    def counted(offset: int, value: bytes) -> int:
        out = driver.handle(pstate, users, InputRecord(0, offset, ENVELOPE_HEADERS, value))
        driver.done(pstate, offset)
        return out.counted

    assert counted(1, envelope(ON_0, ON_0, ON_0, source="s/3", first=10)) == 3  # tau cuts later
    assert counted(1, envelope(ON_0, ON_0, ON_0, source="s/3", first=10)) == 0  # re-delivered
    # An ingest's re-send from its committed offset: only 13 is new.
    assert counted(2, envelope(ON_0, ON_0, ON_0, source="s/3", first=11)) == 1
    # An event of the other partition's user is refused (dead-lettered), not counted.
    assert counted(3, envelope(ON_1, ALSO_ON_0, source="s/4")) == 1
    assert counted(4, b"not an envelope") == 0


def test_a_release_marker_says_up_to_which_tick_each_statistic_is_published():
    driver, sstate = Stage2Driver(CFG, ZeroNoise(), 2), Stage2.new_state()
    (partition,) = [p for p in (0, 1) if driver.statistics_of(p)]

    def marker(tick: int) -> dict[str, int]:
        value = orjson.dumps({"tick": tick})
        record = InputRecord(partition, tick, [(HEADER, RELEASE)], value)
        return driver.handle(record, lambda name: sstate).published

    nothing = InputRecord(partition, 0, [(HEADER, RELEASE)], b'{"tick": 3}')
    assert driver.handle(nothing, lambda name: None).published == {}  # no state: no tick
    for offset, report in enumerate(
        [Report("events", 0, 4, 4, {"w": 1}), Report("events", 1, 4, 4, {"w": 1})]
        + [Report("events", 0, 5, 5, {"w": 1})]
    ):
        driver.on_report(sstate, report, offset)
    assert marker(3) == {"events": 3}  # nothing closed above 3 was due
    assert marker(5) == {"events": 4}  # tick 5 waits for partition 1: published up to 4
    driver.on_report(sstate, Report("events", 1, 5, 5, {"w": 1}), 3)
    assert marker(6) == {"events": 5}
