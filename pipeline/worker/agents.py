"""The worker's two Faust agents, thin: each hands every record of its topic, whole, to its
stage's driver (``stages.drivers``: the same code replay runs), reads the records the
consumer skipped when the driver asks for them, sends what the driver returns, waits for
the broker's acknowledgements, and only then stores the state.

Faust's ``send()`` only enqueues. State that says "sent" (a closed tick, a record applied)
is written after the broker has acknowledged every output, so a crash in between re-sends
them (identical: keyed noise) instead of losing them. An exception is a bug: it stops the
worker at once (``crash_only``), and a restarted worker reads the record again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import faust
import orjson

from dpstream.config.kafka import KafkaSecurityConfig
from dpstream.config.schema import PipelineConfig

from ..kafka.clients import read_range
from ..stages.drivers import InputRecord, Stage1Driver, Stage2Driver
from ..stages.stage1_state import PartitionEntry, new_partition_state
from ..stages.stage2 import StatisticChanged
from ..stages.stage2_state import Stage2State
from .changelog import BatchedTable
from .exits import exit_now
from .keys import PipelineKey
from .ledger import signed
from .metrics import WorkerMetrics
from .release_values import Encode

log = logging.getLogger(__name__)


class HoleUnread(RuntimeError):
    """Records the consumer skipped could not be read directly (the worker stops)."""


async def crash_only(
    agent: str, stream: faust.StreamT, handle: Callable[[faust.EventT], Awaitable[None]]
) -> None:
    """``handle`` each event of ``stream``; an exception ends the worker (:func:`exit_now`).

    Bad input never raises here (the drivers dead-letter it), so an exception is a bug,
    and the record may be half applied in memory. Faust's default would log it, restart
    the agent and commit past the record (docs/reliability.md). A restarted worker
    recovers from the changelogs and reads the record again, as after any SIGKILL.
    """
    failed: faust.EventT | None = None
    try:
        async for event in stream.events():
            failed = event
            await handle(event)
            failed = None
    except Exception as exc:  # not a CancelledError: a stop or a rebalance goes on
        if not isinstance(exc, (HoleUnread, StatisticChanged)):  # those logged why
            where = "outside a record"
            if failed is not None:
                msg = failed.message
                where = f"on {msg.topic}[{msg.partition}] offset {msg.offset}"
            log.critical(
                "%s: internal error %s: %r; stopping the worker (a restarted worker "
                "reads the record again)",
                agent,
                where,
                exc,
                exc_info=exc,
            )
        exit_now()


def input_record(event: faust.EventT) -> InputRecord:
    """A Faust event as its stage's driver takes it."""
    msg = event.message
    stamp = int(msg.timestamp * 1000) if msg.timestamp else None
    headers = msg.headers
    if isinstance(headers, Mapping):  # Faust hands over a list; its type allows a mapping
        headers = list(headers.items())
    return InputRecord(msg.partition, msg.offset, headers, event.value, stamp)


def faust_timestamp(timestamp_ms: int) -> float:
    """A Kafka timestamp as Faust's ``send(timestamp=...)`` takes it: in seconds, which it
    turns into ``int(timestamp * 1000)``; half a millisecond more keeps that exact."""
    return (timestamp_ms + 0.5) / 1000


async def acknowledged(sent: list[Awaitable]) -> None:
    """Wait until the broker has acknowledged every send of ``sent``."""
    for future in sent:
        await future


@dataclass(frozen=True)
class Topics:
    """The worker's topics: its input and stage-2 topics, and where it publishes."""

    events: faust.TopicT
    stage2: faust.TopicT
    releases: dict[str, faust.TopicT]
    dead_letters: faust.TopicT
    ledger: faust.TopicT

    @classmethod
    def of(cls, app: faust.App, cfg: PipelineConfig) -> Topics:
        partitions = cfg.input.partitions
        raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
        return cls(
            app.topic(cfg.events_topic, partitions=partitions, **raw),
            app.topic(cfg.stage2_topic, partitions=partitions, **raw),
            {
                s.name: app.topic(cfg.release_topic(s.name), partitions=1, **raw)
                for s in cfg.statistics
            },
            app.topic(cfg.outputs.dead_letter_topic, partitions=1, **raw),
            app.topic(cfg.outputs.ledger_topic, partitions=1, **raw),
        )


class HoleReader:
    """Reads the records of a partition the consumer skipped (Faust can hand an agent a
    partition's records with a hole in them around a rebalance, docs/reliability.md): a
    record never processed would be a user's contribution silently lost."""

    def __init__(self, bootstrap: str, security: KafkaSecurityConfig, group: str) -> None:
        self._bootstrap = bootstrap
        self._security = security
        self._group = group  # the pipeline's tools' group (its ACLs cover it)

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[InputRecord]:
        log.warning(
            "%s[%s]: the consumer skipped offsets %s-%s; reading them directly",
            topic,
            partition,
            start,
            end - 1,
        )
        try:
            found = await asyncio.get_running_loop().run_in_executor(
                None,
                read_range,
                self._bootstrap,
                topic,
                partition,
                start,
                end,
                self._security,
                30.0,
                self._group,
            )
        except Exception as exc:
            # Going on would lose the hole for good (Faust counts it as processed): stop
            # (crash_only); a restarted worker finds the same hole and reads it again.
            log.error(
                "could not read %s[%s] %s-%s: %r; stopping", topic, partition, start, end, exc
            )
            raise HoleUnread(f"{topic}[{partition}] {start}-{end - 1}") from exc
        return [InputRecord(partition, at, headers, value, ts) for at, headers, value, ts in found]


class DeadLetters:
    """Sends dead letters and counts them by reason (logged every 10 s)."""

    def __init__(self, topic: faust.TopicT) -> None:
        self._topic = topic
        self.by_reason: Counter[str] = Counter()

    async def send(self, letters: list[bytes], reasons: list[str]) -> list[Awaitable]:
        self.by_reason.update(reasons)
        return [await self._topic.send(value=letter) for letter in letters]


class Stage1Agent:
    """Stage 1 over the events topic, one record at a time (``Stage1Driver.handle``): its
    partition state and user entries in ONE table, written to the changelog partition of
    the record being processed, in windows (``changelog.py`` says why a crash still loses
    only what the per-record idempotence of ``Stage1.add_events`` repairs). What each
    record did goes to the metrics once it is stored."""

    def __init__(
        self,
        driver: Stage1Driver,
        table: BatchedTable,
        topics: Topics,
        holes: HoleReader,
        dead: DeadLetters,
        metrics: WorkerMetrics,
    ) -> None:
        self._driver = driver
        self._table = table
        self._topics = topics
        self._holes = holes
        self._dead = dead
        self._metrics = metrics

    async def on_event(self, event: faust.EventT) -> None:
        await self.handle(input_record(event))

    def _partition_state(self, partition: int) -> PartitionEntry:
        state: PartitionEntry = self._table.get(f"p:{partition}") or new_partition_state()
        return state

    async def handle(self, record: InputRecord, in_gap: bool = False) -> None:
        if self._table.full:  # at most one sealed window waits (changelog.py)
            await self._table.flush()
        partition = record.partition
        pstate = self._partition_state(partition)
        users = self._table.for_partition(partition, "u:")
        outcome = self._driver.handle(pstate, users, record, in_gap)
        if outcome.hole is not None:
            for missing in await self._holes.read(
                self._topics.events.get_topic_name(), partition, *outcome.hole
            ):
                await self.handle(missing, in_gap=True)
            pstate = self._partition_state(partition)
            outcome = self._driver.handle(pstate, users, record, in_gap=True)
        sent: list[Awaitable] = []
        if outcome.reports:
            # What the records before the marker did is in the changelog before the tick's
            # reports leave (export and inspection see a consistent state).
            await self._table.flush(delivered=True)
        for report in outcome.reports:
            value = orjson.dumps(report.to_json())
            sent.append(await self._topics.stage2.send(key=report.statistic.encode(), value=value))
        sent += await self._dead.send(outcome.dead_letters, outcome.reasons)
        await acknowledged(sent)
        self._driver.done(pstate, record.offset)
        self._table.for_partition(partition)[f"p:{partition}"] = pstate
        closed = pstate["last_tick"] if outcome.reports else None
        self._metrics.stage1_record(partition, outcome, closed)


class Stage2Agent:
    """Stage 2 over the stage-2 topic, one record at a time (``Stage2Driver.handle``): each
    statistic's state in the ``stage2`` table (its JSON), the ledger entries signed with
    the pipeline's key, releases in ``outputs.format`` (``encoders``, by statistic), releases
    and ledger entries stamped with their deadline. What each
    record did goes to the metrics once it is stored."""

    def __init__(
        self,
        cfg: PipelineConfig,
        key: PipelineKey,
        driver: Stage2Driver,
        table: Any,
        topics: Topics,
        holes: HoleReader,
        dead: DeadLetters,
        metrics: WorkerMetrics,
        encoders: Mapping[str, Encode],
    ) -> None:
        self._cfg = cfg
        self._key = key
        self._encoders = encoders
        self._driver = driver
        self._table = table
        self._topics = topics
        self._holes = holes
        self._dead = dead
        self._metrics = metrics

    async def on_event(self, event: faust.EventT) -> None:
        await self.handle(input_record(event))

    def _state_of(self, statistic: str) -> Stage2State | None:
        stored = self._table.get(statistic)
        return None if stored is None else Stage2State.from_json(stored)

    async def handle(self, record: InputRecord, in_gap: bool = False) -> None:
        try:
            outcome = self._driver.handle(record, self._state_of, in_gap)
            if outcome.hole_from is not None:
                # A report of this statistic and stage-1 partition went missing: read the
                # stage-2 partition since the oldest last report and handle it first.
                name = self._topics.stage2.get_topic_name()
                for missing in await self._holes.read(
                    name, record.partition, outcome.hole_from, record.offset
                ):
                    await self.handle(missing, in_gap=True)
                outcome = self._driver.handle(record, self._state_of, in_gap=True)
        except StatisticChanged as exc:
            # Going on would draw new noise for nodes it has released.
            log.error("%s; stopping", exc)
            raise  # crash_only stops the worker
        stamp = None if outcome.timestamp_ms is None else faust_timestamp(outcome.timestamp_ms)
        sent: list[Awaitable] = []
        for name, entry in outcome.ledger:
            value = orjson.dumps(signed(entry, self._cfg, self._key))
            sent.append(
                await self._topics.ledger.send(key=name.encode(), value=value, timestamp=stamp)
            )
        for name, release in outcome.releases:
            releases = self._topics.releases[name]
            value = self._encoders[name](release)
            sent.append(await releases.send(key=name.encode(), value=value, timestamp=stamp))
        sent += await self._dead.send(outcome.dead_letters, outcome.reasons)
        await acknowledged(sent)
        acknowledged_at = time.time()
        for name, state in outcome.states.items():
            self._table[name] = state.to_json()
        self._metrics.stage2_record(outcome, acknowledged_at)
