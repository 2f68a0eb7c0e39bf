"""The ingest stage against a real broker (issue 14): the source topics users already
have, written by the clients they already use, counted exactly once.

Zero noise and a tau above every user's count, so that every release must equal the exact
count of what was produced:

* confluent-kafka at its defaults (keyed by user id, and without keys), kcat (Debian's,
  librdkafka's default partitioner) and Kafka's own console producer (murmur2 with keys,
  sticky without), each into its own source topic of one pipeline: every event counted
  once, and every source topic's records and settings the same after the run as before;
* the worker SIGKILLed during ingest at several points while events stream in, and two
  workers sharing 4 source partitions with one SIGKILLed: per-user counts equal the truth
  and the releases equal ``replay`` of dpstream's events topic.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Consumer, Producer

from dpstream.config.schema import parse_config
from dpstream.pipeline.ingest.consumer import Ingest, consumer_config, source_lag
from dpstream.pipeline.kafka.clients import read_topic
from dpstream.pipeline.kafka.topics import create_source_topics, ensure_topics
from dpstream.pipeline.tools.export import export_log
from dpstream.pipeline.wire.records import decode_envelope, limits_for, rules_fingerprint
from dpstream.pipeline.worker.exits import EXIT_INTERNAL_ERROR
from dpstream.pipeline.worker.processes import spawn_worker
from dpstream.statistics.contract import Report
from dpstream.testing import unique_names
from tests.integration import producers
from tests.integration.support import (
    FAST_REJOIN,
    WorkerProcess,
    assert_equal_to_replay,
    deduplicated,
    hooked,
    readers,
    wait_until,
)

pytestmark = pytest.mark.integration

TICK = 0.5
TAU = 100_000  # above every user's count: nothing is truncated
# Once the file $DPSTREAM_TEST_FREEZE exists, the ingest stops between the events topic's
# acknowledgement of a batch and its commit (and says so with <file>.frozen): a kill there
# makes the next owner re-send what stage 1 has counted, the case the dedupe is for.
FREEZE_HOOK = """
import os
import time
from pathlib import Path

from dpstream.pipeline.ingest import consumer as ingest

_commit = ingest.Ingest._commit
_FREEZE = Path(os.environ["DPSTREAM_TEST_FREEZE"])


def _frozen(self, records):
    if _FREEZE.exists():
        _FREEZE.with_suffix(".frozen").touch()
        while True:
            time.sleep(1)
    _commit(self, records)


ingest.Ingest._commit = _frozen
"""
VARIANTS = [
    (name, keyed) for name in ("confluent_default", "kcat", "java_console") for keyed in (1, 0)
]


def config(topics: list[str], statistics: list[dict], app: dict) -> dict:
    return {
        **app,
        "input": {"topics": topics, "partitions": 4},
        "ticks": {"interval_seconds": TICK},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": float(len(statistics))},
        "statistics": statistics,
    }


def start(
    bootstrap: str,
    directory: Path,
    data: dict,
    env: dict | None = None,
    command: tuple[str, ...] = ("worker",),
    name: str = "",
) -> WorkerProcess:
    """``dpstream <command>`` on ``data`` (``name``: its config file's, when two processes
    of one app id run on different configurations)."""
    cfg = parse_config(data)
    path = directory / f"{cfg.app_id}{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    log = directory / f"{cfg.app_id}.{time.monotonic_ns()}.log"
    create_source_topics(cfg, bootstrap)
    proc = spawn_worker(path, bootstrap, log, env, command=command)
    return WorkerProcess(cfg, path, log, proc)


def latest(reader) -> int | None:
    releases = reader.drain()
    return releases[-1]["value"] if releases else None


def test_every_producer_users_have_is_counted_once_and_the_source_is_untouched(bootstrap, tmp_path):
    if any(name == "kcat" for name, _ in VARIANTS):
        producers.kcat_or_skip()
    names = unique_names({})
    run = names["app_id"]
    topic = {v: f"{run}.src-{v[0]}-{'keyed' if v[1] else 'unkeyed'}" for v in VARIANTS}
    stats = [
        {"name": f"{v[0]}_{v[1]}", "key": f"{v[0]}_{v[1]}", "epsilon": 1.0, "tau": TAU}
        for v in VARIANTS
    ]
    data = config(list(topic.values()), stats, names)
    rng = random.Random(5)
    sent: dict[str, list[dict]] = {}
    for variant in VARIANTS:
        key = f"{variant[0]}_{variant[1]}"
        sent[key] = [{"user_id": f"user-{rng.randrange(60):03d}", "key": key} for _ in range(300)]
        producers.create_source_topic(bootstrap, topic[variant], partitions=3)
        producers.PRODUCERS[variant[0]](bootstrap, topic[variant], sent[key], bool(variant[1]))
    before = {t: producers.snapshot(bootstrap, t) for t in topic.values()}

    worker = start(bootstrap, tmp_path, data)
    rd = readers(bootstrap, worker)
    try:
        wait_until(
            lambda: all(latest(rd[k]) == len(events) for k, events in sent.items()),
            90,
            "every event of every producer released",
            worker,
        )
        releases = {s.name: rd[s.name].records[:] for s in worker.cfg.statistics}
        dead = rd["_dead"].drain()
    finally:
        for r in rd.values():
            r.close()
        worker.stop()
    assert dead == []
    # Each event once, per user: the events topic (as export-log reads it) holds exactly
    # what was produced.
    counted = Counter(
        (e["key"], e["user_id"])
        for e in map(orjson.loads, export_log(worker.cfg, bootstrap))
        if "user_id" in e
    )
    assert counted == Counter((e["key"], e["user_id"]) for ev in sent.values() for e in ev)
    assert_equal_to_replay(worker.cfg, bootstrap, releases, least=1)
    for name in topic.values():
        assert producers.snapshot(bootstrap, name) == before[name], name
    # What `dpstream lag` prints: the group committed every source partition to its end.
    lag = source_lag(worker.cfg, bootstrap)
    assert len(lag) == 3 * len(VARIANTS)
    assert all(row["lag"] == 0 for row in lag.values())
    # (a partition no record went to has no committed offset)
    assert all(row["committed"] == row["end"] for row in lag.values() if row["end"] > 0)


@pytest.mark.parametrize("where", ["thread", "own process"])
def test_the_ingest_in_a_thread_or_its_own_process(bootstrap, tmp_path, where):
    """Besides the default (a child process of the worker): ``--ingest thread``, and
    ``--ingest off`` with ``dpstream ingest`` run as a process of its own."""
    data, source = counting_pipeline(bootstrap)
    events = [{"user_id": f"u{i % 37}"} for i in range(500)]
    producers.produce_confluent_default(bootstrap, source, events, keyed=False)
    mode = "thread" if where == "thread" else "off"
    worker = start(bootstrap, tmp_path, data, command=("worker", "--ingest", mode))
    ingest = None if where == "thread" else start(bootstrap, tmp_path, data, command=("ingest",))
    rd = readers(bootstrap, worker)
    try:
        wait_until(lambda: latest(rd["events"]) == len(events), 90, "the events released", worker)
    finally:
        for r in rd.values():
            r.close()
        worker.stop()
        if ingest is not None:
            ingest.stop()
            assert ingest.proc.returncode == 0, ingest.log_tail()  # SIGTERM: a clean stop


class Stream:
    """Events from 200 users produced into a source topic at about ``rate`` per second, by
    confluent-kafka at its defaults, in a background thread, until ``stop``."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        self.events: list[dict] = []
        self._args = (bootstrap, topic)
        self._chunk = max(1, int(rate / 10))
        self._rng = random.Random(9)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                chunk = [
                    {"user_id": f"u{int(self._rng.paretovariate(1.2)) % 200:03d}"}
                    for _ in range(self._chunk)
                ]
                producers.produce_confluent_default(*self._args, chunk, keyed=True)
                self.events += chunk
                time.sleep(0.1)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def start(self) -> Stream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.close()
        self._thread.join(60)
        assert self.error is None, self.error

    def close(self) -> None:
        self._stop.set()


def check_exact(cfg, bootstrap: str, events: list[dict], releases: list[bytes]) -> None:
    """The ingest did re-send events (else nothing was tested); per-user counts of the
    events topic equal the truth; the releases (re-sent ones byte-identical) equal the
    replay of the events topic and end at the total."""
    positions: Counter[tuple] = Counter()
    for records in read_topic(bootstrap, cfg.events_topic, cfg.input.partitions).values():
        for _, headers, value, _ in records:
            if dict(headers).get("dpstream") == b"envelope":
                env = decode_envelope(value)
                positions.update((env.source, *p) for p in env.positions())
    assert sum(positions.values()) > len(events), "no event was sent twice: nothing tested"
    log = list(export_log(cfg, bootstrap))
    counted = Counter(e["user_id"] for e in map(orjson.loads, log) if "user_id" in e)
    assert counted == Counter(e["user_id"] for e in events)
    once = deduplicated("events", releases)
    assert_equal_to_replay(cfg, bootstrap, {"events": once}, least=1)
    assert orjson.loads(once[-1])["value"] == len(events)


def freezer(tmp_path: Path, name: str) -> tuple[Path, dict[str, str]]:
    freeze = tmp_path / f"{name}.freeze"
    return freeze, {"DPSTREAM_TEST_FREEZE": str(freeze)}


def kill_frozen(worker: WorkerProcess, freeze: Path) -> None:
    """Freeze the worker's ingest after an acknowledged batch, then SIGKILL the worker
    (its ingest dies with it)."""
    freeze.touch()
    frozen = freeze.with_suffix(".frozen")
    wait_until(frozen.exists, 30, "the ingest frozen before a commit", worker)
    worker.proc.kill()
    worker.proc.wait(10)
    freeze.unlink()
    frozen.unlink()


def counting_pipeline(bootstrap: str) -> tuple[dict, str]:
    """A pipeline counting every event of one new 4-partition source topic."""
    names = unique_names({})
    source = names["input"]["topics"][0]
    producers.create_source_topic(bootstrap, source, partitions=4)
    return config([source], [{"name": "events", "epsilon": 1.0, "tau": TAU}], names), source


def released_all(stream: Stream, rd: dict, worker: WorkerProcess) -> list[bytes]:
    """Stop the stream; the releases up to the one counting all it produced."""
    stream.stop()
    wait_until(
        lambda: (latest(rd["events"]) or 0) >= len(stream.events), 120, "every event", worker
    )
    return rd["events"].records[:]


def running(worker: WorkerProcess, rd: dict) -> None:
    """Until the worker's ingest has source partitions and its stages release ticks that
    began after it started (a kill then hits a running pipeline, not a recovery)."""
    started = time.time()
    wait_until(lambda: b"ingest assigned" in worker.log_path.read_bytes(), 60, "ingest", worker)
    wait_until(
        lambda: any(r["tick_end_unix"] > started + 2 * TICK for r in rd["events"].drain()),
        60,
        "releases after the start",
        worker,
    )


def test_sigkill_during_ingest_loses_and_doubles_nothing(bootstrap, tmp_path):
    data, source = counting_pipeline(bootstrap)
    freeze, frozen_env = freezer(tmp_path, "worker")
    env = {**FAST_REJOIN, **hooked(tmp_path, FREEZE_HOOK), **frozen_env}
    worker = start(bootstrap, tmp_path, data, env)
    rd = readers(bootstrap, worker)
    stream = None
    try:
        wait_until(lambda: rd["events"].drain() != [], 90, "the first release", worker)
        stream = Stream(bootstrap, source, rate=3000).start()
        # Killed after an acknowledged, uncommitted batch; at a random moment; again after
        # an acknowledged batch. Each time a new worker takes over.
        for pause, frozen in ((1.0, True), (1.7, False), (0.5, True)):
            running(worker, rd)
            time.sleep(pause)
            if frozen:
                kill_frozen(worker, freeze)
            else:
                worker.proc.kill()
                worker.proc.wait(10)
            worker = start(bootstrap, tmp_path, data, env)
        releases = released_all(stream, rd, worker)
    finally:
        if stream is not None:
            stream.close()
        for r in rd.values():
            r.close()
        worker.stop()
    check_exact(worker.cfg, bootstrap, stream.events, releases)


def test_two_workers_share_the_source_partitions_and_one_is_killed(bootstrap, tmp_path):
    data, source = counting_pipeline(bootstrap)
    freeze, frozen_env = freezer(tmp_path, "first")
    first = start(
        bootstrap, tmp_path, data, {**FAST_REJOIN, **hooked(tmp_path, FREEZE_HOOK), **frozen_env}
    )
    rd = readers(bootstrap, first)
    second = stream = None
    try:
        wait_until(lambda: rd["events"].drain() != [], 90, "the first release", first)
        second = start(bootstrap, tmp_path, data, dict(FAST_REJOIN))
        stream = Stream(bootstrap, source, rate=3000).start()
        # Both ingests in the group: each worker's log names its source partitions.
        wait_until(
            lambda: all(b"ingest assigned" in w.log_path.read_bytes() for w in (first, second)),
            60,
            "both ingests assigned source partitions",
            second,
        )
        time.sleep(2)
        kill_frozen(first, freeze)
        releases = released_all(stream, rd, second)
    finally:
        if stream is not None:
            stream.close()
        for r in rd.values():
            r.close()
        first.stop()
        if second is not None:
            second.stop()
    check_exact(first.cfg, bootstrap, stream.events, releases)


def test_records_arriving_one_by_one_within_the_wait_go_out_as_one_batch(bootstrap):
    """``input.ingest_wait_ms``: once a batch's first record is there, the ingest waits
    for the batch to fill (up to ``ingest_batch`` records), so records that trickle in
    go to the events topic as one envelope per events partition, not one per record
    (all from source partition 0: an envelope holds one source partition's events)."""
    records = 40
    data = unique_names(config([], [{"name": "n", "epsilon": 1.0, "tau": TAU}], {}))
    # A wait far longer than the trickle takes: the batch ends when it is full.
    data["input"].update(partitions=4, ingest_batch=records, ingest_wait_ms=3_000)
    cfg = parse_config(data)
    create_source_topics(cfg, bootstrap)
    ensure_topics(cfg, bootstrap)
    ingest, stop = Ingest(cfg, bootstrap), threading.Event()
    running = threading.Thread(target=ingest.run, args=(stop,))
    running.start()
    producer = Producer({"bootstrap.servers": bootstrap})

    def send(user: str) -> None:
        producer.produce(cfg.input.topics[0], orjson.dumps({"user_id": user}), partition=0)
        producer.flush()  # each record its own produce request

    try:
        # A first record alone (it fills no batch: ingest_batch is 40), so that the
        # ingest is assigned and reading before the trickle starts.
        send("first")
        wait_until(lambda: ingest.events == 1, 60, "the ingest to send the first event")
        for i in range(records):
            send(f"u{i}")
            time.sleep(0.01)
        wait_until(lambda: ingest.events == 1 + records, 60, "the ingest to send every event")
    finally:
        stop.set()
        running.join(30)
    sent = read_topic(bootstrap, cfg.events_topic, cfg.input.partitions)
    envelopes = [decode_envelope(value) for rows in sent.values() for _, _, value, _ in rows]
    assert sum(len(e.events) for e in envelopes) == 1 + records
    assert len(envelopes) - 1 <= cfg.input.partitions


class FirstRecordSeen:
    """The ingest's consumer, telling when its first record came (confluent-kafka's
    consumer blocks other threads' calls while one is in ``consume``)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer, self.seen = consumer, threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.consumer, name)

    def poll(self, timeout: float) -> object:
        message = self.consumer.poll(timeout)
        if message is not None:
            self.seen.set()
        return message


def test_a_read_across_a_rebalance_sends_each_source_partition_in_order(bootstrap, monkeypatch):
    """A read that spans a rebalance holds a partition's records from before it, then the
    same partition again from its committed offset (none here: from the start). Each
    envelope must still be one run in source order, or stage 1 dead-letters it whole and
    its events are lost."""
    per_partition = 30
    data = unique_names(config([], [{"name": "n", "epsilon": 1.0, "tau": TAU}], {}))
    # One read of 10 s: a second member joins the group during it.
    data["input"].update(partitions=2, ingest_batch=100_000, ingest_wait_ms=10_000)
    cfg = parse_config(data)
    create_source_topics(cfg, bootstrap)
    ensure_topics(cfg, bootstrap)
    source = cfg.input.topics[0]
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(2):
        for i in range(per_partition):
            producer.produce(source, orjson.dumps({"user_id": f"u{i}"}), partition=partition)
    producer.flush()
    # Heartbeats every 0.3 s: the ingest learns of the rebalance well within its read.
    monkeypatch.setenv("BROKER_HEARTBEAT_INTERVAL", "0.3")
    monkeypatch.setenv("BROKER_SESSION_TIMEOUT", "6")
    ingest = Ingest(cfg, bootstrap)
    consumer = ingest._consumer = FirstRecordSeen(ingest._consumer)  # type: ignore[assignment]
    consumer.subscribe([source], on_assign=ingest._on_assign, on_revoke=ingest._on_revoke)
    reading = threading.Thread(target=ingest.step, args=(30.0,))
    reading.start()
    member = Consumer(consumer_config(cfg, bootstrap) | {"log_level": 0})
    try:
        assert consumer.seen.wait(30), "the ingest read no record"
        member.subscribe([source])  # joins the group: a rebalance during the ingest's read
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        reading.join(60)
        ingest._settle(0)
        kept = consumer.assignment()
    finally:
        member.close()
        ingest.close()
    assert len(kept) == 1  # the rebalance came during the read: one partition each
    sent = read_topic(bootstrap, cfg.events_topic, cfg.input.partitions)
    envelopes = [decode_envelope(value) for rows in sent.values() for _, _, value, _ in rows]
    # The partition the ingest kept, read twice in one batch: each record once, in order.
    mine = f"{source}/{kept[0].partition}"
    offsets = sorted(o for e in envelopes if e.source == mine for o in e.offsets)
    assert offsets == list(range(per_partition))


def test_a_worker_whose_ingest_process_dies_ends_at_once_with_status_70(bootstrap, tmp_path):
    """The worker's ingest child SIGKILLed: the worker would go on releasing ticks of
    nothing. It ends at once, with the internal-error exit status and a CRITICAL line
    saying how its ingest ended (Faust's own crash stop, used before, could hang)."""
    data, _ = counting_pipeline(bootstrap)
    worker = start(bootstrap, tmp_path, data)
    try:
        wait_until(lambda: b"ingest assigned" in worker.log_path.read_bytes(), 60, "ingest", worker)
        [pid] = set(re.findall(rb"\[ingest (\d+)\] ingest assigned", worker.log_path.read_bytes()))
        os.kill(int(pid), signal.SIGKILL)
        assert worker.proc.wait(60) == EXIT_INTERNAL_ERROR, worker.log_tail()
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
    text = worker.log_path.read_text(errors="replace")
    assert "CRITICAL" in text and "the ingest stopped (exit code -9); stopping the worker" in text


def test_ctrl_c_in_a_terminal_stops_the_worker_and_its_ingest_cleanly(bootstrap, tmp_path):
    """A terminal's Ctrl-C sends SIGINT to the worker's whole process group, its ingest
    child included: the worker shuts down, then stops its ingest, which closes cleanly
    (no KeyboardInterrupt halfway through a batch), and the worker exits 0."""
    data = unique_names(config([], [{"name": "n", "epsilon": 1.0, "tau": TAU}], {}))
    cfg = parse_config(data)
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(data))
    log = tmp_path / "worker.log"
    create_source_topics(cfg, bootstrap)
    cmd = [sys.executable, "-m", "dpstream.pipeline.tools.cli", "worker"]
    cmd += ["--config", str(path), "--bootstrap", bootstrap]
    with open(log, "wb") as out:  # its own process group, as a shell gives it
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(cfg, path, log, proc)
    rd = readers(bootstrap, worker)
    try:
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(20):
            producer.produce(cfg.input.topics[0], orjson.dumps({"user_id": f"u{i}"}))
        producer.flush()
        wait_until(lambda: latest(rd["n"]) == 20, 90, "the events released", worker)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0, worker.log_tail()
    finally:
        for r in rd.values():
            r.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert "KeyboardInterrupt" not in text and "Traceback" not in text, text[-3000:]


def test_a_stand_alone_ingest_with_another_partition_count_is_refused_at_start(bootstrap, tmp_path):
    """Its envelopes would go to partitions whose stage 1 does not own their users (one
    user counted on two partitions: twice its bound). ``dpstream ingest`` refuses to start,
    naming input.partitions, before it reads a record."""
    data, _ = counting_pipeline(bootstrap)
    create_source_topics(parse_config(data), bootstrap)
    ensure_topics(parse_config(data), bootstrap)  # the worker's topics: 4 partitions
    drifted = {**data, "input": {**data["input"], "partitions": 8}}
    ingest = start(bootstrap, tmp_path, drifted, command=("ingest",), name="-drifted")
    try:
        assert ingest.proc.wait(60) == 2, ingest.log_tail()
    finally:
        ingest.stop()
    events_topic = parse_config(data).events_topic
    assert (
        f"config error: input.partitions: topic {events_topic!r} has 4 partitions, "
        "the config says 8"
    ) in ingest.log_path.read_text()
    # It never read a record: its group committed nothing.
    assert all(
        row["committed"] is None for row in source_lag(parse_config(data), bootstrap).values()
    )


def test_a_rolling_change_that_adds_a_sum_counts_nothing_the_old_ingest_let_through(
    bootstrap, tmp_path
):
    """The worker runs the new configuration (a count and, new, a sum with R = 10); an
    ingest still on the old one (the count alone, which ignores values) sends it events
    with ``value: 1e6``. Stage 1 dead-letters every event of the old ingest's envelopes
    (another rules fingerprint) with the reason and the event's source position, the
    worker keeps running, and once the new ingest takes over the releases are the exact
    counts and clipped sums of what it sent (zero noise, tau above every user's total). A
    report of a statistic the new configuration removed is skipped, with one warning."""
    names = unique_names({})
    source = names["input"]["topics"][0]
    producers.create_source_topic(bootstrap, source, partitions=4)
    count = {"name": "n", "epsilon": 1.0, "tau": TAU}
    revenue = {"name": "revenue", "kind": "sum", "max_value": 10, "epsilon": 1.0, "tau": TAU}
    new = config([source], [count, revenue], names)
    old = config([source], [count], names)
    worker = start(bootstrap, tmp_path, new, command=("worker", "--ingest", "off"), name="-w")
    rd = readers(bootstrap, worker)
    ingests = []
    try:
        wait_until(lambda: latest(rd["n"]) is not None, 90, "the first release", worker)
        ingests.append(start(bootstrap, tmp_path, old, command=("ingest",), name="-old"))
        before = [{"user_id": f"u{i % 7}", "value": [1e6, 3][i % 2]} for i in range(20)]
        producers.produce_confluent_default(bootstrap, source, before, keyed=True)
        wait_until(
            lambda: len(rd["_dead"].drain()) >= len(before),
            90,
            "the old ingest's events dead-lettered",
            worker,
        )
        gone = Report("gone", 0, 0, 0, {"w": 5}).to_json()
        stage2 = Producer({"bootstrap.servers": bootstrap})
        for _ in range(2):  # a stage 1 whose configuration still has statistic "gone"
            stage2.produce(worker.cfg.stage2_topic, orjson.dumps(gone), key=b"gone")
        assert stage2.flush(30) == 0
        ingests[0].stop()
        assert ingests[0].proc.returncode == 0, ingests[0].log_tail()
        ingests.append(start(bootstrap, tmp_path, new, command=("ingest",), name="-new"))
        after = [{"user_id": f"u{i % 7}", "value": [1e6, 3, 7][i % 3]} for i in range(30)]
        producers.produce_confluent_default(bootstrap, source, after, keyed=True)
        # The new rules clip 1e6 into [0, 10]: every event counts, for both statistics.
        exact = (len(after), sum(min(e["value"], 10) for e in after))
        wait_until(
            lambda: (latest(rd["n"]), latest(rd["revenue"])) == exact,
            90,
            "the new ingest's events released",
            worker,
        )
        worker.assert_running()
        releases = {s.name: rd[s.name].records[:] for s in worker.cfg.statistics}
        dead = rd["_dead"].drain()
    finally:
        for r in rd.values():
            r.close()
        for ingest in ingests:
            ingest.stop()
        worker.stop()
    rules = {
        tag: rules_fingerprint(limits_for(parse_config(d)), 4)
        for tag, d in (("old", old), ("new", new))
    }
    refused = (
        f"stage 1: envelope made under other rules ({rules['old']}, this stage 1's: {rules['new']})"
    )
    by_stage1 = [d for d in dead if d["reason"].startswith("stage 1: ")]
    assert [d["reason"] for d in by_stage1] == [refused] * len(before)
    assert all(d["topic"] == source and d["index"] == 0 for d in by_stage1)
    assert sorted(d["payload"] for d in by_stage1) == sorted(
        orjson.dumps({"user_id": e["user_id"], "value": float(e["value"])}).decode() for e in before
    )
    by_ingest = [d["reason"] for d in dead if not d["reason"].startswith("stage 1: ")]
    assert by_ingest == []
    assert all(orjson.loads(r)["value"] >= 0 for rs in releases.values() for r in rs)
    text = worker.log_path.read_text(errors="replace")
    assert "internal error" not in text and "Traceback" not in text
    assert text.count("skipping reports of statistic gone") == 1
    assert_equal_to_replay(worker.cfg, bootstrap, releases, least=1)
