"""The ingest stage's Kafka side: the users' source topics -> dpstream's events topic, by
user (its per-record work is ``route.py``).

The source topics are someone else's: the ingest reads them in a consumer group
(``<app_id>-ingest``) with confluent-kafka, needs only Read and Describe on them, and
never writes to them or changes their settings. Any producer, partitioner, partition
count or key (or none) works: the user id is a field of the value
(``input.user_id_field``), in JSON or, with ``input.format``, in a Schema Registry's
Avro, Protobuf or JSON Schema (``wire/registry_formats.py``; a registry that does not
answer pauses the ingest, ``Ingest._pause``). Each event is validated
(``records.parse_event``, the rules and reasons of every other path); a bad one goes to
the dead-letter topic with its source topic, partition, offset and index. The good ones
go to the events topic, to the partition murmur2 picks for their user (stage 1 keeps each
user's contribution bound in one place), as columnar envelopes
(``records.encode_envelope``) that keep each event's source position.

Exactly once without transactions (docs/design.md, "Exactly once from the source"): the
ingest commits a source offset only after the broker has acknowledged every envelope and
dead letter of the records before it, so a crash re-sends and never skips; its producer is
idempotent and gapless (a partition receives a prefix of what it was sent, in order); stage
1 drops an event at or below the last source position it counted (``drivers.unseen``).

Memory is bounded: at most two batches of ``input.ingest_batch`` source records are held,
one on its way to the broker while the next is read and routed.

The worker's metrics (docs/operations.md) learn what its ingest did from an
``IngestReport`` the ingest puts on a queue once a second: its totals since it started
and its lag, never blocking (a full queue drops the report; the next one carries the
totals).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from dpstream.config.schema import PipelineConfig
from dpstream.operators.errors import DpStreamError

from ..kafka.client_logs import RateLimiter, error_callback
from ..kafka.security import confluent_config
from ..kafka.topics import group_id
from ..wire.records import (
    ENVELOPE,
    HEADER,
    Limits,
    RegistryUnavailable,
    limits_for,
)
from .route import SourceRecord, from_last_restart, route

if TYPE_CHECKING:
    from ..wire.registry_formats import RegistryDecoder

log = logging.getLogger(__name__)

LOG_SECONDS = 10.0
REPORT_SECONDS = 1.0  # how often the ingest reports its totals to its worker
REPORTS_QUEUED = 4  # reports that may wait for the worker (more are dropped)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

CLOSE_SECONDS = 8.0
"""How long a stopping ingest waits for the acknowledgements of what it sent: within the
worker's stop bound (``pipeline/worker/lifecycle.py``), which stops the ingest first."""


class IngestFailed(DpStreamError):
    """The events topic refused what the ingest sent; it stops without committing, and a
    restarted ingest re-sends from the last committed offset."""


@dataclass(frozen=True)
class IngestReport:
    """What an ingest has done since it started, for its worker's metrics: source
    records read, valid events sent to the events topic, dead letters by reason, partition
    assignments received, the lag of each source partition it holds, by (topic,
    partition), and per statistic the values clipped and the rule failures on events other
    statistics used, by (statistic, what). Totals, not increments: a report lost on the way
    loses nothing."""

    records: int = 0
    events: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    rebalances: int = 0
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    by_statistic: dict[tuple[str, str], int] = field(default_factory=dict)


class _Partition(TypedDict, total=False):
    """``Producer.produce``'s partition, passed only when chosen (else the partitioner's)."""

    partition: int


def consumer_config(cfg: PipelineConfig, bootstrap: str) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id(cfg.app_id, "ingest"),
        "enable.auto.commit": False,
        # A new group only (input.start): one with committed offsets resumes from them.
        "auto.offset.reset": cfg.input.start,
        # librdkafka's default (1 s) idles the fetcher after the first fetches.
        "fetch.queue.backoff.ms": 10,
        "log_level": 0,
        "error_cb": error_callback("ingest consumer", log),
        **_group_timeouts(),
        **confluent_config(cfg.kafka),
    }


def _group_timeouts() -> dict[str, int]:
    """The worker's Faust group timeouts (BROKER_SESSION_TIMEOUT, BROKER_HEARTBEAT_INTERVAL,
    in seconds, from the environment) hold for its ingest too: both stages fail over alike."""
    out = {}
    for env, setting in (
        ("BROKER_SESSION_TIMEOUT", "session.timeout.ms"),
        ("BROKER_HEARTBEAT_INTERVAL", "heartbeat.interval.ms"),
    ):
        if os.environ.get(env):
            out[setting] = int(float(os.environ[env]) * 1000)
    return out


def producer_config(bootstrap: str, cfg: PipelineConfig) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        # In order, once, and without gaps: a failed batch stops the producer rather than
        # letting a later one land after it (stage 1's dedupe needs a prefix), and no
        # message times out locally (a timeout is the one gap gapless does not cover).
        "enable.idempotence": True,
        "enable.gapless.guarantee": True,
        "message.timeout.ms": 0,
        "linger.ms": 5,
        "compression.type": "lz4",
        "log_level": 0,
        "error_cb": error_callback("ingest producer", log),
        **confluent_config(cfg.kafka),
    }


ENVELOPE_HEADERS = [(HEADER, ENVELOPE)]
# A batch the Schema Registry could not decode is read again after PAUSE_SECONDS, doubled
# on each consecutive failure up to PAUSE_MAX_SECONDS.
PAUSE_SECONDS = 1.0
PAUSE_MAX_SECONDS = 30.0


def source_decoder(cfg: PipelineConfig, limits: Limits) -> RegistryDecoder | None:
    """The source values' decoder for ``input.format`` (None: JSON, decoded in place)."""
    registry = cfg.input.schema_registry
    if cfg.input.format == "json" or registry is None:
        return None
    # Imported here: the Schema Registry's clients and codecs are an extra (pyproject.toml)
    # that a pipeline reading JSON does without.
    from ..kafka.schema_registry import describe, make_client
    from ..wire.registry_formats import RegistryDecoder

    log.info("input.format %s, schemas from %s", cfg.input.format, describe(registry))
    return RegistryDecoder(cfg.input.format, make_client(registry), limits)


def all_dead_lettered(events: int, rejected: Counter[str], top: int = 3) -> str | None:
    """The warning for an interval in which the sources gave records but every one was
    dead-lettered (None otherwise): a pipeline that releases noise alone, most often
    because of a config that does not match the events (``input.user_id_field``), which
    the reasons name. Reasons never hold user ids or payloads (``wire.records``)."""
    if events or not rejected:
        return None
    reasons = "; ".join(f"{reason} ({n})" for reason, n in rejected.most_common(top))
    return (
        f"ingest: every source record of the last {LOG_SECONDS:g} s was dead-lettered "
        f"({sum(rejected.values())} records; the statistics receive none); top reasons: "
        f"{reasons}"
    )


class _Batch:
    """One batch of source records on its way: the offsets to commit once the
    ``outstanding`` envelopes and dead letters are acknowledged."""

    __slots__ = ("ends", "failure", "outstanding")

    def __init__(self, ends: dict[tuple[str, int], int], outstanding: int) -> None:
        self.ends = ends
        self.outstanding = outstanding
        self.failure: KafkaError | None = None

    def delivered(self, error: KafkaError | None, _msg: object) -> None:
        self.outstanding -= 1
        if error is not None and self.failure is None:
            self.failure = error


def _ends(records: list[SourceRecord]) -> dict[tuple[str, int], int]:
    """Per source partition, the offset after the batch's last record."""
    return {(r.topic, r.partition): r.offset + 1 for r in records}


class Ingest:
    """One ingest: a consumer-group member over the source topics and a producer."""

    def __init__(self, cfg: PipelineConfig, bootstrap: str, reports: Any = None) -> None:
        """An ingest of ``cfg``'s sources; ``reports``: a queue (``put_nowait``) its
        ``IngestReport`` goes to every ``REPORT_SECONDS`` while it runs (None: none)."""
        self._cfg = cfg
        self._limits = limits_for(cfg)
        self._decode = source_decoder(cfg, self._limits)
        self._paused_until = 0.0  # the registry did not answer: no read before then
        self._pauses = 0  # consecutive pauses: the next one is longer
        self._wait = cfg.input.ingest_wait_ms / 1000
        self._consumer = Consumer(consumer_config(cfg, bootstrap))
        self._producer = Producer(producer_config(bootstrap, cfg))
        self._pending: deque[_Batch] = deque()  # sent, oldest first, not yet committed
        self._logged = self._reported = time.monotonic()
        self._reports = reports
        self._rebalanced = False  # a rebalance callback ran during the current read
        self._stop: Any = None  # run's stop event: a wait for acknowledgements ends with it
        self._consumer_errors = RateLimiter()
        self.records = 0  # source records read so far
        self.events = 0  # events sent to the events topic so far
        self.rejected: Counter[str] = Counter()  # dead letters so far, by reason
        # Per statistic: values clipped, rule failures on events others counted (exact).
        self.by_statistic: Counter[tuple[str, str]] = Counter()  # (statistic, what)
        self.assignments = 0  # partition assignments received so far
        self._interval_events = 0  # since the last progress line (LOG_SECONDS)
        self._interval_rejected: Counter[str] = Counter()

    def run(self, stop: Any, parent: int | None = None) -> bool:
        """Until ``stop`` is set (or the ``parent`` process is gone): consume, route, send,
        wait for the acknowledgements, commit. Returns whether it stopped cleanly: every
        envelope and dead letter acknowledged and its source offsets committed (``close``)."""
        self._stop = stop
        self._consumer.subscribe(
            self._cfg.input.topics, on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        try:
            while not stop.is_set() and (parent is None or os.getppid() == parent):
                self.step(timeout=0.5)
                now = time.monotonic()
                if now - self._logged > LOG_SECONDS:
                    self._log_progress()
                if self._reports is not None and now - self._reported >= REPORT_SECONDS:
                    self._report()
        except BaseException:
            self.close()
            raise
        return self.close()

    def _log_progress(self) -> None:
        self._logged = time.monotonic()
        lag = {f"{topic}[{partition}]": n for (topic, partition), n in self.lag().items()}
        log.info("ingest lag by source partition: %s", lag)
        if self.rejected:
            log.warning("dead-lettered records so far by reason: %s", dict(self.rejected))
        warning = all_dead_lettered(self._interval_events, self._interval_rejected)
        if warning:
            log.warning("%s", warning)
        self._interval_events, self._interval_rejected = 0, Counter()
        if self.by_statistic:
            # Exact counts of the users' values (docs/security.md, section 5): operators'.
            counts = {f"{what} (statistic {s})": n for (s, what), n in self.by_statistic.items()}
            log.info("per statistic so far: %s", dict(sorted(counts.items())))

    def report(self) -> IngestReport:
        """What this ingest has done so far, and its lag."""
        return IngestReport(
            self.records,
            self.events,
            dict(self.rejected),
            self.assignments,
            self.lag(),
            dict(self.by_statistic),
        )

    def _report(self) -> None:
        self._reported = time.monotonic()
        with contextlib.suppress(queue.Full):  # the worker is behind: the next one will do
            self._reports.put_nowait(self.report())

    def step(self, timeout: float) -> int:
        """Read a batch, route it and send it; commit every earlier batch the events
        topic has acknowledged. Returns how many source records the batch held."""
        wait = self._paused_until - time.monotonic()
        if wait > 0:
            self._settle(0)
            time.sleep(min(wait, timeout))
            return 0
        records = self._read(timeout)
        if not records:
            self._settle(0)
            return 0
        try:
            routed = route(records, self._limits, self._cfg.input.partitions, self._decode)
        except RegistryUnavailable as exc:
            self._pause(records, exc)
            return 0
        self._pauses = 0
        batch = _Batch(_ends(records), len(routed.envelopes) + len(routed.dead_letters))
        for partition, value in routed.envelopes:
            self._send(self._cfg.events_topic, value, partition, ENVELOPE_HEADERS, batch)
        for value in routed.dead_letters:
            self._send(self._cfg.outputs.dead_letter_topic, value, None, None, batch)
        self._pending.append(batch)
        # This batch's acknowledgements arrive while the next one is read and routed; the
        # one before must be complete first (at most two batches held).
        self._settle(1)
        self.records += len(records)
        self.events += routed.events
        self.rejected.update(routed.reasons)
        self._interval_events += routed.events
        self._interval_rejected.update(routed.reasons)
        self.by_statistic.update(routed.tally)
        return len(records)

    def _pause(self, records: list[SourceRecord], why: RegistryUnavailable) -> None:
        """The registry could not give a schema: send nothing of the batch, rewind to its
        first record of each source partition, and read it again after a backoff
        (docs/reliability.md, "Schema Registry outage"). The consumer keeps polling
        meanwhile (``step`` reads nothing until then), so it stays in its group."""
        first: dict[tuple[str, int], int] = {}
        for record in records:
            first.setdefault((record.topic, record.partition), record.offset)
        for (topic, partition), offset in first.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException:
                # Revoked meanwhile: its new owner starts at the last commit, which is at
                # or below this batch (nothing of it was sent or committed).
                continue
        self._pauses += 1
        backoff = min(PAUSE_MAX_SECONDS, PAUSE_SECONDS * 2 ** (self._pauses - 1))
        self._paused_until = time.monotonic() + backoff
        registry = self._cfg.input.schema_registry
        log.warning(
            "ingest paused for %.0f s, %d source records to read again: %s "
            "(input.schema_registry.url: %s)",
            backoff,
            len(records),
            why,
            registry.url if registry else None,
        )

    def _read(self, timeout: float) -> list[SourceRecord]:
        # poll waits for the first record; then the batch fills for at most
        # ``ingest_wait_ms``. consume(n, t) alone is not enough: since confluent-kafka
        # 2.13 it returns once some records came in one of its 200 ms slices.
        self._rebalanced = False
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        messages, size = [first], self._cfg.input.ingest_batch
        deadline = time.monotonic() + self._wait
        while len(messages) < size:
            left = deadline - time.monotonic()
            messages += self._consumer.consume(size - len(messages), max(left, 0.0))
            if left <= 0:
                break
        records = []
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                held = self._consumer_errors.admit(error.code())
                if held is not None:
                    note = self._consumer_errors.note(held)
                    log.warning("ingest consumer: %s%s", error.str(), note)
                continue
            # tuple.__new__: without the NamedTuple's Python-level __new__ (per record).
            records.append(
                tuple.__new__(
                    SourceRecord,
                    (msg.topic(), msg.partition(), msg.offset(), msg.headers(), msg.value()),
                )
            )
        return from_last_restart(records) if self._rebalanced else records

    def _send(
        self, topic: str, value: bytes, partition: int | None, headers, batch: _Batch
    ) -> None:
        kwargs: _Partition = {} if partition is None else {"partition": partition}
        while True:
            try:
                self._producer.produce(
                    topic, value, headers=headers, on_delivery=batch.delivered, **kwargs
                )
                return
            except BufferError:  # the producer's queue is full: let it drain
                self._producer.poll(0.1)

    def _settle(self, keep: int, deadline: float | None = None) -> bool:
        """Wait until at most ``keep`` batches are unacknowledged, and commit the source
        offsets of every batch acknowledged whole, oldest first: a commit of ``c`` says
        that every record below ``c`` is in the events or the dead-letter topic.

        Gives up (returns False, committing nothing more) once ``run``'s stop is set or
        ``deadline`` (``time.monotonic()``) has passed: with the broker gone, no
        acknowledgement comes (no message times out: ``producer_config``), and a stop
        must not wait for it. What was not committed is read again by the next ingest."""
        self._producer.poll(0)
        while self._pending:
            batch = self._pending[0]
            if batch.failure is not None:
                raise IngestFailed(f"the events topic refused a record: {batch.failure}")
            if batch.outstanding == 0:
                self._commit(self._pending.popleft().ends)
            elif len(self._pending) > keep:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if deadline is None and self._stop is not None and self._stop.is_set():
                    return False
                self._producer.poll(0.05)
            else:
                return True
        return True

    def _commit(self, ends: dict[tuple[str, int], int]) -> None:
        offsets = [TopicPartition(t, p, end) for (t, p), end in ends.items()]
        try:
            # Asynchronous: requests go out in order; a lost one is covered by the next.
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            # A rebalance took the partitions: their new owner starts at the last commit,
            # which is at or below what was sent, and stage 1 drops what it counted.
            log.warning("ingest: commit refused (%s); the next owner re-sends", exc)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Hand the partitions over with everything sent committed: fewer re-sends.
        self._rebalanced = True
        self._settle(0)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalanced = True
        self.assignments += 1
        log.info("ingest assigned %s", sorted(f"{p.topic}[{p.partition}]" for p in partitions))

    def lag(self) -> dict[tuple[str, int], int]:
        """Records behind the end of each assigned source partition, by (topic, partition)."""
        out = {}
        for tp in self._consumer.assignment():
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            position = self._consumer.position([tp])[0].offset
            if high >= 0 and position >= 0:
                out[(tp.topic, tp.partition)] = high - position
        return out

    def close(self, seconds: float = CLOSE_SECONDS) -> bool:
        """Wait up to ``seconds`` for the envelopes and dead letters under way, commit what
        they cover, and close the clients. Returns whether everything was acknowledged (a
        clean stop); with the broker gone it returns False after ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            settled = self._settle(0, deadline)
        except IngestFailed:
            settled = False
        self._consumer.close()
        unsent = self._producer.flush(max(0.0, deadline - time.monotonic()))
        if self._decode is not None:
            self._decode.close()
        if not settled or unsent:
            log.warning(
                "ingest: stopped with records the events topic has not acknowledged within "
                "%g s (is the broker reachable?); their source offsets are not committed, "
                "and the next ingest reads them again",
                seconds,
            )
        return settled and not unsent


def source_lag(cfg: PipelineConfig, bootstrap: str, timeout: float = 10.0) -> dict[str, dict]:
    """Per source partition: the ingest group's committed offset, the end, and the lag
    (what ``dpstream lag`` prints; a Kafka tool's ``--describe --group`` says the same)."""
    consumer = Consumer(consumer_config(cfg, bootstrap))
    try:
        out: dict[str, dict] = {}
        topics = consumer.list_topics(timeout=timeout).topics
        tps = [
            TopicPartition(t, p)
            for t in cfg.input.topics
            if t in topics
            for p in sorted(topics[t].partitions)
        ]
        for tp in consumer.committed(tps, timeout=timeout) if tps else []:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            at = tp.offset if tp.offset >= 0 else low
            out[f"{tp.topic}[{tp.partition}]"] = {
                "committed": tp.offset if tp.offset >= 0 else None,
                "end": high,
                "lag": high - at,
            }
        return out
    finally:
        consumer.close()


class IngestHandle:
    """The worker's ingest, in a thread or a child process, stopped with the worker; its
    reports (``latest_report``) come over a bounded queue."""

    def __init__(self, cfg: PipelineConfig, bootstrap: str, mode: str) -> None:
        self._clean = threading.Event()  # an ingest in a thread stopped cleanly
        if mode == "thread":
            self._stop: Any = threading.Event()
            self._reports: Any = queue.Queue(REPORTS_QUEUED)
            self._runner: Any = threading.Thread(
                target=run_ingest,
                args=(cfg, bootstrap, self._stop, None, self._reports, self._clean),
                name="ingest",
                daemon=True,
            )
        else:
            # spawn: the worker already runs librdkafka's threads, which fork would not copy.
            context = multiprocessing.get_context("spawn")
            self._stop = context.Event()
            self._reports = context.Queue(REPORTS_QUEUED)
            self._runner = context.Process(
                target=run_ingest,
                args=(cfg, bootstrap, self._stop, os.getpid(), self._reports),
                name="dpstream-ingest",
                daemon=True,
            )
        self._runner.start()

    def is_alive(self) -> bool:
        return self._runner.is_alive()

    def latest_report(self) -> IngestReport | None:
        """The newest report the ingest sent since the last call (None: none), without
        waiting; older ones are dropped (each report holds the totals)."""
        latest = None
        with contextlib.suppress(queue.Empty):
            while True:
                latest = self._reports.get_nowait()
        return latest

    @property
    def exitcode(self) -> int | None:
        """The ingest process's exit code once it ended (negative: the signal that ended
        it); None while it runs, or for an ingest in a thread."""
        if isinstance(self._runner, multiprocessing.process.BaseProcess):
            return self._runner.exitcode
        return None

    def request_stop(self) -> None:
        """Ask the ingest to stop (it finishes within ``CLOSE_SECONDS``); ``stop`` waits."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """A stop was asked for: the ingest is expected to end."""
        return bool(self._stop.is_set())

    def stop(self, timeout: float = CLOSE_SECONDS + 2.0) -> bool:
        """Stop the ingest and wait for it (a process still running after ``timeout`` is
        killed). Returns whether it stopped cleanly (``Ingest.close``)."""
        self._stop.set()
        self._runner.join(timeout)
        if isinstance(self._runner, multiprocessing.process.BaseProcess):
            if self.is_alive():
                self._runner.kill()
                return False
            return self._runner.exitcode == 0
        return not self.is_alive() and self._clean.is_set()


def run_ingest(
    cfg: PipelineConfig,
    bootstrap: str,
    stop: Any,
    parent: int | None = None,
    reports: Any = None,
    clean: threading.Event | None = None,
) -> bool:
    """An ingest until ``stop`` is set (or, in a child process, its worker is gone),
    reporting to ``reports`` (``Ingest``). Returns whether it stopped cleanly (and sets
    ``clean`` if so); a child process exits with status 1 when it did not."""
    if parent is not None:
        # A terminal's Ctrl-C reaches the whole process group, and so does a SIGTERM sent
        # to it (systemd's default); this process stops when its worker stops it
        # (``stop``: it finishes what it sent), or with the worker (``_die_with_parent``),
        # not halfway through a batch.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _die_with_parent()
        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] [ingest %(process)d] %(message)s"
        )
        if reports is not None:
            # Exit without waiting for the queue's feeder thread to hand over reports the
            # worker no longer reads.
            reports.cancel_join_thread()
    stopped_cleanly = Ingest(cfg, bootstrap, reports).run(stop, parent)
    if stopped_cleanly and clean is not None:
        clean.set()
    if parent is not None and not stopped_cleanly:
        sys.exit(1)
    return stopped_cleanly


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this process when its worker dies, however it dies, so a
    killed worker's ingest sends nothing more (elsewhere ``run`` notices within a batch)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
