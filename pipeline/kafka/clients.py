"""confluent-kafka tools: the project's producer (single events and batch envelopes), topic
readers, and a release reader."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from dpstream.config.kafka import KafkaSecurityConfig
from dpstream.config.schema import PipelineConfig

from ..wire.records import BATCH, HEADER, user_id_of
from .client_logs import error_callback
from .security import confluent_config
from .topics import group_id

log = logging.getLogger(__name__)


def make_producer(
    bootstrap: str, security: KafkaSecurityConfig | None = None, **overrides: object
) -> Producer:
    """The project's producer; ``security`` is the config's ``kafka:`` section (SASL/TLS)."""
    conf = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 20,
        "compression.type": "lz4",
        "enable.idempotence": True,
        "log_level": 0,
        "error_cb": error_callback("producer", log),
    }
    conf.update(confluent_config(security or KafkaSecurityConfig()))
    conf.update(overrides)
    return Producer(conf)


def produce_events(
    producer: Producer,
    cfg: PipelineConfig,
    events: Iterable[dict],
    batch: int = 1,
    serialize: Callable[[dict], bytes] = orjson.dumps,
) -> int:
    """Send events to the first source topic, keyed by user id (at ``input.user_id_field``,
    a dotted path for a nested one; no key for an event without one, which the ingest
    dead-letters); with ``batch > 1`` as batch envelopes (JSON arrays of ``batch`` events)
    that the ingest splits again. ``serialize``: an event's record value (JSON;
    ``tools.avro_events`` writes Avro)."""
    topic = cfg.input.topics[0]
    field = cfg.input.user_id_field
    sent = 0
    buffer: list[dict] = []

    def flush() -> None:
        producer.produce(topic, value=orjson.dumps(buffer), headers=[(HEADER, BATCH)])
        buffer.clear()

    for event in events:
        if batch <= 1:
            user_id = user_id_of(event, field)
            key = None if user_id is None else str(user_id).encode()
            producer.produce(topic, key=key, value=serialize(event))
        else:
            buffer.append(event)
            if len(buffer) >= batch:
                flush()
        sent += 1
        producer.poll(0)
    if buffer:
        flush()
    return sent


TOOLS_GROUP = "dpstream-tools"
"""The group of a reader given none (tests): dpstream's own readers pass the app's,
:func:`tools_group`, which its ACLs cover. The readers only assign partitions and never
commit, but librdkafka still finds the group's coordinator, which needs Describe on the
group."""


def tools_group(cfg: PipelineConfig) -> str:
    """The group of dpstream's own readers of its topics (export-log, ledger, holes)."""
    return group_id(cfg.app_id, "tools")


def _consumer(bootstrap: str, security: KafkaSecurityConfig | None, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 0,
            "error_cb": error_callback("reader", log),
            **confluent_config(security or KafkaSecurityConfig()),
        }
    )


def _next_record(consumer: Consumer, timeout: float, what: str):
    """The next record from the assigned partitions (end-of-partition events skipped)."""
    while True:
        msg = consumer.poll(timeout)
        if msg is None:
            raise TimeoutError(f"reading {what}: no record within {timeout}s")
        error = msg.error()
        if not error:
            return msg
        if error.code() != KafkaError._PARTITION_EOF:
            raise RuntimeError(str(error))


def _fields(msg) -> tuple[int, list, bytes | None, int]:
    return msg.offset(), msg.headers() or [], msg.value(), msg.timestamp()[1]


def read_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    timeout: float = 30.0,
    security: KafkaSecurityConfig | None = None,
    group: str = TOOLS_GROUP,
):
    """Every record of ``topic`` up to its current end, per partition, in offset order.

    Returns {partition: [(offset, headers, value, timestamp_ms)]}.
    """
    consumer = _consumer(bootstrap, security, group)
    try:
        starts, ends = {}, {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                starts[p], ends[p] = low, high
        out: dict[int, list] = {p: [] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in ends])
        remaining = set(ends)
        while remaining:
            msg = _next_record(consumer, timeout, topic)
            p = msg.partition()
            out[p].append(_fields(msg))
            if msg.offset() >= ends[p] - 1:
                remaining.discard(p)
                consumer.pause([TopicPartition(topic, p)])
        return out
    finally:
        consumer.close()


def read_range(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    security: KafkaSecurityConfig | None = None,
    timeout: float = 30.0,
    group: str = TOOLS_GROUP,
) -> list[tuple[int, list, bytes | None, int]]:
    """The records of one partition at offsets ``start`` <= offset < ``end`` (fewer where
    the log has none: transaction markers), as [(offset, headers, value, timestamp_ms)]."""
    consumer = _consumer(bootstrap, security, group)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        out: list[tuple[int, list, bytes | None, int]] = []
        while True:
            msg = _next_record(consumer, timeout, f"{topic}[{partition}] {start}-{end}")
            if msg.offset() >= end:
                return out
            out.append(_fields(msg))
            if msg.offset() == end - 1:
                return out
    finally:
        consumer.close()


def read_releases(
    bootstrap: str,
    topic: str,
    *,
    group: str,
    from_beginning: bool = True,
    security: KafkaSecurityConfig | None = None,
) -> Consumer:
    """A consumer of ``topic`` (a name, or a ``^`` pattern) in ``group``; dpstream's own are
    ``<app_id>-...``, which its ACLs cover (``dpstream tail``: ``<app_id>-tail-<statistic>``)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 0,
            "error_cb": error_callback("release reader", log),
            **confluent_config(security or KafkaSecurityConfig()),
        }
    )
    consumer.subscribe([topic])
    return consumer
