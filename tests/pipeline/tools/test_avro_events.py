"""``dpstream produce --format avro``'s schema made from the events
(pipeline/tools/avro_events.py): a worked example, the events read back through the
ingest's decoder as they were, and fields without one Avro type named."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dpstream.config.schema import parse_config
from dpstream.operators.errors import DpStreamError
from dpstream.pipeline.tools.avro_events import avro_schema
from dpstream.pipeline.tools.synthetic import synthetic_events
from dpstream.pipeline.wire.records import decode_events, limits_for
from dpstream.pipeline.wire.registry_formats import RegistryDecoder

EVENTS = [
    {"user_id": "u1", "key": "view", "value": 1},
    {"user_id": "u2", "key": "click", "value": 2.5, "actor": {"id": "a", "team": None}},
    {"user_id": "u3", "op": "delete", "vip": True},
]


def test_the_schema_has_an_optional_field_per_field_typed_from_its_values():
    def optional(name: str, kind: object) -> dict:
        return {"name": name, "type": ["null", kind], "default": None}

    assert avro_schema(EVENTS) == {
        "type": "record",
        "name": "Event",
        "namespace": "dpstream.produce",
        "fields": [
            optional("user_id", "string"),
            optional("key", "string"),
            optional("value", "double"),  # a long and a double: double
            optional(
                "actor",
                {
                    "type": "record",
                    "name": "Actor",
                    "namespace": "dpstream.produce",
                    "fields": [optional("id", "string"), optional("team", "string")],
                },
            ),
            optional("op", "string"),
            optional("vip", "boolean"),
        ],
    }


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([{"user_id": "u", "tags": ["a"]}], "field tags holds a list"),
        ([{"user_id": "u", "value": 1}, {"user_id": "v", "value": "2"}], "field value holds both"),
        ([{"user_id": "u", "a": {"b": True}}, {"user_id": "u", "a": {"b": 1}}], "field a.b holds"),
    ],
)
def test_a_field_without_one_avro_type_is_named(events, message):
    with pytest.raises(DpStreamError, match=message):
        avro_schema(events)


def test_synthetic_events_read_back_through_the_ingest_as_they_were():
    cfg = parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 2.0},
            "statistics": [
                {"name": "views", "epsilon": 1.0, "key": "view"},
                {"name": "clicks", "epsilon": 1.0, "key": "click"},
            ],
        }
    )
    events = list(synthetic_events(20, 200, seed=3))
    registry = SchemaRegistryClient.new_client({"url": "mock://avro-events"})
    write = AvroSerializer(registry, json.dumps(avro_schema(events)))
    ctx = SerializationContext("src", MessageField.VALUE)
    decoder = RegistryDecoder("avro", registry, limits_for(cfg))
    limits = limits_for(cfg)
    read = [decode_events(write(e, ctx), None, limits, decoder)[0][0] for e in events]
    assert read == [decode_events(json.dumps(e).encode(), None, limits)[0][0] for e in events]
