"""Typed records from record values: every field where the published record has it, the
schema version checked (an unknown one refused by name), invalid records refused without
their values in the message."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from dpstream.client import records, schemas
from dpstream.client.records import Position, RecordError, UnknownSchemaVersion
from dpstream.operators.errors import DpStreamError

COUNT = {
    "schema_version": 3, "statistic": "views", "kind": "count", "tick": 7,
    "tick_end": "2026-11-27T10:00:07+00:00", "tick_end_unix": 1795773607.0,
    "confidence": 0.95, "epsilon": 1.0, "neighbours": "add/remove one user",
    "mechanism": "binary_tree", "step": 7, "value": 42, "std": 3.5,
    "interval": [35.1, 48.9], "tau": 2,
}  # fmt: skip
AT = Position("dp.views", 0, 11, 1795773607123)


def test_a_release_has_its_typed_fields():
    r = records.release(orjson.dumps(COUNT), AT)
    assert (r.statistic, r.kind, r.tick, r.value, r.std, r.tau, r.epsilon) == (
        "views", "count", 7, 42, 3.5, 2, 1.0,
    )  # fmt: skip
    assert r.interval == (35.1, 48.9) and not r.exhausted
    assert r.tick_end == datetime(2026, 11, 27, 10, 0, 7, tzinfo=UTC)
    assert r.fields == COUNT and r.position == AT


def test_an_exhausted_release_has_no_value():
    last = {k: COUNT[k] for k in list(COUNT)[:10]}
    last.update(exhausted=True, value=None, note="lifetime budget spent")
    r = records.release(orjson.dumps(last))
    assert r.exhausted and r.value is None and r.interval is None and r.tau is None


def test_a_newer_schema_version_is_refused_by_name():
    known = schemas.known_versions(schemas.RELEASE)  # 3 and any later version's file
    newer = {**COUNT, "schema_version": max(known) + 1}
    reads = ", ".join(map(str, known))
    with pytest.raises(UnknownSchemaVersion, match=rf"of schema_version {max(known) + 1}: "
                       rf"this dpstream reads {reads} \(a newer pipeline"):  # fmt: skip
        records.release(orjson.dumps(newer))
    with pytest.raises(DpStreamError, match=r"^a release record at dp.views\[0\] offset 11 of"):
        records.release(orjson.dumps(newer), AT)
    with pytest.raises(UnknownSchemaVersion, match="schema_version None"):
        records.release(orjson.dumps({k: v for k, v in COUNT.items() if k != "schema_version"}))


@pytest.mark.parametrize(
    "changed",
    [{"value": "secret-42"}, {"interval": [1, 2, 3]}, {"extra": 1}, {"kind": "histogram"}],
    ids=["type", "items", "extra-field", "kind-of-other-shape"],
)
def test_an_invalid_release_is_refused_without_its_values(changed):
    with pytest.raises(RecordError, match=r"not valid under release\.v3\.json") as refused:
        records.release(orjson.dumps({**COUNT, **changed}))
    assert "secret" not in str(refused.value)
    # Unvalidated, the same record is read as it is (a trusted topic, read in bulk).
    if "value" not in changed:
        assert records.release(orjson.dumps({**COUNT, **changed}), validate=False).tick == 7


def test_an_unvalidated_record_of_another_shape_is_refused_as_one():
    for broken in ({k: v for k, v in COUNT.items() if k != "tick"}, {**COUNT, "tick_end": 5}):
        with pytest.raises(RecordError, match="without a field as its schema has it"):
            records.release(orjson.dumps(broken), validate=False)


def test_what_is_not_a_json_object_is_refused():
    for value in (b"{not json", b"[1, 2]", None):
        with pytest.raises(RecordError, match="a release record that is not"):
            records.release(value)


def test_a_ledger_entry_says_what_its_statistic_spent():
    entry = {
        "schema_version": 4, "app_id": "shop", "statistic": "views_auto", "tick": 9,
        "total_epsilon": 4.0, "event": "budget", "tracker_epsilon": 0.2,
        "instances_epsilon": 0.3, "epsilon_spent": 0.5, "epsilon": 1.0, "tau": 4,
        "svt_index": 2, "instance": 1, "key_commitment": "c", "mac": "m",
    }  # fmt: skip
    e = records.ledger_entry(orjson.dumps(entry))
    assert (e.event, e.app_id, e.statistic, e.tick, e.total_epsilon, e.epsilon_spent) == (
        "budget", "shop", "views_auto", 9, 4.0, 0.5,
    )  # fmt: skip
    with pytest.raises(RecordError, match="not valid under ledger.v4.json"):
        records.ledger_entry(orjson.dumps({k: v for k, v in entry.items() if k != "mac"}))


def test_a_dead_letter_keeps_its_payload_out_of_its_repr():
    letter = {"reason": "not JSON", "topic": "clicks", "partition": 1, "offset": 5,
              "index": None, "payload": "user-123 secret", "payload_truncated": False}  # fmt: skip
    d = records.dead_letter(orjson.dumps(letter))
    assert (d.reason, d.topic, d.partition, d.offset, d.payload) == (
        "not JSON", "clicks", 1, 5, "user-123 secret",
    )  # fmt: skip
    assert "user-123" not in repr(d)
    with pytest.raises(UnknownSchemaVersion, match="dead-letter record of schema_version 2"):
        records.dead_letter(orjson.dumps({**letter, "schema_version": 2}))
