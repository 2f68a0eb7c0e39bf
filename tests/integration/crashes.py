"""The crash machinery of the fault-injection tests (test_faults.py): the producer of
rounds of traffic, a worker's lives across SIGKILLs, the crash schedule, the outputs it
collects and the checks that hold for every noise mode; and the zero-noise crash run as a
scenario, which test_faults.py runs on the jar broker and test_containers.py on a
container broker.
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

import orjson
from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from dpstream.config.schema import PipelineConfig
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.tools.synthetic import synthetic_events
from dpstream.pipeline.worker.processes import spawn_worker
from tests.integration.support import (
    FAST_REJOIN,
    TICK,
    TopicReader,
    WorkerProcess,
    deduplicated,
    pipeline_config,
    readers,
    truncated_counts,
    wait_for_first_release,
    wait_until,
    worker_pool,
)

USERS = 200  # enough light users that the truncated counts still grow while we crash
PER_ROUND = 40  # events per round; one round per tick
MIN_ROUNDS = 30
MAX_ROUNDS = 400
# Test-only Faust settings, read from the environment: a SIGKILLed member holds its
# partitions until its session times out (Faust's default: 60 s per restart).
RESTART_TIMEOUT = 60.0  # a restart takes 6-15 s (session timeout, rejoin, table recovery)
CLI = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]
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


class ReleaseWatch:
    """Follows every release topic from its end, to kill the worker right after a release."""

    def __init__(self, bootstrap: str, cfg: PipelineConfig) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "t-watch",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        topics = [cfg.release_topic(s.name) for s in cfg.statistics]
        self._consumer.assign([TopicPartition(t, 0, OFFSET_END) for t in topics])
        self._newest: int | None = None
        self._tau: int | None = None

    def _take(self, timeout: float) -> int | None:
        """The tick of the next release, if it is newer than every release before."""
        msg = self._consumer.poll(timeout)
        if msg is None or msg.error():
            return None
        tick = orjson.loads(msg.value())["tick"]
        if self._newest is not None and tick <= self._newest:
            return None
        self._newest = tick
        return tick

    def first_release_of_a_new_tick(self, worker: WorkerProcess, timeout: float = 30) -> int:
        """Return right after the first release of a new tick shows up on any release topic
        (the other statistics of that tick are being closed at that moment)."""
        while self._consumer.poll(0) is not None:
            pass  # what arrived while nobody watched
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            worker.assert_running()
            if (tick := self._take(0.01)) is not None:
                return tick
        raise AssertionError(f"no new release within {timeout} s\n{worker.log_tail()}")

    def release_with_a_new_tau(
        self, worker: WorkerProcess, topic: str, timeout: float = 60
    ) -> tuple[int, int]:
        """Return right after a release on ``topic`` whose tau exceeds every tau it showed
        before: the tracker has just doubled tau and the new instance released."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            worker.assert_running()
            msg = self._consumer.poll(0.01)
            if msg is None or msg.error() or msg.topic() != topic:
                continue
            release = orjson.loads(msg.value())
            seen, self._tau = self._tau, max(self._tau or 0, release["tau"])
            if seen is not None and release["tau"] > seen:
                return release["tick"], release["tau"]
        raise AssertionError(f"no tau change within {timeout} s\n{worker.log_tail()}")

    def close(self) -> None:
        self._consumer.close()


def kill_at_a_random_instant(lives: Lives, rng: random.Random, what: str) -> None:
    """At a uniformly random instant of the next tick: while events stream in, a tick is
    being closed, or nothing happens."""
    at = (math.floor(time.time() / TICK) + 1 + rng.random()) * TICK
    time.sleep(max(0.0, at - time.time()))
    lives.kill(f"{what} ({(at / TICK) % 1:.2f} into a tick)")


def crash_repeatedly(
    lives: Lives, rd: dict[str, TopicReader], watch: ReleaseWatch, rng: random.Random
) -> None:
    """Four SIGKILLs (five with a user-level statistic), each followed by a restart on the
    same config and environment."""
    cfg = lives.first.cfg
    auto = [s for s in cfg.statistics if s.user_level]
    if auto:
        # 0. Right after the tracker doubled tau: the new truncation instance's first
        # release is out, its state (and the other statistics') maybe not stored yet.
        tick, tau = watch.release_with_a_new_tau(lives.current, cfg.release_topic(auto[0].name))
        lives.kill(f"right after tau became {tau} at tick {tick}")
        wait_for_progress(lives, rd, lives.restart())
    # 1. Mid-tick, at a random instant, while events stream in.
    time.sleep(rng.uniform(1.0, 3.0))
    kill_at_a_random_instant(lives, rng, "mid-tick")
    wait_for_progress(lives, rd, lives.restart())
    # 2. Right after a release: the first one of a new tick, while stage 2 is still closing
    # that tick for the other statistics and has not necessarily stored its state.
    tick = watch.first_release_of_a_new_tick(lives.current)
    lives.kill(f"right after the first release of tick {tick}")
    wait_for_progress(lives, rd, lives.restart())
    # 3. Another random instant.
    kill_at_a_random_instant(lives, rng, "random")
    lives.restart()
    # 4. While the restarted worker restores its tables from the changelogs.
    restarted = lives.current

    def recovering() -> bool:
        return RECOVERING in restarted.log_path.read_text(errors="replace")

    wait_until(recovering, RESTART_TIMEOUT, "the restarted worker's table recovery", restarted)
    time.sleep(rng.uniform(0.0, 0.5))
    lives.kill("during recovery")
    wait_for_progress(lives, rd, lives.restart())


def table_state(bootstrap: str, topic: str, partitions: int) -> dict:
    """The latest value of every key of a Faust table's changelog (JSON keys and values):
    what a restarted worker recovers."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "t-table",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    state: dict = {}
    try:
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        while ends:
            msg = consumer.poll(30)
            assert msg is not None, f"reading {topic}: nothing within 30 s"
            if msg.error() or msg.offset() >= ends.get(msg.partition(), -1):
                continue  # past the end taken above: written since
            state[orjson.loads(msg.key())] = orjson.loads(msg.value())
            if msg.offset() == ends[msg.partition()] - 1:
                del ends[msg.partition()]
        return state
    finally:
        consumer.close()


def user_entries(bootstrap: str, cfg: PipelineConfig) -> dict:
    """Stage 1's user entries ("u:<user>" keys of the stage1 table), by user."""
    state = table_state(bootstrap, cfg.changelog_topics[0], cfg.input.partitions)
    return {k[2:]: v for k, v in state.items() if k.startswith("u:")}


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
    cfg = lives.first.cfg
    return {
        "users": user_entries(lives.bootstrap, cfg),
        "releases": {s.name: rd[s.name].records[:] for s in lives.first.cfg.statistics},
        "ledger": rd["_ledger"].records[:],
        "dead": rd["_dead"].drain(),
        "last": last,
        "sent": traffic.sent,
        "kills": lives.kills,
    }


def crash_run(bootstrap: str, directory: Path, data: dict, env: dict[str, str], seed: int) -> dict:
    """A worker run under the crash schedule; returns its outputs and exported log."""
    with worker_pool(bootstrap, directory) as start:
        worker = start(data, env={**env, **FAST_REJOIN})
        lives = Lives(worker, bootstrap, {**env, **FAST_REJOIN})
        rd = readers(bootstrap, worker)
        watch = ReleaseWatch(bootstrap, worker.cfg)
        traffic = Traffic(bootstrap, worker.cfg, seed)
        try:
            wait_for_first_release(worker, rd["views"])
            traffic.start()
            crash_repeatedly(lives, rd, watch, random.Random(seed))
            out = finish(lives, rd, traffic)
        except BaseException:
            traffic.abort()
            raise
        finally:
            for r in rd.values():
                r.close()
            watch.close()
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
        env={**os.environ, **env},  # with the key: the log's MAC, which keyed replay needs
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


def check_common(run: dict, kills: int) -> dict[str, list[bytes]]:
    """What holds for every noise mode: no lost tick, identical copies, the ledger, every
    produced event in the log once, no dead letters. Returns the deduplicated releases."""
    cfg = run["cfg"]
    assert len(run["kills"]) == kills, run["kills"]
    assert run["dead"] == []
    log = run["log"]
    assert sum(1 for x in log if b'"user_id"' in x) == run["sent"]
    # Stage 1's bound state after the crashes: every user's used units per statistic equal
    # that user's events in the log -- none lost (it could exceed tau), none counted twice.
    used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for line in log:
        event = orjson.loads(line)
        for s in cfg.statistics:
            if "user_id" in event and (s.key is None or event.get("key") == s.key):
                used[event["user_id"]][s.name] += 1
    assert {u: e["used"] for u, e in run["users"].items()} == used
    releases = {}
    for name, raw in run["releases"].items():
        releases[name] = deduplicated(name, raw)
        ticks = [orjson.loads(r)["tick"] for r in releases[name]]
        assert ticks[-1] >= run["last"], name
        assert len(ticks) >= MIN_ROUNDS, name
    # The ledger: one entry per statistic (a re-sent copy identical), the configured epsilon.
    entries: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    budget: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    statements: set[bytes] = set()
    for record in run["ledger"]:
        obj = orjson.loads(record)
        if obj.get("event") == "statement":  # written by every worker start
            statements.add(record)
            continue
        if obj.get("event") == "budget":  # the accountant of a tau: auto statistic
            budget[obj["statistic"], obj["tick"]].add(record)
            continue
        entries[obj["statistic"], obj["instance"]].add(record)
    assert sorted(entries) == sorted((s.name, 0) for s in cfg.statistics)
    # Restarts state the same statement again: one distinct record.
    assert len(statements) == 1, statements
    statement = orjson.loads(next(iter(statements)))
    assert statement["per_user_total"] <= cfg.privacy.total_epsilon
    for (name, tick), copies in budget.items():
        assert len(copies) == 1, f"{name} tick {tick}: differing budget entries {copies}"
        entry = orjson.loads(next(iter(copies)))
        assert entry["epsilon_spent"] < entry["epsilon"], entry
    for s in cfg.statistics:
        copies = entries[s.name, 0]
        assert len(copies) == 1, f"{s.name}: differing ledger entries {copies}"
        assert orjson.loads(next(iter(copies)))["epsilon"] == s.epsilon
    return releases


def summary(run: dict) -> str:
    copies = sum(len(raw) for raw in run["releases"].values())
    unique = sum(len({orjson.loads(r)["tick"] for r in raw}) for raw in run["releases"].values())
    return f"kills {run['kills']}; {copies} releases, {copies - unique} re-sent copies"


def worker_sigkill_restarts_zero_noise(bootstrap: str, tmp_path: Path) -> None:
    """Zero noise under the crash schedule (four SIGKILLs): the releases equal the
    truncated true counts of the exported log."""
    run = crash_run(bootstrap, tmp_path, pipeline_config({"mode": "insecure_zero"}), {}, 6)
    print(summary(run))
    releases = check_common(run, kills=4)
    truth = truncated_counts(run["log"], run["cfg"])
    for name, released in releases.items():
        for record in released:
            rel = orjson.loads(record)
            exact = truth[name].get(rel["tick"], 0)
            # Exactly the truncated truth: no user counted twice or beyond tau, no unit lost.
            assert rel["value"] == exact, (name, rel["tick"], rel["value"], exact)
        # The count still grew across the crashes (light users below tau kept arriving).
        values = [orjson.loads(r)["value"] for r in released]
        assert values[-1] > values[len(values) // 2] > 0, name
