"""The operations endpoint (pipeline/worker/operations.py) without a worker: its port, and
the heartbeat's work on Faust's own (unstarted) App with a fake clock and ingest. The
endpoint on a running worker: tests/integration/test_operations.py."""

from __future__ import annotations

import asyncio
import socket

import faust
import pytest
from faust.types import TP

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.pipeline.ingest.consumer import IngestReport
from dpstream.pipeline.stages.drivers import Stage1Outcome, Stage2Outcome
from dpstream.pipeline.worker.health import LIVENESS_STALL_SECONDS
from dpstream.pipeline.worker.metrics import WorkerMetrics
from dpstream.pipeline.worker.operations import Operations, bind


def test_a_port_already_taken_names_the_config_field():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=r"metrics\.port: .*127\.0\.0\.1:\d+"):
            bind("127.0.0.1", port)


def test_bind_takes_a_free_port_without_serving_yet():
    server = bind("127.0.0.1", 0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1" and port > 0
    finally:
        server.server_close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class FakeIngest:
    def __init__(self) -> None:
        self.alive = True
        self.reports: list[IngestReport] = []

    def is_alive(self) -> bool:
        return self.alive

    def latest_report(self) -> IngestReport | None:
        return self.reports.pop() if self.reports else None


CFG = parse_config(
    {
        "input": {"partitions": 1},
        "ticks": {"interval_seconds": 10},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 1.0},
        "statistics": [{"name": "count", "epsilon": 1.0, "tau": 2}],
    }
)


def test_the_heartbeat_feeds_the_probes_and_the_metrics():
    app = faust.App("operations-test", broker="kafka://127.0.0.1:9", store="memory://")
    clock, ingest, metrics = FakeClock(), FakeIngest(), WorkerMetrics(CFG)
    operations = Operations(CFG, app, metrics, ingest, clock)  # type: ignore[arg-type]
    operations.observe()
    status, body = operations.readyz()
    assert status == 503 and not body["conditions"]["partitions_assigned"]
    assert not body["conditions"]["tables_recovered"]  # no assignment yet
    asyncio.run(app.on_partitions_assigned.send({TP(CFG.events_topic, 0), TP(CFG.stage2_topic, 0)}))
    metrics.stage1_record(0, Stage1Outcome(), closed=98)  # tick 99 ended at 1,000
    metrics.stage2_record(Stage2Outcome(published={"count": 97}), 1_000.0)
    ingest.reports.append(IngestReport(5, 4, {}, 1, {("src", 0): 2}))
    operations.observe()
    status, body = operations.readyz()
    assert (status, body["ready"]) == (200, True), body
    events = metrics.registry.get_sample_value("dpstream_events_in_total", {"stage": "ingest"})
    assert events == 4
    # The ingest ends: not ready; the loop stops turning: not live either.
    ingest.alive = False
    operations.observe()
    assert operations.readyz()[1]["conditions"]["ingest_running"] is False
    clock.now += LIVENESS_STALL_SECONDS + 1
    status, body = operations.livez()
    assert status == 503 and body["event_loop_heartbeat_age_seconds"] == LIVENESS_STALL_SECONDS + 1
    # A scrape says the same, in the Prometheus text format.
    text, content_type = operations.scrape("")
    assert content_type.startswith("text/plain")
    assert b"dpstream_ready 0.0" in text and b'dpstream_events_in_total{stage="ingest"} 4.0' in text


def test_each_table_recovery_is_timed_once():
    app = faust.App("recovery-timing", broker="kafka://127.0.0.1:9", store="memory://")
    metrics = WorkerMetrics(CFG)
    operations = Operations(CFG, app, metrics, None, FakeClock())  # type: ignore[arg-type]
    recovery = app.tables.recovery
    for _ in range(2):  # two recoveries, each seen by several heartbeats
        recovery._set_recovery_started()
        operations.observe()
        recovery._set_recovery_ended()
        operations.observe()
        operations.observe()
    assert metrics.registry.get_sample_value("dpstream_table_recovery_seconds_count") == 2
