"""What each stage does with one record: the same code in the worker and in ``replay``.

The Faust agents (``app.py``) read records, call these drivers, send what they return and
store the states once the broker has acknowledged it; ``replay.py`` calls the same drivers
over a log. Neither decides anything the drivers decide: which marker is a re-delivery,
which bad event is dead-lettered (once), which events of an envelope this stage 1's own
rules refuse, where a consumer skipped records, what a report closes, what a release
marker publishes and with which timestamp, which of the ingest's events were counted
before, which reports name a statistic no longer configured. No Kafka here.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from dpstream.config.schema import PipelineConfig
from dpstream.operators.noise import NoiseSource
from dpstream.statistics.contract import Report
from dpstream.statistics.events import Batch, Event

from ..wire.records import (
    ENVELOPE,
    RELEASE,
    TICK,
    BadRecord,
    Envelope,
    Limits,
    check_marker_time,
    dead_letter,
    decode_envelope,
    decode_tick,
    event_dead_letter,
    header_kind,
    limits_for,
    partition_for,
    refused_rows,
    release_deadline_ms,
    rules_fingerprint,
)
from .stage1 import Stage1
from .stage1_state import PartitionEntry, UserEntry, redelivered
from .stage2 import Stage2
from .stage2_state import Stage2State, StatisticRun

log = logging.getLogger(__name__)

FOREIGN_RULES = "stage 1: envelope made under other rules"
"""The reason of an event whose envelope carries another rules fingerprint; the dead
letter's reason goes on with both fingerprints, the envelope's as it came."""

Rejected = tuple[int | None, str]
"""A dead letter: the event's index in its envelope (None: the whole record) and why."""


@dataclass(frozen=True, slots=True)
class Refused:
    """An event of an envelope that stage 1 refused: why, and its source position (as
    the ingest's dead letters name it) and the event, so that it can be sent again."""

    reason: str
    source: str  # "<topic>/<partition>"
    offset: int
    index: int
    event: Event

    def dead_letter(self) -> bytes:
        return event_dead_letter(self.reason, self.source, self.offset, self.index, self.event)


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One record of a stage's input topic, as its consumer hands it over (or as replay
    makes it: ``tools/replay.py``)."""

    partition: int
    offset: int
    headers: Sequence[tuple[str, bytes]] | None
    value: bytes | None
    timestamp_ms: int | None = None  # the broker's stamp (None: not checked)


@dataclass
class Stage1Outcome:
    """What stage 1 made of one record: the offsets the consumer skipped before it (read
    and ``handle`` them first, then this record again), or the reports to send to stage 2
    and the dead letters; then ``Stage1Driver.done`` once they are acknowledged.
    ``counted``: the record's events counted here for the first time (the metrics')."""

    hole: tuple[int, int] | None = None
    reports: list[Report] = field(default_factory=list)
    dead_letters: list[bytes] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # of the dead letters, in order
    counted: int = 0

    def reject(self, reason: str, dead_letter: bytes) -> None:
        self.reasons.append(reason)
        self.dead_letters.append(dead_letter)


class Stage1Driver:
    """Stage 1, one input record at a time, over one partition's state and users."""

    def __init__(self, cfg: PipelineConfig, limits: Limits | None = None) -> None:
        """Stage 1 of ``cfg``, checking envelopes against ``limits`` (the ingest's rules
        under ``cfg``; replay's log names users ``user_id``, whatever the config reads)."""
        self.stage1 = Stage1(cfg)
        self._topic = cfg.events_topic
        self._partitions = cfg.input.partitions
        self._interval = cfg.ticks.interval_seconds
        self._limits = limits_for(cfg) if limits is None else limits
        # What the ingest writes into the envelopes it makes under this configuration.
        self.rules = rules_fingerprint(self._limits, self._partitions)
        self._foreign: set[str | None] = set()  # other rules seen (each logged once)

    def handle(
        self,
        pstate: PartitionEntry,
        users: MutableMapping[str, UserEntry],
        record: InputRecord,
        in_gap: bool = False,
    ) -> Stage1Outcome:
        """What record ``record`` of the events topic does, in the worker and in replay:
        the offsets the consumer skipped before it (unless it is itself read from such a
        ``hole``: ``in_gap``); else an envelope's events counted (``on_envelope``), a tick
        marker's tick closed (``on_marker``), anything else dead-lettered; a re-delivered
        record sends no dead letter and no report a second time."""
        hole = None if in_gap else self.skipped(pstate, record.offset)
        if hole is not None:
            return Stage1Outcome(hole=hole)
        out = Stage1Outcome()
        fresh = not redelivered(pstate, record.offset)
        kind = header_kind(record.headers)
        if kind == TICK:
            if fresh:
                reports, bad = self.on_marker(
                    pstate, users, record.partition, record.value, record.timestamp_ms
                )
                out.reports = reports
                self._reject_all(out, record, bad)
        elif kind == ENVELOPE:
            bad, refused, out.counted = self._count_envelope(
                pstate, users, record.partition, record.offset, record.value
            )
            self._reject_all(out, record, bad)
            for event in refused:
                out.reject(event.reason, event.dead_letter())
        elif fresh:  # only the ingest and the clock write this topic
            self._reject_all(out, record, [(None, "not a dpstream envelope or tick marker")])
        return out

    def _reject_all(self, out: Stage1Outcome, record: InputRecord, bad: list[Rejected]) -> None:
        for index, reason in bad:
            letter = dead_letter(
                reason, self._topic, record.partition, record.offset, record.value, index
            )
            out.reject(reason, letter)

    @staticmethod
    def skipped(pstate: PartitionEntry, offset: int) -> tuple[int, int] | None:
        """Offsets [start, end) before ``offset`` the consumer never handed over (Faust can
        leave a hole at a rebalance): they must be processed first."""
        last = pstate["last_offset"]
        return (last + 1, offset) if 0 <= last < offset - 1 else None

    def on_envelope(
        self,
        pstate: PartitionEntry,
        users: MutableMapping[str, UserEntry],
        partition: int,
        offset: int,
        value: bytes | None,
    ) -> tuple[list[Rejected], list[Refused]]:
        """Count the events of envelope record ``offset`` that this partition has not
        counted before and that pass its own rules (``admitted``). Returns the dead
        letters: the record's when it is not an envelope, and the refused events'."""
        bad, refused, _ = self._count_envelope(pstate, users, partition, offset, value)
        return bad, refused

    def _count_envelope(
        self,
        pstate: PartitionEntry,
        users: MutableMapping[str, UserEntry],
        partition: int,
        offset: int,
        value: bytes | None,
    ) -> tuple[list[Rejected], list[Refused], int]:
        """``on_envelope``, and how many events it counted."""
        fresh = not redelivered(pstate, offset)
        try:
            envelope = decode_envelope(value)
        except BadRecord as exc:
            return ([(None, exc.reason)] if fresh else []), [], 0
        events, refused = self.admitted(pstate, envelope, partition)
        self.stage1.add_events(pstate, users, events, offset, partition)
        return [], refused if fresh else [], len(events)

    def admitted(
        self, pstate: PartitionEntry, envelope: Envelope, partition: int
    ) -> tuple[Batch, list[Refused]]:
        """(the events of ``envelope`` this partition counts, the ones it refuses, why).

        Of the events it has not counted before (``unseen``, whose position advances past
        refused ones too: they are handled, dead-lettered), it counts those that an
        ingest under this configuration would have sent to ``partition``: the envelope
        must carry this configuration's rules fingerprint (else every event is refused),
        and each event must pass the same checks the ingest makes, with the same reasons
        (``records.refused_rows``). An ingest whose configuration drifted, or an old one
        during a rolling change, cannot feed this stage 1 events its bounds do not hold
        for, or users it does not own (docs/design.md, section 2a)."""
        batch = self.unseen(pstate, envelope)
        if not len(batch):
            return batch, []
        start = len(envelope.offsets) - len(batch)
        if envelope.rules != self.rules:
            self._log_foreign(envelope.rules)
            reason = (
                "stage 1: envelope without a rules fingerprint"
                if envelope.rules is None
                else f"{FOREIGN_RULES} ({envelope.rules}, this stage 1's: {self.rules})"
            )
            refused = [(row, reason) for row in range(len(batch))]
        else:
            refused = [
                (row, f"stage 1: {reason}")
                for row, reason in refused_rows(batch, self._limits, partition, self._partitions)
            ]
        if not refused:
            return batch, []
        rows = [row for row, _ in refused]
        keep = np.ones(len(batch), dtype=bool)
        keep[rows] = False
        out = [
            Refused(
                reason,
                envelope.source,
                envelope.offsets[start + row],
                envelope.indexes[start + row],
                event,
            )
            for (row, reason), event in zip(refused, batch.events(rows), strict=True)
        ]
        return batch.take(keep), out

    def _log_foreign(self, rules: str | None) -> None:
        if rules in self._foreign:
            return
        self._foreign.add(rules)
        log.warning(
            "stage 1: dead-lettering envelopes made under rules %s (this configuration's: "
            "%s): an ingest runs with another configuration or partition count",
            rules,
            self.rules,
        )

    @staticmethod
    def unseen(pstate: PartitionEntry, envelope: Envelope) -> Batch:
        """The envelope's events after the last source position this partition counted
        of its source partition (and that position, advanced).

        This is what makes the ingest's re-sends harmless: every ingest sends each
        partition the events of a source partition in source order, gapless, from where
        its consumer group had committed, which is at or below what reached this topic;
        so an event at or below the last counted position was counted (docs/design.md,
        "Exactly once from the source")."""
        sources = pstate.setdefault("sources", {})
        last = sources.get(envelope.source)
        batch = envelope.batch
        if last is not None and len(batch):
            seen = (last[0], last[1])
            if (envelope.offsets[-1], envelope.indexes[-1]) <= seen:
                batch = batch.tail(len(batch))  # all re-sent
            elif (envelope.offsets[0], envelope.indexes[0]) <= seen:  # a re-send's tail
                batch = batch.tail(bisect.bisect_right(envelope.positions(), seen))
        if len(batch):
            sources[envelope.source] = [envelope.offsets[-1], envelope.indexes[-1]]
        return batch

    def on_marker(
        self,
        pstate: PartitionEntry,
        users: MutableMapping[str, UserEntry],
        partition: int,
        value: bytes | None,
        timestamp_ms: int | None,
    ) -> tuple[list[Report], list[Rejected]]:
        """Close the marker's tick (call only for a marker that is not re-delivered):
        its reports, or the marker's dead letter."""
        try:
            tick = decode_tick(value or b"")
            check_marker_time(tick, self._interval, timestamp_ms)
        except BadRecord as exc:
            return [], [(None, exc.reason)]
        return self.stage1.close_tick(pstate, partition, tick, users), []

    @staticmethod
    def done(pstate: PartitionEntry, offset: int) -> None:
        """Record ``offset`` is applied (after its outputs were acknowledged)."""
        pstate["last_offset"] = max(pstate["last_offset"], offset)


@dataclass
class Stage2Outcome:
    """What stage 2 made of one record of its topic: where reports went missing before it
    (read the stage-2 partition from ``hole_from`` up to it, ``handle`` those records
    first, then this one again), or the releases and ledger entries to publish, by
    statistic, with their Kafka timestamp, and the statistics' states to store once they
    are acknowledged. ``published``: after a release marker, each statistic of its
    partition that has closed a tick, with the tick every release up to which is now
    published (the marker's tick, or its last closed tick if that is earlier)."""

    hole_from: int | None = None
    states: dict[str, Stage2State] = field(default_factory=dict)
    releases: list[tuple[str, dict]] = field(default_factory=list)
    ledger: list[tuple[str, dict]] = field(default_factory=list)
    timestamp_ms: int | None = None
    dead_letters: list[bytes] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)


def statistics_by_partition(cfg: PipelineConfig, partitions: int) -> dict[int, list[str]]:
    """The statistics of each stage-2 partition, as Faust keys the stage-2 topic: by
    statistic name, with Kafka's default partitioner (murmur2)."""
    out: dict[int, list[str]] = {}
    for stat in cfg.statistics:
        out.setdefault(partition_for(stat.name, partitions), []).append(stat.name)
    return out


class Stage2Driver:
    """Stage 2, one record at a time, over one statistic's state: a report is absorbed and
    closes the ticks every partition has reported, whose releases and ledger entries are
    held in the state; a release marker publishes those of its tick and before."""

    def __init__(
        self,
        cfg: PipelineConfig,
        noise: NoiseSource,
        partitions: int,
        runs: Mapping[str, StatisticRun] | None = None,
    ) -> None:
        self.stage2 = Stage2(cfg, noise, partitions, runs)
        self._topic = cfg.stage2_topic
        self._interval = cfg.ticks.interval_seconds
        self._delay = cfg.ticks.release_delay
        self._names_by_partition = statistics_by_partition(cfg, partitions)
        self._configured = frozenset(s.name for s in cfg.statistics)
        self._unknown: set[str] = set()  # statistics whose reports were skipped (logged once)

    def handle(
        self,
        record: InputRecord,
        state_of: Callable[[str], Stage2State | None],
        in_gap: bool = False,
    ) -> Stage2Outcome:
        """What record ``record`` of the stage-2 topic does, in the worker and in replay,
        over the statistics' stored states (``state_of``): a report is absorbed (a report
        of a statistic no longer configured is skipped; one after a hole asks for the
        hole first, unless it is itself read from one: ``in_gap``), a release marker
        publishes what its partition's statistics hold up to its tick, at its deadline."""
        if header_kind(record.headers) == RELEASE:
            return self._release(record, state_of)
        report = Report.from_json(orjson.loads(record.value or b""))
        if not self.configured(report):
            return Stage2Outcome()
        state = state_of(report.statistic) or self.stage2.new_state()
        start = None if in_gap else self.missing_reports(state, report)
        if start is not None:
            log.warning(
                "stage 2, %s: reports after tick %s missing; reading stage-2 partition %s "
                "offsets %s-%s directly",
                report.statistic,
                state.reported[report.partition],
                record.partition,
                start,
                record.offset - 1,
            )
            return Stage2Outcome(hole_from=start)
        self.on_report(state, report, record.offset)
        return Stage2Outcome(states={report.statistic: state})

    def _release(
        self, record: InputRecord, state_of: Callable[[str], Stage2State | None]
    ) -> Stage2Outcome:
        """A release marker: what its partition's statistics hold up to its tick, stamped
        with its deadline; or its dead letter when it is not the clock's."""
        try:
            tick = self.release_tick(record.value, record.timestamp_ms)
        except BadRecord as exc:
            letter = dead_letter(
                exc.reason, self._topic, record.partition, record.offset, record.value, None
            )
            return Stage2Outcome(dead_letters=[letter], reasons=[exc.reason])
        out = Stage2Outcome(timestamp_ms=self.deadline_ms(tick))
        for name in self.statistics_of(record.partition):
            state = state_of(name)
            if state is None:
                continue
            releases, ledger = self.on_release(state, tick)
            if state.last_closed is not None:
                out.published[name] = min(tick, state.last_closed)
            if releases or ledger:
                out.releases.extend((name, r) for r in releases)
                out.ledger.extend((name, e) for e in ledger)
                out.states[name] = state
        return out

    def configured(self, report: Report) -> bool:
        """Whether ``report``'s statistic is in this configuration. One that is not (removed
        in a rolling change: a stage 1 under the old configuration still reports it) is
        skipped, with a warning once per name: it releases nothing more, and the ledger
        keeps its spend charged as retired (``ledger.plan``)."""
        name = report.statistic
        if name in self._configured:
            return True
        if name not in self._unknown:
            self._unknown.add(name)
            log.warning(
                "stage 2: skipping reports of statistic %s, which this configuration does "
                "not have (its spend stays charged as retired)",
                name,
            )
        return False

    @staticmethod
    def missing_reports(state: Stage2State, report: Report) -> int | None:
        """The stage-2 offset to read from when reports of this statistic and stage-1
        partition went missing before ``report`` (a consumer hole), else None.

        That is just after the OLDEST of the stage-1 partitions' last absorbed reports:
        every missing report of every partition lies after it. Reading only after the
        statistic's latest report would lose one that a later report of another partition
        was absorbed after (its tick would then close without it, and be released a second
        time with other contents); reading only after this partition's would miss another
        partition's report skipped before that (it would be absorbed out of order).
        A hole before a partition's FIRST report of a statistic cannot be told from a
        start; Faust's holes come at rebalances, when every partition has long reported."""
        last = state.reported.get(report.partition)
        if last is not None and report.from_tick > last + 1:
            return min(state.offsets.values(), default=-1) + 1
        return None

    def on_report(self, state: Stage2State, report: Report, offset: int) -> None:
        """Absorb report ``offset``; hold the releases and ledger entries of every tick
        it closes until their release marker (``on_release``). A report of a statistic
        not configured is skipped (``configured``)."""
        if not self.configured(report):
            return
        last = state.reported.get(report.partition)
        releases, ledger = self.stage2.on_report(state, report)
        state.held_releases.extend(releases)
        state.held_ledger.extend(ledger)
        if last is None or report.tick > last:  # absorbed, not a re-delivered copy
            state.offsets[report.partition] = offset

    def statistics_of(self, partition: int) -> list[str]:
        """The statistics whose reports and state are in stage-2 partition ``partition``:
        a release marker there publishes theirs."""
        return self._names_by_partition.get(partition, [])

    def release_tick(self, value: bytes | None, timestamp_ms: int | None) -> int:
        """The tick of a release marker (its broker timestamp checked against the tick's
        deadline, as a tick marker's against its end); BadRecord when it is not one."""
        what = "release marker"
        tick = decode_tick(value or b"", what)
        check_marker_time(tick, self._interval, timestamp_ms, self._delay, what)
        return tick

    def deadline_ms(self, tick: int) -> int:
        """The Kafka timestamp of what release marker ``tick`` publishes: its deadline."""
        return release_deadline_ms(tick, self._interval, self._delay)

    @staticmethod
    def on_release(state: Stage2State, tick: int) -> tuple[list[dict], list[dict]]:
        """(releases, ledger entries) that release marker ``tick`` publishes: those held
        of ticks up to ``tick``, in closing order, a tick that missed its own deadline
        included; they leave the state (store it once they are acknowledged)."""
        releases = [r for r in state.held_releases if r["tick"] <= tick]
        ledger = [e for e in state.held_ledger if e["tick"] <= tick]
        state.held_releases = [r for r in state.held_releases if r["tick"] > tick]
        state.held_ledger = [e for e in state.held_ledger if e["tick"] > tick]
        return releases, ledger
