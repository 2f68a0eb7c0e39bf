"""Fault injection against a real Kafka broker (issue 6, items 1 and 2).

* Worker crash and restart: while a producer streams events of 200 users, one round per
  0.5 s tick, the worker is SIGKILLed four times -- mid-tick, right after a release shows
  up on an output topic, at a random moment, and during the restarted worker's recovery --
  and each time restarted as a new ``dpstream worker`` on the same config file and
  environment (so the same noise key). At-least-once delivery may release a tick twice;
  every copy must be byte-identical, and after dedupe by tick:
  - keyed noise: the releases are consecutive and equal ``dpstream replay`` of the
    exported input log with the same key, byte for byte (no second noise draw, no user
    counted twice, no tick lost);
  - zero noise, the same crash schedule: every release equals the truncated true count;
  - the ledger holds one entry per statistic (re-sent copies identical), with the
    configured epsilon.
* Broker restart: the worker's broker is stopped and restarted mid-stream on the same
  data directory; the worker must reconnect and the same equalities must hold.

Kill points come from observable events plus a seeded RNG. The workers get test-only
Faust settings (environment variables Faust reads) so that a SIGKILLed member leaves the
consumer group after 6 s instead of Faust's default 60 s session timeout.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from dpstream.config.schema import PipelineConfig
from dpstream.pipeline.broker import LocalKafka
from dpstream.pipeline.clients import make_producer, produce_events
from dpstream.pipeline.synthetic import synthetic_events
from dpstream.pipeline.worker_support import spawn_worker
from tests.conftest import WorkerProcess, wait_until, worker_pool
from tests.integration.test_pipeline import (
    TICK,
    TopicReader,
    pipeline_config,
    readers,
    truncated_counts,
    wait_for_first_release,
)

pytestmark = pytest.mark.integration

USERS = 200  # enough light users that the truncated counts still grow while we crash
PER_ROUND = 40  # events per round; one round per tick
MIN_ROUNDS = 30
MAX_ROUNDS = 400
KEY_ENV = "DPSTREAM_TEST_KEY"
# Test-only Faust settings, read from the environment: a SIGKILLed member holds its
# partitions until its session times out (Faust's default: 60 s per restart).
FAST_REJOIN = {
    "BROKER_SESSION_TIMEOUT": "6",
    "BROKER_HEARTBEAT_INTERVAL": "1",
    "BROKER_REBALANCE_TIMEOUT": "10",
}
RESTART_TIMEOUT = 60.0  # a restart takes 6-15 s (session timeout, rejoin, table recovery)
CLI = [sys.executable, "-m", "dpstream.pipeline.cli"]
RECOVERING = "Restoring state from changelog topics"  # Faust's recovery, logged at INFO


class Traffic(threading.Thread):
    """Produces one round of events per tick (every user once first, then Zipf-like traffic,
    singles and batch envelopes alternating) until stopped, and at least MIN_ROUNDS."""

    def __init__(self, bootstrap: str, cfg: PipelineConfig, seed: int) -> None:
        super().__init__(name="traffic", daemon=True)
        self._servers, self._cfg = bootstrap, cfg
        events = [{"user_id": f"user-{u:05d}", "key": "view"} for u in range(USERS)]
        events += synthetic_events(USERS, MAX_ROUNDS * PER_ROUND, seed=seed)
        self._events = events
        self._stopping = threading.Event()
        self._abort = threading.Event()
        self.sent = self.rounds = 0  # events, whether single records or in envelopes
        self.failures: list[str] = []
        self.error: BaseException | None = None

    def _on_delivery(self, err, _msg) -> None:
        if err is not None:
            self.failures.append(str(err))

    def run(self) -> None:
        try:
            producer = make_producer(self._servers, on_delivery=self._on_delivery)
            for i in range(MAX_ROUNDS):
                if self._abort.is_set() or (self._stopping.is_set() and i >= MIN_ROUNDS):
                    break
                chunk = self._events[i * PER_ROUND : (i + 1) * PER_ROUND]
                self.sent += produce_events(producer, self._cfg, chunk, batch=1 if i % 2 else 8)
                producer.flush(10)
                self.rounds = i + 1
                time.sleep(TICK)
            left = producer.flush(1 if self._abort.is_set() else 120)
            if left:
                self.failures.append(f"{left} records still undelivered")
        except BaseException as exc:  # re-raised in the test's thread by stop()
            self.error = exc

    def stop(self) -> None:
        """Finish (at least MIN_ROUNDS) and check every event was delivered once."""
        self._stopping.set()
        self.join(MIN_ROUNDS * TICK + 180)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        assert self.failures == []
        assert self.rounds >= MIN_ROUNDS
        assert self.sent == min(self.rounds * PER_ROUND, len(self._events))

    def abort(self) -> None:
        self._abort.set()
        if self.ident is not None:  # started
            self.join(30)


class Lives:
    """One pipeline's worker across SIGKILLs: each restart is a new ``dpstream worker``
    process on the same config file, bootstrap and environment (the same noise key)."""

    def __init__(self, first: WorkerProcess, bootstrap: str, env: dict[str, str]) -> None:
        self.first = self.current = first
        self.bootstrap, self.env = bootstrap, env
        self.workers = [first]
        self.kills: list[str] = []

    def kill(self, what: str) -> None:
        self.current.assert_running()
        self.current.proc.kill()
        assert self.current.proc.wait(10) == -signal.SIGKILL
        self.kills.append(what)

    def restart(self) -> float:
        """Start the next worker; return the wall-clock time it was started."""
        log_path = self.first.log_path.with_name(
            f"{self.first.cfg.app_id}.restart{len(self.workers)}.log"
        )
        proc = spawn_worker(self.first.config_path, self.bootstrap, log_path, self.env)
        self.current = WorkerProcess(self.first.cfg, self.first.config_path, log_path, proc)
        self.workers.append(self.current)
        return time.time()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def wait_for_progress(
    lives: Lives, rd: dict[str, TopicReader], since: float, timeout: float = RESTART_TIMEOUT
) -> None:
    """Until every statistic has released a tick that ended after ``since``: its markers
    were written after that moment, so by the worker running now."""
    tick = math.floor(since / TICK)

    def done() -> bool:
        return all(
            any(r["tick"] >= tick for r in rd[s.name].drain()) for s in lives.first.cfg.statistics
        )

    wait_until(done, timeout, f"releases of tick {tick} after a restart", lives.current)


def kill_right_after_a_release(lives: Lives, bootstrap: str, topic: str) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "t-watch",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lives.current.assert_running()
            msg = consumer.poll(0.02)
            if msg is not None and not msg.error():
                lives.kill(f"right after the release of tick {orjson.loads(msg.value())['tick']}")
                return
        raise AssertionError(f"no release within 30 s\n{lives.current.log_tail()}")
    finally:
        consumer.close()


def crash_four_times(lives: Lives, rd: dict[str, TopicReader], bootstrap: str, seed: int):
    rng = random.Random(seed)
    # 1. Mid-tick: a random instant inside a tick, after some traffic.
    time.sleep(rng.uniform(1.0, 3.0))
    at = (math.floor(time.time() / TICK) + 1 + rng.uniform(0.2, 0.8)) * TICK
    time.sleep(max(0.0, at - time.time()))
    lives.kill("mid-tick")
    wait_for_progress(lives, rd, lives.restart())
    # 2. Right after a release shows up: stage 2 may not have stored its state yet.
    views = lives.first.cfg.release_topic("views")
    kill_right_after_a_release(lives, bootstrap, views)
    wait_for_progress(lives, rd, lives.restart())
    # 3. A random moment of steady processing.
    time.sleep(rng.uniform(0.0, 4 * TICK))
    lives.kill("random")
    lives.restart()
    # 4. While the restarted worker restores its tables and re-reads uncommitted input.
    restarted = lives.current

    def recovering() -> bool:
        return RECOVERING in restarted.log_path.read_text(errors="replace")

    wait_until(recovering, RESTART_TIMEOUT, "the restarted worker's table recovery", restarted)
    time.sleep(rng.uniform(0.0, 1.0))
    lives.kill("during recovery")
    wait_for_progress(lives, rd, lives.restart())


def finish(lives: Lives, rd: dict[str, TopicReader], traffic: Traffic) -> dict:
    """Stop the traffic, wait for the releases of its last tick, collect every output."""
    time.sleep(4 * TICK)  # some traffic after the last restart
    traffic.stop()
    last = math.floor(time.time() / TICK) + 1

    def done() -> bool:
        return all(
            (rel := rd[s.name].drain()) and max(r["tick"] for r in rel) >= last
            for s in lives.first.cfg.statistics
        )

    wait_until(done, 60, f"releases up to tick {last}", lives.current)
    lives.current.assert_running()
    rd["_ledger"].drain()
    return {
        "releases": {s.name: rd[s.name].records[:] for s in lives.first.cfg.statistics},
        "ledger": rd["_ledger"].records[:],
        "dead": rd["_dead"].drain(),
        "last": last,
        "sent": traffic.sent,
        "kills": lives.kills,
    }


def crash_run(bootstrap: str, directory: Path, noise: dict, env: dict[str, str], seed: int):
    """A worker run under the crash schedule; returns its outputs and exported log."""
    with worker_pool(bootstrap, directory) as start:
        worker = start(pipeline_config(noise), env={**env, **FAST_REJOIN})
        lives = Lives(worker, bootstrap, {**env, **FAST_REJOIN})
        rd = readers(bootstrap, worker)
        traffic = Traffic(bootstrap, worker.cfg, seed)
        try:
            wait_for_first_release(worker, rd["views"])
            traffic.start()
            crash_four_times(lives, rd, bootstrap, seed)
            out = finish(lives, rd, traffic)
        except BaseException:
            traffic.abort()
            raise
        finally:
            for r in rd.values():
                r.close()
            lives.stop()
        out.update(exported(bootstrap, worker, env, directory), cfg=worker.cfg)
        return out


def exported(bootstrap: str, worker: WorkerProcess, env: dict[str, str], directory: Path):
    """``dpstream export-log`` of the input topic and, with keyed noise, ``dpstream replay``."""
    log_path = directory / "events.jsonl"
    config = ["--config", str(worker.config_path)]
    subprocess.run(
        [*CLI, "export-log", *config, "--bootstrap", bootstrap, "--out", str(log_path)],
        check=True,
        timeout=120,
    )
    out = {"log": log_path.read_bytes().splitlines(), "replayed": None}
    if worker.cfg.noise.mode.value == "keyed":
        proc = subprocess.run(
            [*CLI, "replay", *config, "--events", str(log_path)],
            check=True,
            capture_output=True,
            timeout=120,
            env={**os.environ, **env},
        )
        replayed: dict[str, list[bytes]] = defaultdict(list)
        for line in proc.stdout.splitlines():
            replayed[orjson.loads(line)["statistic"]].append(line)
        out["replayed"] = replayed
    return out


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


def check_common(run: dict, kills: int) -> dict[str, list[bytes]]:
    """What holds for every noise mode: no lost tick, identical copies, the ledger, every
    produced event in the log once, no dead letters. Returns the deduplicated releases."""
    cfg = run["cfg"]
    assert len(run["kills"]) == kills, run["kills"]
    assert run["dead"] == []
    log = run["log"]
    assert sum(1 for x in log if b'"user_id"' in x) == run["sent"]
    releases = {}
    for name, raw in run["releases"].items():
        releases[name] = deduplicated(name, raw)
        ticks = [orjson.loads(r)["tick"] for r in releases[name]]
        assert ticks[-1] >= run["last"], name
        assert len(ticks) >= MIN_ROUNDS, name
    # The ledger: one entry per statistic (a re-sent copy identical), the configured epsilon.
    entries: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    for record in run["ledger"]:
        obj = orjson.loads(record)
        entries[obj["statistic"], obj["instance"]].add(record)
    assert sorted(entries) == sorted((s.name, 0) for s in cfg.statistics)
    for s in cfg.statistics:
        copies = entries[s.name, 0]
        assert len(copies) == 1, f"{s.name}: differing ledger entries {copies}"
        assert orjson.loads(next(iter(copies)))["epsilon"] == s.epsilon
    return releases


def summary(run: dict) -> str:
    copies = sum(len(raw) for raw in run["releases"].values())
    unique = sum(len({orjson.loads(r)["tick"] for r in raw}) for raw in run["releases"].values())
    return f"kills {run['kills']}; {copies} releases, {copies - unique} re-sent copies"


def test_worker_sigkill_restarts_keyed_releases_equal_replay(bootstrap, tmp_path):
    key = np.random.default_rng(6).bytes(24).hex()
    run = crash_run(bootstrap, tmp_path, {"mode": "keyed", "key_env": KEY_ENV}, {KEY_ENV: key}, 6)
    print(summary(run))
    releases = check_common(run, kills=4)
    truth = truncated_counts(run["log"], run["cfg"])
    for name, released in releases.items():
        replayed = run["replayed"][name]
        assert len(replayed) >= len(released), name
        assert replayed[: len(released)] == released, name  # byte for byte
        values = [orjson.loads(r) for r in released]
        assert all("insecure" not in v for v in values)
        # Real noise: most keyed releases differ from the exact truncated counts.
        noisy = sum(v["value"] != truth[name].get(v["tick"], 0) for v in values)
        assert noisy > len(values) // 2, name


def test_worker_sigkill_restarts_zero_noise_releases_equal_truncated_counts(bootstrap, tmp_path):
    run = crash_run(bootstrap, tmp_path, {"mode": "insecure_zero"}, {}, 6)
    print(summary(run))
    releases = check_common(run, kills=4)
    truth = truncated_counts(run["log"], run["cfg"])
    for name, released in releases.items():
        for record in released:
            rel = orjson.loads(record)
            assert rel["value"] == truth[name].get(rel["tick"], 0), (name, rel["tick"])
        # The count still grew across the crashes (light users below tau kept arriving).
        values = [orjson.loads(r)["value"] for r in released]
        assert values[-1] > values[len(values) // 2] > 0, name


class BrokerMovedError(AssertionError):
    """The restarted broker listens on other ports than the one the worker knows."""


@pytest.mark.xfail(
    strict=True,
    raises=BrokerMovedError,
    reason="LocalKafka.start() cannot restart a broker on its previous ports: "
    "pipeline/broker.py LocalKafka._start_once() always takes new ones from _free_ports(2) "
    "and rewrites server.properties, so a worker (bootstrap fixed at start) cannot reconnect",
)
def test_worker_reconnects_after_a_broker_restart(tmp_path):
    rng = random.Random(7)
    key = np.random.default_rng(7).bytes(24).hex()
    env = {KEY_ENV: key, **FAST_REJOIN}
    data_dir = tmp_path / "kafka"
    kafka = LocalKafka.start(data_dir=data_dir)
    try:
        with worker_pool(kafka.bootstrap, tmp_path) as start:
            worker = start(pipeline_config({"mode": "keyed", "key_env": KEY_ENV}), env=env)
            lives = Lives(worker, kafka.bootstrap, env)
            rd = readers(kafka.bootstrap, worker)
            traffic = Traffic(kafka.bootstrap, worker.cfg, 7)
            try:
                wait_for_first_release(worker, rd["views"])
                traffic.start()
                time.sleep(rng.uniform(2.0, 5.0))
                before = kafka.bootstrap
                kafka.stop()  # SIGTERM; the data directory is kept
                time.sleep(rng.uniform(1.0, 3.0))
                kafka = LocalKafka.start(data_dir=data_dir)
                if kafka.bootstrap != before:
                    raise BrokerMovedError(f"broker moved from {before} to {kafka.bootstrap}")
                wait_for_progress(lives, rd, time.time(), timeout=120)
                out = finish(lives, rd, traffic)
            except BaseException:
                traffic.abort()
                worker.proc.kill()  # it may hang on a broker it cannot reach
                raise
            finally:
                for r in rd.values():
                    r.close()
                lives.stop()
            out.update(exported(kafka.bootstrap, worker, {KEY_ENV: key}, tmp_path), cfg=worker.cfg)
    finally:
        kafka.stop()
    print(summary(out))
    releases = check_common(out, kills=0)
    for name, released in releases.items():
        assert out["replayed"][name][: len(released)] == released, name
