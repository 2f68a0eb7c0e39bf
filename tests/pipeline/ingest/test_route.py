"""The ingest's routing and the envelope format, without a broker (pipeline/ingest/consumer.py,
pipeline/wire/records.py)."""

from __future__ import annotations

import base64
import dataclasses

import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from dpstream.config.schema import parse_config
from dpstream.pipeline.ingest.route import (
    ENVELOPE_BYTES,
    SourceRecord,
    from_last_restart,
    route,
)
from dpstream.pipeline.wire.records import (
    BadRecord,
    RegistryUnavailable,
    decode_envelope,
    encode_envelope,
    limits_for,
    partition_for,
)
from dpstream.pipeline.wire.registry_formats import RegistryDecoder
from dpstream.statistics.events import Event
from tests.registry_producers import serializer

CFG = parse_config(
    {
        "input": {"partitions": 3},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 2.0},
        "statistics": [
            {"name": "views", "epsilon": 1.0, "tau": 2, "key": "view"},
            {"name": "sum", "kind": "sum", "epsilon": 1.0, "tau": 4, "max_value": 4, "key": "buy"},
        ],
    }
)
LIMITS = limits_for(CFG)


def record(offset: int, value: object, partition: int = 0, headers=None) -> SourceRecord:
    raw = value if isinstance(value, bytes) else orjson.dumps(value)
    return SourceRecord("src", partition, offset, headers, raw)


def decoded(routed) -> dict[int, list]:
    out: dict[int, list] = {}
    for partition, value in routed.envelopes:
        env = decode_envelope(value)
        out.setdefault(partition, []).extend(
            (env.source, o, i, e)
            for o, i, e in zip(env.offsets, env.indexes, env.events, strict=True)
        )
    return out


def test_events_go_to_their_users_partition_with_their_source_positions():
    users = [f"u{i}" for i in range(12)]
    records = [
        record(10 + n, {"user_id": u, "key": "view"}, partition=n % 2) for n, u in enumerate(users)
    ]
    routed = route(records, LIMITS, 3)
    assert routed.dead_letters == [] and routed.events == 12
    by_partition = decoded(routed)
    for partition, events in by_partition.items():
        assert {partition_for(e.user_id, 3) for *_, e in events} == {partition}
    positions = sorted(
        (s, o, i, e.user_id) for events in by_partition.values() for s, o, i, e in events
    )
    assert positions == sorted((f"src/{n % 2}", 10 + n, 0, u) for n, u in enumerate(users))
    # One envelope per (source partition, events partition): a single source in each.
    assert len(routed.envelopes) == len({(n % 2, partition_for(u, 3)) for n, u in enumerate(users)})


def test_a_batch_record_keeps_each_good_event_at_its_index_and_dead_letters_the_rest():
    batch = [
        {"user_id": "a", "key": "view"},
        {"user_id": 5},
        {"user_id": "b", "key": "buy", "value": 3},
    ]
    routed = route([record(7, batch, headers=[("dpstream", b"batch")])], LIMITS, 1)
    assert [(o, i, e.user_id, e.value) for _, o, i, e in decoded(routed)[0]] == [
        (7, 0, "a", None),
        (7, 2, "b", 3.0),
    ]
    (dead,) = map(orjson.loads, routed.dead_letters)
    assert (dead["topic"], dead["partition"], dead["offset"], dead["index"]) == ("src", 0, 7, 1)
    assert dead["reason"] == "user_id is not a string" and routed.reasons == [dead["reason"]]


@pytest.mark.parametrize(
    ("value", "headers", "reason"),
    [
        (b"{not json", None, "malformed JSON"),
        ({"tick": 3}, [("dpstream", b"tick")], "unknown dpstream header"),
        ({"user_id": "a", "key": "view"}, [("dpstream", b"envelope")], "unknown dpstream header"),
        ({"user_id": "a", "key": "nope"}, None, "unknown statistic key"),
        (
            {"user_id": "a", "key": "buy", "value": "9"},
            None,
            "value is not a number (statistic sum)",
        ),
    ],
)
def test_a_bad_source_record_is_dead_lettered_with_its_position(value, headers, reason):
    routed = route([record(3, value, partition=2, headers=headers)], LIMITS, 3)
    assert routed.envelopes == [] and routed.events == 0
    (dead,) = map(orjson.loads, routed.dead_letters)
    assert dead["reason"] == reason and (dead["partition"], dead["offset"]) == (2, 3)


def test_route_counts_clipped_values_per_statistic():
    records = [
        record(n, {"user_id": "a", "key": "buy", "value": v}) for n, v in enumerate([9, 2, -1])
    ]
    routed = route(records, LIMITS, 3)
    assert routed.events == 3 and not routed.dead_letters
    assert routed.tally == {("sum", "clipped"): 2}  # 9 and -1 outside [0, 4]


def test_the_user_id_may_be_a_nested_field():
    limits = dataclasses.replace(LIMITS, user_id_path=("actor", "id"), plans={})
    records = [
        record(0, {"actor": {"id": "x"}, "key": "view"}),
        record(1, {"actor": {"name": "x"}, "key": "view"}),
        record(2, {"actor": "x", "key": "view"}),
        record(3, {"user_id": "x", "key": "view"}),
    ]
    routed = route(records, limits, 1)
    assert [e.user_id for *_, e in decoded(routed)[0]] == ["x"]
    assert routed.reasons == ["missing actor.id"] * 3


def test_large_events_are_split_into_envelopes_under_the_size_bound():
    # 4,000 events with 256-character user ids of 3-byte characters, from one source
    # partition: 2,000 of them in one envelope would be 1.5 MB, more than a producer sends.
    users = ["用" * 250 + f"{i % 500:06d}" for i in range(4000)]
    routed = route(
        [record(i, {"user_id": u, "key": "view"}) for i, u in enumerate(users)], LIMITS, 1
    )
    assert routed.dead_letters == [] and routed.events == 4000
    assert max(len(v) for _, v in routed.envelopes) <= ENVELOPE_BYTES
    assert [o for _, o, _, _ in decoded(routed)[0]] == list(range(4000))  # in source order


def test_an_event_too_large_for_any_envelope_is_dead_lettered():
    limits = dataclasses.replace(
        LIMITS, known_keys=None, max_record_bytes=4 * ENVELOPE_BYTES, plans={}
    )
    huge = {"user_id": "a", "key": "k" * (2 * ENVELOPE_BYTES)}
    routed = route([record(0, {"user_id": "b"}), record(1, huge)], limits, 1)
    assert [e.user_id for *_, e in decoded(routed)[0]] == ["b"] and routed.events == 1
    (dead,) = map(orjson.loads, routed.dead_letters)
    assert (dead["reason"], dead["offset"]) == ("event too large for the events topic", 1)


def test_an_envelope_round_trips_every_field():
    events = [
        Event("a", "view", None),
        Event("b", None, 2.5, True),
        Event("c", "buy", 3.0, False, (("h3", "8a2a"),)),
    ]
    env = decode_envelope(encode_envelope("t/4", [5, 5, 9], [0, 1, 0], events, rules="f00"))
    assert (env.source, env.offsets, env.indexes, env.events, env.rules) == (
        "t/4",
        [5, 5, 9],
        [0, 1, 0],
        events,
        "f00",
    )
    compact = orjson.loads(encode_envelope("t/4", [1], [0], [Event("a", None, None)], rules="f"))
    assert compact == {"s": "t/4", "r": "f", "o": [1], "U": ["a"], "x": [0]}  # absent: not written


@pytest.mark.parametrize(
    "value",
    [
        b"[]",
        b'{"s": "a/0", "o": [1, 1], "u": ["x", "y"]}',  # positions not increasing
        b'{"s": "a/0", "o": [1], "u": ["x"], "d": [[0]]}',
        b'{"s": "a/0", "o": [1], "u": ["x"], "d": 5}',
        b'{"s": "a/0", "o": [1], "u": ["x"], "v": ["1"]}',
        b'{"s": "a/0", "o": [1], "u": ["x"], "c": {"h3": [1]}}',
        b'{"s": "a/0", "o": [1], "u": []}',
        b'{"s": "a/0", "o": [1.5], "u": ["x"]}',
    ],
)
def test_what_is_not_an_envelope_is_refused(value):
    with pytest.raises(BadRecord, match="malformed envelope"):
        decode_envelope(value)


def test_a_read_across_a_rebalance_keeps_each_partition_from_its_last_restart():
    # Source partition 0 was held at 5..7 when a rebalance gave it back from its
    # committed offset 4; partition 1, given to another member, does not restart.
    held = [record(5, {}), record(20, {}, partition=1), record(6, {}), record(7, {})]
    again = [record(4, {}), record(5, {}), record(21, {}, partition=1), record(6, {})]
    kept = from_last_restart(held + again + [record(8, {})])
    assert [(r.partition, r.offset) for r in kept] == [
        (1, 20),
        (0, 4),
        (0, 5),
        (1, 21),
        (0, 6),
        (0, 8),
    ]
    assert from_last_restart(held) == held  # no restart: the same records


def test_records_across_a_rebalance_route_to_envelopes_in_source_order():
    # Without from_last_restart, partition 0's envelope repeats offsets 5 and 6, and
    # stage 1 would dead-letter it whole ("malformed envelope": not in source order).
    users = [f"u{i}" for i in range(8)]
    held = [record(5 + i, {"user_id": u, "key": "view"}) for i, u in enumerate(users[:2])]
    again = [record(4 + i, {"user_id": u, "key": "view"}) for i, u in enumerate(users[:4])]
    with pytest.raises(BadRecord, match="malformed envelope"):
        for _, value in route(held + again, LIMITS, 1).envelopes:
            decode_envelope(value)
    routed = route(from_last_restart(held + again), LIMITS, 1)
    [(_, value)] = routed.envelopes
    assert decode_envelope(value).offsets == [4, 5, 6, 7]


def test_records_in_a_registry_format_are_routed_and_their_dead_letters_keep_the_bytes():
    registry = SchemaRegistryClient.new_client({"url": "mock://route"})
    write = serializer("avro", registry, "src")
    good = write({"user_id": "u1", "key": "view"})
    unknown = good[:1] + (77).to_bytes(4, "big") + good[5:]
    records = [
        record(4, good, partition=1),
        record(5, b"\x07not avro", partition=1),
        record(6, unknown, partition=1),
    ]
    routed = route(records, LIMITS, 3, RegistryDecoder("avro", registry, LIMITS))
    assert [(o, i, e.user_id) for _, o, i, e in decoded(routed)[partition_for("u1", 3)]] == [
        (4, 0, "u1")
    ]
    dead = [orjson.loads(d) for d in routed.dead_letters]
    assert [(d["offset"], d["partition"], d["reason"]) for d in dead] == [
        (5, 1, "wrong magic byte: not in the Schema Registry's wire format"),
        (6, 1, "unknown schema id"),
    ]
    assert all(d["payload_encoding"] == "base64" for d in dead)
    assert base64.b64decode(dead[1]["payload"]) == unknown


def test_a_registry_that_does_not_answer_stops_the_batch_whole():
    def unavailable(value: bytes) -> object:
        raise RegistryUnavailable("the Schema Registry did not give a schema (ConnectError)")

    with pytest.raises(RegistryUnavailable):
        route([record(0, b"\x00\x00\x00\x00\x01")], LIMITS, 3, unavailable)
