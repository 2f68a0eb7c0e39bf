"""A release's bytes as ``outputs.format`` says: JSON unchanged by default; Avro framed as
a Schema Registry client reads it (confluent-kafka's ``AvroDeserializer`` on a ``mock://``
registry), with each topic's schema registered once under ``<topic>-value``; a registry
that cannot be reached names the field."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka import schema_registry
from dpstream.pipeline.worker.release_values import release_encoders
from dpstream.statistics import avro_schemas

STATISTICS = [
    {"name": "views", "kind": "count", "epsilon": 1.0, "tau": 2},
    {"name": "views_auto", "kind": "count", "epsilon": 1.0, "tau": "auto"},
]
RELEASE = {
    "schema_version": 4, "statistic": "views", "kind": "count", "tick": 3,
    "tick_end": "1970-01-01T00:00:02+00:00", "tick_end_unix": 2.0, "step": 4, "value": 7,
    "std": 1.5, "interval": [4.0, 10.0], "unbiased": 7, "tau": 2, "confidence": 0.95,
    "epsilon": 1.0, "neighbours": "whole_user", "mechanism": "binary", "tree": None,
    "interval_of": "truncated", "accounting": "pure_dp", "noise": "discrete_laplace",
    "insecure": "insecure_zero",
}  # fmt: skip


def config(outputs: dict | None = None):
    extra = {} if outputs is None else {"outputs": outputs}
    return parse_config({"privacy": {"total_epsilon": 10.0}, "statistics": STATISTICS, **extra})


def test_json_releases_are_the_bytes_they_were():
    encoders = release_encoders(config())
    assert encoders["views"](RELEASE) == orjson.dumps(RELEASE)


def test_avro_releases_are_registered_once_and_read_by_a_registry_client(monkeypatch):
    client = SchemaRegistryClient.new_client({"url": "mock://release-values"})
    monkeypatch.setattr(schema_registry, "make_client", lambda reg, section: client)
    cfg = config({"format": "avro", "schema_registry": {"url": "http://registry.test:8081"}})
    encoders = release_encoders(cfg)
    assert sorted(client.get_subjects()) == ["dp.views-value", "dp.views_auto-value"]
    value = encoders["views"](RELEASE)
    registered = client.get_latest_version("dp.views-value")
    assert value[:5] == b"\x00" + registered.schema_id.to_bytes(4, "big")
    context = SerializationContext("dp.views", MessageField.VALUE)
    decoded = AvroDeserializer(client, return_record_name=True)(value, context)
    assert decoded[0] == f"{avro_schemas.NAMESPACE}.CounterRelease"
    assert avro_schemas.from_avro(decoded) == RELEASE
    # tau: auto's topic has the user-level shape.
    auto = client.get_latest_version("dp.views_auto-value").schema.schema_str
    assert "UserLevelRelease" in auto and "CounterRelease" not in auto


def test_an_unreachable_registry_names_the_field():
    cfg = config({"format": "avro", "schema_registry": {"url": "http://127.0.0.1:9"}})
    with pytest.raises(ConfigError, match=r"outputs.schema_registry.url: .*dp.views-value"):
        release_encoders(cfg)


def test_a_refused_schema_stops_the_start_naming_the_subject(monkeypatch):
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = SchemaRegistryClient.new_client({"url": "mock://release-values-refused"})

    def refuse(subject_name, schema, *args, **kwargs):
        raise SchemaRegistryError(409, 409, "Schema being registered is incompatible")

    monkeypatch.setattr(client, "register_schema", refuse)
    monkeypatch.setattr(schema_registry, "make_client", lambda reg, section: client)
    cfg = config({"format": "avro", "schema_registry": {"url": "http://registry.test:8081"}})
    with pytest.raises(
        ConfigError, match=r"outputs.schema_registry: .* subject dp.views-value \(HTTP 409"
    ):
        release_encoders(cfg)
