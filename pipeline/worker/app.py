"""The Faust app: topics, tables, the two stage agents and the public clock.

Agents are thin: decode, load state from the table, call the stage logic of
``stages.py`` (which calls ``operators``), store the state, send what it returns.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TypedDict

import faust
import orjson

from dpstream.config.schema import PipelineConfig
from dpstream.statistics.contract import Report

from ..ingest.consumer import IngestHandle
from ..kafka.clients import read_range, tools_group
from ..kafka.security import faust_credentials
from ..stages.drivers import Refused, Stage1Driver, Stage2Driver
from ..stages.stage1_state import PartitionState, new_partition_state
from ..stages.stage2 import Stage2, StatisticChanged
from ..stages.stage2_state import Stage2State, StatisticRun
from ..wire.records import (
    ENVELOPE,
    HEADER,
    RELEASE,
    TICK,
    BadRecord,
    dead_letter,
    encode_tick,
    header_kind,
)
from . import faust_compat
from .changelog import WINDOW_BYTES, BatchedTable
from .exits import exit_now
from .keys import PipelineKey
from .ledger import signed

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


def stop_if_ingest_ended(ingest: IngestHandle) -> None:
    """End the worker (:func:`exit_now`) once its ingest has ended: the worker would go on
    releasing ticks while no event reaches the events topic. A restarted worker starts a
    new ingest, which re-sends from the source offsets the old one committed."""
    if ingest.is_alive():
        return
    how = "its thread ended" if ingest.exitcode is None else f"exit code {ingest.exitcode}"
    log.critical("the ingest stopped (%s); stopping the worker", how)
    exit_now()


def faust_timestamp(timestamp_ms: int) -> float:
    """A Kafka timestamp as Faust's ``send(timestamp=...)`` takes it: in seconds, which it
    turns into ``int(timestamp * 1000)``; half a millisecond more keeps that exact."""
    return (timestamp_ms + 0.5) / 1000


def broker_urls(bootstrap: str, scheme: str = "kafka") -> list[str]:
    return [f"{scheme}://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


class _Codecs(TypedDict):
    """The keyword arguments of ``App.topic`` that name a topic's key and value codecs."""

    key_serializer: str
    value_serializer: str


def create_app(
    cfg: PipelineConfig,
    bootstrap: str,
    key: PipelineKey,
    datadir: Path,
    ingest: IngestHandle | None = None,
    runs: Mapping[str, StatisticRun] | None = None,
    replicas: int = 1,
) -> faust.App:
    """Build the worker's Faust app for one pipeline definition: ``key`` draws the noise
    and signs the ledger entries, ``runs`` are the statistics' runs the ledger states
    (``ledger.record_statement``), ``ingest`` is the worker's own ingest, watched: the
    worker stops when it does; ``replicas`` is the replication factor of topics Faust
    would create (``topics.replication``; ``ensure_topics`` created them all)."""
    partitions = cfg.input.partitions
    # Faust's internals we depend on: versions checked, our transport (faust_compat).
    faust_compat.install()
    app = faust.App(
        cfg.app_id,
        broker=broker_urls(bootstrap, faust_compat.SCHEME),
        store="memory://",
        datadir=str(datadir),
        web_enabled=False,
        topic_partitions=partitions,
        topic_replication_factor=replicas,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        producer_linger_ms=5,
        # A stage-1 changelog window goes out as one record batch (changelog.py).
        producer_max_batch_size=WINDOW_BYTES + 64 * 1024,
        worker_redirect_stdouts=False,
        # SASL/TLS from the config's kafka: section (None: PLAINTEXT).
        broker_credentials=faust_credentials(cfg.kafka),
    )
    raw: _Codecs = {"key_serializer": "raw", "value_serializer": "raw"}
    events_topic = app.topic(cfg.events_topic, partitions=partitions, **raw)
    stage2_topic = app.topic(cfg.stage2_topic, partitions=partitions, **raw)
    release_topics = {
        s.name: app.topic(cfg.release_topic(s.name), partitions=1, **raw) for s in cfg.statistics
    }
    dead_letter_topic = app.topic(cfg.outputs.dead_letter_topic, partitions=1, **raw)
    ledger_topic = app.topic(cfg.outputs.ledger_topic, partitions=1, **raw)

    # Stage-1 state in ONE table: user entries ("u:<user>") and the partition's tick state
    # ("p:<partition>"), both written to the changelog partition of the record being
    # processed, in batches (changelog.py says why a crash still loses only what the
    # per-record idempotence of Stage1.add_events repairs).
    stage1_table = BatchedTable(app, app.Table("stage1", partitions=partitions, key_type=str))
    stage1_table.install()
    stage2_state = app.Table("stage2", partitions=partitions, key_type=str)
    # Faust's recovery of these tables waits for the changelogs without a time limit.
    faust_compat.watch_recovery(app)

    driver1 = Stage1Driver(cfg)
    driver2 = Stage2Driver(cfg, key.noise, partitions, runs)
    rejected: Counter[str] = Counter()

    async def reject(
        reason: str,
        partition: int,
        offset: int,
        value: bytes | None,
        index: int | None = None,
        topic: str = cfg.events_topic,
    ) -> Awaitable:
        rejected[reason] += 1
        return await dead_letter_topic.send(
            value=dead_letter(reason, topic, partition, offset, value, index)
        )

    async def refuse(refused: Refused) -> Awaitable:
        # An event stage 1's own rules refused: named by its source position, as the
        # ingest's dead letters are, with the event itself (it can be sent again).
        rejected[refused.reason] += 1
        return await dead_letter_topic.send(value=refused.dead_letter())

    async def acknowledged(sent: list[Awaitable]) -> None:
        # Faust's send() only enqueues. State that says "sent" (a closed tick, a record
        # applied) is written after the broker has acknowledged every output, so a crash in
        # between re-sends them (identical, keyed noise) instead of losing them.
        for future in sent:
            await future

    tools = tools_group(cfg)

    async def read_hole(topic: str, partition: int, start: int, end: int) -> list:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, read_range, bootstrap, topic, partition, start, end, cfg.kafka, 30.0, tools
            )
        except Exception as exc:
            # Going on would lose the hole for good (Faust counts it as processed): stop
            # (crash_only); a restarted worker finds the same hole and reads it again.
            log.error(
                "could not read %s[%s] %s-%s: %r; stopping", topic, partition, start, end, exc
            )
            raise HoleUnread(f"{topic}[{partition}] {start}-{end - 1}") from exc

    async def fill_gap(partition: int, start: int, end: int) -> None:
        # Faust can hand the agent a partition's records with a hole in them around a
        # rebalance (docs/reliability.md); a record never processed would be a user's
        # contribution silently lost. Read the hole directly and process it first.
        log.warning(
            "partition %s: the consumer skipped offsets %s-%s; reading them directly",
            partition,
            start,
            end - 1,
        )
        missing = await read_hole(cfg.events_topic, partition, start, end)
        for at, headers, value, timestamp_ms in missing:
            await handle_input(partition, at, value, headers, timestamp_ms, in_gap=True)

    async def handle_input(
        partition: int,
        offset: int,
        value: bytes | None,
        headers,
        timestamp_ms: int | None,
        in_gap: bool = False,
    ) -> None:
        pkey = f"p:{partition}"
        pstate: PartitionState = stage1_table.get(pkey) or new_partition_state()
        hole = None if in_gap else driver1.skipped(pstate, offset)
        if hole is not None:
            await fill_gap(partition, *hole)
            pstate = stage1_table.get(pkey)
        entries = stage1_table.for_partition(partition)
        users = stage1_table.for_partition(partition, "u:")
        sent: list[Awaitable] = []
        refused: list[Refused] = []
        kind = header_kind(headers)
        if kind == TICK:
            if driver1.is_redelivered(pstate, offset):
                return  # its reports went out before
            # What the records before the marker did is in the changelog before the
            # tick's reports leave (export and inspection see a consistent state).
            await stage1_table.flush(delivered=True)
            reports, rejected = driver1.on_marker(pstate, users, partition, value, timestamp_ms)
            for report in reports:
                sent.append(
                    await stage2_topic.send(
                        key=report.statistic.encode(), value=orjson.dumps(report.to_json())
                    )
                )
        elif kind == ENVELOPE:
            if stage1_table.full:
                await stage1_table.flush()
                pstate = stage1_table.get(pkey) or pstate
            rejected, refused = driver1.on_envelope(pstate, users, partition, offset, value)
        else:  # only the ingest and the clock write this topic
            fresh = not driver1.is_redelivered(pstate, offset)
            rejected = [(None, "not a dpstream envelope or tick marker")] if fresh else []
        for index, reason in rejected:
            sent.append(await reject(reason, partition, offset, value, index))
        for event in refused:
            sent.append(await refuse(event))
        await acknowledged(sent)
        driver1.done(pstate, offset)
        entries[pkey] = pstate

    async def on_input(event: faust.EventT) -> None:
        msg = event.message
        stamp = int(msg.timestamp * 1000) if msg.timestamp else None
        await handle_input(msg.partition, msg.offset, event.value, msg.headers, stamp)

    @app.agent(events_topic, name="stage1")
    async def stage1_agent(stream: faust.StreamT) -> None:
        await crash_only("stage 1", stream, on_input)

    def stored_stage2_state(statistic: str) -> Stage2State | None:
        stored = stage2_state.get(statistic)
        return None if stored is None else Stage2State.from_json(stored)

    async def handle_stage2(
        partition: int,
        offset: int,
        value: bytes,
        headers,
        timestamp_ms: int | None,
        in_gap: bool = False,
    ) -> None:
        # The stage-2 topic holds stage 1's reports and the clock's release markers.
        if header_kind(headers) == RELEASE:
            await handle_release(partition, offset, value, timestamp_ms)
        else:
            await handle_report(partition, offset, value, in_gap)

    async def handle_report(
        partition: int, offset: int, value: bytes, in_gap: bool = False
    ) -> None:
        report = Report.from_json(orjson.loads(value))
        if not driver2.configured(report):
            return  # a statistic removed from the configuration: skipped, never stored
        state = stored_stage2_state(report.statistic) or Stage2.new_state()
        start = None if in_gap else driver2.missing_reports(state, report)
        if start is not None:
            # A report of this statistic and stage-1 partition went missing: the same
            # consumer holes as in stage 1 (fill_gap). Read the stage-2 partition since
            # this statistic's last report and process what is there first.
            log.warning(
                "stage 2, %s: reports after tick %s missing; reading stage-2 partition %s "
                "offsets %s-%s directly",
                report.statistic,
                state.reported[report.partition],
                partition,
                start,
                offset - 1,
            )
            missing = await read_hole(cfg.stage2_topic, partition, start, offset)
            for at, headers, earlier, timestamp_ms in missing:
                await handle_stage2(partition, at, earlier, headers, timestamp_ms, in_gap=True)
            state = stored_stage2_state(report.statistic) or state
        try:
            # Closes what every partition has reported; its outputs wait in the state
            # for their release marker.
            driver2.on_report(state, report, offset)
        except StatisticChanged as exc:
            # Going on would draw new noise for nodes the old parameters released.
            log.error("%s; stopping", exc)
            raise  # crash_only stops the worker
        stage2_state[report.statistic] = state.to_json()

    async def handle_release(
        partition: int, offset: int, value: bytes, timestamp_ms: int | None
    ) -> None:
        # The release marker of tick t, written by the clock at t's deadline: publish
        # what this partition's statistics closed up to t, stamped with that deadline,
        # so that when a release leaves and its timestamp depend on the clock only.
        try:
            tick = driver2.release_tick(value, timestamp_ms)
        except BadRecord as exc:
            where = cfg.stage2_topic
            await acknowledged([await reject(exc.reason, partition, offset, value, None, where)])
            return
        stamp = faust_timestamp(driver2.deadline_ms(tick))
        for name in driver2.statistics_of(partition):
            state = stored_stage2_state(name)
            if state is None:
                continue
            releases, ledger = driver2.on_release(state, tick)
            if not (releases or ledger):
                continue
            name_key, topic = name.encode(), release_topics[name]
            sent = [
                await ledger_topic.send(
                    key=name_key, value=orjson.dumps(signed(e, cfg, key)), timestamp=stamp
                )
                for e in ledger
            ]
            for release in releases:
                value = orjson.dumps(release)
                sent.append(await topic.send(key=name_key, value=value, timestamp=stamp))
            await acknowledged(sent)
            stage2_state[name] = state.to_json()

    async def on_stage2(event: faust.EventT) -> None:
        msg = event.message
        stamp = int(msg.timestamp * 1000) if msg.timestamp else None
        await handle_stage2(msg.partition, msg.offset, event.value, msg.headers, stamp)

    @app.agent(stage2_topic, name="stage2")
    async def stage2_agent(stream: faust.StreamT) -> None:
        await crash_only("stage 2", stream, on_stage2)

    interval, delay = cfg.ticks.interval_seconds, cfg.ticks.release_delay
    clock: dict[bytes, int | None] = {TICK: None, RELEASE: None}

    async def write_markers(topic: faust.TopicT, kind: bytes, upto: int) -> None:
        # Every partition gets each marker; a new leader starts at the current one (a
        # release marker publishes every tick closed before it, so none is lost).
        last = clock[kind]
        for tick in range(upto if last is None else last + 1, upto + 1):
            for partition in range(partitions):
                await topic.send(
                    value=encode_tick(tick), partition=partition, headers=[(HEADER, kind)]
                )
            clock[kind] = tick

    @app.timer(cfg.ticks.marker_period_seconds, on_leader=True)
    async def public_clock() -> None:
        now = time.time()
        # Tick n covers [n*I, (n+1)*I) of Unix time: boundaries depend on the clock only;
        # its release deadline (n+1)*I + delay too.
        await write_markers(events_topic, TICK, math.floor(now / interval) - 1)
        await write_markers(stage2_topic, RELEASE, math.floor((now - delay) / interval) - 1)

    @app.timer(1.0)
    async def watch_ingest() -> None:
        if ingest is not None:
            stop_if_ingest_ended(ingest)

    @app.timer(10.0)
    async def report_rejections() -> None:
        if rejected:
            log.warning("dead-lettered records so far by reason: %s", dict(rejected))

    return app
