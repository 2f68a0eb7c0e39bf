"""Events written as Kafka shops write them, through a real Schema Registry (issue 29):
Apicurio Registry's application serving Confluent's API (the ``schema_registry`` fixture,
one per session), confluent-kafka's SerializingProducer with its AvroSerializer,
ProtobufSerializer and JSONSerializer, a real broker.

* each format, zero noise: the releases are the exact counts and sums of what was
  produced, a producer that moves to a new compatible Avro schema mid-stream is read
  without a restart, hostile records (a wrong magic byte, an unknown schema id, a
  truncated payload) are dead-lettered with their reason and source position, and the
  releases equal the replay of the exported log;
* ``dpstream produce --format avro`` writes what such a pipeline counts;
* a registry that does not answer pauses the ingest: nothing is dead-lettered, sent or
  committed, and an ingest that reaches the registry then sends every event once.

Run them alone with ``pytest -m registry``.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer, SerializingProducer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import StringSerializer

from dpstream.config.schema import parse_config
from dpstream.deploy.broker import _free_ports
from dpstream.pipeline.ingest.consumer import Ingest, source_lag
from dpstream.pipeline.kafka.clients import read_topic
from dpstream.pipeline.kafka.topics import create_source_topics, ensure_topics
from dpstream.pipeline.tools.export import export_log
from dpstream.pipeline.worker.processes import spawn_worker
from dpstream.testing import unique_names
from tests.integration import producers
from tests.integration.scenarios import shop_events
from tests.integration.support import WorkerProcess, assert_equal_to_replay, readers, wait_until
from tests.registry_producers import (
    AVRO_V1,
    AVRO_V2,
    FORMATS,
    as_record,
    serializer,
    value_serializer,
)

pytestmark = [pytest.mark.integration, pytest.mark.registry]

TICK = 0.5
MAX_VALUE = 5


def pipeline(fmt: str, url: str, partitions: int = 2) -> dict:
    names = unique_names({})
    return {
        **names,
        "input": {
            "topics": [f"{names['app_id']}.src"],
            "partitions": partitions,
            "format": fmt,
            "schema_registry": {"url": url},
        },
        "ticks": {"interval_seconds": TICK},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 2.0},
        "statistics": [
            {"name": "views", "epsilon": 1.0, "tau": 100_000, "key": "view"},
            {
                "name": "spend",
                "kind": "sum",
                "epsilon": 1.0,
                "tau": 100_000,
                "key": "buy",
                "max_value": MAX_VALUE,
            },
        ],  # fmt: skip
    }


def start(bootstrap: str, directory: Path, data: dict) -> WorkerProcess:
    cfg = parse_config(data)
    path = directory / f"{cfg.app_id}.yaml"
    path.write_text(yaml.safe_dump(data))
    log = directory / f"{cfg.app_id}.log"
    create_source_topics(cfg, bootstrap)
    return WorkerProcess(cfg, path, log, spawn_worker(path, bootstrap, log))


class Sent:
    """Delivery reports: each record's value -> its (partition, offset)."""

    def __init__(self) -> None:
        self.positions: dict[bytes, tuple[int, int]] = {}
        self.errors: list[str] = []

    def __call__(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.positions[msg.value()] = (msg.partition(), msg.offset())


def produce_as_users_do(bootstrap: str, url: str, fmt: str, topic: str, events: list[dict]):
    """SerializingProducer with the format's serializer, keyed by user id; Avro moves to
    the compatible ``AVRO_V2`` (one more optional field) halfway through."""
    half = len(events) // 2
    with SchemaRegistryClient({"url": url}) as client:
        for part, schema in ((events[:half], AVRO_V1), (events[half:], AVRO_V2)):
            producer = SerializingProducer(
                {
                    "bootstrap.servers": bootstrap,
                    "key.serializer": StringSerializer(),
                    "value.serializer": value_serializer(fmt, client, schema),
                }
            )
            for event in part:
                record = as_record(fmt, event)
                if fmt == "avro" and schema is AVRO_V2:
                    record = {**record, "region": "eu"}
                producer.produce(topic, key=event["user_id"], value=record)
                producer.poll(0)
            assert producer.flush(30) == 0


def produce_hostile(bootstrap: str, topic: str, template: bytes) -> dict[tuple[int, int], str]:
    """A wrong magic byte, an unknown schema id and a truncated payload, with a plain
    Producer; {(partition, offset): the reason they must be dead-lettered with}."""
    reasons = {
        b"\x01" + template[1:]: "wrong magic byte: not in the Schema Registry's wire format",
        template[:1] + (987_654).to_bytes(4, "big") + template[5:]: "unknown schema id",
        template[:3]: "truncated record: shorter than the Schema Registry framing",
    }
    sent = Sent()
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in reasons:
        producer.produce(topic, value=value, on_delivery=sent)
    assert producer.flush(30) == 0 and not sent.errors
    return {sent.positions[value]: reason for value, reason in reasons.items()}


def truncated_payload(bootstrap: str, url: str, fmt: str, topic: str) -> tuple[bytes, str]:
    """A record whose framing is right and whose payload is cut short, and its reason."""
    event = {"user_id": "somebody-long", "key": "view", "value": 1.0}
    with SchemaRegistryClient({"url": url}) as client:
        value = serializer(fmt, client, topic)(event)
    cut = value[: len(value) - 6]
    name = {"avro": "Avro", "protobuf": "Protobuf", "json_schema": "JSON Schema"}[fmt]
    return cut, f"payload does not decode with its {name} schema"


def latest(reader) -> float | None:
    releases = reader.drain()
    return releases[-1]["value"] if releases else None


def test_each_format_is_counted_exactly_and_its_hostile_records_dead_lettered(
    bootstrap, schema_registry, tmp_path
):
    runs = {}
    for n, fmt in enumerate(FORMATS):
        data = pipeline(fmt, schema_registry)
        topic = data["input"]["topics"][0]
        producers.create_source_topic(bootstrap, topic, partitions=2)
        events = shop_events(n, 240, MAX_VALUE)
        produce_as_users_do(bootstrap, schema_registry, fmt, topic, events)
        with SchemaRegistryClient({"url": schema_registry}) as client:
            template = serializer(fmt, client, topic)(events[0])
        hostile = produce_hostile(bootstrap, topic, template)
        cut, reason = truncated_payload(bootstrap, schema_registry, fmt, topic)
        hostile.update(produce_hostile_value(bootstrap, topic, cut, reason))
        runs[fmt] = (data, events, hostile)
    workers = {fmt: start(bootstrap, tmp_path, data) for fmt, (data, _, _) in runs.items()}
    rd = {fmt: readers(bootstrap, w) for fmt, w in workers.items()}
    try:
        for fmt, (_, events, _) in runs.items():
            views = sum(e["key"] == "view" for e in events)
            spend = sum(e.get("value", 0) for e in events if e["key"] == "buy")
            wait_until(
                lambda r=rd[fmt], v=views, s=spend: (
                    (latest(r["views"]), latest(r["spend"])) == (v, s)
                ),
                120,
                f"the exact counts of the {fmt} events",
                workers[fmt],
            )
        released = {
            fmt: {s.name: rd[fmt][s.name].records[:] for s in w.cfg.statistics}
            for fmt, w in workers.items()
        }
        dead = {fmt: rd[fmt]["_dead"].drain() for fmt in runs}
    finally:
        for readers_of in rd.values():
            for r in readers_of.values():
                r.close()
        for w in workers.values():
            w.stop()
    for fmt, (_, events, hostile) in runs.items():
        got = {(d["partition"], d["offset"]): d["reason"] for d in dead[fmt]}
        assert got == hostile, fmt
        assert all(d["payload_encoding"] == "base64" for d in dead[fmt])
        assert all(base64.b64decode(d["payload"]) for d in dead[fmt])
        cfg = workers[fmt].cfg
        counted = Counter(
            (e["user_id"], e["key"], e.get("value"))
            for e in map(orjson.loads, export_log(cfg, bootstrap))
            if "user_id" in e
        )
        assert counted == Counter((e["user_id"], e["key"], e.get("value")) for e in events), fmt
        if fmt == "avro":  # the producer moved to a second schema version mid-stream
            ids = {
                value[1:5]
                for rows in read_topic(bootstrap, cfg.input.topics[0], 2).values()
                for _, _, value, _ in rows
                if (rows and value[:1] == b"\x00" and len(value) > 8)
            }
            assert len(ids - {(987_654).to_bytes(4, "big")}) == 2
        assert_equal_to_replay(cfg, bootstrap, released[fmt], least=1)


def produce_hostile_value(bootstrap: str, topic: str, value: bytes, reason: str):
    sent = Sent()
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=value, on_delivery=sent)
    assert producer.flush(30) == 0 and not sent.errors
    return {sent.positions[value]: reason}


def test_dpstream_produce_format_avro_writes_what_the_pipeline_counts(
    bootstrap, schema_registry, tmp_path
):
    data = pipeline("avro", schema_registry)
    data["statistics"] = [{"name": "views", "epsilon": 1.0, "tau": 100_000}]
    data["privacy"]["total_epsilon"] = 1.0
    path = tmp_path / "avro.yaml"
    path.write_text(yaml.safe_dump(data))
    events = tmp_path / "events.jsonl"
    lines = [{"user_id": f"u{i % 7}", "key": "view", "actor": {"team": "a"}} for i in range(50)]
    events.write_bytes(b"\n".join(map(orjson.dumps, lines)))
    cli = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]
    done = subprocess.run(
        [*cli, "produce", "--config", str(path), "--bootstrap", bootstrap, "--events", str(events)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "(avro)" in done.stdout
    worker = start(bootstrap, tmp_path, data)
    rd = readers(bootstrap, worker)
    try:
        wait_until(lambda: latest(rd["views"]) == 50, 120, "the 50 Avro events counted", worker)
        assert rd["_dead"].drain() == []
    finally:
        for r in rd.values():
            r.close()
        worker.stop()


def test_a_registry_that_does_not_answer_pauses_the_ingest_and_loses_nothing(
    bootstrap, schema_registry
):
    (dead_port,) = _free_ports(1)  # nothing listens there
    down = pipeline("avro", f"http://127.0.0.1:{dead_port}/apis/ccompat/v7", partitions=1)
    cfg = parse_config(down)
    topic = cfg.input.topics[0]
    producers.create_source_topic(bootstrap, topic, partitions=1)
    create_source_topics(cfg, bootstrap)
    ensure_topics(cfg, bootstrap)
    events = shop_events(7, 30, MAX_VALUE)
    produce_as_users_do(bootstrap, schema_registry, "avro", topic, events)

    def sent_events() -> int:
        records = read_topic(bootstrap, cfg.events_topic, 1, timeout=10)[0]
        return len(records)

    paused = Ingest(cfg, bootstrap)
    with running(paused):
        # Read, find no registry, rewind, pause; twice at least.
        wait_until(lambda: paused._pauses >= 2, 90, "the ingest to pause twice")
    assert paused.events == 0 and not paused.rejected
    assert sent_events() == 0
    assert read_topic(bootstrap, cfg.outputs.dead_letter_topic, 1, timeout=10)[0] == []
    assert all(row["committed"] is None for row in source_lag(cfg, bootstrap).values())

    answering = {**down["input"], "schema_registry": {"url": schema_registry}}
    up = parse_config({**down, "input": answering})
    ingest = Ingest(up, bootstrap)
    with running(ingest):
        wait_until(lambda: ingest.events == len(events), 60, "every event sent")
    assert not ingest.rejected
    assert sent_events() > 0
    assert source_lag(up, bootstrap)[f"{topic}[0]"]["lag"] == 0


@contextmanager
def running(ingest: Ingest) -> Iterator[None]:
    """``ingest.run`` in a thread until the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=ingest.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
