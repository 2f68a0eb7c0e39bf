"""The typed records a downstream reader gets: a ``Release``, a ``LedgerEntry``, a
``DeadLetter``, each made from one record value of its topic, checked against the schema
version it names (``schemas``) and refused when this installation has no schema for it.

The typed attributes are the ones every record of the family has (or has in the same
sense: ``value`` and ``interval`` of a release); ``fields`` keeps the whole record as
published, for what a kind adds (docs/schemas/ lists each kind's fields).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from jsonschema import Draft202012Validator

from dpstream.operators.errors import DpStreamError

from . import schemas


class RecordError(DpStreamError, ValueError):
    """A record that is not one of the published shapes (not JSON, no schema version
    this installation knows, or not valid under its schema)."""


class UnknownSchemaVersion(RecordError):
    """A record of a schema version this installation has no schema for: a newer
    pipeline's (upgrade dpstream) or one this version no longer reads."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record was read: topic, partition, offset and its Kafka timestamp (ms)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Release:
    """One release of one statistic at one tick.

    Attributes:
        statistic: the statistic's name; ``kind`` its kind (count, sum, histogram, ...).
        tick: the tick released; ``tick_end`` when it ended (UTC).
        value: the released number (a cell mean's for its ``fields["cell"]``); None for a
            histogram (``fields["values"]``, per bin), a mean while its noisy count is
            below 1, and the last release of a statistic whose budget is spent.
        interval: the 95% interval of ``value`` from the noise alone (None where the
            release has none: a k-selection's is ``fields["margin"]`` in ranks).
        std: the noise's standard deviation, where the release says it.
        tau: the contribution bound (a ``tau: auto`` statistic's tracked one), if any.
        epsilon: the statistic's configured epsilon.
        exhausted: the statistic's lifetime budget is spent: no further releases.
        fields: the whole record as published.
        position: where it was read (None: not read from Kafka).
    """

    statistic: str
    kind: str
    tick: int
    tick_end: datetime
    schema_version: int
    value: float | None
    interval: tuple[float, float] | None
    std: float | None
    tau: int | None
    epsilon: float
    exhausted: bool
    fields: Mapping[str, Any]
    position: Position | None = None


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One entry of the ledger: a worker's statement, a statistic's start, or a spend.

    Attributes:
        event: ``statement``, ``start``, ``budget``, ``cells`` or ``exhausted``.
        app_id: the pipeline that wrote it.
        statistic: the statistic it is about (None for a statement: all of them).
        tick: the tick it was written at (None for a statement).
        total_epsilon: the pipeline's ``privacy.total_epsilon`` then.
        epsilon_spent: the statistic's epsilon spent so far, where the entry says it
            (a start: what its run is charged; a budget or exhausted entry: spent);
            a statement: what one user can lose across the pipeline (per_user_total).
        fields: the whole entry as published (with its MAC, which this client does not
            verify: that needs the pipeline's key, ``dpstream ledger`` does).
        position: where it was read (None: not read from Kafka).
    """

    event: str
    app_id: str
    statistic: str | None
    tick: int | None
    schema_version: int
    total_epsilon: float
    epsilon_spent: float | None
    fields: Mapping[str, Any]
    position: Position | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record the pipeline rejected: why and where from. ``payload`` is a bounded
    prefix of the rejected record: user data, kept out of ``repr`` (and so of logs)."""

    reason: str
    topic: str
    partition: int
    offset: int
    index: int | None
    payload_truncated: bool
    payload: str = field(repr=False)
    position: Position | None = None


def checked(
    family: str, value: bytes | None, validate: bool, position: Position | None = None
) -> tuple[dict[str, Any], int]:
    """The record ``value`` of ``family`` (read at ``position``) as a dict, and its schema
    version, checked against that version's schema when ``validate``.

    Raises:
        UnknownSchemaVersion: a version this installation has no schema for.
        RecordError: not a JSON object, or (``validate``) not valid under its schema.
    """
    what = _what(family, position)
    try:
        record = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        raise RecordError(f"{what} that is not JSON") from None
    return checked_record(family, record, validate, position)


def checked_record(
    family: str, record: object, validate: bool, position: Position | None = None
) -> tuple[dict[str, Any], int]:
    """As ``checked``, of a record already decoded (from Avro: ``release_of``)."""
    what = _what(family, position)
    if not isinstance(record, dict):
        raise RecordError(f"{what} that is not a JSON object")
    # Dead letters name no version: the first shape is version 1.
    version = record.get("schema_version", 1 if family == schemas.DEAD_LETTER else None)
    known = schemas.known_versions(family)
    if version not in known:
        raise UnknownSchemaVersion(
            f"{what} of schema_version {version!r}: this dpstream reads "
            f"{', '.join(map(str, known))} (a newer pipeline wrote it: upgrade dpstream)"
        )
    if validate:
        _validate(schemas.validator(family, version), record, what, family, version)
    return record, version


def _what(family: str, position: Position | None) -> str:
    if position is None:
        return f"a {family} record"
    return f"a {family} record at {position.topic}[{position.partition}] offset {position.offset}"


@contextmanager
def _unvalidated(family: str, position: Position | None) -> Iterator[None]:
    """Where ``validate=False`` let through a record of another shape: a ``RecordError``
    naming the field, not a ``KeyError``."""
    try:
        yield
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RecordError(f"{_what(family, position)} without a field as its schema has it: "
                          f"{type(exc).__name__} {exc}") from None  # fmt: skip


def _validate(
    validator: Draft202012Validator, record: dict, what: str, family: str, version: int
) -> None:
    # The message names the field and the rule, never the value (a dead letter's is user
    # data).
    errors = list(validator.iter_errors(record))
    if errors:
        where = ", ".join(sorted({e.json_path for e in errors}))
        raise RecordError(
            f"{what} not valid under {schemas.file_name(family, version)} (at {where})"
        )


def release(
    value: bytes | None, position: Position | None = None, validate: bool = True
) -> Release:
    """The release in a record value of a release topic."""
    record, version = checked(schemas.RELEASE, value, validate, position)
    with _unvalidated(schemas.RELEASE, position):
        return _release(record, version, position)


def release_of(
    record: Mapping[str, Any], position: Position | None = None, validate: bool = True
) -> Release:
    """The release of a record already decoded (an Avro release topic's, as its JSON reads:
    ``avro_schemas.from_avro``), checked as ``release`` checks one."""
    checked_dict, version = checked_record(schemas.RELEASE, dict(record), validate, position)
    with _unvalidated(schemas.RELEASE, position):
        return _release(checked_dict, version, position)


def _release(record: dict[str, Any], version: int, position: Position | None) -> Release:
    interval = record.get("interval")
    tau = record.get("tau")
    value_of = record.get("value")
    return Release(
        statistic=record["statistic"],
        kind=record["kind"],
        tick=record["tick"],
        tick_end=datetime.fromisoformat(record["tick_end"]),
        schema_version=version,
        value=value_of if isinstance(value_of, int | float) else None,
        interval=(float(interval[0]), float(interval[1])) if interval else None,
        std=record["std"] if isinstance(record.get("std"), int | float) else None,
        tau=tau if isinstance(tau, int) else None,
        epsilon=record["epsilon"],
        exhausted=bool(record.get("exhausted", False)),
        fields=record,
        position=position,
    )


def ledger_entry(
    value: bytes | None, position: Position | None = None, validate: bool = True
) -> LedgerEntry:
    """The entry in a record value of the ledger topic."""
    record, version = checked(schemas.LEDGER, value, validate, position)
    with _unvalidated(schemas.LEDGER, position):
        return _ledger_entry(record, version, position)


def _ledger_entry(record: dict[str, Any], version: int, position: Position | None) -> LedgerEntry:
    event = record["event"]
    spent = {
        "statement": "per_user_total",
        "start": "charged",
        "budget": "epsilon_spent",
        "exhausted": "epsilon_spent",
    }.get(event)
    return LedgerEntry(
        event=event,
        app_id=record["app_id"],
        statistic=record.get("statistic"),
        tick=record.get("tick"),
        schema_version=version,
        total_epsilon=record["total_epsilon"],
        epsilon_spent=record[spent] if spent else None,
        fields=record,
        position=position,
    )


def dead_letter(
    value: bytes | None, position: Position | None = None, validate: bool = True
) -> DeadLetter:
    """The dead letter in a record value of the dead-letter topic."""
    record, _ = checked(schemas.DEAD_LETTER, value, validate, position)
    with _unvalidated(schemas.DEAD_LETTER, position):
        return DeadLetter(
            reason=record["reason"],
            topic=record["topic"],
            partition=record["partition"],
            offset=record["offset"],
            index=record.get("index"),
            payload_truncated=record["payload_truncated"],
            payload=record["payload"],
            position=position,
        )
