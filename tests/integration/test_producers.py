"""The producer kit of tests/integration/producers.py against the real broker: each client
users have (confluent-kafka at its defaults, kcat, Kafka's Java console producer), keyed
and unkeyed, delivers every event exactly once; keyed, it keeps a user on one partition,
but librdkafka's clients (CRC32) and Java's (murmur2) pick different partitions for the
same user -- why dpstream's ingest re-partitions the source topic itself. And ``snapshot``
sees one added record and one changed topic config."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from tests.integration import producers
from tests.integration.producers import (
    PRODUCERS,
    QUIET,
    crc32_partition,
    create_source_topic,
    key_of,
    murmur2_partition,
    produce_confluent_default,
    snapshot,
    value_of,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
USERS = 50
EVENTS = 500

# The partitioner each client uses by default on a keyed record.
PARTITIONER = {
    "confluent_default": ("CRC32 (librdkafka consistent_random)", crc32_partition),
    "kcat": ("CRC32 (librdkafka consistent_random)", crc32_partition),
    "java_console": ("murmur2 (Java built-in)", murmur2_partition),
}


def fresh_topic() -> str:
    return f"t-{uuid.uuid4().hex[:8]}.source"


def make_events(n: int = EVENTS) -> list[dict]:
    # Distinct values (seq), so that every event can be found again by value.
    return [
        {"user_id": f"user-{i % USERS}", "key": "click" if i % 3 else "view", "seq": i}
        for i in range(n)
    ]


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_every_event_arrives_once(bootstrap, client, keyed):
    topic = fresh_topic()
    create_source_topic(bootstrap, topic, PARTITIONS)
    events = make_events()
    PRODUCERS[client](bootstrap, topic, events, keyed)
    snap = snapshot(bootstrap, topic)
    records = snap["records"]

    # Exactly once: the values read back are the values produced, each once.
    assert sorted(r["value"] for r in records) == sorted(value_of(e) for e in events)
    assert all(r["headers"] is None for r in records)
    by_value = {value_of(e): e for e in events}
    placement: dict[str, set[int]] = defaultdict(set)
    for r in records:
        event = by_value[r["value"]]
        assert r["key"] == (key_of(event).encode() if keyed else None)
        placement[key_of(event)].add(r["partition"])
    spread = Counter(r["partition"] for r in records)
    print(f"\n{client} {'keyed' if keyed else 'unkeyed'}: records per partition {dict(spread)}")
    if not keyed:
        return

    # Keyed: every user on one partition, the one its client's partitioner names.
    assert all(len(parts) == 1 for parts in placement.values()), placement
    where = {user: parts.pop() for user, parts in placement.items()}
    name, partitioner = PARTITIONER[client]
    other_name, other = next(p for p in set(PARTITIONER.values()) if p[1] is not partitioner)
    expected = {u: partitioner(u.encode(), PARTITIONS) for u in where}
    assert where == expected, f"{client} did not place keys as {name} does"
    agree = sum(where[u] == other(u.encode(), PARTITIONS) for u in where)
    print(
        f"{client}: all {len(where)} users where {name} puts them; "
        f"{other_name} would agree on only {agree}"
    )
    # The two partitioners differ: a topic keyed by one client is misrouted for the other.
    assert agree < len(where) / 2


def test_snapshot_sees_one_added_record_and_a_config_change(bootstrap):
    topic = fresh_topic()
    create_source_topic(bootstrap, topic, PARTITIONS)
    produce_confluent_default(bootstrap, topic, make_events(40), keyed=True)
    before = snapshot(bootstrap, topic)
    assert len(before["records"]) == 40
    assert snapshot(bootstrap, topic) == before  # reading changes nothing

    extra = {"user_id": "user-extra", "key": "view", "seq": 40}
    produce_confluent_default(bootstrap, topic, [extra], keyed=False)
    added = snapshot(bootstrap, topic)
    assert added != before
    new = [r for r in added["records"] if r not in before["records"]]
    assert [r["value"] for r in new] == [value_of(extra)]
    assert added["configs"] == before["configs"]

    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    change = ConfigEntry(
        "message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[change])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    changed = snapshot(bootstrap, topic)
    assert changed["records"] == added["records"]
    assert changed["configs"] != added["configs"]
    assert changed["configs"]["message.timestamp.type"] == "LogAppendTime"


def test_without_kcat_a_developer_skips_and_ci_fails(monkeypatch):
    monkeypatch.setattr(producers.shutil, "which", lambda _name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install kcat"):
        producers.kcat_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the kcat tests"):
        producers.kcat_or_skip()
