"""The Faust app: its settings, topics and tables, the two stage agents (``agents.py``),
the public clock (``clock.py``) and the watches."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import faust

from dpstream.config.schema import PipelineConfig

from ..ingest.consumer import IngestHandle
from ..kafka.clients import tools_group
from ..kafka.security import faust_credentials
from ..stages.drivers import Stage1Driver, Stage2Driver
from ..stages.stage2_state import StatisticRun
from . import faust_compat
from .agents import DeadLetters, HoleReader, Stage1Agent, Stage2Agent, Topics, crash_only
from .changelog import WINDOW_BYTES, BatchedTable
from .clock import PublicClock
from .exits import exit_now
from .keys import PipelineKey
from .metrics import WorkerMetrics
from .release_values import Encode, release_encoders

log = logging.getLogger(__name__)


def stop_if_ingest_ended(ingest: IngestHandle) -> None:
    """End the worker (:func:`exit_now`) once its ingest has ended: the worker would go on
    releasing ticks while no event reaches the events topic. A restarted worker starts a
    new ingest, which re-sends from the source offsets the old one committed. An ingest
    asked to stop (the worker is stopping: ``lifecycle.Worker``) is expected to end."""
    if ingest.is_alive() or ingest.stopping:
        return
    how = "its thread ended" if ingest.exitcode is None else f"exit code {ingest.exitcode}"
    log.critical("the ingest stopped (%s); stopping the worker", how)
    exit_now()


def broker_urls(bootstrap: str, scheme: str = "kafka") -> list[str]:
    return [f"{scheme}://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def create_app(
    cfg: PipelineConfig,
    bootstrap: str,
    key: PipelineKey,
    datadir: Path,
    ingest: IngestHandle | None = None,
    runs: Mapping[str, StatisticRun] | None = None,
    replicas: int = 1,
    metrics: WorkerMetrics | None = None,
    encoders: Mapping[str, Encode] | None = None,
) -> faust.App:
    """Build the worker's Faust app for one pipeline definition: ``key`` draws the noise
    and signs the ledger entries, ``runs`` are the statistics' runs the ledger states
    (``ledger.record_statement``), ``ingest`` is the worker's own ingest, watched: the
    worker stops when it does (unless it was asked to stop); ``replicas`` is the
    replication factor of topics Faust would create (``topics.replication``;
    ``ensure_topics`` created them all); the agents record into ``metrics`` (None:
    metrics of their own, which nothing serves); releases are written by ``encoders``
    (``release_values.release_encoders``; None: made here)."""
    # Faust's internals we depend on: versions checked, our transport (faust_compat).
    faust_compat.install()
    app = faust_app(cfg, bootstrap, datadir, replicas)
    topics = Topics.of(app, cfg)
    partitions = cfg.input.partitions
    metrics = metrics or WorkerMetrics(cfg)
    stage1_table = BatchedTable(
        app,
        app.Table("stage1", partitions=partitions, key_type=str),
        written=lambda records: metrics.changelog_written("stage1", records),
    )
    stage1_table.install()
    stage2_table = app.Table("stage2", partitions=partitions, key_type=str)
    # Faust's recovery of these tables waits for the changelogs without a time limit.
    faust_compat.watch_recovery(app)
    holes = HoleReader(bootstrap, cfg.kafka, tools_group(cfg))
    dead = DeadLetters(topics.dead_letters)
    stage1 = Stage1Agent(Stage1Driver(cfg), stage1_table, topics, holes, dead, metrics)
    driver2 = Stage2Driver(cfg, key.noise, partitions, runs)
    encoders = encoders or release_encoders(cfg)  # Avro: schemas registered before releases
    stage2 = Stage2Agent(cfg, key, driver2, stage2_table, topics, holes, dead, metrics, encoders)

    @app.agent(topics.events, name="stage1")
    async def stage1_agent(stream: faust.StreamT) -> None:
        await crash_only("stage 1", stream, stage1.on_event)

    @app.agent(topics.stage2, name="stage2")
    async def stage2_agent(stream: faust.StreamT) -> None:
        await crash_only("stage 2", stream, stage2.on_event)

    clock = PublicClock(cfg, topics.events, topics.stage2)
    app.timer(cfg.ticks.marker_period_seconds, on_leader=True)(clock.tick)
    _watch(app, ingest, dead)
    return app


def faust_app(cfg: PipelineConfig, bootstrap: str, datadir: Path, replicas: int = 1) -> faust.App:
    """The Faust app's settings: memory stores with changelogs, raw codecs, no web server,
    the config's Kafka security, ``replicas`` for what Faust would create."""
    return faust.App(
        cfg.app_id,
        broker=broker_urls(bootstrap, faust_compat.SCHEME),
        store="memory://",
        datadir=str(datadir),
        web_enabled=False,
        topic_partitions=cfg.input.partitions,
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


def _watch(app: faust.App, ingest: IngestHandle | None, dead: DeadLetters) -> None:
    """The worker's watches: its ingest (the worker stops when it does) every second, the
    dead letters so far every 10 s."""

    @app.timer(1.0)
    async def watch_ingest() -> None:
        if ingest is not None:
            stop_if_ingest_ended(ingest)

    @app.timer(10.0)
    async def report_rejections() -> None:
        if dead.by_reason:
            log.warning("dead-lettered records so far by reason: %s", dict(dead.by_reason))
