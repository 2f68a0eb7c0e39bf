"""Helpers the integration tests share: worker subprocesses and waiting on them, the
standard pipeline, topic readers, waiting for ticks, producing rounds, the replay comparison,
the truncated counts computed from scratch. A plain module, so that no test module imports
another (conftest imports the worker helpers from here for its fixtures)."""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.deploy import broker
from dpstream.deploy.broker import containers_required, docker_available
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.kafka.topics import create_source_topics
from dpstream.pipeline.tools.export import LOG_MAC, export_log
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.worker.keys import load_noise
from dpstream.pipeline.worker.ledger import LOG_HEADER
from dpstream.pipeline.worker.processes import spawn_worker, stop_worker
from dpstream.testing.pipeline import unique_names  # the plugin's: one way to name a test's topics

TICK = 0.5
PARTITIONS = 4


@dataclass
class WorkerProcess:
    """A ``dpstream worker`` subprocess with its parsed config and the log it writes."""

    cfg: PipelineConfig
    config_path: Path
    log_path: Path
    proc: subprocess.Popen

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def assert_running(self) -> None:
        assert self.proc.poll() is None, f"worker exited:\n{self.log_tail()}"

    def stop(self) -> None:
        stop_worker(self.proc)


@contextmanager
def worker_pool(bootstrap: str, directory: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``dpstream worker`` subprocesses on demand; stop them all on exit."""
    started: list[WorkerProcess] = []

    def start(data: dict, env: dict[str, str] | None = None) -> WorkerProcess:
        data = unique_names(data)
        cfg = parse_config(data)
        config_path = directory / f"{cfg.app_id}.yaml"
        config_path.write_text(yaml.safe_dump(data))
        log_path = directory / f"{cfg.app_id}.log"
        create_source_topics(cfg, bootstrap)  # as a user's producer setup would
        proc = spawn_worker(config_path, bootstrap, log_path, env)
        worker = WorkerProcess(cfg, config_path, log_path, proc)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, worker: WorkerProcess | None = None
) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds (with the worker's
    log tail) or as soon as ``worker`` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker is not None:
            worker.assert_running()
        if predicate():
            return
        time.sleep(0.25)
    tail = f"\nworker log:\n{worker.log_tail()}" if worker else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{tail}")


def pipeline_config(noise: dict) -> dict:
    return {
        "input": {"partitions": PARTITIONS, "max_record_bytes": 4096},
        "ticks": {"interval_seconds": TICK},
        "noise": noise,
        "privacy": {"total_epsilon": 10.0},
        # Every tree mechanism runs in the same pipeline, over the same events.
        "statistics": [
            {"name": "views", "epsilon": 1.0, "tau": 5, "key": "view"},
            {
                "name": "clicks",
                "epsilon": 1.0,
                "tau": 2,
                "key": "click",
                "mechanism": "kary_subtract",
                "k": 3,
            },
            {
                "name": "views4",
                "epsilon": 1.0,
                "tau": 3,
                "key": "view",
                "mechanism": "kary",
                "k": 4,
            },
            {
                "name": "clicks_exp",
                "epsilon": 0.1,
                "tau": 2,
                "key": "click",
                "mechanism": "expiring",
                "lambda": 1,
                "horizon_ticks": 100_000,  # its budget lasts beyond any run here
            },
        ],
    }


class TopicReader:
    """Reads a single-partition topic from its start, keeping every record in order, with
    its Kafka timestamp (ms) and when this reader received it (``time.time()``)
    (``client``: librdkafka settings to add, e.g. a secured broker's and a group its
    ACLs cover)."""

    def __init__(self, bootstrap: str, topic: str, client: dict | None = None) -> None:
        self.records: list[bytes] = []
        self.timestamps: list[int] = []
        self.seen: list[float] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "t-reader",
                "enable.auto.commit": False,
                "log_level": 0,
                **(client or {}),
            }
        )
        self._consumer.assign([TopicPartition(topic, 0, 0)])
        self._following: threading.Thread | None = None
        self._stop = threading.Event()

    def _poll(self, timeout: float) -> bool:
        msg = self._consumer.poll(timeout)
        if msg is None:
            return False
        if not msg.error():
            self.seen.append(time.time())
            self.timestamps.append(msg.timestamp()[1])
            self.records.append(msg.value())  # last: a record read has its time
        return True

    def drain(self) -> list[dict]:
        if self._following is None:
            while self._poll(0.2):
                pass
        return [orjson.loads(r) for r in self.records[:]]

    def follow(self) -> None:
        """Read in a thread of its own until ``close``: ``seen`` is then when each record
        reached the consumer, not when a test got round to polling."""
        self._following = threading.Thread(target=self._follow, daemon=True)
        self._following.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            self._poll(0.05)

    def close(self) -> None:
        if self._following is not None:
            self._stop.set()
            self._following.join()
        self._consumer.close()


def readers(
    bootstrap: str, worker: WorkerProcess, client: dict | None = None
) -> dict[str, TopicReader]:
    cfg = worker.cfg
    out = {
        s.name: TopicReader(bootstrap, cfg.release_topic(s.name), client) for s in cfg.statistics
    }
    out["_dead"] = TopicReader(bootstrap, cfg.outputs.dead_letter_topic, client)
    out["_ledger"] = TopicReader(bootstrap, cfg.outputs.ledger_topic, client)
    return out


def wait_for_first_release(worker: WorkerProcess, reader: TopicReader) -> None:
    wait_until(lambda: reader.drain() != [], 90, "the worker's first release", worker)


def wait_for_tick(worker: WorkerProcess, rd: dict[str, TopicReader], tick: int) -> None:
    def done() -> bool:
        return all(
            (rel := rd[s.name].drain()) and rel[-1]["tick"] >= tick for s in worker.cfg.statistics
        )

    wait_until(done, 60, f"releases up to tick {tick}", worker)


def replayed_releases(cfg, bootstrap: str) -> dict[str, list[bytes]]:
    """``dpstream replay`` of the exported input log (the worker's key must be in the
    environment), per statistic, as the worker serializes releases."""
    out: dict[str, list[bytes]] = defaultdict(list)
    for release in replay(cfg, export_log(cfg, bootstrap), load_noise(cfg)):
        out[release["statistic"]].append(orjson.dumps(release))
    return out


def produce_rounds(bootstrap: str, cfg, rounds: Iterable[list[dict]], batch: int, pause: float):
    """Each round's events through dpstream's producer, then a pause (about a tick)."""
    producer = make_producer(bootstrap)
    for events in rounds:
        produce_events(producer, cfg, events, batch=batch)
        assert producer.flush(10) == 0
        time.sleep(pause)


def collected(rd: dict[str, TopicReader], cfg) -> tuple[dict[str, list[bytes]], list, list]:
    """(releases per statistic as read so far, ledger entries, dead letters)."""
    releases = {s.name: rd[s.name].records[:] for s in cfg.statistics}
    return releases, rd["_ledger"].drain(), rd["_dead"].drain()


def assert_equal_to_replay(cfg, bootstrap: str, pipeline: dict[str, list[bytes]], least: int = 0):
    """Every statistic released at least ``least`` records, byte for byte a prefix of
    ``replayed_releases`` (the worker's key must be in the environment)."""
    replayed = replayed_releases(cfg, bootstrap)
    for name, released in pipeline.items():
        assert len(released) >= least, name
        assert replayed[name][: len(released)] == released, name  # byte for byte


def rounds_equal_to_replay(
    bootstrap: str,
    worker: WorkerProcess,
    rounds: Iterable[list[dict]],
    first: str,
    key_env: str,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, list[bytes]], list]:
    """Wait for ``first``'s first release, produce ``rounds`` a tick apart, wait for the
    next tick's releases, then check them (at least one per round, no dead letters)
    against the replay under ``key``; (releases per statistic, ledger entries)."""
    cfg = worker.cfg
    rd = readers(bootstrap, worker)
    rounds = list(rounds)
    try:
        wait_for_first_release(worker, rd[first])
        produce_rounds(bootstrap, cfg, rounds, batch=100, pause=cfg.ticks.interval_seconds)
        wait_for_tick(worker, rd, math.floor(time.time() / cfg.ticks.interval_seconds) + 1)
        pipeline, ledger, dead = collected(rd, cfg)
    finally:
        for r in rd.values():
            r.close()
    assert dead == []
    monkeypatch.setenv(key_env, key)
    assert_equal_to_replay(cfg, bootstrap, pipeline, least=len(rounds))
    return pipeline, ledger


def truncated_counts(log: list[bytes], cfg) -> dict[str, dict[int, int]]:
    """The exact truncated running counts of the fixed-tau statistics, computed here from
    scratch (not with Stage1)."""
    used: dict[tuple[str, str], int] = defaultdict(int)
    total = dict.fromkeys((s.name for s in cfg.statistics), 0)
    out: dict[str, dict[int, int]] = defaultdict(dict)
    for line in log:
        obj = orjson.loads(line)
        if LOG_HEADER in obj or LOG_MAC in obj:
            continue
        if "user_id" not in obj:
            for s in cfg.statistics:
                out[s.name][obj["tick"]] = total[s.name]
            continue
        for s in cfg.statistics:
            if not s.user_level and (s.key is None or obj.get("key") == s.key):
                used[s.name, obj["user_id"]] += 1
                total[s.name] += used[s.name, obj["user_id"]] <= s.tau
    return out


# Restarts and rebalances in seconds (Faust's settings from the environment).
FAST_REJOIN = {
    "BROKER_SESSION_TIMEOUT": "6",
    "BROKER_HEARTBEAT_INTERVAL": "1",
    "BROKER_REBALANCE_TIMEOUT": "10",
}


def deduplicated(name: str, raw: list[bytes]) -> list[bytes]:
    """One release per tick in first-seen order; a re-sent copy must be byte-identical,
    and the ticks must be consecutive (none lost) with steps 1, 2, 3, ..."""
    first: dict[int, bytes] = {}
    for record in raw:
        tick = orjson.loads(record)["tick"]
        assert first.setdefault(tick, record) == record, (
            f"{name}: tick {tick} released twice with different contents:\n"
            f"{first[tick]!r}\n{record!r}"
        )
    out = list(first.values())
    ticks = [orjson.loads(r)["tick"] for r in out]
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), f"{name}: {ticks}"
    assert [orjson.loads(r)["step"] for r in out] == list(range(1, len(out) + 1)), name
    return out


def round_trip(bootstrap: str, n: int = 100) -> None:
    """``n`` records through a new topic of the broker at ``bootstrap``, read back in order."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"dpstream-broker-test-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    new_topic = NewTopic(topic, num_partitions=1, replication_factor=1)
    for future in admin.create_topics([new_topic]).values():
        future.result(timeout=30)

    errors: list[object] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    for i in range(n):
        producer.produce(
            topic,
            key=f"user-{i % 7}".encode(),
            value=str(i).encode(),
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(30) == 0
    assert errors == []

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    received: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(received) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            received.append(msg.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert received == [str(i).encode() for i in range(n)]


def require_docker() -> None:
    """Skip without an engine, unless containers are required (CI): then fail."""
    if docker_available():
        return
    if containers_required():
        pytest.fail(f"{broker.REQUIRE_CONTAINERS_ENV} is set but no Docker engine answers")
    pytest.skip("no Docker engine answers (CI runs these with one)")


def hooked(tmp_path: Path, source: str) -> dict[str, str]:
    """The environment that makes a worker run ``source`` at start-up (a sitecustomize
    module first on its PYTHONPATH)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(source)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}


def require_peer(peer: str) -> None:
    """Build or install a benchmark peer (``kafka-streams:...``, ``quix:...``) or skip the
    test where it cannot be had here (no Maven, no network); under ``CI=true`` fail: CI
    must run the peers."""
    from bench.throughput import peers

    setup = peers.build_kafka_streams if peer.startswith("kafka-streams") else peers.quix_python
    try:
        setup()
    except peers.PeerUnavailable as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the peer benchmarks, but: {e}", pytrace=False)
        pytest.skip(f"peer unavailable here: {e}")
