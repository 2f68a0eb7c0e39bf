"""The worker's operations endpoint on a real broker (docs/operations.md): what /metrics
says against what the test did and what the topics hold, and /livez and /readyz on a
running worker, during a table recovery and with the broker stopped.

The tests share one broker of their own (module scope), which the last one stops and
starts again under a running worker."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.deploy.broker import LocalKafka
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.worker.processes import spawn_worker, stop_worker
from dpstream.testing import unique_names
from tests.integration.support import WorkerProcess, readers, wait_until

pytestmark = pytest.mark.integration

TICK = 0.5
VALID = 20_000  # events
USERS = 10_000  # a changelog a restarted worker takes a while to recover
MALFORMED = 3  # source records that are not JSON
UNKNOWN_KEY = 2  # events with a key no statistic counts

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Broker:
    """The module's broker, which a test may stop and start again on its data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.kafka = LocalKafka.start(data_dir=data_dir)

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    def restart(self) -> None:
        before = self.kafka.bootstrap
        self.kafka = LocalKafka.start(data_dir=self.data_dir)
        assert self.kafka.bootstrap == before  # the same ports, from its properties


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("kafka"))
    try:
        yield broker
    finally:
        broker.kafka.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config() -> dict:
    return unique_names(
        {
            "input": {"partitions": 2},
            "ticks": {"interval_seconds": TICK},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 4.0},
            "statistics": [
                {"name": "views", "epsilon": 1.0, "tau": 5, "key": "view"},
                {"name": "clicks", "epsilon": 0.5, "tau": 2, "key": "click"},
            ],
        }
    )


@pytest.fixture
def started() -> Iterator[list[WorkerProcess]]:
    """The workers a test starts, killed at its end whatever happened (a worker may wait
    long for a broker that is gone)."""
    workers: list[WorkerProcess] = []
    try:
        yield workers
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()


def start_worker(
    started: list[WorkerProcess], bootstrap: str, data: dict, tmp_path: Path, port: int
) -> WorkerProcess:
    """A ``dpstream worker`` of ``data`` serving its metrics and probes on ``port``."""
    cfg = parse_config(data)
    config_path = tmp_path / f"{cfg.app_id}.yaml"
    config_path.write_text(yaml.safe_dump(data))
    log_path = tmp_path / f"{cfg.app_id}-{time.monotonic_ns()}.log"
    command = ("worker", "--metrics-port", str(port))
    proc = spawn_worker(config_path, bootstrap, log_path, command=command)
    started.append(WorkerProcess(cfg, config_path, log_path, proc))
    return started[-1]


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""  # not serving (yet)


def probe(port: int, path: str) -> tuple[int, dict]:
    status, body = get(port, path)
    return status, (orjson.loads(body) if status else {})


def scrape(port: int) -> Samples:
    status, body = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def by_label(samples: Samples, name: str, label: str, **fixed: str) -> dict[str, float]:
    out = {}
    for (sample, labels), v in samples.items():
        held = dict(labels)
        if sample == name and all(held.get(k) == x for k, x in fixed.items()):
            out[held[label]] = v
    return out


def produce_traffic(bootstrap: str, cfg: PipelineConfig) -> None:
    """``VALID`` good events, ``MALFORMED`` records that are not JSON and ``UNKNOWN_KEY``
    events with a key no statistic counts."""
    events = [
        {"user_id": f"user-{i % USERS}", "key": "view" if i % 3 else "click"} for i in range(VALID)
    ]
    events += [{"user_id": "user-1", "key": "no such key"}] * UNKNOWN_KEY
    producer = make_producer(bootstrap)
    produce_events(producer, cfg, events)
    raw = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    for i in range(MALFORMED):
        raw.produce(cfg.input.topics[0], key=b"user-2", value=b"{not json %d" % i)
    assert producer.flush(30) == 0 and raw.flush(30) == 0


def wait_ready(port: int, worker: WorkerProcess, timeout: float = 180) -> list[tuple[int, dict]]:
    """Poll /readyz (often: a recovery is short) until it answers 200; every answer seen."""
    seen: list[tuple[int, dict]] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1][0] != 200:
        worker.assert_running()
        assert time.monotonic() < deadline, f"/readyz not 200 in {timeout}s: {seen[-1:]}"
        time.sleep(0.05)
        seen.append(probe(port, "/readyz"))
    return seen


def test_metrics_match_what_it_did_and_a_restart_recovers_before_ready(kafka, started, tmp_path):
    bootstrap, port, data = kafka.bootstrap, free_port(), config()
    worker = start_worker(started, bootstrap, data, tmp_path, port)
    cfg = worker.cfg
    rd = readers(bootstrap, worker)
    try:
        wait_ready(port, worker)
        status, live = probe(port, "/livez")
        assert status == 200 and live["live"] is True
        produce_traffic(bootstrap, cfg)

        def counted() -> bool:
            s = scrape(port)
            return (
                value(s, "dpstream_events_in_total", stage="stage1") >= VALID
                and sum(by_label(s, "dpstream_dead_letters_total", "reason").values())
                >= MALFORMED + UNKNOWN_KEY
            )

        wait_until(counted, 120, "every event counted by stage 1", worker)
        # Ticks after the last event: every release of the statistics counts them.
        time.sleep(4 * TICK)
        samples = scrape(port)
        releases = {s.name: rd[s.name].drain() for s in cfg.statistics}
        ledger, dead = rd["_ledger"].drain(), rd["_dead"].drain()
    finally:
        for r in rd.values():
            r.close()
    assert value(samples, "dpstream_events_in_total", stage="ingest") == VALID
    assert value(samples, "dpstream_events_in_total", stage="stage1") == VALID
    source_records = VALID + UNKNOWN_KEY + MALFORMED
    assert value(samples, "dpstream_records_in_total", stage="ingest") == source_records
    # Dead letters by reason: what the dead-letter topic holds, what the test sent.
    metric_reasons = by_label(samples, "dpstream_dead_letters_total", "reason", stage="ingest")
    assert metric_reasons == dict(Counter(d["reason"] for d in dead))
    assert sorted(metric_reasons.values()) == sorted([MALFORMED, UNKNOWN_KEY])
    assert by_label(samples, "dpstream_dead_letters_total", "reason", stage="stage1") == {}
    for stat in cfg.statistics:
        name = stat.name
        released_tick = value(samples, "dpstream_released_tick", statistic=name)
        # The scrape saw every release up to its released tick, no other.
        upto = [r for r in releases[name] if r["tick"] <= released_tick]
        assert value(samples, "dpstream_releases_total", statistic=name) == len(upto) > 0
        assert value(samples, "dpstream_release_latency_seconds_count", statistic=name) == len(upto)
        start = next(e for e in ledger if e.get("event") == "start" and e["statistic"] == name)
        assert value(samples, "dpstream_epsilon_spent", statistic=name) == start["epsilon"]
        assert value(samples, "dpstream_epsilon_charged", statistic=name) == start["epsilon"]
        assert value(samples, "dpstream_closed_tick", statistic=name) >= released_tick
        assert value(samples, "dpstream_release_lag_ticks", statistic=name) <= 2
    assert value(samples, "dpstream_total_epsilon") == 4.0
    assert value(samples, "dpstream_changelog_writes_total", table="stage1") > 0
    assert value(samples, "dpstream_changelog_writes_total", table="stage2") > 0
    assert value(samples, "dpstream_rebalances_total", consumer="ingest") >= 1
    assert value(samples, "dpstream_ready") == 1
    lag = by_label(samples, "dpstream_ingest_lag_records", "partition")
    assert lag and set(lag.values()) == {0.0}
    # No label carries a user id.
    assert not any("user-" in v for _, labels in samples for _, v in labels)

    # A new worker starts with empty tables (its state directory is new): it recovers them
    # from the changelogs and is not ready until it has.
    stop_worker(worker.proc)
    worker = start_worker(started, bootstrap, data, tmp_path, port)
    seen = wait_ready(port, worker)
    after = scrape(port)
    stop_worker(worker.proc)
    answered = [body for status, body in seen if status]
    assert answered and all(status in (0, 503) for status, _ in seen[:-1])
    assert all(not body["ready"] for body in answered[:-1])
    recovering = [b for b in answered if not b["conditions"]["tables_recovered"]]
    print(
        f"{len(answered)} answers before ready, {len(recovering)} recovering; recovery took "
        f"{value(after, 'dpstream_table_recovery_seconds_sum'):.2f} s"
    )
    assert recovering, [b["conditions"] for b in answered]
    assert value(after, "dpstream_table_recovery_seconds_count") >= 1
    assert value(after, "dpstream_ready_condition", condition="tables_recovered") == 1


def test_with_the_broker_stopped_the_worker_is_live_and_not_ready(kafka, started, tmp_path):
    port, data = free_port(), config()
    worker = start_worker(started, kafka.bootstrap, data, tmp_path, port)
    try:
        wait_ready(port, worker)
        kafka.kafka.stop()  # SIGTERM; the data directory is kept for the restart below

        def unready() -> bool:
            return probe(port, "/readyz")[0] == 503

        wait_until(unready, 60, "/readyz 503 with the broker stopped", worker)
        status, body = probe(port, "/readyz")
        assert status == 503 and not body["conditions"]["ticks_released"]
        for _ in range(4):  # and it stays live: its event loop turns
            status, live = probe(port, "/livez")
            assert status == 200 and live["live"] is True
            time.sleep(TICK)
    finally:
        worker.proc.kill()  # it may wait long for a broker it cannot reach
        worker.proc.wait()
        if not kafka.kafka.is_alive():
            kafka.restart()
