"""The release topics' Avro schemas (docs/schemas/*.avsc) are what the generator makes from
statistics/releases.py, it maps each annotation as docs/design.md section 7a says, and
every release replay emits, of every kind, written with its topic's schema through a
Schema Registry and read back, is the release (the same dict, in the same key order)."""

from __future__ import annotations

import json
import random
from typing import Annotated, Literal, NotRequired, TypedDict

import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dpstream.client import schemas
from dpstream.config.schema import parse_config
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.worker.keys import PipelineKey
from dpstream.statistics import avro_schemas, registry
from dpstream.statistics.releases import ExhaustedFields, Items, fields_of
from tests import record_kinds

KEY = PipelineKey.from_key(bytes(range(32)))
TICKS = 8


def test_the_committed_avro_schemas_are_the_generated_ones():
    # Fails after any change of a release's shape: run `make schemas`.
    for name, schema in avro_schemas.generate().items():
        committed = (schemas.folder() / name).read_text("utf-8")
        assert committed == schemas.dumps(schema), f"docs/schemas/{name}: run `make schemas`"


class Inner(TypedDict):
    n: int


class Shape(TypedDict):
    flag: Literal[True]
    pair: Annotated[list[float], Items(2)]
    mode: Literal["full", "half"]
    maybe: float | None
    number: int | float
    inner: Inner
    again: Inner | None
    counts: dict[str, int]
    later: NotRequired[str]
    later_or_null: NotRequired[int | None]


def test_the_type_mapping():
    named: set[str] = set()
    fields = {name: avro_schemas._field(name, hint, always, named)
              for name, hint, always in fields_of((Shape,))}  # fmt: skip
    inner = {"type": "record", "name": "Inner", "namespace": avro_schemas.NAMESPACE,
             "fields": [{"name": "n", "type": "long"}]}  # fmt: skip
    assert [f["type"] for f in fields.values()] == [
        "boolean",
        {"type": "array", "items": "double"},
        "string",
        ["null", "double"],
        "double",
        inner,
        ["null", f"{avro_schemas.NAMESPACE}.Inner"],  # defined once, then named
        {"type": "map", "values": "long"},
        ["null", "string"],
        ["null", "long"],
    ]
    assert [n for n, f in fields.items() if "default" in f] == ["later", "later_or_null"]
    assert all(f["default"] is None for n, f in fields.items() if "default" in f)


def test_an_annotation_without_an_avro_type_is_refused():
    with pytest.raises(TypeError, match="no Avro schema"):
        avro_schemas.avro_type(set[int], set())


def test_a_release_record_is_in_the_releases_key_order():
    record = avro_schemas.release_record(ExhaustedFields, set())
    names = [f["name"] for f in record["fields"]]
    assert names[:9] == ["schema_version", "statistic", "kind", "tick", "tick_end",
                         "tick_end_unix", "exhausted", "value", "note"]  # fmt: skip
    assert names[9] == "confidence"


def replayed(public_counts: bool) -> tuple[list[dict], dict[str, type]]:
    """The releases of a replay of every kind's traffic over ``TICKS`` ticks, and each
    statistic's release shape."""
    cfg = parse_config(record_kinds.config(public_counts, {"mode": "keyed"}))
    rng = random.Random(7)
    lines: list[bytes] = []
    for tick in range(1, TICKS + 1):
        events = record_kinds.round_of_events(rng, cfg.model_dump()["statistics"])
        lines += [orjson.dumps(e) for e in events]
        lines.append(orjson.dumps({"tick": tick}))
    releases = list(replay(cfg, lines, KEY.noise))
    shapes = {s.name: registry.release_fields(s, cfg) for s in cfg.statistics}
    return releases, shapes


@pytest.mark.parametrize("public_counts", [False, True], ids=["whole-users", "public-counts"])
def test_every_release_reads_back_from_avro_as_it_was(public_counts):
    releases, shapes = replayed(public_counts)
    client = SchemaRegistryClient.new_client({"url": "mock://avro-schemas"})
    deserializer = AvroDeserializer(client, return_record_name=True)
    serializers = {
        name: AvroSerializer(client, json.dumps(avro_schemas.topic_schema(fields)))
        for name, fields in shapes.items()
    }
    read_shapes = set()
    for release in releases:
        context = SerializationContext(f"dp.{release['statistic']}", MessageField.VALUE)
        value = serializers[release["statistic"]](release, context)
        assert value[0] == 0  # Confluent's framing: the magic byte, then the schema id
        decoded = deserializer(value, context)
        read_shapes.add(decoded[0].rpartition(".")[2])
        back = avro_schemas.from_avro(decoded)
        assert back == release
        assert list(back) == list(release)
    # Every shape the pipeline releases in was read, the exhausted one among them.
    expected = {f"{avro_schemas.shape_name(f)}Release" for f in shapes.values()}
    if not public_counts:
        expected.add("ExhaustedRelease")
    assert read_shapes == expected


def test_a_zcdp_release_reads_back_from_avro_as_it_was():
    # rho and delta are optional fields of the header: present under zcdp.
    cfg = parse_config(
        {
            "noise": {"mode": "keyed"},
            "privacy": {"accounting": "zcdp", "total_rho": 1.0},
            "statistics": [{"name": "views", "rho": 1.0, "tau": 3}],
        }
    )
    lines = [orjson.dumps({"user_id": f"u{i}"}) for i in range(4)] + [b'{"tick": 1}']
    (release,) = replay(cfg, lines, KEY.noise)
    client = SchemaRegistryClient.new_client({"url": "mock://avro-zcdp"})
    fields = registry.release_fields(cfg.statistics[0], cfg)
    serializer = AvroSerializer(client, json.dumps(avro_schemas.topic_schema(fields)))
    context = SerializationContext("dp.views", MessageField.VALUE)
    decoded = AvroDeserializer(client, return_record_name=True)(
        serializer(release, context), context
    )
    back = avro_schemas.from_avro(decoded)
    assert back == release and back["rho"] == 1.0 and back["delta"] == 1e-6
    assert list(back) == list(release)
