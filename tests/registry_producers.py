"""Events written as Kafka shops write them: confluent-kafka's AvroSerializer,
ProtobufSerializer and JSONSerializer over a Schema Registry (a ``mock://`` client in unit
tests, the session's real registry in integration tests). A plain module, shared by the
unit and the integration tests.

The schemas hold what dpstream reads (user_id, key, value, op) with the types a producer
would pick: Avro unions with null for the optional fields, proto3 ``optional`` for them
(so that an absent value is absent, not 0), a JSON Schema object. ``AVRO_V2`` is a
backward-compatible evolution of ``AVRO_V1`` (one more optional field).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
from google.protobuf.message_factory import GetMessageClass

FORMATS = ("avro", "protobuf", "json_schema")

AVRO_V1 = orjson.dumps(
    {
        "type": "record",
        "name": "Event",
        "namespace": "shop.events",
        "fields": [
            {"name": "user_id", "type": "string"},
            {"name": "key", "type": ["null", "string"], "default": None},
            {"name": "value", "type": ["null", "double"], "default": None},
            {"name": "op", "type": ["null", "string"], "default": None},
        ],
    }
).decode()

AVRO_V2 = orjson.dumps(
    {
        **orjson.loads(AVRO_V1),
        "fields": [
            *orjson.loads(AVRO_V1)["fields"],
            {"name": "region", "type": ["null", "string"], "default": None},
        ],
    }
).decode()

JSON_SCHEMA = orjson.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Event",
        "type": "object",
        "properties": {
            "user_id": {"type": "string"},
            "key": {"type": "string"},
            "value": {"type": "number"},
            "op": {"type": "string", "enum": ["insert", "delete"]},
        },
        "required": ["user_id"],
    }
).decode()

_STRING, _DOUBLE, _MESSAGE, _ENUM = 9, 1, 11, 14
_OPTIONAL = 1  # LABEL_OPTIONAL; proto3 ``optional`` adds a synthetic oneof


@functools.cache
def protobuf_classes() -> dict[str, type]:
    """Message classes of a .proto a shop would write, built from its descriptor (no
    protoc here)::

        syntax = "proto3";
        package shop.events;
        import "google/protobuf/timestamp.proto";
        message Actor { string id = 1; }
        enum Kind { KIND_UNSPECIFIED = 0; VIEW = 1; BUY = 2; }
        message Event {
          string user_id = 1;
          optional string key = 2;
          optional double value = 3;
          optional string op = 4;
          google.protobuf.Timestamp ts = 5;
          Actor actor = 6;
          Kind kind = 7;
          double amount = 8;             // no presence: unset reads as 0
          message Inner { string user_id = 1; }
        }
    """
    proto = descriptor_pb2.FileDescriptorProto(
        name="shop/events.proto",
        package="shop.events",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    actor = proto.message_type.add(name="Actor")
    actor.field.add(name="id", number=1, type=_STRING, label=_OPTIONAL)
    kind = proto.enum_type.add(name="Kind")
    for number, name in enumerate(("KIND_UNSPECIFIED", "VIEW", "BUY")):
        kind.value.add(name=name, number=number)
    event = proto.message_type.add(name="Event")
    event.field.add(name="user_id", number=1, type=_STRING, label=_OPTIONAL)
    for number, (name, kind_) in enumerate(
        (("key", _STRING), ("value", _DOUBLE), ("op", _STRING)), start=2
    ):
        event.oneof_decl.add(name=f"_{name}")
        event.field.add(
            name=name,
            number=number,
            type=kind_,
            label=_OPTIONAL,
            proto3_optional=True,
            oneof_index=len(event.oneof_decl) - 1,
        )
    event.field.add(
        name="ts", number=5, type=_MESSAGE, label=_OPTIONAL, type_name=".google.protobuf.Timestamp"
    )
    event.field.add(
        name="actor", number=6, type=_MESSAGE, label=_OPTIONAL, type_name=".shop.events.Actor"
    )
    event.field.add(
        name="kind", number=7, type=_ENUM, label=_OPTIONAL, type_name=".shop.events.Kind"
    )
    event.field.add(name="amount", number=8, type=_DOUBLE, label=_OPTIONAL)
    inner = event.nested_type.add(name="Inner")
    inner.field.add(name="user_id", number=1, type=_STRING, label=_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    well_known = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(well_known)
    pool.Add(well_known)
    pool.Add(proto)
    return {
        name: GetMessageClass(pool.FindMessageTypeByName(f"shop.events.{name}"))
        for name in ("Event", "Actor", "Event.Inner")
    }


def value_serializer(
    fmt: str, client: SchemaRegistryClient, avro_schema: str = AVRO_V1
) -> Callable[[object, SerializationContext], bytes]:
    """The format's serializer, as a producer configures it (``value.serializer`` of a
    SerializingProducer): its schema registered under ``<topic>-value`` (TopicNameStrategy)."""
    if fmt == "avro":
        return AvroSerializer(client, avro_schema)
    if fmt == "json_schema":
        return JSONSerializer(JSON_SCHEMA, client)
    event_class = protobuf_classes()["Event"]
    return ProtobufSerializer(event_class, client, {"use.deprecated.format": False})


def as_record(fmt: str, event: dict) -> object:
    """An event as the format's serializer takes it: a dict with every field of the Avro
    schema, a Protobuf message, a dict for JSON Schema."""
    if fmt == "avro":
        return full(event)
    if fmt == "protobuf":
        return protobuf_classes()["Event"](**event)
    return event


def serializer(
    fmt: str, client: SchemaRegistryClient, topic: str, avro_schema: str = AVRO_V1
) -> Callable[[dict], bytes]:
    """event dict -> the record value a producer with that format's serializer writes to
    ``topic``."""
    write = value_serializer(fmt, client, avro_schema)
    ctx = SerializationContext(topic, MessageField.VALUE)
    return lambda event: write(as_record(fmt, event), ctx)


def full(event: dict) -> dict:
    """An event with every field of ``AVRO_V1`` (the Avro serializer wants them all)."""
    return {"key": None, "value": None, "op": None, **event}
