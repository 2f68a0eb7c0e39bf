"""The benchmark's inputs: synthetic events, the records they become, and the topics
pre-produced with them.

Two shapes are read by the throughput contenders:

* ``single``: single-event JSON records keyed by user id in a source topic (the users'
  topic), written by a plain confluent-kafka Producer as users have it;
* ``envelopes``: dpstream's own columnar envelopes (``records.encode_envelope``, what the
  ingest writes for the same events: ``ingest.route``) in a topic shaped like dpstream's
  events topic (partitioned by user, header ``dpstream: envelope``);
* ``avro``: the same events as ``single``, as single-event Avro records in the Schema
  Registry's wire format (confluent-kafka's AvroSerializer, the schema ``dpstream produce
  --format avro`` makes from them), keyed by user id: what the ingest reads with
  ``input.format: avro`` (the ``ingest`` contender only).

Latency and memory runs also produce source records in batches (JSON arrays, header
``dpstream: batch``): ``messages(events, batch)``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from dpstream.config.schema import PipelineConfig

SINGLE = "single"
ENVELOPES = "envelopes"
AVRO = "avro"
SHAPES = (SINGLE, ENVELOPES, AVRO)
# The source topics' producer: a plain confluent-kafka Producer as users have it, at its
# defaults but for lz4 (a pre-produced topic of several 100,000 records).
SOURCE_PRODUCER = {"compression.type": "lz4", "log_level": 0}

# (key, value, headers, partition or None for the producer's partitioner) of each record,
# serialized once per dataset.
Message = tuple[bytes | None, bytes, list | None, int | None]


@dataclass
class Dataset:
    """A pre-produced, committed topic: what the ceilings, the naive agent and the peers
    read. ``name`` is its key in a run's results (``single``, ``envelopes``, or
    ``single-<events>`` for a contender's longer span); the pipeline runs read copies of
    it."""

    name: str
    shape: str
    topic: str
    partitions: int
    events: int
    records: int
    ends: dict[int, int]
    produce_seconds: float


def shape_name(shape: str) -> str:
    return {
        SINGLE: "single-event records",
        ENVELOPES: "our envelopes (columnar, events topic)",
        AVRO: "single-event Avro records (Schema Registry)",
    }[shape]


def batch_name(batch: int) -> str:
    """The source records of latency and memory runs: single events or batches of them."""
    return "single-event records" if batch <= 1 else f"source batches of {batch}"


def synthetic(users: int, count: int, seed: int) -> Iterator[dict]:
    from dpstream.pipeline.tools.synthetic import synthetic_events

    return synthetic_events(users, count, seed=seed)


def cycle_users(users: int, events: int) -> Iterator[dict]:
    """``events`` events from users 0..users-1 in turn, keys alternating view/click per
    round (memory runs: the same log length whatever the number of users)."""
    for i in range(events):
        u, j = i % users, i // users
        yield {"user_id": f"user-{u:07d}", "key": "click" if (u + j) % 2 else "view"}


def round_robin(users: int, per_user: int) -> Iterator[dict]:
    """Every user ``per_user`` times, keys alternating view/click."""
    for j in range(per_user):
        for u in range(users):
            yield {"user_id": f"user-{u:07d}", "key": "click" if (u + j) % 2 else "view"}


def compact(value: bytes) -> bytes:
    """A copy of exactly ``len(value)`` bytes: orjson >= 3.12 returns every small value in
    a 4 KiB allocation (ijl/orjson's buffer is never trimmed), so five million kept
    single-event records took 20 GB; copied, 1,000,000 take 0.3 GB."""
    return bytes(memoryview(value))


def messages(events: Iterator[dict], batch: int) -> tuple[list[Message], int]:
    """Source records for ``events``: single-event records keyed by user id (batch 1),
    else batches (JSON arrays, header ``dpstream: batch``, no key), as
    ``clients.produce_events`` writes them; and the number of events."""
    from dpstream.pipeline.wire.records import BATCH, HEADER

    out: list[Message] = []
    n = 0
    if batch <= 1:
        for e in events:
            out.append((str(e["user_id"]).encode(), compact(orjson.dumps(e)), None, None))
            n += 1
        return out, n
    buffer: list[dict] = []
    for e in events:
        buffer.append(e)
        n += 1
        if len(buffer) >= batch:
            out.append((None, orjson.dumps(buffer), [(HEADER, BATCH)], None))
            buffer = []
    if buffer:
        out.append((None, orjson.dumps(buffer), [(HEADER, BATCH)], None))
    return out, n


def avro_messages(events: list[dict], registry: str) -> list[Message]:
    """``events`` as single-event Avro records keyed by user id (see the module docstring),
    their schema registered in the Schema Registry at ``registry``."""
    import json

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from dpstream.pipeline.tools.avro_events import avro_schema

    schema = avro_schema(events)
    names = [f["name"] for f in schema["fields"]]
    ctx = SerializationContext("bench.avro", MessageField.VALUE)
    with SchemaRegistryClient({"url": registry}) as client:
        write = AvroSerializer(client, json.dumps(schema))
        return [
            (str(e["user_id"]).encode(), write(dict.fromkeys(names) | e, ctx), None, None)
            for e in events
        ]


def source_records(msgs: list[Message], partitions: int, topic: str = "bench.source") -> list:
    """``msgs`` as the ingest's consumer hands them over (``ingest.SourceRecord``): keyed
    records in the partition librdkafka's default partitioner picks (CRC32 of the key),
    unkeyed ones round-robin; offsets per partition; interleaved by partition in chunks
    of 500, as fetches return them."""
    import zlib

    from dpstream.pipeline.ingest.route import SourceRecord

    per: list[list] = [[] for _ in range(partitions)]
    for i, (key, value, headers, _) in enumerate(msgs):
        p = zlib.crc32(key) % partitions if key is not None else i % partitions
        per[p].append(SourceRecord(topic, p, len(per[p]), headers, value))
    out: list = []
    for start in range(0, max(map(len, per)), 500):
        for records in per:
            out += records[start : start + 500]
    return out


def routed_envelopes(cfg: PipelineConfig, msgs: list[Message]) -> list[tuple[int, bytes]]:
    """What the ingest writes for ``msgs``: (events partition, columnar envelope), from
    ``ingest.route`` over the records as its consumer returns them, in the worker's
    ``input.ingest_batch`` chunks."""
    from dpstream.pipeline.ingest.route import route
    from dpstream.pipeline.wire.records import limits_for

    limits, partitions, chunk = limits_for(cfg), cfg.input.partitions, cfg.input.ingest_batch
    records = source_records(msgs, partitions)
    out: list[tuple[int, bytes]] = []
    for start in range(0, len(records), chunk):
        out += route(records[start : start + chunk], limits, partitions).envelopes
    return out


def envelope_messages(envelopes: list[tuple[int, bytes]]) -> list[Message]:
    """Columnar envelopes as records of an events topic: unkeyed, in their partition."""
    from dpstream.pipeline.ingest.consumer import ENVELOPE_HEADERS

    return [(None, raw, ENVELOPE_HEADERS, p) for p, raw in envelopes]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-offsets", "log_level": 0})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


def create_source(bootstrap: str, topic: str, partitions: int) -> None:
    """The source topic, as a user would have it: broker defaults, ``partitions``."""
    from confluent_kafka.admin import AdminClient, NewTopic

    client = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    if topic in client.list_topics(timeout=30).topics:
        return
    for future in client.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result()


def produce_nowait(producer, topic: str, msgs: list[Message]) -> None:
    """Queue ``msgs`` (waiting only while the producer's queue is full)."""
    for key, value, headers, partition in msgs:
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    headers=headers,
                    partition=-1 if partition is None else partition,
                )
                break
            except BufferError:  # the default queue (100,000 messages) is full
                producer.poll(0.05)
        producer.poll(0)


def produce_source(producer, topic: str, msgs: list[Message]) -> None:
    produce_nowait(producer, topic, msgs)
    if producer.flush(300):
        raise RuntimeError("pre-producing: messages still queued after 300 s")


def preproduce(
    bootstrap: str, name: str, shape: str, partitions: int, msgs: list[Message], events: int
) -> Dataset:
    """Write the records into a new topic with a plain confluent-kafka Producer (defaults
    but lz4; single events keyed by user id: librdkafka's default partitioner,
    consistent_random over CRC32, picks the partition; envelopes go to their own)."""
    from confluent_kafka import Producer

    topic = f"bench-{name}-{uuid.uuid4().hex[:6]}.source"
    create_source(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, **SOURCE_PRODUCER})
    started = time.perf_counter()
    produce_source(producer, topic, msgs)
    seconds = time.perf_counter() - started
    ends = end_offsets(bootstrap, topic, partitions)
    return Dataset(
        name=name,
        shape=shape,
        topic=topic,
        partitions=partitions,
        events=events,
        records=sum(ends.values()),
        ends=ends,
        produce_seconds=seconds,
    )


def hold_source(bootstrap: str, topic: str, partitions: int, msgs: list[Message]):
    """The same records as ``preproduce`` (same producer settings plus a transactional id)
    into ``topic``, inside a transaction left open: a read_committed consumer, as the
    ingest's is (librdkafka's default), sees none of them until ``commit_transaction``, so
    a worker can start up first and then find the whole backlog at once. Returns the
    producer, to commit."""
    from confluent_kafka import Producer

    create_source(bootstrap, topic, partitions)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **SOURCE_PRODUCER,
            "transactional.id": f"bench-hold-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 600_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    produce_source(producer, topic, msgs)
    return producer
