"""Avro, Protobuf and JSON Schema source records (pipeline/wire/registry_formats.py) against
confluent-kafka's ``mock://`` registry: each format reads as JSON does (the same events,
the same reasons), the types JSON does not have map as documented, hostile records are
refused with their reason, and a registry that does not answer is not the record's fault.
"""

from __future__ import annotations

import datetime
import decimal
import uuid

import orjson
import pytest
from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dpstream.config.schema import parse_config
from dpstream.pipeline.wire.records import (
    BadRecord,
    RegistryUnavailable,
    decode_events,
    limits_for,
)
from dpstream.pipeline.wire.registry_formats import MAX_REFUSED_IDS, RegistryDecoder
from tests.registry_producers import (
    AVRO_V1,
    AVRO_V2,
    FORMATS,
    JSON_SCHEMA,
    protobuf_classes,
    serializer,
)

CFG = parse_config(
    {
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 3.0},
        "statistics": [
            {"name": "views", "epsilon": 1.0, "key": "view", "deletions": True},
            {"name": "spend", "kind": "sum", "epsilon": 1.0, "max_value": 10, "key": "buy"},
            {"name": "clicks", "epsilon": 1.0, "key": "click"},
        ],
    }
)
LIMITS = limits_for(CFG)
TOPIC = "shop.events"
CTX = SerializationContext(TOPIC, MessageField.VALUE)

# Good and bad events, each as a JSON producer would write it.
EVENTS = [
    {"user_id": "alice", "key": "view"},
    {"user_id": "bob", "key": "buy", "value": 3.0},
    {"user_id": "bob", "key": "buy", "value": 2.5},  # a real value: the sum rounds it
    {"user_id": "carol", "key": "buy", "value": 11.0},  # above max_value: the sum clips it
    {"user_id": "carol", "key": "buy"},  # no value
    {"user_id": "dave", "key": "nope"},  # no statistic counts it
    {"user_id": "dave", "key": "view", "op": "delete"},
    {"user_id": "erin", "key": "click", "op": "delete"},  # clicks has no deletions
    {"user_id": "erin"},  # no key
    {"user_id": "   ", "key": "view"},
    {"user_id": "frank", "key": "view", "op": "upsert"},  # json_schema refuses it itself
]


def client() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": "mock://dpstream-tests"})


def outcome(value: bytes, decode=None) -> object:
    """The events of a record, or its reason."""
    try:
        return decode_events(value, None, LIMITS, decode)[0]
    except BadRecord as exc:
        return exc.reason


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_reads_as_json_does(fmt):
    registry = client()
    write = serializer(fmt, registry, TOPIC)
    decoder = RegistryDecoder(fmt, registry, LIMITS)
    events = EVENTS if fmt != "json_schema" else EVENTS[:-1]  # its serializer refuses "upsert"
    got = [outcome(write(e), decoder) for e in events]
    want = [outcome(orjson.dumps(e)) for e in events]
    assert got == want
    # The worked example: what is accepted, and why the rest is not.
    assert [g if isinstance(g, str) else len(g) for g in got[:10]] == [
        1,
        1,
        1,
        1,
        "missing value (statistic spend)",
        "unknown statistic key",
        1,
        "op delete: no statistic with deletions counts this event",
        "missing key",
        "empty user_id",
    ]


def test_a_json_schema_payload_that_breaks_its_schema_is_dead_lettered():
    registry = client()
    good = serializer("json_schema", registry, TOPIC)({"user_id": "u", "key": "view"})
    broken = good[:5] + orjson.dumps({"user_id": 7, "key": "view"})  # user_id must be a string
    decoder = RegistryDecoder("json_schema", registry, LIMITS)
    assert outcome(broken, decoder) == "payload does not decode with its JSON Schema schema"


AVRO_TYPES = orjson.dumps(
    {
        "type": "record",
        "name": "Typed",
        "fields": [
            {"name": "user_id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "key", "type": {"type": "enum", "name": "Key", "symbols": ["view", "buy"]}},
            {
                "name": "value",
                "type": [
                    "null",
                    {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
                ],
            },
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
).decode()
UTC = datetime.UTC


def test_avro_values_that_are_not_json_map_as_their_json_text_would():
    registry = client()
    write = AvroSerializer(registry, AVRO_TYPES)
    user = uuid.UUID("12345678-1234-5678-1234-567812345678")
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    decoder = RegistryDecoder("avro", registry, LIMITS)
    value = write({"user_id": user, "key": "buy", "value": decimal.Decimal("4.00"), "ts": at}, CTX)
    # A decimal is the nearest float, a uuid its canonical string, an enum its symbol, a
    # timestamp its ISO 8601 string.
    assert decoder(value) == {
        "user_id": "12345678-1234-5678-1234-567812345678",
        "key": "buy",
        "value": 4.0,
        "ts": "2026-01-02T03:04:05.678000+00:00",
    }
    (event,), _ = decode_events(value, None, LIMITS, decoder)
    as_json = orjson.dumps({"user_id": str(user), "key": "buy", "value": 4, "ts": at.isoformat()})
    assert [event] == decode_events(as_json, None, LIMITS)[0]
    fraction = write(
        {"user_id": user, "key": "buy", "value": decimal.Decimal("2.50"), "ts": at}, CTX
    )
    assert [e.value for e in outcome(fraction, decoder)] == [2.5]  # type: ignore[union-attr]


def test_avro_records_read_as_confluent_kafkas_avro_deserializer_reads_them():
    # The decoder reads Avro with fastavro and the writer schema, as AvroDeserializer does
    # without a subject: the same records, logical types, unions and references included.
    registry = client()
    money = orjson.dumps(
        {
            "type": "record",
            "name": "Money",
            "namespace": "shop",
            "fields": [
                {"name": "cents", "type": "long"},
                {"name": "tags", "type": {"type": "map", "values": "string"}},
            ],
        }
    ).decode()
    registry.register_schema("money", Schema(money, "AVRO"))
    order = orjson.dumps(
        {
            "type": "record",
            "name": "Order",
            "namespace": "shop",
            "fields": [
                {"name": "user_id", "type": "string"},
                {"name": "price", "type": ["null", "shop.Money"], "default": None},
                {"name": "items", "type": {"type": "array", "items": "int"}},
            ],
        }
    ).decode()
    with_ref = Schema(order, "AVRO", [SchemaReference("shop.Money", "money", 1)])
    values = [
        AvroSerializer(registry, with_ref, conf={"auto.register.schemas": True})(
            {"user_id": "u", "price": {"cents": 250, "tags": {"a": "b"}}, "items": [1, 2]}, CTX
        ),
        AvroSerializer(registry, AVRO_TYPES)(
            {
                "user_id": uuid.UUID(int=7),
                "key": "view",
                "value": decimal.Decimal("1.25"),
                "ts": datetime.datetime(2026, 5, 6, tzinfo=UTC),
            },
            CTX,
        ),
        serializer("avro", registry, TOPIC, AVRO_V2)({"user_id": "v", "region": "eu"}),
    ]
    decoder = RegistryDecoder("avro", registry, LIMITS)
    confluent = AvroDeserializer(registry)
    for value in values:
        decoder(value)  # fetches the schema
        assert decoder._deserialize(value) == confluent(value, None)


def test_avro_bytes_and_timestamps_are_no_user_id_and_no_value():
    registry = client()
    schema = orjson.dumps(
        {
            "type": "record",
            "name": "Odd",
            "fields": [
                {"name": "user_id", "type": ["bytes", "string"]},
                {"name": "key", "type": "string"},
                {
                    "name": "value",
                    "type": ["double", {"type": "long", "logicalType": "timestamp-micros"}],
                },
            ],
        }
    ).decode()
    write = AvroSerializer(registry, schema)
    decoder = RegistryDecoder("avro", registry, LIMITS)
    at = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    by_bytes = write({"user_id": b"alice", "key": "view", "value": 1.0}, CTX)
    assert outcome(by_bytes, decoder) == "user_id is not a string"
    by_time = write({"user_id": "alice", "key": "buy", "value": at}, CTX)
    assert outcome(by_time, decoder) == "value is not a number (statistic spend)"


def test_protobuf_reads_the_writer_schema_with_nested_paths_enums_and_timestamps():
    registry = client()
    classes = protobuf_classes()
    write = ProtobufSerializer(classes["Event"], registry, {"use.deprecated.format": False})
    message = classes["Event"](key="buy", value=3.0, kind=2)
    message.actor.id = "alice"
    message.ts.FromSeconds(1_700_000_000)
    value = write(message, CTX)
    decoder = RegistryDecoder("protobuf", registry, LIMITS)
    # Every field by its .proto name; those without presence (user_id, amount) with their
    # defaults; optional ones that are unset (op) absent.
    assert decoder(value) == {
        "user_id": "",
        "key": "buy",
        "value": 3.0,
        "ts": "2023-11-14T22:13:20+00:00",
        "actor": {"id": "alice"},
        "kind": "BUY",
        "amount": 0.0,
    }
    nested = limits_for(
        CFG.model_copy(update={"input": CFG.input.model_copy(update={"user_id_field": "actor.id"})})
    )
    (event,), _ = decode_events(value, None, nested, RegistryDecoder("protobuf", registry, nested))
    assert (event.user_id, event.key, event.value) == ("alice", "buy", 3.0)


def test_a_proto3_field_without_presence_reads_as_its_default():
    # ``amount`` (double, no ``optional``) unset is 0.0, as protobuf defines it; the
    # optional ``value`` unset is absent: a sum refuses the second, not the first.
    registry = client()
    classes = protobuf_classes()
    write = ProtobufSerializer(classes["Event"], registry, {"use.deprecated.format": False})
    decoder = RegistryDecoder("protobuf", registry, LIMITS)
    record = decoder(write(classes["Event"](user_id="u", key="buy"), CTX))
    assert record["amount"] == 0.0 and "value" not in record


def test_protobuf_message_index_path_picks_a_nested_message():
    registry = client()
    inner = protobuf_classes()["Event.Inner"]
    value = ProtobufSerializer(inner, registry, {"use.deprecated.format": False})(
        inner(user_id="u7"), CTX
    )
    assert value[5:8] == b"\x04\x02\x00"  # two indexes: Event (1), its first nested (0)
    decoder = RegistryDecoder("protobuf", registry, LIMITS)
    assert decoder(value) == {"user_id": "u7"}
    out_of_range = value[:5] + b"\x04\x02\x0a" + value[8:]  # nested index 5: none
    assert outcome(out_of_range, decoder) == "payload does not decode with its Protobuf schema"


@pytest.mark.parametrize("fmt", ["avro", "json_schema"])
def test_a_new_schema_version_mid_stream_is_read_with_its_own_schema(fmt):
    registry = client()
    decoder = RegistryDecoder(fmt, registry, LIMITS)
    if fmt == "avro":
        old = serializer("avro", registry, TOPIC, AVRO_V1)
        new = serializer("avro", registry, TOPIC, AVRO_V2)
        first = old({"user_id": "a", "key": "view"})
        second = new({"user_id": "b", "key": "view", "region": "eu"})
    else:
        first = serializer("json_schema", registry, TOPIC)({"user_id": "a", "key": "view"})
        v2 = {**orjson.loads(JSON_SCHEMA), "properties": {"region": {"type": "string"}}}
        schema_id = registry.register_schema(
            f"{TOPIC}-value", Schema(orjson.dumps(v2).decode(), "JSON")
        )
        payload = {"user_id": "b", "key": "view", "region": "eu"}
        second = b"\x00" + schema_id.to_bytes(4, "big") + orjson.dumps(payload)
    assert first[1:5] != second[1:5]  # two schema ids
    got = [decoder(first), decoder(second), decoder(first)]
    assert [r["user_id"] for r in got] == ["a", "b", "a"]
    assert got[1]["region"] == "eu" and "region" not in got[0]


class CountingRegistry:
    """A mock registry that counts get_schema calls and can be told to fail."""

    def __init__(self) -> None:
        self.inner = client()
        self.calls = 0
        self.failure: Exception | None = None

    def get_schema(self, schema_id, subject_name=None, fmt=None):
        self.calls += 1
        if self.failure is not None:
            raise self.failure
        return self.inner.get_schema(schema_id, subject_name, fmt)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_records_are_refused_with_their_reason(fmt):
    registry = CountingRegistry()
    good = serializer(fmt, registry.inner, TOPIC)({"user_id": "u", "key": "view"})
    decoder = RegistryDecoder(fmt, registry, LIMITS)  # type: ignore[arg-type]
    assert len(outcome(good, decoder)) == 1
    name = {"avro": "Avro", "protobuf": "Protobuf", "json_schema": "JSON Schema"}[fmt]
    assert (
        outcome(good[:4], decoder) == "truncated record: shorter than the Schema Registry framing"
    )
    assert outcome(b"\x01" + good[1:], decoder) == (
        "wrong magic byte: not in the Schema Registry's wire format"
    )
    assert outcome(orjson.dumps({"user_id": "u"}), decoder) == (
        "wrong magic byte: not in the Schema Registry's wire format"
    )
    assert (
        outcome(good[:5] + b"\xff" * 3, decoder)
        == f"payload does not decode with its {name} schema"
    )
    unknown = good[:1] + (999).to_bytes(4, "big") + good[5:]
    calls = registry.calls
    for _ in range(3):
        assert outcome(unknown, decoder) == "unknown schema id"
    assert registry.calls == calls + 1  # asked once, then remembered


def test_avro_truncated_payload_does_not_decode():
    registry = client()
    value = serializer("avro", registry, TOPIC)({"user_id": "somebody", "key": "view"})
    decoder = RegistryDecoder("avro", registry, LIMITS)
    assert outcome(value[:8], decoder) == "payload does not decode with its Avro schema"


@pytest.mark.parametrize(
    ("fmt", "other"), [("avro", "protobuf"), ("protobuf", "json_schema"), ("json_schema", "avro")]
)
def test_a_schema_of_another_format_is_refused(fmt, other):
    registry = client()
    value = serializer(other, registry, TOPIC)(
        {"user_id": "u", "key": "view"} if other == "avro" else {"user_id": "u", "key": "view"}
    )
    name = {"avro": "Avro", "protobuf": "Protobuf", "json_schema": "JSON Schema"}[fmt]
    assert outcome(value, RegistryDecoder(fmt, registry, LIMITS)) == f"schema is not {name}"


@pytest.mark.parametrize(
    "failure",
    [
        SchemaRegistryError(503, 50301, "unavailable"),
        SchemaRegistryError(401, 40101, "unauthorized"),
        SchemaRegistryError(404, -1, "not a registry"),  # a wrong url: 404 without its code
        ConnectionRefusedError(111, "refused"),
    ],
)
def test_a_registry_that_does_not_give_the_schema_is_not_the_records_fault(failure):
    registry = CountingRegistry()
    value = serializer("avro", registry.inner, TOPIC)({"user_id": "u", "key": "view"})
    decoder = RegistryDecoder("avro", registry, LIMITS)  # type: ignore[arg-type]
    registry.failure = failure
    with pytest.raises(RegistryUnavailable, match="the Schema Registry did not give a schema"):
        decode_events(value, None, LIMITS, decoder)
    registry.failure = None  # it answers again: the same record decodes
    assert len(outcome(value, decoder)) == 1


def test_the_remembered_unknown_ids_are_bounded():
    registry = client()
    value = serializer("avro", registry, TOPIC)({"user_id": "u", "key": "view"})
    decoder = RegistryDecoder("avro", registry, LIMITS)
    for schema_id in range(100, 100 + MAX_REFUSED_IDS + 1):
        assert outcome(value[:1] + schema_id.to_bytes(4, "big") + value[5:], decoder) == (
            "unknown schema id"
        )
    assert len(decoder._refused) <= MAX_REFUSED_IDS


def test_a_dpstream_batch_header_is_json_only():
    registry = client()
    value = serializer("avro", registry, TOPIC)({"user_id": "u", "key": "view"})
    with pytest.raises(BadRecord, match="dpstream header on a record not in JSON"):
        decode_events(value, b"batch", LIMITS, RegistryDecoder("avro", registry, LIMITS))


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="input.format must be avro, protobuf or json_schema"):
        RegistryDecoder("xml", client(), LIMITS)
