"""An Avro release topic's values read as the same typed releases as JSON ones
(``reader.AvroReleases``): what the worker writes (``release_values``) on a ``mock://``
registry, decoded, mapped back and checked against the release's JSON Schema; a value
that does not decode is a ``RecordError`` naming its position."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from dpstream.client import reader
from dpstream.client.records import Position, RecordError, release
from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka import schema_registry
from dpstream.pipeline.worker.release_values import release_encoders

URL = "http://registry.test:8081"
RELEASE = {
    "schema_version": 4, "statistic": "views", "kind": "count", "tick": 3,
    "tick_end": "1970-01-01T00:00:02+00:00", "tick_end_unix": 2.0, "step": 4, "value": 7,
    "std": 1.5, "interval": [4.0, 10.0], "unbiased": 7, "tau": 2, "confidence": 0.95,
    "epsilon": 1.0, "neighbours": "whole_user", "mechanism": "kary_subtract",
    "tree": {"name": "kary_subtract", "k": 3}, "interval_of": "truncated",
    "accounting": "pure_dp", "noise": "discrete_laplace", "insecure": "insecure_zero",
}  # fmt: skip
POSITION = Position("dp.views", 0, 41, 0)


@pytest.fixture
def registry(monkeypatch) -> SchemaRegistryClient:
    client = SchemaRegistryClient.new_client({"url": "mock://client-reader"})
    monkeypatch.setattr(schema_registry, "make_client", lambda reg, section: client)
    monkeypatch.setattr(reader, "make_client", lambda reg, section: client)
    return client


def test_an_avro_release_reads_as_the_json_one(registry):
    cfg = parse_config({
        "privacy": {"total_epsilon": 10.0},
        "statistics": [{"name": "views", "kind": "count", "epsilon": 1.0, "tau": 2}],
        "outputs": {"format": "avro", "schema_registry": {"url": URL}},
    })  # fmt: skip
    value = release_encoders(cfg)["views"](RELEASE)
    got = reader.AvroReleases("dp.views", cfg.outputs.schema_registry)(value, POSITION, True)
    assert got == release(orjson.dumps(RELEASE), POSITION)
    assert dict(got.fields) == RELEASE and got.value == 7 and got.tau == 2


def test_a_value_that_does_not_decode_names_its_position(registry):
    section = parse_config({
        "privacy": {"total_epsilon": 10.0},
        "statistics": [{"name": "views", "kind": "count", "epsilon": 1.0, "tau": 2}],
        "outputs": {"format": "avro", "schema_registry": {"url": URL}},
    }).outputs.schema_registry  # fmt: skip
    read = reader.AvroReleases("dp.views", section)
    with pytest.raises(RecordError, match=r"dp.views\[0\] offset 41 that does not decode"):
        read(b'{"schema_version": 4}', POSITION, True)
