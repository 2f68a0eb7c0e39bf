"""Reading dpstream's topics as typed records: ``releases``, ``ledger``, ``dead_letters``.

Each is an iterator over one topic, from its beginning or its end, that stops at the end
of the topic (what is committed when it gets there) or, with ``follow``, waits for more.
It assigns the topic's partitions itself and never commits: a reader joins no group and
moves no one's offsets. The group it names (``<app_id>-tail-<what>``) is only what
librdkafka asks the group coordinator about; the reader ACLs (``pipeline.kafka.acls``)
grant that prefix. Transactions: only committed records are read (the worker publishes
in transactions).

Where the topic and the connection come from: a pipeline config (its topics, its
``kafka:`` security section, so the secured broker works too) and the bootstrap servers,
or a topic name, bootstrap servers and optionally the security section.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import TypeVar

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from dpstream.config.kafka import KafkaSecurityConfig, SchemaRegistryConfig
from dpstream.config.schema import PipelineConfig
from dpstream.pipeline.kafka.schema_registry import make_client
from dpstream.pipeline.kafka.security import confluent_config
from dpstream.pipeline.kafka.topics import group_id
from dpstream.statistics import avro_schemas

from .records import (
    DeadLetter,
    LedgerEntry,
    Position,
    RecordError,
    Release,
    dead_letter,
    ledger_entry,
    release,
    release_of,
)

T = TypeVar("T")

POLL_SECONDS = 0.5
"""How long one poll waits: how soon a ``stop`` event is seen while following."""


def releases(
    statistic: str,
    bootstrap: str,
    config: PipelineConfig | None = None,
    *,
    topic: str | None = None,
    security: KafkaSecurityConfig | None = None,
    from_beginning: bool = True,
    follow: bool = False,
    validate: bool = True,
    stop: threading.Event | None = None,
    schema_registry: SchemaRegistryConfig | None = None,
) -> Generator[Release]:
    """The releases of ``statistic``, in tick order (its topic has one partition).

    Args:
        statistic: the statistic's name (``statistics[].name``).
        bootstrap: the Kafka bootstrap servers.
        config: the pipeline (its release topic and ``kafka:`` section); or give ``topic``
            (and ``security`` for a secured broker).
        from_beginning: start at the topic's first record (else at its end: only new ones).
        follow: wait for new releases at the end (else stop there).
        validate: check each release against its published schema (about 1.5 ms a record;
            off for bulk reads of a trusted topic).
        stop: set by another thread to end a following iterator within ``POLL_SECONDS``.
        schema_registry: the registry of a topic written in Avro (``outputs.format: avro``);
            with a config, its ``outputs.schema_registry`` when its format is avro. The
            releases are the same typed records as from JSON (``AvroReleases``).

    Raises:
        UnknownSchemaVersion: a release of a schema version this dpstream does not know.
        RecordError: a record that is not a release of a known shape.
    """
    name = topic or _config(config, "topic").release_topic(statistic)
    if schema_registry is None and config is not None and config.outputs.format == "avro":
        schema_registry = config.outputs.schema_registry
    group = f"tail-{statistic}"
    if schema_registry is None:
        return _typed(release, name, bootstrap, config, security, group,
                      from_beginning, follow, validate, stop)  # fmt: skip
    parse = AvroReleases(name, schema_registry)
    return _closing(parse, _typed(parse, name, bootstrap, config, security, group,
                                  from_beginning, follow, validate, stop))  # fmt: skip


def _closing(parse: AvroReleases, records: Generator[Release]) -> Generator[Release]:
    """``records``, then the registry client closed, however the iteration ends."""
    try:
        yield from records
    finally:
        records.close()
        parse.close()


class AvroReleases:
    """Releases from an Avro release topic's values: decoded with the registry
    (confluent-kafka's ``AvroDeserializer``, the writer's schema by the id in the value),
    mapped back to the release as its JSON reads (``avro_schemas.from_avro``), then checked
    and typed as a JSON release is."""

    def __init__(self, topic: str, registry: SchemaRegistryConfig) -> None:
        # Imported here: the Schema Registry's client is an extra (pyproject.toml).
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        self._client = make_client(registry, "outputs.schema_registry")
        self._deserialize = AvroDeserializer(self._client, return_record_name=True)
        self._context = SerializationContext(topic, MessageField.VALUE)

    def close(self) -> None:
        self._client.close()

    def __call__(self, value: bytes | None, position: Position, validate: bool) -> Release:
        from confluent_kafka.serialization import SerializationError

        try:
            decoded = self._deserialize(value, self._context)
        except SerializationError as exc:
            raise RecordError(
                f"a release record at {position.topic}[{position.partition}] offset "
                f"{position.offset} that does not decode with its Avro schema ({exc})"
            ) from None
        return release_of(avro_schemas.from_avro(decoded), position, validate)


def ledger(
    bootstrap: str,
    config: PipelineConfig | None = None,
    *,
    topic: str | None = None,
    security: KafkaSecurityConfig | None = None,
    from_beginning: bool = True,
    follow: bool = False,
    validate: bool = True,
    stop: threading.Event | None = None,
) -> Generator[LedgerEntry]:
    """The ledger's entries in log order (``outputs.ledger_topic``); arguments as for
    ``releases``. Entries of every app id sharing the topic are read: filter on
    ``app_id``."""
    name = topic or _config(config, "topic").outputs.ledger_topic
    return _typed(ledger_entry, name, bootstrap, config, security, "tail-ledger",
                  from_beginning, follow, validate, stop)  # fmt: skip


def dead_letters(
    bootstrap: str,
    config: PipelineConfig | None = None,
    *,
    topic: str | None = None,
    security: KafkaSecurityConfig | None = None,
    from_beginning: bool = True,
    follow: bool = False,
    validate: bool = True,
    stop: threading.Event | None = None,
) -> Generator[DeadLetter]:
    """The dead letters (``outputs.dead_letter_topic``): the operators' topic, holding
    user data, that the reader ACLs do not grant; arguments as for ``releases``."""
    name = topic or _config(config, "topic").outputs.dead_letter_topic
    return _typed(dead_letter, name, bootstrap, config, security, "tail-dead-letters",
                  from_beginning, follow, validate, stop)  # fmt: skip


def _config(config: PipelineConfig | None, instead: str) -> PipelineConfig:
    if config is None:
        raise TypeError(f"give a pipeline config or a {instead}")
    return config


def _typed(
    parse: Callable[[bytes | None, Position, bool], T],
    topic: str,
    bootstrap: str,
    config: PipelineConfig | None,
    security: KafkaSecurityConfig | None,
    role: str,
    from_beginning: bool,
    follow: bool,
    validate: bool,
    stop: threading.Event | None,
) -> Generator[T]:
    group = group_id(config.app_id if config else "dpstream-client", role)
    sec = security or (config.kafka if config else KafkaSecurityConfig())
    for position, value in read(topic, bootstrap, sec, group, from_beginning, follow, stop):
        if value is not None:  # no record in a record without a value
            yield parse(value, position, validate)


def read(
    topic: str,
    bootstrap: str,
    security: KafkaSecurityConfig,
    group: str,
    from_beginning: bool,
    follow: bool,
    stop: threading.Event | None = None,
) -> Generator[tuple[Position, bytes | None]]:
    """Every committed record of ``topic`` from its beginning or end, to its end or (with
    ``follow``) on; a topic that does not exist yet is waited for with ``follow``, else
    has no records."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "log_level": 0,
            **confluent_config(security),
        }
    )
    try:
        partitions = _partitions(consumer, topic, follow, stop)
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(topic, p, start) for p in partitions])
        not_at_end = set(partitions)
        while (follow or not_at_end) and not (stop and stop.is_set()):
            msg = consumer.poll(POLL_SECONDS)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"reading {topic}: {error}")
                not_at_end.discard(msg.partition())
                continue
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None  # a record, not an event
            position = Position(topic, partition, offset, msg.timestamp()[1])
            yield position, msg.value()
    finally:
        consumer.close()


def _partitions(
    consumer: Consumer, topic: str, follow: bool, stop: threading.Event | None
) -> list[int]:
    """The partitions of ``topic``; with ``follow``, once it exists."""
    while True:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is not None and metadata.error is None and metadata.partitions:
            return sorted(metadata.partitions)
        if not follow or (stop and stop.is_set()):
            return []
        if stop:
            stop.wait(POLL_SECONDS)
        else:
            threading.Event().wait(POLL_SECONDS)
