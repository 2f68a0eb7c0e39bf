"""The ingest's per-record work, free of Kafka: validate the source records' events,
dead-letter the bad ones, group the good ones by (source partition, events partition) in
source order and encode them as envelopes (``route``); and keep a read that spans a
rebalance in source order (``from_last_restart``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from dpstream.statistics.events import Event

from ..wire.records import (
    BadRecord,
    Decode,
    Limits,
    Tally,
    dead_letter,
    decode_events,
    encode_envelope,
    event_dead_letter,
    header_kind,
    partition_for,
    rules_fingerprint,
    source_id,
)

# An envelope holds at most this many events and bytes: well under the producer's and the
# broker's default message size (1 MB).
ENVELOPE_EVENTS = 2000


ENVELOPE_BYTES = 512 * 1024


class SourceRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    headers: list | None
    value: bytes | None


@dataclass
class Routed:
    """One batch of source records, routed: envelopes by events partition, dead letters."""

    envelopes: list[tuple[int, bytes]] = field(default_factory=list)
    dead_letters: list[bytes] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    events: int = 0
    # Per statistic: values clipped, and rule failures on events others counted
    # (``records.Tally``).
    tally: Tally = field(default_factory=dict)


_Columns = tuple[list[int], list[int], list[Event]]  # offsets, indexes, events


# What a record's dead letters name: the event's index in it (None: the whole record).
_Bad = Sequence[tuple[int | None, str]]


def route(
    records: Iterable[SourceRecord],
    limits: Limits,
    partitions: int,
    decode: Decode | None = None,
) -> Routed:
    """Validate the records' events and group them by (source partition, events partition)
    in source order; bad records and events become dead letters. Each envelope carries
    the fingerprint of ``limits`` and ``partitions`` (stage 1 counts only envelopes made
    under its own). ``decode``: the source values' format, None for JSON (a Schema
    Registry format's decoder may raise ``RegistryUnavailable``: the batch is not routed,
    nothing of it is sent, and the ingest reads it again)."""
    # Per (source partition, events partition), in order of first event: offsets,
    # indexes, events. The hot loop keeps its lookups local and builds no tuple per event:
    # a few hundred ns per event is a third of the ingest.
    columns: list[tuple[str, int, int, _Columns]] = []
    by_source: dict[tuple[str, int], dict[int, _Columns]] = {}
    owner: dict[str, int] = {}  # user id -> events partition, within the batch
    out = Routed()
    tally = out.tally
    topic, source_partition, groups = None, None, {}
    bad: _Bad
    for record in records:
        headers = record.headers
        try:
            events, bad = decode_events(
                record.value, header_kind(headers) if headers else None, limits, decode, tally
            )
        except BadRecord as exc:
            bad, events = [(None, exc.reason)], []
        if bad:
            _reject(out, record, bad, binary=decode is not None)
        if not events:
            continue
        indexes = _good_indexes(len(events), bad) if bad else None
        offset = record.offset
        if record.partition != source_partition or record.topic != topic:  # runs per source
            topic, source_partition = record.topic, record.partition
            groups = by_source.setdefault((topic, source_partition), {})
        for n, event in enumerate(events):
            user = event.user_id
            partition = owner.get(user)
            if partition is None:
                partition = owner[user] = partition_for(user, partitions)
            group = groups.get(partition)
            if group is None:
                group = groups[partition] = ([], [], [])
                columns.append((topic, source_partition, partition, group))
            group[0].append(offset)
            group[1].append(n if indexes is None else indexes[n])
            group[2].append(event)
        out.events += len(events)
    rules = rules_fingerprint(limits, partitions)
    for topic, source_partition, partition, (offsets, indexes, events) in columns:
        source = source_id(topic, source_partition)
        for start in range(0, len(events), ENVELOPE_EVENTS):
            end = start + ENVELOPE_EVENTS
            where = (source, partition, rules)
            _add_envelopes(out, where, offsets[start:end], indexes[start:end], events[start:end])
    return out


def from_last_restart(records: list[SourceRecord]) -> list[SourceRecord]:
    """``records`` without those of a source partition before its last restart: a record
    whose offset is not above the one before it of the same partition.

    A read that spans a rebalance (the callbacks run inside ``poll``/``consume``) can hold
    a partition's records from before it, then the same partition again from its committed
    offset, which is at or below them (the ingest commits only what it sent). An envelope
    must hold one source partition's events in source order (stage 1 dead-letters it
    whole otherwise, and its events would be lost); the records from the last restart on
    are that run, and cover the ones dropped. A partition now owned by another member has
    no restart here: its records go out, and stage 1 counts each event once
    (``Stage1Driver.unseen``)."""
    last: dict[tuple[str, int], int] = {}
    start: dict[tuple[str, int], int] = {}
    for i, record in enumerate(records):
        source = (record.topic, record.partition)
        if source in last and record.offset <= last[source]:
            start[source] = i
        last[source] = record.offset
    if not start:
        return records
    return [r for i, r in enumerate(records) if i >= start.get((r.topic, r.partition), 0)]


def _good_indexes(good: int, bad: _Bad) -> list[int]:
    """The good events' indexes in their record: those not dead-lettered, in order."""
    rejected = {index for index, _ in bad}
    return [i for i in range(good + len(bad)) if i not in rejected]


def _reject(out: Routed, record: SourceRecord, bad: _Bad, binary: bool) -> None:
    topic, partition, offset, value = record.topic, record.partition, record.offset, record.value
    for index, reason in bad:
        out.reasons.append(reason)
        out.dead_letters.append(
            dead_letter(reason, topic, partition, offset, value, index, binary=binary)
        )


def _add_envelopes(
    out: Routed,
    where: tuple[str, int, str],
    offsets: list[int],
    indexes: list[int],
    events: list[Event],
) -> None:
    """One envelope, or halves of it until each is at most ENVELOPE_BYTES (long user ids,
    keys or cell keys make events large); an event too large alone is dead-lettered.
    ``where``: the source, the events partition and the rules fingerprint."""
    source, partition, rules = where
    value = encode_envelope(source, offsets, indexes, events, rules=rules)
    if len(value) <= ENVELOPE_BYTES:
        out.envelopes.append((partition, value))
    elif len(events) == 1:
        reason = "event too large for the events topic"
        out.reasons.append(reason)
        out.dead_letters.append(
            event_dead_letter(reason, source, offsets[0], indexes[0], events[0])
        )
        out.events -= 1
    else:
        half = len(events) // 2
        for part in (slice(0, half), slice(half, None)):
            _add_envelopes(out, where, offsets[part], indexes[part], events[part])
