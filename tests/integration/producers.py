"""Producers as users have them, to write a source topic the way real clients do, and a
snapshot of a topic to prove that a run left it unchanged. A plain module (like support.py).

Each ``produce_*`` function takes ``(bootstrap, topic, events, keyed)``, writes every event
as one record whose value is the event's compact JSON (``orjson.dumps``), whose key is
``str(event["user_id"])`` when ``keyed`` (else no key), with no headers, and returns once
every record is acknowledged by the broker (raising :class:`ProduceError` otherwise):

* :func:`produce_confluent_default`: confluent-kafka's ``Producer`` at its default settings
  (librdkafka's ``consistent_random`` partitioner: CRC32 of the key, random without one).
* :func:`produce_kcat`: Debian's ``kcat`` (librdkafka, its default partitioner too). Where
  ``kcat`` is missing the calling test skips, except under ``CI=true``, where it fails.
* :func:`produce_java_console`: Kafka's own ``kafka-console-producer`` (``ConsoleProducer``
  of ``kafka-tools``, from the broker's jars): the Java client's built-in partitioner,
  murmur2 of the key, sticky batches without one.

:func:`crc32_partition` and :func:`murmur2_partition` say where each partitioner puts a key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import murmur2
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from dpstream.deploy import broker

TIMEOUT = 30.0
"""Seconds any one call here may take before it gives up."""

QUIET = {"log_level": 0}  # our own clients only; the producers under test keep their defaults


class ProduceError(AssertionError):
    """A producer did not get every record acknowledged."""


# --------------------------------------------------------------------------- records


def value_of(event: dict) -> bytes:
    """The record value every producer here writes: the event as compact JSON."""
    return orjson.dumps(event)


def key_of(event: dict) -> str:
    """The record key of a keyed producer: the user id as a string."""
    return str(event["user_id"])


def crc32_partition(key: bytes, partitions: int) -> int:
    """Where librdkafka's default ``consistent_random`` partitioner puts a non-empty key."""
    return zlib.crc32(key) % partitions


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Where the Java client's default partitioner puts a key (``Utils.toPositive(murmur2)``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# --------------------------------------------------------------------------- topics


def create_source_topic(bootstrap: str, topic: str, partitions: int = 4) -> None:
    """Create ``topic`` with ``partitions`` partitions and otherwise the broker's defaults
    (no topic config at all), and wait until every partition has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
        ready = meta is not None and meta.error is None and len(meta.partitions) == partitions
        if ready and all(p.leader >= 0 and p.error is None for p in meta.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} has no leader for every partition after {TIMEOUT} s")


def _partitions(bootstrap: str, topic: str) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    meta = admin.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
    if meta is None or meta.error is not None:
        raise AssertionError(f"topic {topic}: {meta.error if meta else 'not found'}")
    return sorted(meta.partitions)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-offsets", **QUIET})
    try:
        return {p: _high_watermark(consumer, topic, p) for p in _partitions(bootstrap, topic)}
    finally:
        consumer.close()


# Right after a topic is created its leader may not serve it yet, though the metadata
# already names it; librdkafka does not mark these retriable for get_watermark_offsets.
NOT_SERVED_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def _high_watermark(consumer: Consumer, topic: str, partition: int) -> int:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=TIMEOUT
            )[1]
        except KafkaException as exc:
            error = exc.args[0]
            waiting = error.retriable() or error.code() in NOT_SERVED_YET
            if not waiting or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def topic_configs(bootstrap: str, topic: str) -> dict[str, str | None]:
    """The topic's settings whose source is not Kafka's default (``describe_configs``): its
    own overrides, and the cluster's settings for every topic (KRaft in 4.1 sets
    ``min.insync.replicas`` so)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
    return {name: e.value for name, e in sorted(entries.items()) if not e.is_default}


def snapshot(bootstrap: str, topic: str) -> dict[str, Any]:
    """Every record of every partition of ``topic`` and its non-default configs.

    Two snapshots are equal exactly when no record was added, removed or changed (key,
    value, headers, timestamp and its type; offsets included, so transaction markers and
    compaction show too) and no topic config changed.

    Returns:
        ``{"partitions": {partition: high watermark}, "records": [{partition, offset, key,
        value, headers, timestamp_type, timestamp}, ...] (by partition, then offset),
        "configs": {name: value}}``.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "t-snapshot",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_uncommitted",  # every record in the log, aborted or not
            "fetch.wait.max.ms": 10,  # the EOF fetch need not wait for new records
            **QUIET,
        }
    )
    records: list[dict[str, Any]] = []
    try:
        marks = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)
            for p in _partitions(bootstrap, topic)
        }
        ends = {p: high for p, (_low, high) in marks.items()}
        # From each log start offset as found (OFFSET_BEGINNING would cost a 0.5 s lookup).
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _high) in marks.items()])
        # EOF comes once a partition's fetch position reaches its high watermark, also when
        # the last offsets were control records (never delivered) or the partition is empty.
        pending = set(ends)
        deadline = time.monotonic() + TIMEOUT
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"snapshot of {topic}: partitions {pending} not read")
            for msg in consumer.consume(1000, timeout=0.05):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise AssertionError(f"snapshot of {topic}: {err}")
                    if msg.offset() >= ends[msg.partition()]:
                        pending.discard(msg.partition())
                    continue
                if msg.offset() >= ends[msg.partition()]:
                    continue  # written after the snapshot began
                ts_type, ts = msg.timestamp()
                records.append(
                    {
                        "partition": msg.partition(),
                        "offset": msg.offset(),
                        "key": msg.key(),
                        "value": msg.value(),
                        "headers": msg.headers(),
                        "timestamp_type": ts_type,
                        "timestamp": ts,
                    }
                )
    finally:
        consumer.close()
    records.sort(key=lambda r: (r["partition"], r["offset"]))
    return {"partitions": ends, "records": records, "configs": topic_configs(bootstrap, topic)}


# --------------------------------------------------------------------------- producers


def produce_confluent_default(bootstrap: str, topic: str, events: list[dict], keyed: bool) -> None:
    """confluent-kafka's ``Producer`` with nothing but ``bootstrap.servers`` set."""
    producer = Producer({"bootstrap.servers": bootstrap})
    failed: list[str] = []

    def report(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for event in events:
        kwargs = {"key": key_of(event).encode()} if keyed else {}
        while True:
            try:
                producer.produce(topic, value=value_of(event), on_delivery=report, **kwargs)
                break
            except BufferError:  # the local queue is full: serve delivery reports, retry
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(TIMEOUT)
    if left or failed:
        raise ProduceError(f"confluent-kafka: {left} unacknowledged, failed: {failed[:5]}")


KCAT_HINT = "kcat is not installed (Debian: apt-get install kcat; .ci/run installs it in CI)"


def kcat_or_skip() -> str:
    """The ``kcat`` executable; a test without one is skipped, or failed under ``CI=true``
    (CI must prove that the kcat tests ran)."""
    found = shutil.which("kcat")
    if found is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{KCAT_HINT}; CI must run the kcat tests", pytrace=False)
        pytest.skip(KCAT_HINT)
    return found


def _lines(events: Sequence[dict], keyed: bool) -> bytes:
    """One line per event, ``key<TAB>value`` when keyed: the input of kcat and the console
    producer. Compact JSON escapes tabs and newlines inside strings, so values split cleanly."""
    out = []
    for event in events:
        value = value_of(event)
        if keyed:
            key = key_of(event).encode()
            if b"\t" in key or b"\n" in key or b"\r" in key:
                raise ValueError(f"a key with a tab or line break cannot be piped: {key!r}")
            value = key + b"\t" + value
        out.append(value + b"\n")
    return b"".join(out)


def _run_cli(
    what: str,
    cmd: list[str],
    bootstrap: str,
    topic: str,
    events: list[dict],
    keyed: bool,
    failed: Callable[[str], bool],
) -> None:
    """Pipe the events into ``cmd``; check its exit, its output and the topic's end offsets
    (a command-line producer may report a failed delivery only as text)."""
    before = sum(end_offsets(bootstrap, topic).values())
    try:
        # Fixed argument lists from this module; the only inputs are the test's names.
        result = subprocess.run(  # noqa: S603
            cmd, input=_lines(events, keyed), capture_output=True, timeout=TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        output = ((exc.stdout or b"") + (exc.stderr or b"")).decode("utf-8", "replace")
        raise ProduceError(f"{what} still running after {TIMEOUT} s:\n{output[-3000:]}") from None
    output = (result.stdout + result.stderr).decode("utf-8", "replace")
    if result.returncode != 0 or failed(output):
        raise ProduceError(f"{what} (exit {result.returncode}):\n{output[-3000:]}")
    written = sum(end_offsets(bootstrap, topic).values()) - before
    if written < len(events):
        raise ProduceError(f"{what}: {written} of {len(events)} records written:\n{output}")


def produce_kcat(bootstrap: str, topic: str, events: list[dict], keyed: bool) -> None:
    """``kcat -P -b <bootstrap> -t <topic> [-K <TAB>]`` with one event per stdin line (no
    ``-p``: librdkafka's default partitioner chooses). kcat waits for every delivery
    report before it exits."""
    cmd = [kcat_or_skip(), "-P", "-b", bootstrap, "-t", topic]
    if keyed:
        cmd += ["-K", "\\t"]  # kcat parses the escape
    _run_cli("kcat", cmd, bootstrap, topic, events, keyed, lambda out: "fail" in out.lower())


def produce_java_console(bootstrap: str, topic: str, events: list[dict], keyed: bool) -> None:
    """Kafka's ``kafka-console-producer.sh --bootstrap-server <bootstrap> --topic <topic>``
    (``org.apache.kafka.tools.ConsoleProducer`` run from the broker's jars, see
    :func:`dpstream.deploy.broker.kafka_tool_command`) with one event per stdin line, keyed
    through ``--property parse.key=true`` (its default ``key.separator`` is a tab). Its
    defaults are ``acks=all`` and a producer closed (all records sent) at end of input; a
    failed send is only logged ("Error when sending message")."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic]
    if keyed:
        args += ["--property", "parse.key=true", "--property", "key.separator=\t"]
    cmd = broker.kafka_tool_command(broker.CONSOLE_PRODUCER, *args)
    _run_cli(
        "kafka-console-producer",
        cmd,
        bootstrap,
        topic,
        events,
        keyed,
        lambda out: "ERROR" in out or "Exception" in out,
    )


PRODUCERS: dict[str, Callable[[str, str, list[dict], bool], None]] = {
    "confluent_default": produce_confluent_default,
    "kcat": produce_kcat,
    "java_console": produce_java_console,
}
"""Every producer above by a short name, for ``pytest.mark.parametrize``."""
