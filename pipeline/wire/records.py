"""Wire formats: the source topics' records, dpstream's events topic, and validation.

A source record (the user's topic, read by the ingest, ``ingest.py``) is one of:
  * an event: a JSON object
    ``{"user_id": str, "value"?: number, "key"?: str, "ts"?: number|str, "op"?: "insert"|"delete"}``
    (``op: delete`` feeds the deletion stream of statistics that have one), plus, for a
    ``cell_mean`` statistic, its cell attribute (``cells.field``, e.g.
    ``"h3": "8a2a1072b59ffff"``: a non-empty string). The user id is read from
    ``input.user_id_field`` (a dotted path for a nested field); its key, partition and
    producer do not matter;
  * a batch envelope (header ``dpstream: batch``): a JSON array of such events (our
    producer's), each event positioned by (record offset, index in the array);
  * with ``input.format`` avro, protobuf or json_schema: one event in a Schema Registry's
    wire format, decoded into the same object by ``registry_formats`` (``Decode``) and
    read by the same rules.

dpstream's events topic (written by the ingest and the clock only) holds
  * envelopes (header ``dpstream: envelope``): the validated events of one source
    partition whose users hash (murmur2) to the record's partition, in source order,
    columnar for stage 1 (``encode_envelope``), with the fingerprint of the rules they
    were validated and routed under (``rules_fingerprint``), which stage 1 checks along
    with each event (``refused_rows``);
  * tick markers (header ``dpstream: tick``): ``{"tick": n}``, written by the leader's
    clock into every partition. Events between markers n-1 and n belong to tick n.

dpstream's stage-2 topic (written by stage 1 and the clock only) holds stage 1's reports
(no header, ``statistic.Report``) and release markers (header ``dpstream: release``):
``{"tick": n}``, written by the leader's clock into every partition once tick n's release
deadline has passed (``release_deadline_ms``); stage 2 publishes what it closed up to
tick n then, stamped with that deadline.

A bad source record or event is rejected with a reason and goes to the dead-letter topic.
Reasons name the problem, never the raw value (user ids and payloads stay out of logs).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np
import orjson
from aiokafka.partitioner import murmur2

from dpstream.config.schema import PipelineConfig
from dpstream.operators.errors import DpStreamError
from dpstream.statistics.events import NO_VALUE, Batch, Event, ValueRule, Where, scalar_tag
from dpstream.statistics.registry import value_rule

HEADER = "dpstream"
TICK = b"tick"
RELEASE = b"release"
BATCH = b"batch"
ENVELOPE = b"envelope"


class BadRecord(Exception):  # noqa: N818 - it is a verdict on input, not a program error
    """An input record (or one event of an envelope) that cannot be used, and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RegistryUnavailable(DpStreamError):
    """A source record's schema could not be had, for a reason that is not the record's:
    the Schema Registry did not answer, answered with a server or authorization error, or
    is not at its URL (``registry_formats``). Nothing of the record's batch is sent or
    dead-lettered; the ingest pauses and reads the batch again."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_record_bytes: int
    max_user_id_length: int
    # The event keys some statistic counts; None when a statistic counts every event.
    known_keys: frozenset[str] | None
    value_rules: tuple[ValueRule, ...] = ()
    # Event attributes that hold a cell key (kind cell_mean), and their longest value.
    cell_fields: tuple[str, ...] = ()
    max_cell_key_length: int = 128
    # Where an event's user id is: a path of JSON object fields (``input.user_id_field``).
    user_id_path: tuple[str, ...] = ("user_id",)
    # The fields statistics read by dotted path (their ``value_field`` and ``where``
    # fields): (dotted path, its parts), kept in the event's ``attrs``.
    attr_paths: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # key -> _value_plan(...) for an insert and for a delete: which rules apply to such an
    # event, computed once.
    plans: dict = field(default_factory=dict, compare=False, repr=False)


RULES_DOMAIN = b"dpstream-envelope-rules-v1\0"


def rules_fingerprint(limits: Limits, partitions: int) -> str:
    """A short hash of everything that decides whether an event is accepted and where it
    goes: the value rules, the known keys, the cell fields and their limit, the user id's
    path and length limit (``limits``), and the events topic's partition count.

    The ingest writes it into every envelope; stage 1 counts only envelopes made under its
    own (docs/design.md, section 2a). Statistic names are left out (they name the reasons,
    and a rule's order only picks which reason): renaming a statistic or reordering the
    statistics is not a change of rules. ``max_record_bytes`` is left out too: it bounds a
    source record, which stage 1 never sees, not what an event may contribute.
    """
    rules = {orjson.dumps(_rule_terms(r)).decode() for r in limits.value_rules}
    canonical = orjson.dumps(
        {
            "rules": sorted(rules),
            "known_keys": None if limits.known_keys is None else sorted(limits.known_keys),
            "cell_fields": sorted(limits.cell_fields),
            "max_cell_key_length": limits.max_cell_key_length,
            "user_id_path": list(limits.user_id_path),
            "max_user_id_length": limits.max_user_id_length,
            "partitions": partitions,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(RULES_DOMAIN + canonical).hexdigest()[:16]


def _rule_terms(rule: ValueRule) -> list[object]:
    """What of ``rule`` decides acceptance; the value field and filter only where set, so
    the rules of a statistic without them hash as they always have."""
    terms: list[object] = [
        rule.key,
        rule.needs_value,
        rule.max_value,
        rule.deletions,
        rule.cell_field,
        None if rule.cell_keys is None else sorted(rule.cell_keys),
    ]
    if rule.value_path is not None or rule.where is not None:
        where = None if rule.where is None else [[p, sorted(v)] for p, v in rule.where]
        terms += [rule.value_path, where]
    return terms


@functools.lru_cache(maxsize=1 << 16)  # ~10 MB at most
def _murmur2_positive(user_id: str) -> int:
    # Users repeat (the ingest routes every event, close_tick checks every entry): the
    # pure-Python murmur2 cost 4 µs per event uncached.
    return murmur2(user_id.encode()) & 0x7FFFFFFF


def partition_for(user_id: str, partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner picks for key ``user_id``."""
    return _murmur2_positive(user_id) % partitions


def header_kind(headers: Iterable[tuple[str, bytes]] | dict[str, bytes] | None) -> bytes | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for name, value in items:
        if name == HEADER:
            return bytes(value) if value is not None else b""  # b"": an unknown kind
    return None


Tally = dict[tuple[str, str], int]
"""What the ingest counts per statistic, by (statistic, what): the values it clipped
(what: ``CLIPPED``) and the events it could not use that others did (what: the reason)."""

CLIPPED = "clipped"


def parse_event(obj: object, limits: Limits, tally: Tally | None = None) -> Event:
    """The event in ``obj`` under ``limits``; BadRecord (with its reason) when no
    statistic can use it. Into ``tally`` (when given): each statistic's clipped values
    and its rule failures on events that another statistic counts."""
    # orjson returns exact dicts, lists, strs, ints, floats and bools: ``type(x) is``
    # checks are exact here (a bool is not an int) and cheaper than isinstance.
    if type(obj) is not dict:
        raise BadRecord("event is not a JSON object")
    get = obj.get
    path = limits.user_id_path
    user_id = get(path[0]) if len(path) == 1 else _nested(obj, path)
    if type(user_id) is not str or len(user_id) > limits.max_user_id_length or not user_id.strip():
        raise _bad_user_id(user_id, ".".join(path))
    key = get("key")
    if key is not None and type(key) is not str:
        raise BadRecord("key is not a string")
    if limits.known_keys is not None and key not in limits.known_keys:
        # No statistic would count this event.
        raise BadRecord("unknown statistic key" if key is not None else "missing key")
    value = get("value")
    problem = None  # why a present value is no value: a failure of the rules needing one
    if value is not None:
        if type(value) is int:
            value = float(value)
        elif type(value) is not float:
            value, problem = None, "value is not a number"
        elif not math.isfinite(value):
            value, problem = None, "value is not finite"
    ts = get("ts")
    if ts is not None and type(ts) not in (int, float, str):
        raise BadRecord("ts is not a number or string")
    op = get("op", "insert")  # present but null is not an op
    if op == "insert":
        delete = False
    elif op == "delete":
        delete = True
    else:
        raise BadRecord("op is not insert or delete")
    cells: tuple[tuple[str, str], ...] = ()
    for name in limits.cell_fields:
        cell = get(name)
        if cell is None:
            continue  # a statistic that needs it rejects the event below
        if type(cell) is not str:
            raise BadRecord(f"{name} is not a string")
        if not cell.strip():
            raise BadRecord(f"empty {name}")
        if len(cell) > limits.max_cell_key_length:
            raise BadRecord(f"{name} too long")
        cells += ((name, cell),)
    attrs = _attrs(obj, limits.attr_paths) if limits.attr_paths else ()
    # tuple.__new__ skips the NamedTuple's Python-level __new__: 0.25 µs of the ingest's
    # per-event cost.
    event = tuple.__new__(Event, (user_id, key, value, delete, cells, attrs))
    plans = limits.plans.get(key)  # keyed by key alone: no tuple built per event
    if plans is None:
        rules = limits.value_rules
        plans = limits.plans[key] = (_value_plan(rules, key, False), _value_plan(rules, key, True))
    deletable, checks, free = plans[delete]
    if delete and not deletable:
        raise BadRecord("op delete: no statistic with deletions counts this event")
    if checks:
        _check_values(event, checks, free, problem, tally)
    return event


def _attrs(obj: dict, paths: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple:
    """(dotted path, JSON scalar) of each path the event holds a scalar at (an object, a
    list, a non-finite number or an integer beyond 64 bits (a decoded Schema Registry
    record may hold one; JSON cannot) is none)."""
    out: tuple = ()
    for name, path in paths:
        x: Any = obj.get(path[0]) if len(path) == 1 else _nested(obj, path)
        if _is_scalar(x):
            out += ((name, x),)
    return out


_INT64 = 1 << 63


def _is_scalar(x: Any) -> bool:
    kind = type(x)
    if kind is int:
        return -_INT64 <= x < _INT64  # an envelope's integers are 64-bit
    if kind is float:
        return math.isfinite(x)
    return kind is str or kind is bool


def matches(event: Event, where: Where) -> bool:
    """Whether ``event`` holds one of the accepted values in each of ``where``'s fields."""
    return all(scalar_tag(event.attr(path)) in accepted for path, accepted in where)


def value_of(event: Event, rule: ValueRule, problem: str | None) -> tuple[float | None, str]:
    """(the value ``rule``'s statistic reads of ``event``, else None and why)."""
    path = rule.value_path
    if path is None:
        return event.value, problem or "missing value"
    x = event.attr(path)
    if type(x) is int or type(x) is float:
        return float(x), ""  # type: ignore[arg-type]
    return None, f"missing {path}" if x is None else f"{path} is not a number"


def _nested(obj: object, path: tuple[str, ...]) -> object:
    for name in path:
        if type(obj) is not dict:
            return None
        obj = obj.get(name)
    return obj


def user_id_of(event: object, user_id_field: str) -> object:
    """The value at ``input.user_id_field`` (a dotted path) of a decoded event, or None:
    what a producer keys a record by, as the ingest reads it (not validated here)."""
    return _nested(event, tuple(user_id_field.split(".")))


def _bad_user_id(user_id: object, name: str) -> BadRecord:
    if user_id is None:
        return BadRecord(f"missing {name}")
    if type(user_id) is not str:
        return BadRecord(f"{name} is not a string")
    if not user_id.strip():
        return BadRecord(f"empty {name}")
    return BadRecord(f"{name} too long")


def _value_plan(
    rules: tuple[ValueRule, ...], key: str | None, delete: bool
) -> tuple[bool, tuple[ValueRule, ...], bool]:
    """(whether a statistic with deletions counts such an event, the rules that select it
    and check it, whether a statistic that selects it needs nothing of it) for events
    with this key and op. A rule's failure keeps the event from that statistic only: it
    is refused when every statistic that selects it fails (``_check_values``)."""
    deletable, checks, free = False, [], False
    for rule in rules:
        if rule.key is not None and key != rule.key:
            continue
        deletable = deletable or rule.deletions
        if delete and not rule.deletions:
            continue
        if rule.needs_value or rule.where is not None:
            checks.append(rule)
        else:
            free = True
    return deletable, tuple(checks), free


def _rule_failure(event: Event, rule: ValueRule, value: float | None, why: str) -> str | None:
    """Why ``rule``'s statistic cannot use ``event`` whose value for it is ``value``
    (``why``: why it has none) (None: it can)."""
    if value is None:
        return why
    if rule.cell_field is not None:
        cell = event.cell(rule.cell_field)
        if cell is None:
            return f"missing {rule.cell_field}"
        if rule.cell_keys is not None and cell not in rule.cell_keys:
            return f"{rule.cell_field} not in cells.keys"
    return None


def failure_reason(failed: list[tuple[str, str]]) -> str:
    """One reason for an event no statistic could use, from (reason, statistic) of each
    statistic that selected it: "missing value (statistics revenue, basket)"."""
    by_reason: dict[str, list[str]] = {}
    for reason, statistic in failed:
        by_reason.setdefault(reason, []).append(statistic)
    return "; ".join(
        f"{reason} (statistic {names[0]})"
        if len(names) == 1
        else f"{reason} (statistics {', '.join(names)})"
        for reason, names in by_reason.items()
    )


def _check_values(
    event: Event,
    checks: tuple[ValueRule, ...],
    free: bool,
    problem: str | None,
    tally: Tally | None,
) -> None:
    """Each rule's check of ``event``; BadRecord when every statistic that selects it
    fails (``free``: one that needs nothing of it does not). Into ``tally``: the values
    clipped and, for an event used by some, the others' failures."""
    failed: list[tuple[str, str]] = []
    used = free
    for rule in checks:
        if rule.where is not None and not matches(event, rule.where):
            continue  # not an event it selects
        if not rule.needs_value:
            used = True
            continue
        value, why = value_of(event, rule, problem)
        reason = _rule_failure(event, rule, value, why)
        if reason is not None:
            failed.append((reason, rule.statistic))
            continue
        used = True
        if tally is not None and rule.bounds is not None:
            lower, upper = rule.bounds
            if not lower <= value <= upper:  # type: ignore[operator]  # not None: checked
                what = (rule.statistic, CLIPPED)
                tally[what] = tally.get(what, 0) + 1
    if not used:
        raise BadRecord(failure_reason(failed) if failed else "no statistic's where matches")
    if not failed:
        return
    if tally is not None:
        for reason, statistic in failed:
            what = (statistic, reason)
            tally[what] = tally.get(what, 0) + 1


def _loads(value: bytes) -> object:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        # orjson refuses NaN, Infinity and overflowing numbers; say so precisely.
        if "infinity" in str(exc) or b"NaN" in value or b"Infinity" in value:
            raise BadRecord("non-finite number (NaN or infinity)") from None
        raise BadRecord("malformed JSON") from None


# A marker is written by the leader's clock right after its time (a tick's end, a release
# deadline); the broker stamps it (the events and stage-2 topics use LogAppendTime). One
# that claims a time not yet come, or one long over, is not the clock's: anyone who may
# write the topic could write it.
MARKER_CLOCK_SKEW_SECONDS = 2.0
MARKER_MAX_AGE_SECONDS = 300.0


def release_deadline_ms(tick: int, interval: float, delay: float) -> int:
    """Tick ``tick``'s release deadline, tick end + ``delay``, in whole milliseconds (a
    Kafka timestamp): its releases' record timestamp."""
    return round(((tick + 1) * interval + delay) * 1000)


def check_marker_time(
    tick: int,
    interval: float,
    timestamp_ms: int | None,
    delay: float = 0.0,
    what: str = "tick marker",
) -> None:
    """Raise BadRecord unless marker ``tick`` was appended after its time, the tick's end
    plus ``delay`` (a release marker's: the release delay), and not long after
    (``timestamp_ms``: the record's broker timestamp; None skips)."""
    if timestamp_ms is None or timestamp_ms <= 0:
        return
    appended, due = timestamp_ms / 1000, (tick + 1) * interval + delay
    if due > appended + MARKER_CLOCK_SKEW_SECONDS:
        raise BadRecord(f"{what} from the future")
    if appended - due > max(MARKER_MAX_AGE_SECONDS, 10 * interval):
        raise BadRecord(f"{what} too old")


def decode_tick(value: bytes, what: str = "tick marker") -> int:
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise BadRecord(f"malformed {what}") from None
    tick = obj.get("tick") if isinstance(obj, dict) else None
    if isinstance(tick, bool) or not isinstance(tick, int) or tick < 0:
        raise BadRecord(f"malformed {what}")
    return tick


def encode_tick(tick: int) -> bytes:
    return orjson.dumps({"tick": tick})


Decode = Callable[[bytes], object]
"""A source record's value -> the decoded record ``parse_event`` reads (BadRecord if it
does not decode): JSON's is ``_loads``; a Schema Registry format's is a
``registry_formats.RegistryDecoder``."""


def decode_events(
    value: bytes | None,
    kind: bytes | None,
    limits: Limits,
    decode: Decode | None = None,
    tally: Tally | None = None,
) -> tuple[list[Event], list[tuple[int, str]]]:
    """Decode an event record or envelope; ``decode``: the values' format (None: JSON);
    ``tally``: as ``parse_event``'s.

    Returns the good events and, for an envelope, (index, reason) for each bad event in
    it: one bad event does not sink its neighbours. Raises BadRecord when the record as
    a whole is unusable.
    """
    if value is None:
        raise BadRecord("empty record")
    if len(value) > limits.max_record_bytes:
        raise BadRecord("oversized record")
    if decode is not None:
        # Batch envelopes are dpstream's own JSON; in another format a record is one event.
        if kind is not None:
            raise BadRecord("dpstream header on a record not in JSON")
        return [parse_event(decode(value), limits, tally)], []
    obj = _loads(value)
    if kind == BATCH:
        if type(obj) is not list:
            raise BadRecord("batch envelope is not a JSON array")
        good: list[Event] = []
        bad: list[tuple[int, str]] = []
        append = good.append
        for i, item in enumerate(obj):
            try:
                append(parse_event(item, limits, tally))
            except BadRecord as exc:
                bad.append((i, exc.reason))
        return good, bad
    if kind is not None:
        raise BadRecord("unknown dpstream header")
    return [parse_event(obj, limits, tally)], []


def event_json(event: Event) -> dict[str, object]:
    """The canonical JSON form of a validated event (used by export and replay logs)."""
    out: dict[str, object] = {"user_id": event.user_id}
    if event.key is not None:
        out["key"] = event.key
    if event.value is not None:
        out["value"] = event.value
    if event.delete:
        out["op"] = "delete"
    for attr, cell in event.cells:
        out[attr] = cell
    for path, x in event.attrs:
        _set_nested(out, path.split("."), x)
    return out


def _set_nested(out: dict, path: list[str], x: object) -> None:
    for name in path[:-1]:
        inner = out.setdefault(name, {})
        if type(inner) is not dict:
            return  # a scalar there already (the same event's): nothing below it
        out = inner
    out.setdefault(path[-1], x)


# A dead letter keeps this much of the record it reports (for inspection; never logged).
DEAD_LETTER_PAYLOAD_CHARS = 4096

DEAD_LETTER_SCHEMA_VERSION = 1
"""The shape of ``DeadLetterRecord``. Dead letters carry no ``schema_version`` field: one
without is version 1 (a later shape will say its version)."""


class DeadLetterRecord(TypedDict):
    """A record of the dead-letter topic: why, where from (the rejected record's topic,
    partition and offset, and its index in a batch or envelope), and a bounded prefix of
    what. The payload is the user's data: the topic is the pipeline operators', never
    granted to readers of the releases (``kafka.acls``)."""

    reason: str
    topic: str
    partition: int
    offset: int
    index: int | None
    payload: str
    payload_truncated: bool
    payload_encoding: NotRequired[Literal["base64"]]  # a binary payload (Avro, Protobuf)


def dead_letter(
    reason: str,
    topic: str,
    partition: int,
    offset: int,
    payload: bytes | None,
    index: int | None,
    binary: bool = False,
) -> bytes:
    """A dead-letter record: why, where from, and (a bounded prefix of) what. A
    ``binary`` payload (Avro, Protobuf: text would garble it) is written in base64, with
    ``"payload_encoding": "base64"``."""
    raw = payload or b""
    if binary:
        kept = raw[: DEAD_LETTER_PAYLOAD_CHARS // 4 * 3]  # base64: 4 characters per 3 bytes
        text, truncated = base64.b64encode(kept).decode("ascii"), len(kept) < len(raw)
    else:
        text = raw.decode("utf-8", errors="replace")
        truncated = len(text) > DEAD_LETTER_PAYLOAD_CHARS
    record: DeadLetterRecord = {
        "reason": reason,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "index": index,
        "payload": text[:DEAD_LETTER_PAYLOAD_CHARS],
        "payload_truncated": truncated,
    }
    if binary:
        record["payload_encoding"] = "base64"
    return orjson.dumps(record)


def event_dead_letter(reason: str, source: str, offset: int, index: int, event: Event) -> bytes:
    """The dead letter of a validated event, named by its source position (``source``:
    "<topic>/<partition>", as ``source_id`` writes it), its canonical JSON as the payload
    (it can be produced again as it is)."""
    topic, _, partition = source.rpartition("/")
    payload = orjson.dumps(event_json(event))
    return dead_letter(reason, topic, int(partition), offset, payload, index)


Position = tuple[int, int]
"""Where an event was in its source partition: (record offset, index in a batch record)."""

_VALUE_TYPES = {float, int, type(None)}
_SCALARS = (str, bool, int, float)


@dataclass(frozen=True, slots=True)
class Envelope:
    """Validated events of one source partition, in source order (positions strictly
    increasing), all of users that hash to the events partition the envelope is in."""

    source: str  # "<topic>/<partition>"
    offsets: list[int]
    indexes: list[int]
    batch: Batch
    rules: str | None = None  # the ingest's ``rules_fingerprint`` (None: the envelope has none)

    @property
    def events(self) -> list[Event]:
        return list(self.batch)

    def positions(self) -> list[Position]:
        return list(zip(self.offsets, self.indexes, strict=True))


def source_id(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def encode_envelope(
    source: str, offsets: list[int], indexes: list[int], events: list[Event], *, rules: str
) -> bytes:
    """Columns, so that stage 1 reads an envelope into numpy arrays without a Python
    object per event: "s" the source, "r" the rules the events were validated and routed
    under (``rules_fingerprint``), "o" offsets, "U" the distinct user ids and "x" each
    event's index in "U", and only where some event has one: "i" indexes, "K" the
    distinct keys and "y" each event's index in "K" (-1: none), "v" values, "d" the
    positions of deletions, "c" cell keys per attribute, "a" the fields statistics read
    by path (``Limits.attr_paths``), per path."""
    users: dict[str, int] = {}
    keys: dict[str | None, int] = {None: -1}
    x, y, values, deletes = [], [], [], []
    has_value = has_cells = has_attrs = False
    for n, e in enumerate(events):
        x.append(users.setdefault(e.user_id, len(users)))
        y.append(keys.setdefault(e.key, len(keys) - 1))
        values.append(e.value)
        if e.value is not None:
            has_value = True
        if e.delete:
            deletes.append(n)
        if e.cells:
            has_cells = True
        if e.attrs:
            has_attrs = True
    out: dict[str, object] = {"s": source, "r": rules, "o": offsets, "U": list(users), "x": x}
    if any(indexes):
        out["i"] = indexes
    if len(keys) > 1:
        out["K"] = [k for k in keys if k is not None]
        out["y"] = y
    if has_value:
        out["v"] = values
    if deletes:
        out["d"] = deletes
    if has_cells:
        attrs = sorted({a for e in events for a, _ in e.cells})
        out["c"] = {a: [e.cell(a) for e in events] for a in attrs}
    if has_attrs:
        paths = sorted({p for e in events for p, _ in e.attrs})
        out["a"] = {p: [e.attr(p) for e in events] for p in paths}
    return orjson.dumps(out)


def _column(obj: dict, name: str, n: int, kinds: tuple[type, ...]) -> list:
    column = obj.get(name)
    if column is None:
        return [None] * n
    if type(column) is not list or len(column) != n:
        raise BadRecord("malformed envelope")
    for item in column:
        if item is not None and type(item) not in kinds:
            raise BadRecord("malformed envelope")
    return column


def _ints(obj: dict, name: str, n: int, default: int, low: int, high: int | None) -> np.ndarray:
    """Column ``name`` as int64, every entry in [low, high) (absent: all ``default``;
    high None: no upper bound)."""
    column = obj.get(name)
    if column is None:
        return np.full(n, default, dtype=np.int64)
    if type(column) is not list or len(column) != n:
        raise BadRecord("malformed envelope")
    try:
        array = np.array(column) if n else np.zeros(0, dtype=np.int64)
    except ValueError:  # ragged nesting
        raise BadRecord("malformed envelope") from None
    if array.dtype.kind != "i" or array.ndim != 1:
        raise BadRecord("malformed envelope")  # floats, strings, bools, nesting
    if n and (array.min() < low or (high is not None and array.max() >= high)):
        raise BadRecord("malformed envelope")  # out of range
    return array.astype(np.int64, copy=False)


def _names(obj: dict, name: str) -> list[str]:
    names = obj.get(name, [])
    if type(names) is not list or any(type(x) is not str for x in names):
        raise BadRecord("malformed envelope")
    return names


def _values(values: list) -> np.ndarray:
    """A value column (numbers and None) as float64, None as NaN."""
    try:
        array = np.array(values)
    except ValueError:  # ragged nesting
        raise BadRecord("malformed envelope") from None
    if array.dtype.kind == "O":  # some events have no value: check the rest are numbers
        if not set(map(type, values)) <= _VALUE_TYPES:
            raise BadRecord("malformed envelope")
        array = np.array(values, dtype=np.float64)  # None -> NaN
    elif array.dtype.kind not in "fi":
        raise BadRecord("malformed envelope")  # strings, bools
    if array.ndim != 1 or bool(np.isinf(array).any()):
        raise BadRecord("malformed envelope")
    return array.astype(np.float64, copy=False)


def decode_envelope(value: bytes | None) -> Envelope:
    """An envelope written by ``encode_envelope``; BadRecord when it is not one. Only the
    shape is checked here (in numpy); stage 1 checks the events against its own rules
    (``refused_rows``)."""
    try:
        obj = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        raise BadRecord("malformed envelope") from None
    if type(obj) is not dict or type(obj.get("s")) is not str or type(obj.get("o")) is not list:
        raise BadRecord("malformed envelope")
    rules = obj.get("r")
    if rules is not None and type(rules) is not str:
        raise BadRecord("malformed envelope")
    offsets = obj["o"]
    n = len(offsets)
    offset = _ints(obj, "o", n, 0, 0, None)
    index = _ints(obj, "i", n, 0, 0, None)
    user_ids = _names(obj, "U")
    if "x" not in obj:
        raise BadRecord("malformed envelope")
    user = _ints(obj, "x", n, -1, 0, len(user_ids))
    keys = _names(obj, "K")
    key = _ints(obj, "y", n, -1, -1, len(keys))
    values = obj.get("v")
    if values is None:
        value_column = np.full(n, NO_VALUE)
    elif type(values) is not list or len(values) != n:
        raise BadRecord("malformed envelope")
    else:
        value_column = _values(values)
    delete = np.zeros(n, dtype=bool)
    deletes = obj.get("d")
    if deletes:
        delete[_ints(obj, "d", len(deletes) if type(deletes) is list else -1, 0, 0, n)] = True
    cells_by_attr = obj.get("c") or {}
    if type(cells_by_attr) is not dict:
        raise BadRecord("malformed envelope")
    cells = tuple((a, _column(cells_by_attr, a, n, (str,))) for a in cells_by_attr)
    attrs_by_path = obj.get("a") or {}
    if type(attrs_by_path) is not dict:
        raise BadRecord("malformed envelope")
    attrs = tuple((p, _column(attrs_by_path, p, n, _SCALARS)) for p in attrs_by_path)
    later = (offset[1:] > offset[:-1]) | ((offset[1:] == offset[:-1]) & (index[1:] > index[:-1]))
    if not later.all():
        raise BadRecord("malformed envelope")  # not in source order
    indexes = obj["i"] if "i" in obj else [0] * n
    batch = Batch(user_ids, user, keys, key, value_column, delete, cells, attrs)
    return Envelope(obj["s"], offsets, indexes, batch, rules)


def refused_rows(
    batch: Batch, limits: Limits, partition: int, partitions: int
) -> list[tuple[int, str]]:
    """(row, reason) of each event of ``batch`` that an ingest under ``limits`` would not
    have sent to events partition ``partition`` of ``partitions``, in row order: the
    reason ``parse_event`` gives (its first failed check) or, for an event it accepts
    whose user belongs to another partition, that partition.

    Stage 1's check of envelopes it did not make (docs/design.md, section 2a): numpy masks
    over the columns, and Python per distinct user, key and cell key; nothing per event
    unless some event fails."""
    if not len(batch):
        return []
    failures: list[tuple[np.ndarray, str]] = []  # (rows, reason) of each failed check
    _user_failures(batch, limits, failures)
    _key_failures(batch, limits, failures)
    cells = {attr: np.array(column, dtype=object) for attr, column in batch.cells}
    for attr in limits.cell_fields:
        if attr in cells:
            _cell_key_failures(attr, cells[attr], limits.max_cell_key_length, failures)
    _rule_failures(batch, limits.value_rules, cells, failures)
    routed = [partition_for(u, partitions) for u in batch.user_ids]
    if routed.count(partition) != len(routed):
        reasons = [
            None
            if p == partition
            else f"user belongs to partition {p} of {partitions}, not {partition}"
            for p in routed
        ]
        _by_user(batch.user, reasons, failures)
    if not failures:
        return []
    first = np.full(len(batch), len(failures), dtype=np.int64)
    for n, (mask, _) in reversed(list(enumerate(failures))):
        first[mask] = n  # the earliest failed check wins: parse_event's order
    rows = np.flatnonzero(first < len(failures))
    return [
        (row, failures[n][1]) for row, n in zip(rows.tolist(), first[rows].tolist(), strict=True)
    ]


_Failures = list[tuple[np.ndarray, str]]


def _failed(mask: np.ndarray, reason: str, failures: _Failures) -> None:
    if np.count_nonzero(mask):  # a sixth of ndarray.any()'s cost on small arrays
        failures.append((mask, reason))


def _user_failures(batch: Batch, limits: Limits, failures: _Failures) -> None:
    """``parse_event``'s checks of the user id (never blank nor too long)."""
    users, name, longest = batch.user_ids, ".".join(limits.user_id_path), limits.max_user_id_length
    if max(map(len, users)) <= longest and all(map(str.strip, users)):
        return
    reasons = [
        f"empty {name}" if not u.strip() else f"{name} too long" if len(u) > longest else None
        for u in users
    ]
    _by_user(batch.user, reasons, failures)


def _by_user(user: np.ndarray, reasons: list[str | None], failures: _Failures) -> None:
    """The rows of the users with a reason (``reasons``: per user index), by reason."""
    by_reason: dict[str, list[int]] = {}
    for u, reason in enumerate(reasons):
        if reason is not None:
            by_reason.setdefault(reason, []).append(u)
    for reason, which in by_reason.items():
        _failed(np.isin(user, which), reason, failures)


def _key_failures(batch: Batch, limits: Limits, failures: _Failures) -> None:
    """``parse_event``'s check that some statistic counts the event's key."""
    if limits.known_keys is None:
        return
    _failed(batch.key < 0, "missing key", failures)
    unknown = [k for k, key in enumerate(batch.keys) if key not in limits.known_keys]
    if unknown:
        _failed(np.isin(batch.key, unknown), "unknown statistic key", failures)


def _cell_key_failures(attr: str, column: np.ndarray, longest: int, failures: _Failures) -> None:
    """``parse_event``'s checks of a cell attribute's keys (a string, never blank nor
    longer than ``longest``); ``column``: the keys, None where an event has none."""
    distinct = set(column.tolist()) - {None}
    blank = [c for c in distinct if not c.strip()]
    long = [c for c in distinct if c.strip() and len(c) > longest]
    for bad, reason in ((blank, f"empty {attr}"), (long, f"{attr} too long")):
        if bad:
            failures.append((np.isin(column, bad), reason))


def _rule_failures(
    batch: Batch, rules: tuple[ValueRule, ...], cells: dict[str, np.ndarray], failures: _Failures
) -> None:
    """The deletions no statistic with deletions counts (``_value_plan``), then the
    events that every statistic selecting them fails (``_check_values``), with the reason
    ``failure_reason`` gives, or that no statistic's ``where`` selects: an event one
    statistic can use is not refused."""
    delete = batch.delete
    deletes = bool(np.count_nonzero(delete))
    deletable = np.zeros(len(batch), dtype=bool) if deletes else delete
    used = np.zeros(len(batch), dtype=bool)  # some statistic that selects it can use it
    failed: list[tuple[np.ndarray, str, str]] = []  # (rows, reason, statistic)
    for rule in rules:
        if rule.key is None:
            selects = np.ones(len(batch), dtype=bool)  # every event
        elif rule.key in batch.keys:
            selects = batch.key == batch.keys.index(rule.key)
        else:
            continue  # no event of the batch has its key
        if deletes and rule.deletions:
            deletable = deletable | selects
        if deletes and not rule.deletions:
            selects = selects & ~delete
        if rule.where is not None:
            selects = selects & where_rows(batch, rule.where)
        fails = _value_failures(rule, batch, selects, cells) if rule.needs_value else []
        bad = np.zeros(len(batch), dtype=bool)
        for rows, reason in fails:
            failed.append((rows, reason, rule.statistic))
            bad |= rows
        used |= selects & ~bad
    if deletes:
        reason = "op delete: no statistic with deletions counts this event"
        _failed(delete & ~deletable, reason, failures)
    if any(rule.where is not None for rule in rules):
        refused = ~used  # unselected rows too; those of an earlier failure keep its reason
    else:
        refused = np.zeros(len(batch), dtype=bool)
        for rows, _, _ in failed:
            refused |= rows
        refused &= ~used
    if not np.count_nonzero(refused):
        return
    by_reason: dict[str, list[int]] = {}  # per refused row (few: an ingest that drifted)
    for row in np.flatnonzero(refused).tolist():
        named = [(r, name) for rows, r, name in failed if rows[row]]
        reason = failure_reason(named) if named else "no statistic's where matches"
        by_reason.setdefault(reason, []).append(row)
    for reason, rows_of in by_reason.items():
        mask = np.zeros(len(batch), dtype=bool)
        mask[rows_of] = True
        failures.append((mask, reason))


def where_rows(batch: Batch, where: Where) -> np.ndarray:
    """The rows of ``batch`` that ``where`` selects (``matches`` over the columns)."""
    attrs = dict(batch.attrs)
    out = np.ones(len(batch), dtype=bool)
    for path, accepted in where:
        column = attrs.get(path) or [None] * len(batch)
        out &= np.fromiter((scalar_tag(x) in accepted for x in column), bool, len(batch))
    return out


def value_column(batch: Batch, path: str | None) -> np.ndarray:
    """The values at ``path`` as float64, NaN where there is no number (None: the
    events' "value")."""
    if path is None:
        return batch.value
    column = dict(batch.attrs).get(path)
    if column is None:
        return np.full(len(batch), NO_VALUE)
    numbers = (float(x) if type(x) is int or type(x) is float else NO_VALUE for x in column)
    return np.fromiter(numbers, np.float64, len(batch))


def _value_failures(
    rule: ValueRule, batch: Batch, selects: np.ndarray, cells: dict[str, np.ndarray]
) -> list[tuple[np.ndarray, str]]:
    """(rows, reason) of the events ``rule`` selects (``selects``) and cannot use, as
    ``value_of`` and ``_rule_failure`` say: no value (NaN), then no cell key or one outside
    the domain."""
    out: list[tuple[np.ndarray, str]] = []
    value = value_column(batch, rule.value_path)
    missing = selects & np.isnan(value)
    if np.count_nonzero(missing):
        if rule.value_path is None:
            out.append((missing, "missing value"))
        else:
            path, fields = rule.value_path, dict(batch.attrs).get(rule.value_path)
            present = np.zeros(len(value), dtype=bool)
            if fields is not None:
                present = np.fromiter((x is not None for x in fields), bool, len(value))
            _failed(missing & ~present, f"missing {path}", out)
            _failed(missing & present, f"{path} is not a number", out)
    if rule.cell_field is None:
        return out
    attr, rest = rule.cell_field, selects & ~missing
    column = cells.get(attr)
    absent = np.ones(len(value), dtype=bool) if column is None else column == None  # noqa: E711
    if np.count_nonzero(rest & absent):
        out.append((rest & absent, f"missing {attr}"))
    if column is not None and rule.cell_keys is not None:
        foreign = set(column.tolist()) - rule.cell_keys - {None}
        if foreign:
            out.append((rest & np.isin(column, list(foreign)), f"{attr} not in cells.keys"))
    return out


def limits_for(cfg: PipelineConfig) -> Limits:
    # A statistic without a key filter counts every event, whatever its key.
    counts_every_key = any(s.key is None for s in cfg.statistics)
    keys = frozenset(s.key for s in cfg.statistics if s.key is not None)
    return Limits(
        max_record_bytes=cfg.input.max_record_bytes,
        max_user_id_length=cfg.input.max_user_id_length,
        known_keys=None if counts_every_key else keys,
        value_rules=tuple(value_rule(s) for s in cfg.statistics),
        cell_fields=tuple(sorted({s.cells.field for s in cfg.statistics if s.cells})),
        max_cell_key_length=cfg.input.max_cell_key_length,
        user_id_path=tuple(cfg.input.user_id_field.split(".")),
        attr_paths=tuple((p, tuple(p.split("."))) for p in read_by_path(cfg)),
    )


def read_by_path(cfg: PipelineConfig) -> list[str]:
    """The fields the statistics read by dotted path (value fields, ``where`` fields),
    sorted."""
    paths = {s.value_field for s in cfg.statistics if s.value_field is not None}
    paths |= {p for s in cfg.statistics for p in (s.where or {})}
    return sorted(paths)
