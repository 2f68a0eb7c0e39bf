"""dpstream against a real Kafka broker: throughput, release latency, memory (issue 7).

One command measures, in one run and on the same events, pre-produced into a SOURCE topic
(the users' topic, issue 14) by a plain confluent-kafka Producer:

  a. the ceiling: a plain consumer (aiokafka, confluent-kafka, and confluent-kafka with
     ``fetch.queue.backoff.ms=10``) reading and parsing the source topic;
  b. the naive peer: a plain Faust agent that only parses and counts, on the source topic;
  c. the dpstream pipeline end to end (the worker's ingest + stage 1 + stage 2 +
     releases), on single-event records and on batch envelopes, with the ingest in a
     child process or a thread of the worker (``--ingest-mode``);
  d. release latency (release time minus tick end) while events arrive at a fixed rate;
  e. the worker's peak RSS, its growth per user, and the bytes of state per user and per
     tree;
  f. in process: the ingest's routing (``ingest.route``) and stage 1 on the columnar
     envelopes it writes, in µs per event;

prints a table (events/s and each contender's ratio to the aiokafka and confluent-kafka
ceilings of the same run) and writes docs/benchmarks.md. The full mode adds three
diagnostic variants of the naive agent (with stage 1's table writes; with those writes'
changelog sent two cheaper ways), which split the pipeline's cost into Faust, state
writes and DP logic.
``--profile`` adds py-spy and cProfile profiles of the worker (section "Profile: <label>",
kept across runs with other labels, e.g. "before" and "after").

    .venv/bin/python -m bench.throughput                 # full: 3 runs, ~25 min today
    .venv/bin/python -m bench.throughput --quick         # 1 run, small sizes, ~2-3 min
    .venv/bin/python -m bench.throughput --profile --profile-label after
    .venv/bin/python -m bench.throughput --render RUN.json [OUT.md]  # re-render a --json run

The broker is ``KAFKA_BOOTSTRAP_SERVERS`` if set, else one started for the run
(``deploy/broker.py``). Definitions are in the document this writes ("How it is
measured"); this is a benchmark: nothing in the test suite asserts on its timings.
"""

from __future__ import annotations

import argparse
import importlib.resources
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    fmt_bytes,
    fmt_rate,
    linear_fit,
    loadavg,
    machine,
    median,
    percentile,
    proc_cpu_seconds,
    proc_status,
    spread,
)
from dpstream.config.schema import PipelineConfig, parse_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "DPSTREAM_BENCH_KEY"
CONTENDERS = (
    "aiokafka",
    "confluent",
    "confluent-backoff",
    "faust-naive",
    "faust-tables",
    "faust-batched",
    "faust-direct",
    "dpstream",
)
EXPERIMENTS = ("faust-tables", "faust-batched", "faust-direct")  # not in --quick
LABELS = {
    "aiokafka": "aiokafka consumer + orjson (ceiling)",
    "confluent": "confluent-kafka consumer + orjson",
    "confluent-backoff": "confluent-kafka consumer, fetch.queue.backoff.ms=10, + orjson",
    "faust-naive": "naive Faust agent (parse + count)",
    "faust-tables": "naive agent + stage 1's table writes, no DP",
    "faust-batched": "same writes, changelog sent as 1 batch per record",
    "faust-direct": "same writes, changelog sent by aiokafka's send()",
    "dpstream": "dpstream pipeline (ingest + stage 1 + 2 + releases)",
}
INGEST_MODES = ("process", "thread")
# Set from --worker-loglevel in main(): the dpstream worker's and the naive agent's level.
# "info" is the CLI default. At "warning" or above, faust.Worker keeps its terminal
# spinner, which sets the ROOT logger to DEBUG so that every aiokafka/Faust debug call
# builds a LogRecord (measured: 15-18% of the worker's main thread).
WORKER = {"loglevel": "info"}
PRODUCER_QUEUE = {
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_000_000,
}
# The source topics' producer: a plain confluent-kafka Producer as users have it, at its
# defaults but for lz4 (a pre-produced topic of several 100,000 records).
SOURCE_PRODUCER = {"compression.type": "lz4", "log_level": 0}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def shape_name(batch: int) -> str:
    return "single-event records" if batch <= 1 else f"envelopes of {batch}"


# --------------------------------------------------------------------------- configs


def base_config(path: Path | None) -> dict:
    if path is not None:
        return yaml.safe_load(path.read_text())
    text = importlib.resources.files("dpstream.config").joinpath("demo.yaml").read_text()
    return yaml.safe_load(text)


def run_config(base: dict, tag: str, topic: str | None, tick: float, partitions: int) -> dict:
    """``base`` with its own app id and output topics (so runs never share state), the
    given source topic (else one of its own), and a keyed noise source whose key is in
    ``$DPSTREAM_BENCH_KEY``."""
    run = f"{tag}-{uuid.uuid4().hex[:6]}"
    data = dict(base)
    data["app_id"] = f"bench-{run}"
    data["input"] = {k: v for k, v in base.get("input", {}).items() if k != "topic"}
    data["input"]["topics"] = [topic or f"bench-{run}.source"]
    data["input"]["partitions"] = partitions
    data["ticks"] = {**base.get("ticks", {}), "interval_seconds": tick}
    data["outputs"] = {
        "release_topic_prefix": f"bench-{run}.dp.",
        "dead_letter_topic": f"bench-{run}.dead-letter",
        "ledger_topic": f"bench-{run}.ledger",
    }
    data["noise"] = {"mode": "keyed", "key_env": KEY_ENV}
    return data


def write_config(data: dict, workdir: Path) -> tuple[PipelineConfig, Path]:
    cfg = parse_config(data, "benchmark config")
    path = workdir / f"{cfg.app_id}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg, path


# --------------------------------------------------------------------------- datasets


@dataclass
class Dataset:
    """A source topic, pre-produced and committed: what the ceilings and the naive agent
    read. The pipeline runs read copies of it (``hold_source``)."""

    batch: int
    topic: str
    partitions: int
    events: int
    records: int
    ends: dict[int, int]
    produce_seconds: float


# (key, value, headers) of each source record, serialized once per dataset.
Message = tuple[bytes | None, bytes, list | None]


def synthetic(users: int, count: int, seed: int) -> Iterator[dict]:
    from dpstream.pipeline.synthetic import synthetic_events

    return synthetic_events(users, count, seed=seed)


def cycle_users(users: int, events: int) -> Iterator[dict]:
    """``events`` events from users 0..users-1 in turn, keys alternating view/click per
    round (memory runs: the same log length whatever the number of users)."""
    for i in range(events):
        u, j = i % users, i // users
        yield {"user_id": f"user-{u:07d}", "key": "click" if (u + j) % 2 else "view"}


def round_robin(users: int, per_user: int) -> Iterator[dict]:
    """Every user ``per_user`` times, keys alternating view/click."""
    for j in range(per_user):
        for u in range(users):
            yield {"user_id": f"user-{u:07d}", "key": "click" if (u + j) % 2 else "view"}


def messages(events: Iterator[dict], batch: int) -> tuple[list[Message], int]:
    """Source records for ``events``: single-event records keyed by user id (batch 1),
    else our batch envelopes (JSON arrays, header ``dpstream: batch``, no key), as
    ``clients.produce_events`` writes them; and the number of events."""
    from dpstream.pipeline.records import BATCH, HEADER

    out: list[Message] = []
    n = 0
    if batch <= 1:
        for e in events:
            out.append((str(e["user_id"]).encode(), orjson.dumps(e), None))
            n += 1
        return out, n
    buffer: list[dict] = []
    for e in events:
        buffer.append(e)
        n += 1
        if len(buffer) >= batch:
            out.append((None, orjson.dumps(buffer), [(HEADER, BATCH)]))
            buffer = []
    if buffer:
        out.append((None, orjson.dumps(buffer), [(HEADER, BATCH)]))
    return out, n


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-offsets", "log_level": 0})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


def create_source(bootstrap: str, topic: str, partitions: int) -> None:
    """The source topic, as a user would have it: broker defaults, ``partitions``."""
    from confluent_kafka.admin import AdminClient, NewTopic

    client = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    if topic in client.list_topics(timeout=30).topics:
        return
    for future in client.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result()


def produce_source(producer, topic: str, msgs: list[Message]) -> None:
    for key, value, headers in msgs:
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers)
                break
            except BufferError:  # the default queue (100,000 messages) is full
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("pre-producing: messages still queued after 300 s")


def preproduce(
    bootstrap: str, topic: str, partitions: int, msgs: list[Message], events: int, batch: int
) -> Dataset:
    """Write the records into the source topic ``topic`` with a plain confluent-kafka
    Producer (defaults but lz4; single events keyed by user id: librdkafka's default
    partitioner, consistent_random over CRC32, picks the partition)."""
    from confluent_kafka import Producer

    create_source(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, **SOURCE_PRODUCER})
    started = time.perf_counter()
    produce_source(producer, topic, msgs)
    seconds = time.perf_counter() - started
    ends = end_offsets(bootstrap, topic, partitions)
    return Dataset(
        batch=batch,
        topic=topic,
        partitions=partitions,
        events=events,
        records=sum(ends.values()),
        ends=ends,
        produce_seconds=seconds,
    )


def hold_source(bootstrap: str, topic: str, partitions: int, msgs: list[Message]):
    """The same records as ``preproduce`` (same producer settings plus a transactional id)
    into ``topic``, inside a transaction left open: a read_committed consumer, as the
    ingest's is (librdkafka's default), sees none of them until ``commit_transaction``, so
    a worker can start up first and then find the whole backlog at once. Returns the
    producer, to commit."""
    from confluent_kafka import Producer

    create_source(bootstrap, topic, partitions)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **SOURCE_PRODUCER,
            "transactional.id": f"bench-hold-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 600_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    produce_source(producer, topic, msgs)
    return producer


# --------------------------------------------------------------------------- watching a worker


class Watcher:
    """Reads a pipeline's release topics and its stage-2 topic from the start, and with
    ``events`` also dpstream's events topic (the ingest's envelopes and the clock's
    markers), to find the tick that holds the last of ``events`` events.

    Timestamps are the records' CreateTime (set by the worker's producer when it sent
    them) or, on the events topic, LogAppendTime (the broker's), so they do not depend on
    how fast this process polls.
    """

    def __init__(self, bootstrap: str, cfg: PipelineConfig, events: int | None = None) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.cfg = cfg
        self.stats = [s.name for s in cfg.statistics]
        self.release_topics = {cfg.release_topic(s): s for s in self.stats}
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-watch-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        tps = [TopicPartition(t, 0, 0) for t in self.release_topics]
        tps += [TopicPartition(cfg.stage2_topic, p, 0) for p in range(cfg.input.partitions)]
        self.expect = events
        if events is not None:
            tps += [TopicPartition(cfg.events_topic, p, 0) for p in range(cfg.input.partitions)]
        self.consumer.assign(tps)
        # statistic -> tick -> (CreateTime in s, seen at in s)
        self.releases: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
        # tick -> [CreateTime in s] of stage-1 reports that end at that tick
        self.reports: dict[int, list[float]] = defaultdict(list)
        self.on_report: Callable[[int], None] | None = None
        # The events topic: events in envelopes so far, the first and last envelope's
        # append time, per partition its last envelope's offset and its markers.
        self.ingested = 0
        self.first_envelope = math.inf
        self.last_envelope = 0.0
        self.last_offset: dict[int, int] = {}
        self.markers: dict[int, list[tuple[int, int, float]]] = defaultdict(list)

    def poll(self, timeout: float) -> None:
        from dpstream.pipeline.records import ENVELOPE, TICK, header_kind

        for msg in self.consumer.consume(num_messages=10_000, timeout=timeout):
            if msg.error():
                continue
            ts = msg.timestamp()[1] / 1000
            topic = msg.topic()
            if topic == self.cfg.events_topic:
                kind = header_kind(msg.headers())
                if kind == ENVELOPE:
                    self.ingested += len(orjson.loads(msg.value())["o"])
                    self.first_envelope = min(self.first_envelope, ts)
                    self.last_envelope = max(self.last_envelope, ts)
                    self.last_offset[msg.partition()] = msg.offset()
                elif kind == TICK:
                    tick = orjson.loads(msg.value())["tick"]
                    self.markers[msg.partition()].append((msg.offset(), tick, ts))
                continue
            obj = orjson.loads(msg.value())
            if topic in self.release_topics:
                self.releases[obj["statistic"]][obj["tick"]] = (ts, time.time())
            else:
                self.reports[obj["tick"]].append(ts)
                if self.on_report is not None:
                    self.on_report(obj["tick"])

    def closing(self) -> tuple[int, float] | None:
        """Once every event is in the events topic and each partition has a marker after
        its last envelope: the latest such marker's tick (its release holds the last
        event) and its append time; else None."""
        if self.expect is None or self.ingested < self.expect:
            return None
        out = (-1, 0.0)
        for partition, last in self.last_offset.items():
            after = [(t, ts) for offset, t, ts in self.markers[partition] if offset > last]
            if not after:
                return None
            out = max(out, min(after))
        return out

    def released(self, tick: int) -> bool:
        return all(tick in self.releases[s] for s in self.stats)

    def any_release(self) -> bool:
        return any(self.releases[s] for s in self.stats)

    def wait(
        self, done: Callable[[], bool], timeout: float, what: str, proc: subprocess.Popen, logf
    ) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited while waiting for {what}:\n{tail(logf)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout:.0f} s; worker log:\n{tail(logf)}")
            self.poll(0.05)

    def close(self) -> None:
        self.consumer.close()


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    from dpstream.pipeline.worker_support import stop_worker

    stop_worker(proc, timeout)


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a process-mode worker's ingest)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (the worker and its ingest process)."""
    return sum(proc_cpu_seconds(p) or 0.0 for p in [pid, *children(pid)])


def ingest_assigned(bootstrap: str, cfg: PipelineConfig, timeout: float = 120.0) -> None:
    """Wait until the ingest's consumer group holds every source partition."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    group = f"{cfg.app_id}-ingest"
    deadline = time.monotonic() + timeout
    while True:
        try:
            desc = client.describe_consumer_groups([group])[group].result()
            held = {
                (tp.topic, tp.partition)
                for m in desc.members
                for tp in m.assignment.topic_partitions
            }
            if desc.state == ConsumerGroupState.STABLE and len(held) >= cfg.input.partitions:
                return
        except Exception:  # noqa: S110 - the group does not exist yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ingest group {group} did not get its partitions")
        time.sleep(0.2)


# --------------------------------------------------------------------------- contenders


def run_ceiling(client: str, bootstrap: str, ds: Dataset) -> dict:
    ends = orjson.dumps({str(p): e for p, e in ds.ends.items()}).decode()
    cmd = [sys.executable, "-m", "bench.ceiling", client, "--bootstrap", bootstrap]
    cmd += ["--topic", ds.topic, "--ends", ends]
    out = subprocess.run(  # noqa: S603 - fixed argument list
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{client} ceiling failed:\n{out.stderr[-3000:]}")
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    if res["events"] != ds.events:
        raise RuntimeError(f"{client} read {res['events']} events, expected {ds.events}")
    return res


def run_naive(
    bootstrap: str, ds: Dataset, workdir: Path, tables: str = "none", cprofile: Path | None = None
) -> dict:
    """``cprofile``: also write a cProfile of the agent's main thread (first record to last
    event) there (``NAIVE_CPROFILE``, bench/naive_agent.py)."""
    result = workdir / f"naive-{uuid.uuid4().hex[:8]}.json"
    env = {**os.environ, **({"NAIVE_CPROFILE": str(cprofile)} if cprofile else {})}
    logf = result.with_suffix(".log")
    cmd = [sys.executable, "-m", "bench.naive_agent", "--bootstrap", bootstrap]
    cmd += ["--topic", ds.topic, "--partitions", str(ds.partitions)]
    cmd += ["--expect", str(ds.events), "--result", str(result)]
    cmd += ["--loglevel", WORKER["loglevel"], "--tables", tables]
    with open(logf, "wb") as fh:
        proc = subprocess.Popen(  # noqa: S603 - fixed argument list
            cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 900
        while not result.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"naive Faust agent exited:\n{tail(logf)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"naive Faust agent did not finish:\n{tail(logf)}")
            time.sleep(0.05)
        res = orjson.loads(result.read_bytes())
        res["peak_rss"] = proc_status(proc.pid).get("VmHWM")
        return res
    finally:
        stop(proc)


def spawn(
    config_path: Path,
    bootstrap: str,
    log_path: Path,
    env: dict[str, str],
    ingest: str | None,
    stats: Path | None = None,
) -> subprocess.Popen:
    """``dpstream worker`` (``ingest``: its ``--ingest`` mode; None: the worker's default);
    with ``stats``, under ``bench/cprofile_worker.py`` writing there."""
    cmd = [sys.executable, "-m"]
    cmd += ["bench.cprofile_worker", str(stats)] if stats else ["dpstream.pipeline.cli"]
    cmd += ["worker", "--config", str(config_path), "--bootstrap", bootstrap]
    cmd += ["--loglevel", WORKER["loglevel"]]
    if ingest:
        cmd += ["--ingest", ingest]
    with open(log_path, "wb") as fh:
        return subprocess.Popen(  # noqa: S603 - fixed argument list
            cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )


def run_pipeline(
    bootstrap: str,
    base: dict,
    ds: Dataset,
    msgs: list[Message],
    workdir: Path,
    tick: float,
    env: dict[str, str],
    ingest: str | None = None,
    profile: tuple[str, Path] | None = None,
    profile_rate: int = 100,
) -> dict:
    """A dpstream worker over a source topic of its own holding ``msgs`` (the dataset's
    records, the same producer), written in a transaction left open (``hold_source``).
    Once the worker runs (its first release is out, its ingest holds every source
    partition), the transaction is committed: the whole backlog becomes visible at once.
    Time = from that commit to the release of the tick holding the last event (the first
    marker after the last envelope in every events partition: ``Watcher.closing``).

    ``profile``: ("pyspy", raw output file) attaches py-spy over that span (and a second
    one to a process-mode ingest, ``<file>.ingest``); ("cprofile", stats file) runs the
    worker under ``bench/cprofile_worker.py`` and switches cProfile on and off at the same
    two moments (its main thread only).
    """
    from dpstream.pipeline.topics import ensure_topics

    cfg, path = write_config(run_config(base, "p", None, tick, ds.partitions), workdir)
    ensure_topics(cfg, bootstrap)  # the source topic too
    source = cfg.input.topics[0]
    producer = hold_source(bootstrap, source, ds.partitions, msgs)
    watcher = Watcher(bootstrap, cfg, events=ds.events)
    logf = workdir / f"{cfg.app_id}.log"
    spawned = time.time()
    kind, out = profile or ("", Path())
    proc = spawn(path, bootstrap, logf, env, ingest, out if kind == "cprofile" else None)
    spies: list[subprocess.Popen] = []
    try:
        watcher.wait(watcher.any_release, 180, "a first release", proc, logf)
        ingest_assigned(bootstrap, cfg)
        ready = time.time()
        cpu0 = tree_cpu_seconds(proc.pid)
        if kind == "pyspy":
            targets = [(proc.pid, out)] + [
                (child, out.with_suffix(".ingest.txt")) for child in children(proc.pid)
            ]
            for pid, to in targets:
                cmd = [py_spy() or "py-spy", "record", "--pid", str(pid), "--threads"]
                cmd += ["--idle", "-f", "raw", "-r", str(profile_rate), "-o", str(to)]
                spies.append(
                    subprocess.Popen(  # noqa: S603 - fixed argument list
                        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                )
            time.sleep(0.5)  # attached
        elif kind == "cprofile":
            proc.send_signal(signal.SIGRTMIN + 1)
        producer.commit_transaction(30)
        start = time.time()  # every event is visible to the ingest from now on
        watcher.wait(lambda: watcher.closing() is not None, 1800, "every event", proc, logf)
        last, marker = watcher.closing() or (-1, 0.0)
        watcher.wait(lambda: watcher.released(last), 600, f"release of tick {last}", proc, logf)
        cpu1, wall1 = tree_cpu_seconds(proc.pid), time.time()
        mem = proc_status(proc.pid)
        ingest_mem = [proc_status(c) for c in children(proc.pid)]
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        if kind == "cprofile":
            proc.send_signal(signal.SIGRTMIN + 2)
            watcher.wait(out.exists, 60, "the cProfile stats", proc, logf)
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.kill()
        stop(proc)
        watcher.close()
    end = max(watcher.releases[s][last][0] for s in watcher.stats)
    dead = sum(end_offsets(bootstrap, cfg.outputs.dead_letter_topic, 1).values())
    return {
        "events": ds.events,
        "records": ds.records,
        "ingest": ingest or "default",
        "seconds": end - start,
        # From the commit to the first / last envelope in the events topic, and from the
        # last envelope to the closing tick's marker (a wait when stage 1 had caught up).
        "first_envelope_seconds": watcher.first_envelope - start,
        "ingest_seconds": watcher.last_envelope - start,
        "marker_wait_seconds": max(0.0, marker - watcher.last_envelope),
        "cpu_seconds": cpu1 - cpu0,
        "cpu_wall_seconds": wall1 - start,
        "startup_seconds": ready - spawned,
        "peak_rss": mem.get("VmHWM"),
        "rss": mem.get("VmRSS"),
        "ingest_peak_rss": max((m.get("VmHWM", 0) for m in ingest_mem), default=None),
        "dead_letters": dead,
    }


# --------------------------------------------------------------------------- latency


def run_latency(
    bootstrap: str,
    base: dict,
    workdir: Path,
    env: dict[str, str],
    *,
    batch: int,
    rate: float,
    seconds: float,
    tick: float,
    users: int,
    partitions: int,
    seed: int,
    wait: float,
    ingest: str | None = None,
) -> dict:
    """Produce ``rate`` events/s for ``seconds`` into a running worker's source topic
    (a plain confluent-kafka Producer, as ``preproduce``: single events keyed by user, or
    batch envelopes); for every tick that lies wholly inside the production window,
    latency = release CreateTime - tick end. Waits at most ``wait`` s after production for
    the last of those ticks."""
    from confluent_kafka import Producer

    from dpstream.pipeline.topics import ensure_topics

    cfg, path = write_config(run_config(base, "l", None, tick, partitions), workdir)
    ensure_topics(cfg, bootstrap)
    source = cfg.input.topics[0]
    watcher = Watcher(bootstrap, cfg)
    logf = workdir / f"{cfg.app_id}.log"
    proc = spawn(path, bootstrap, logf, env, ingest)
    producer = Producer({"bootstrap.servers": bootstrap, **SOURCE_PRODUCER})
    total = int(rate * seconds)
    step = 0.05  # produce every 50 ms what is due: envelopes hold <= rate*step events
    events = list(synthetic(users, total, seed))
    try:
        watcher.wait(watcher.any_release, 180, "a first release", proc, logf)
        ingest_assigned(bootstrap, cfg)
        cpu0 = tree_cpu_seconds(proc.pid)
        start = time.time()
        sent = 0
        while sent < total:
            due = min(total, int((time.time() - start) * rate)) - sent
            if due > 0:
                msgs, n = messages(iter(events[sent : sent + due]), batch)
                produce_source_nowait(producer, source, msgs)
                sent += n
            producer.poll(0)
            watcher.poll(0)
            elapsed = time.time() - start
            time.sleep(max(0.0, (math.floor(elapsed / step) + 1) * step - elapsed))
        producer.flush(60)
        end = time.time()
        first, last = math.ceil(start / tick), math.floor(end / tick) - 1
        released_all = True
        try:
            watcher.wait(lambda: watcher.released(last), wait, "the last releases", proc, logf)
        except TimeoutError:
            released_all = False
        cpu1 = tree_cpu_seconds(proc.pid)
        wall1 = time.time()
        mem = proc_status(proc.pid)
    finally:
        stop(proc)
        watcher.close()
    # Latency of every (statistic, tick); one not released by wall1 counts with the lower
    # bound wall1 - tick end (censored). Per tick: its slowest statistic.
    lat, per_tick, censored = [], [], 0
    for t in range(first, last + 1):
        got = [watcher.releases[s].get(t) for s in watcher.stats]
        row = [(g[0] if g else wall1) - (t + 1) * tick for g in got]
        censored += not all(got)
        lat += row
        per_tick.append(max(row))
    # Growth over the released ticks only (a censored value is a bound, not a latency).
    released = [
        x
        for t, x in zip(range(first, last + 1), per_tick, strict=True)
        if all(watcher.releases[s].get(t) for s in watcher.stats)
    ]
    third = max(1, len(released) // 3)
    growth = (
        median(released[-third:]) - median(released[:third]) if len(released) >= 2 else math.nan
    )
    return {
        "batch": batch,
        "rate": rate,
        "ingest": ingest or "default",
        "achieved_rate": total / (end - start),
        "ticks": last - first + 1,
        "samples": len(lat),
        "censored_ticks": censored,
        "growth": growth,
        "kept_up": released_all and censored == 0 and not growth >= tick,
        "p50": percentile(lat, 50),
        "p99": percentile(lat, 99),
        "max": max(lat) if lat else math.nan,
        "cpu_share": (cpu1 - cpu0) / (wall1 - start),
        "peak_rss": mem.get("VmHWM"),
    }


def produce_source_nowait(producer, topic: str, msgs: list[Message]) -> None:
    for key, value, headers in msgs:
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)


# --------------------------------------------------------------------------- memory


def run_memory(
    bootstrap: str,
    base: dict,
    workdir: Path,
    env: dict[str, str],
    *,
    users: int,
    events: int,
    batch: int,
    tick: float,
    partitions: int,
    ingest: str | None = None,
) -> dict:
    """A worker over ``events`` events from ``users`` users; its RSS once the last event's
    tick is released."""
    msgs, n = messages(cycle_users(users, events), batch)
    ds = Dataset(batch, "", partitions, n, len(msgs), {}, 0.0)
    res = run_pipeline(bootstrap, base, ds, msgs, workdir, tick, env, ingest)
    return {"users": users, **res}


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(deep_size(getattr(obj, a), seen) for a in obj.__slots__ if hasattr(obj, a))
    elif hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    return size


def state_constants(base: dict, users: int, per_user: int, tree_ticks: list[int]) -> dict:
    """Bytes of state per user (stage 1) and per statistic (stage 2), in process.

    Drives ``Stage1`` / ``Stage2`` the way ``pipeline/replay.py`` does (envelopes decoded by
    ``records.decode_events``, reports from ``Stage1.close_tick``), with plain dicts where
    the worker has Faust tables (the memory store keeps table values as these same Python
    objects). Per user: tracemalloc growth of the ``users`` mapping after
    ``users * per_user`` events, and the mean changelog record (orjson key + value). Per
    statistic: its stage-2 state after t ticks (one event per tick), as orjson (the
    changelog record) and as Python objects, plus the keyed-noise cache.
    """
    from dpstream.operators.noise import KeyedNoise
    from dpstream.pipeline.records import BATCH, decode_events
    from dpstream.pipeline.stages import Stage1, Stage2
    from dpstream.pipeline.worker_support import limits_for

    cfg = parse_config(run_config(base, "s", None, 1.0, 4), "benchmark config")
    limits = limits_for(cfg)
    stage1 = Stage1(cfg)
    pstate = Stage1.new_partition_state()
    table: dict[str, dict] = {}

    def feed(envelope: list[dict], offset: int) -> None:
        events, bad = decode_events(orjson.dumps(envelope), BATCH, limits)
        assert not bad, bad
        stage1.add_events(pstate, table, events, offset)
        pstate["last_offset"] = offset

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    offset, chunk = 0, []
    for e in round_robin(users, per_user):
        chunk.append(e)
        if len(chunk) == 100:
            feed(chunk, offset)
            chunk, offset = [], offset + 1
    if chunk:
        feed(chunk, offset)
    chunk = []
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    changelog = sum(len(orjson.dumps(k)) + len(orjson.dumps(v)) for k, v in table.items())
    example = next(iter(table.items()))
    del table

    trees, caches = [], []
    for t_max in tree_ticks:
        stage1, table = Stage1(cfg), {}
        pstate = Stage1.new_partition_state()
        stage2 = Stage2(cfg, KeyedNoise(bytes(32)), partitions=1)
        sstates = {s.name: Stage2.new_state() for s in cfg.statistics}
        for t in range(1, t_max + 1):
            feed([{"user_id": f"user-{t % 1000}", "key": "click"}], t)
            for report in stage1.close_tick(pstate, 0, t):
                stage2.on_report(sstates[report.statistic], report)
        cache = getattr(stage2._noise, "_cache", {})  # measuring it, not using it
        caches.append(
            {
                "ticks": t_max,
                "entries": len(cache),
                "bytes": deep_size(cache),
                "max": getattr(stage2._noise, "maxsize", 0),
            }
        )
        for stat in cfg.statistics:
            sstate = sstates[stat.name]
            trees.append(
                {
                    "statistic": stat.name,
                    "mechanism": stat.mechanism,
                    "ticks": t_max,
                    "json_bytes": len(orjson.dumps(sstate)),
                    "python_bytes": deep_size(sstate),
                    "tree_json_bytes": len(orjson.dumps(sstate.get("tree"))),
                }
            )
    return {
        "users": users,
        "per_user": per_user,
        "python_bytes_per_user": grown / users,
        "changelog_bytes_per_user": changelog / users,
        "example_entry": orjson.dumps({example[0]: example[1]}).decode(),
        "trees": trees,
        "noise_cache": caches,
    }


def source_records(msgs: list[Message], partitions: int, topic: str = "bench.source") -> list:
    """``msgs`` as the ingest's consumer hands them over (``ingest.SourceRecord``): keyed
    records in the partition librdkafka's default partitioner picks (CRC32 of the key),
    unkeyed ones round-robin; offsets per partition; interleaved by partition in chunks
    of 500, as fetches return them."""
    import zlib

    from dpstream.pipeline.ingest import SourceRecord

    per: list[list] = [[] for _ in range(partitions)]
    for i, (key, value, headers) in enumerate(msgs):
        p = zlib.crc32(key) % partitions if key is not None else i % partitions
        per[p].append(SourceRecord(topic, p, len(per[p]), headers, value))
    out: list = []
    for start in range(0, max(map(len, per)), 500):
        for records in per:
            out += records[start : start + 500]
    return out


def ingest_micro(base: dict, users: int, events: int, batches: list[int], seed: int) -> dict:
    """The ingest's own Python cost per event, no Kafka: ``ingest.route`` (decode and
    validate each source record, murmur2 per user, columnar envelopes) over records as the
    consumer returns them, in the worker's ``input.ingest_batch`` chunks. Per shape
    (1 = single-event records): µs per event, and the envelopes it writes."""
    from dpstream.pipeline.ingest import route
    from dpstream.pipeline.worker_support import limits_for

    cfg = parse_config(run_config(base, "s", None, 1.0, 4), "benchmark config")
    limits, partitions, chunk = limits_for(cfg), cfg.input.partitions, cfg.input.ingest_batch
    out = {"events": events, "ingest_batch": chunk, "shapes": {}}
    for batch in batches:
        msgs, n = messages(synthetic(users, events, seed), batch)
        records = source_records(msgs, partitions)
        t = time.perf_counter()
        envelopes = routed = 0
        for start in range(0, len(records), chunk):
            r = route(records[start : start + chunk], limits, partitions)
            envelopes += len(r.envelopes)
            routed += r.events
        seconds = time.perf_counter() - t
        assert routed == n, (routed, n)
        out["shapes"][str(batch)] = {
            "route_us": 1e6 * seconds / n,
            "envelopes": envelopes,
            "events_per_envelope": n / max(1, envelopes),
        }
    return out


def stage1_micro(base: dict, users: int, events: int, batch: int, seed: int) -> dict:
    """Stage 1's own Python cost per event, no Kafka and no Faust: what ``handle_input``
    does with an envelope of the events topic (``records.decode_envelope``,
    ``Stage1Driver.unseen``, ``Stage1Driver.on_events``, i.e. ``Stage1.add_events``, with a
    dict as the table), over the columnar envelopes the ingest writes (``ingest.route`` of
    the same synthetic events, in source records of ``batch`` events, 1 = single-event
    records)."""
    from dpstream.pipeline.drivers import Stage1Driver
    from dpstream.pipeline.ingest import route
    from dpstream.pipeline.records import decode_envelope
    from dpstream.pipeline.stages import Stage1
    from dpstream.pipeline.worker_support import limits_for

    cfg = parse_config(run_config(base, "s", None, 1.0, 4), "benchmark config")
    limits, partitions, chunk = limits_for(cfg), cfg.input.partitions, cfg.input.ingest_batch
    msgs, _ = messages(synthetic(users, events, seed), batch)
    records = source_records(msgs, partitions)
    envelopes: list[tuple[int, bytes]] = []
    for start in range(0, len(records), chunk):
        envelopes += route(records[start : start + chunk], limits, partitions).envelopes
    t = time.perf_counter()
    for _, raw in envelopes:
        orjson.loads(raw)
    t_json = time.perf_counter() - t
    t = time.perf_counter()
    decoded = [decode_envelope(raw) for _, raw in envelopes]
    t_decode = time.perf_counter() - t
    n = sum(len(e.events) for e in decoded)
    driver = Stage1Driver(cfg)
    pstates = {p: Stage1.new_partition_state() for p in range(partitions)}
    t = time.perf_counter()
    fresh = [
        Stage1Driver.unseen(pstates[p], env) for (p, _), env in zip(envelopes, decoded, strict=True)
    ]
    t_unseen = time.perf_counter() - t
    table: dict = {}
    t = time.perf_counter()
    for offset, ((p, _), evs) in enumerate(zip(envelopes, fresh, strict=True)):
        driver.on_events(pstates[p], table, p, offset, evs, [])
        Stage1Driver.done(pstates[p], offset)
    t_add = time.perf_counter() - t
    return {
        "events": n,
        "batch": batch,
        "envelopes": len(envelopes),
        "orjson_us": 1e6 * t_json / n,
        "decode_us": 1e6 * t_decode / n,
        "unseen_us": 1e6 * t_unseen / n,
        "add_us": 1e6 * t_add / n,
        "writes_per_event": sum(len({e.user_id for e in env.events}) for env in decoded) / n,
    }


# --------------------------------------------------------------------------- report


@dataclass
class Results:
    args: argparse.Namespace
    info: dict
    kafka: str
    load_start: str
    load_end: str = ""
    datasets: dict[int, Dataset] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)  # {run, batch, contender, ...}
    latency: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    constants: dict | None = None
    micro: dict | None = None
    ingest_micro: dict | None = None
    profiles: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    commit: str = ""
    date: str = ""

    def rows(self, batch: int, contender: str) -> list[dict]:
        return [r for r in self.runs if r["batch"] == batch and r["contender"] == contender]

    def ratio(self, batch: int, contender: str, reference: str = "aiokafka") -> list[float]:
        """Per run: contender events/s over reference events/s in the same run."""
        ref = {r["run"]: r["rate"] for r in self.rows(batch, reference)}
        return [r["rate"] / ref[r["run"]] for r in self.rows(batch, contender) if r["run"] in ref]

    def contenders(self) -> list[str]:
        """Row names: the contenders, the pipeline once per ingest mode when several."""
        out = []
        for c in self.args.contenders:
            out += pipeline_names(self.args) if c == "dpstream" else [c]
        return out


def pipeline_names(args: argparse.Namespace) -> list[str]:
    modes = args.ingest_modes
    return ["dpstream"] if len(modes) == 1 else [f"dpstream-{m}" for m in modes]


def label(name: str, args: argparse.Namespace) -> str:
    if name.startswith("dpstream"):
        mode = name.partition("-")[2] or args.ingest_modes[0]
        where = "worker's default" if mode == "default" else mode
        return f"{LABELS['dpstream']}, ingest: {where}"
    return LABELS[name]


def pipeline_rows(res: Results, batch: int) -> list[dict]:
    return [r for r in res.runs if r["batch"] == batch and r["contender"].startswith("dpstream")]


def throughput_table(res: Results) -> str:
    lines = [
        "| input | contender | events | events/s (median) | spread (min-max) | runs "
        "| ratio to aiokafka (median) | ratio to confluent-kafka (median) | CPU µs/event "
        "| peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for batch, ds in res.datasets.items():
        for contender in res.contenders():
            rows = res.rows(batch, contender)
            if not rows:
                continue
            rates = [r["rate"] for r in rows]
            lo, hi = spread(rates)
            ratio = median(res.ratio(batch, contender))
            ratio_c = median(res.ratio(batch, contender, "confluent"))
            cpu = median(1e6 * r["cpu_seconds"] / r["events"] for r in rows)
            rss = median(r.get("peak_rss") or math.nan for r in rows)
            lines.append(
                f"| {shape_name(batch)} | {label(contender, res.args)} | {ds.events:,} "
                f"| {fmt_rate(median(rates))} | {fmt_rate(lo)}-{fmt_rate(hi)} | {len(rows)} "
                f"| {ratio:.3f} | {ratio_c:.3f} | {cpu:.1f} | {fmt_bytes(rss)} |"
            )
    return "\n".join(lines)


def latency_table(res: Results) -> str:
    if not res.latency:
        return "(not measured in this run)"
    lines = [
        "| input | target rate | achieved | ticks | samples | p50 s | p99 s | max s "
        "| p99 / tick | growth s | kept up | worker CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    tick = res.args.tick
    for r in res.latency:
        kept = "yes" if r["kept_up"] else "NO"
        if r["censored_ticks"]:
            kept += f" ({r['censored_ticks']} ticks unreleased: lower bounds)"
        lines.append(
            f"| {shape_name(r['batch'])} | {fmt_rate(r['rate'])}/s "
            f"| {fmt_rate(r['achieved_rate'])}/s | {r['ticks']} | {r['samples']} "
            f"| {r['p50']:.3f} | {r['p99']:.3f} | {r['max']:.3f} | {r['p99'] / tick:.2f} "
            f"| {r['growth']:+.2f} | {kept} | {100 * r['cpu_share']:.0f}% |"
        )
    return "\n".join(lines)


def memory_section(res: Results) -> str:
    out = []
    if res.memory:
        out.append(
            f"Each run: a fresh worker over a log of {res.args.memory_events:,} events (envelopes "
            "of up to the largest `--batch`) from N users taking turns; VmRSS and VmHWM read "
            "from /proc once T1 is released. Every run has the same log length and, with N "
            "at least partitions x envelope size, the same number of table writes (every "
            "envelope holds distinct users), so the slope over N is the memory per user and "
            "the intercept is the worker's baseline plus the high-water of its transient "
            "allocations. The latter is large for a pre-produced log: the changelog writes "
            "the worker makes while racing through a backlog wait in Faust's and aiokafka's "
            "producer buffers (several KB each, with their futures) until sent, and the "
            "allocator keeps the arenas afterwards. Not a leak: checked by hand once (commit "
            "cd41d99), a worker that had processed a 10,000-event log (170 MiB) stayed at "
            "167 MiB while fed four more logs of the same size."
        )
        lines = [
            "| users | events | worker VmRSS after the log | peak RSS (VmHWM) |",
            "|---:|---:|---:|---:|",
        ]
        for m in res.memory:
            lines.append(
                f"| {m['users']:,} | {m['events']:,} | {fmt_bytes(m['rss'])} "
                f"| {fmt_bytes(m['peak_rss'])} |"
            )
        out.append("\n".join(lines))
        if len(res.memory) >= 2:
            xs = [m["users"] for m in res.memory]
            for key, name in (("rss", "VmRSS"), ("peak_rss", "peak RSS")):
                slope, icpt = linear_fit(xs, [m[key] for m in res.memory])
                out.append(
                    f"Least-squares fit, {name} = {fmt_bytes(icpt)} + {slope:,.0f} B x users."
                )
    c = res.constants
    if c:
        out.append(
            f"In-process, per user (stage 1, {c['users']:,} users x {c['per_user']} events, "
            f"tracemalloc of the `users` table as the memory store holds it): "
            f"**{c['python_bytes_per_user']:,.0f} B per user** in Python objects; "
            f"changelog record (orjson key + value) {c['changelog_bytes_per_user']:,.0f} B. "
            f"An entry: `{c['example_entry']}`."
        )
        lines = [
            "| statistic | mechanism | ticks | state JSON B | state Python B | tree JSON B |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for t in c["trees"]:
            lines.append(
                f"| {t['statistic']} | {t['mechanism']} | {t['ticks']:,} | {t['json_bytes']:,} "
                f"| {t['python_bytes']:,} | {t['tree_json_bytes']:,} |"
            )
        title = "Per statistic (stage 2 state, keyed noise, one event per tick):"
        out.append(title + "\n\n" + "\n".join(lines))
        out.append(
            "Keyed-noise cache (`CachedNoise`, one per worker, shared by all statistics): "
            + "; ".join(
                f"after {n['ticks']:,} ticks {n['entries']:,} entries, {fmt_bytes(n['bytes'])}"
                f" ({n['bytes'] / max(1, n['entries']):,.0f} B/entry; bound {n['max']:,} "
                f"entries = {fmt_bytes(n['max'] * n['bytes'] / max(1, n['entries']))})"
                for n in c["noise_cache"]
            )
            + "."
        )
    return "\n\n".join(out) if out else "(not measured in this run)"


def micro_section(res: Results) -> str:
    m, im = res.micro, res.ingest_micro
    if not m and not im:
        return "(not measured in this run)"
    parts = []
    if im:
        rows = "\n".join(
            f"| {shape_name(int(b))} | {x['route_us']:.2f} | {x['envelopes']:,} "
            f"| {x['events_per_envelope']:,.0f} |"
            for b, x in im["shapes"].items()
        )
        parts.append(
            f"""`ingest_micro` in `bench/throughput.py`: `pipeline.ingest.route` (decode and
validate every source record with `records.decode_events`, murmur2 per user, columnar
envelopes with `records.encode_envelope`) over {im["events"]:,} events as the ingest's
consumer hands them over, in chunks of `input.ingest_batch` = {im["ingest_batch"]:,} records;
no Kafka (the consume, produce, flush and commit around it are not in it).

| source records | route µs/event | envelopes written | events per envelope |
|---|---:|---:|---:|
{rows}"""
        )
    if m:
        total = m["decode_us"] + m["unseen_us"] + m["add_us"]
        parts.append(
            f"""`stage1_micro`: what stage 1's `handle_input` does with an envelope of the events
topic, in this process, over the {m["envelopes"]:,} columnar envelopes `ingest.route` writes for
the same events in {shape_name(m["batch"])} ({m["events"]:,} events), with a plain dict as the
table. Per event:

| step | µs/event |
|---|---:|
| `orjson.loads` of the envelope alone (for scale) | {m["orjson_us"]:.2f} |
| `records.decode_envelope` (columns to `Event`s, shape checks) | {m["decode_us"]:.2f} |
| `Stage1Driver.unseen` (drop what was counted before, by source position) | {m["unseen_us"]:.2f} |
| `Stage1Driver.on_events` = `Stage1.add_events` (truncation, pending sums, user entries) \
| {m["add_us"]:.2f} |
| **total** (bounds stage 1 at {1e6 / total:,.0f} events/s on one core) | **{total:.2f}** |

The worker adds to this Faust's per-record cost (now per envelope) and the state writes:
{m["writes_per_event"]:.2f} table writes per event (distinct users per envelope / events)."""
        )
    return "\n\n".join(parts)


def decomposition_table(res: Results) -> str:
    """Time per event (1 / events/s, medians over runs) of the Faust contenders."""
    names = ["faust-naive", "faust-tables", "dpstream", "faust-batched", "faust-direct"]
    if not any(res.rows(b, c) for b in res.datasets for c in names[1:2]):
        return ""

    pipeline = pipeline_names(res.args)[0]

    def us(b: int, c: str) -> float:
        return median(1e6 / r["rate"] for r in res.rows(b, pipeline if c == "dpstream" else c))

    lines = [
        "| input | naive agent | + stage 1's table writes | pipeline | writes add | DP logic "
        "adds | writes as 1 batch/record | writes by aiokafka send() |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in res.datasets:
        t = {c: us(b, c) for c in names}
        lines.append(
            f"| {shape_name(b)} | {t['faust-naive']:.1f} µs | {t['faust-tables']:.1f} µs "
            f"| {t['dpstream']:.1f} µs | +{t['faust-tables'] - t['faust-naive']:.1f} µs "
            f"| {t['dpstream'] - t['faust-tables']:+.1f} µs | {t['faust-batched']:.1f} µs "
            f"| {t['faust-direct']:.1f} µs |"
        )
    return (
        "Where the pipeline's time per event goes (wall time per event = 1 / events/s, "
        'medians over runs; the agent variants are described under "How it is '
        'measured"):\n\n' + "\n".join(lines) + '\n\n"writes add" = stage 1\'s table '
        'writes on top of the naive agent, "DP logic adds" = the pipeline on top of '
        "those writes (validation, routing check, truncation, stage 2, releases). The last "
        "two columns are the same writes sent two cheaper ways. The pipeline itself "
        "sends its stage-1 changelog in batches that span records (pipeline/changelog.py), "
        "so it can beat the Faust-table-writes variant (DP logic adds < 0); what it costs "
        "over Faust is then the pipeline column against the naive agent's. Since the ingest "
        "(issue 14), the agents read the source topic record by record while the pipeline's "
        "stage 1 reads the ingest's envelopes (hundreds of events each, whatever the source "
        "records' shape), so on single-event records the pipeline no longer pays Faust's "
        "per-record cost and is faster than the naive agent itself."
    )


def unquantized(r: dict) -> float:
    """A pipeline run's seconds without the wait for the closing tick's marker."""
    return r["seconds"] - r["marker_wait_seconds"]


def spans_table(res: Results) -> str:
    """Where a pipeline run's time goes, from the commit that makes the backlog visible:
    medians over runs, per input shape and ingest mode."""
    lines = [
        "| input | ingest | first envelope | last envelope (ingest done) | ingest events/s "
        "| marker wait | last release | end to end events/s | without the marker wait "
        "| CPU µs/event |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for batch in res.datasets:
        for name in pipeline_names(res.args):
            rows = res.rows(batch, name)
            if not rows:
                continue

            def med(key: str, rows: list[dict] = rows) -> float:
                return median(r[key] for r in rows)

            n = rows[0]["events"]
            lines.append(
                f"| {shape_name(batch)} | {rows[0]['ingest']} "
                f"| +{med('first_envelope_seconds'):.2f} s | +{med('ingest_seconds'):.2f} s "
                f"| {fmt_rate(median(n / r['ingest_seconds'] for r in rows))} "
                f"| {med('marker_wait_seconds'):.2f} s | +{med('seconds'):.2f} s "
                f"| {fmt_rate(median(r['rate'] for r in rows))} "
                f"| {fmt_rate(median(n / unquantized(r) for r in rows))} "
                f"| {median(1e6 * r['cpu_seconds'] / n for r in rows):.1f} |"
            )
    if len(lines) == 2:
        return ""
    return (
        "Where the pipeline's time goes (medians over runs; times from the commit that makes "
        "the backlog visible): the first and the last envelope the ingest appends to the "
        "events topic (broker time), the wait from the last envelope to the clock's marker "
        "that closes its tick (the tick must end first: up to one tick plus the clock's "
        "period when stage 1 has caught up with the ingest), the release of that tick. "
        '"Without the marker wait" = events / (last release - marker wait), the rate the '
        "tick's quantization hides. CPU = the worker and its ingest process.\n\n" + "\n".join(lines)
    )


def dominates_section(res: Results) -> str:
    """What bounds the end-to-end row on single-event records, from this run's numbers:
    the spans of the pipeline runs, the py-spy profile, the in-process micro-benchmarks."""
    from bench import pyspy_summary

    if 1 not in res.datasets:
        return "(no single-event records in this run)"
    out = []
    for name in pipeline_names(res.args):
        rows = res.rows(1, name)
        if not rows:
            continue
        total = median(r["seconds"] for r in rows)
        ingest = median(r["ingest_seconds"] for r in rows)
        wait = median(r["marker_wait_seconds"] for r in rows)
        out.append(
            f"* **{label(name, res.args)}**: the ingest appended its last envelope at "
            f"+{ingest:.2f} s of the {total:.2f} s end to end ({100 * ingest / total:.0f}%, "
            f"medians; {fmt_rate(rows[0]['events'] / ingest)} events/s through the ingest); "
            f"the rest is the wait for the marker that closes the last event's tick "
            f"({wait:.2f} s) and stage 1 reaching it, stage 2 and the release."
        )
    for p in res.profiles:
        if p["tool"] != "pyspy" or p["batch"] != 1:
            continue
        prof = pyspy_summary.parse(Path(p["path"]).read_text())
        idle = 100 * (prof.main_total - prof.main_busy) / max(1, prof.main_total)
        out.append(
            f"* Under py-spy ({fmt_rate(p['rate'])} events/s), the worker's main thread "
            f"(stage 1, stage 2, Faust) was idle {idle:.0f}% of the span"
            + (": it waits for the ingest's envelopes." if idle >= 25 else ".")
        )
        ingest = Path(p["path"]).with_suffix(".ingest.txt")
        iprof = pyspy_summary.parse(ingest.read_text()) if ingest.exists() else None
        if iprof is None and prof.threads.get("ingest"):
            iprof = pyspy_summary.parse(Path(p["path"]).read_text(), "ingest")
        if iprof is not None and iprof.main_total:
            top = ", ".join(
                f"`{fn.split(' (')[0]}` {100 * n / iprof.main_total:.0f}%"
                for fn, n in iprof.self_time.most_common(6)
            )
            out.append(
                "* The ingest's own thread, self time in % of its samples: "
                f"{top}. `Ingest._read`'s self time is its `poll()`/`consume()` calls into "
                "librdkafka (copying records into Python, waiting for fetched data or for a "
                "core); a batch's acknowledgements arrive while the next is read and routed, "
                "and its offsets are committed asynchronously once it is acknowledged whole."
            )
    im, m = res.ingest_micro, res.micro
    if im and m and "1" in im["shapes"]:
        route = im["shapes"]["1"]["route_us"]
        stage1 = m["decode_us"] + m["unseen_us"] + m["add_us"]
        name = pipeline_names(res.args)[0]
        e2e = median(1e6 / r["rate"] for r in res.rows(1, name))
        against = "" if math.isnan(e2e) else f", against {e2e:.1f} µs per event end to end ({name})"
        out.append(
            f"* In Python alone (below): the ingest's `route` takes {route:.2f} µs per "
            f"single event ({fmt_rate(1e6 / route)} events/s on one core, validation "
            f"included) and stage 1 {stage1:.2f} µs per event on its envelopes{against}."
        )
    return "\n".join(out)


def targets_section(res: Results) -> str:
    args = res.args
    rows = ["| target | measured | met |", "|---|---|---|"]
    names = pipeline_names(args)
    if 1 in res.datasets:
        for name in names:
            r = median(res.ratio(1, name, "confluent"))
            if not math.isnan(r):
                rows.append(
                    "| end to end on single-event records >= 13% of the plain confluent-kafka "
                    f"consume of the same source topic (same run; {label(name, args)}) "
                    f"| {100 * r:.1f}% | {'yes' if r >= 0.13 else 'no'} |"
                )
    for r in res.latency:
        ok = r["kept_up"] and r["p99"] < 2 * args.tick
        rows.append(
            f"| p99 release latency < 2 ticks ({2 * args.tick:g} s) at {fmt_rate(r['rate'])} "
            f"events/s, {shape_name(r['batch'])} | {r['p99']:.3f} s = "
            f"{r['p99'] / args.tick:.2f} ticks{'' if r['kept_up'] else ' (did not keep up)'} "
            f"| {'yes' if ok else 'no'} |"
        )
    for b in [b for b in res.datasets if b > 1]:
        r = median(res.ratio(b, names[0]))
        if not math.isnan(r):
            rows.append(
                f"| (issue 7) pipeline on {shape_name(b)} >= 50% of the aiokafka ceiling (same "
                f"run, same events) | {100 * r:.1f}% | {'yes' if r >= 0.5 else 'no'} |"
            )
    if 1 in res.datasets:
        ratios = res.ratio(1, names[0], "faust-naive")
        if ratios:
            extra = 1 / median(ratios) - 1  # time per event, pipeline over naive, minus 1
            rows.append(
                "| (issue 7) single-event records: the pipeline adds <= 20% over the naive "
                f"Faust agent (time per event) | {100 * extra:+.0f}% "
                f"| {'yes' if extra <= 0.2 else 'no'} |"
            )
    if res.constants:
        c = res.constants
        slope = math.nan
        if len(res.memory) >= 2:
            slope, _ = linear_fit([m["users"] for m in res.memory], [m["rss"] for m in res.memory])
        rows.append(
            "| worker memory O(users), constant documented | "
            f"{c['python_bytes_per_user']:,.0f} B/user in state objects; worker RSS slope "
            f"{'n/a' if math.isnan(slope) else f'{slope:,.0f} B/user'} | see Memory |"
        )
    return "\n".join(rows)


def ceiling_budget(res: Results) -> str:
    """What 13% of the confluent-kafka ceiling leaves per single event, against what the
    ingest and stage 1 take in Python alone."""
    m, im = res.micro, res.ingest_micro
    if 1 not in res.datasets or not m or not im or "1" not in im["shapes"]:
        return ""
    ceiling = median(1e6 / r["rate"] for r in res.rows(1, "confluent"))
    if math.isnan(ceiling):
        return ""
    pipes = "; ".join(
        f"{label(n, res.args)}: {median(1e6 / r['rate'] for r in res.rows(1, n)):.2f} µs"
        for n in pipeline_names(res.args)
        if res.rows(1, n)
    )
    route = im["shapes"]["1"]["route_us"]
    stage1 = m["decode_us"] + m["unseen_us"] + m["add_us"]
    return (
        "What the 13% target leaves per single event (time per event = 1 / events/s, "
        f"medians): the confluent-kafka ceiling takes {ceiling:.2f} µs, so the budget is "
        f"{ceiling / 0.13:.2f} µs. Measured end to end: {pipes}. In Python alone, without "
        f"Kafka or Faust: the ingest's `route` {route:.2f} µs (in its own process when the "
        f"ingest is one) and stage 1 on the envelopes {stage1:.2f} µs (below)."
    )


def runs_table(res: Results) -> str:
    lines = [
        "| run | input | contender | events/s | seconds | CPU s | CPU share | extra |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in res.runs:
        extra = ""
        if r["contender"].startswith("dpstream"):
            extra = (
                f"ingest {r['ingest']}; first envelope +{r['first_envelope_seconds']:.2f} s, "
                f"last +{r['ingest_seconds']:.2f} s, marker wait "
                f"{r['marker_wait_seconds']:.2f} s; startup {r['startup_seconds']:.1f} s, "
                f"dead letters {r['dead_letters']}, RSS {fmt_bytes(r['rss'])}"
            )
        share = r.get("cpu_wall_seconds") or r["seconds"]
        lines.append(
            f"| {r['run'] + 1} | {shape_name(r['batch'])} | {r['contender']} "
            f"| {fmt_rate(r['rate'])} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} "
            f"| {100 * r['cpu_seconds'] / share:.0f}% | {extra} |"
        )
    return "\n".join(lines)


def profile_section(res: Results) -> str:
    from bench import pyspy_summary

    label = res.args.profile_label
    parts = [
        f"## Profile: {label}\n",
        f"Commit `{res.commit}`, {res.date}, load average at the start of the run "
        f"{res.load_start}. One extra pipeline run per input shape and "
        "tool (not counted in the tables above), of the end-to-end row (ingest in "
        f"{res.args.ingest_modes[0]} mode), profiled from the moment the source records "
        "become visible to the release of the tick holding the last event, so start-up is "
        "not in it. Raw profiles: "
        f"`{res.args.workdir}`.\n",
        f"* **py-spy** ({res.args.profile_rate} Hz, `record --threads --idle -f raw`, wall "
        "clock): self = innermost Python frame, inclusive = anywhere on the stack, in % of "
        "the main thread's busy samples (idle = innermost frame is a select/poll/sleep/lock "
        "wait). Wall clock: on a loaded machine a syscall that wakes another process (a "
        "socket write to the broker) also collects the time the worker waits for a core.",
        "* **cProfile** (`bench/cprofile_worker.py`, main thread): exact call counts per "
        "event. Its per-call overhead slows the worker (see its events/s), which also "
        "changes how the producer batches: counts of produce requests, waits and tasks are "
        "of that slower run; counts of table writes, hashes and messages are not.\n",
    ]
    for p in sorted(res.profiles, key=lambda p: (p["batch"], p["tool"] != "pyspy")):
        head = (
            f"### {shape_name(p['batch'])}, {p['tool']} ({p['events']:,} events; "
            f"{fmt_rate(p['rate'])} events/s and {p['cpu_us']:.0f} µs worker CPU per event "
            "under the profiler"
        )
        if p["tool"] == "pyspy":
            text = Path(p["path"]).read_text()
            prof = pyspy_summary.parse(text)
            idle = 100 * (prof.main_total - prof.main_busy) / max(1, prof.main_total)
            parts.append(f"{head}; main thread idle {idle:.0f}%)\n")
            parts.append(pyspy_summary.thread_lines(prof) + "\n")
            parts.append(pyspy_summary.bucket_lines(text) + "\n")
            parts.append(pyspy_summary.table(prof, "self", 15) + "\n")
            if prof.threads.get("ingest"):
                parts.append("The worker's ingest thread, self time:\n")
                parts.append(pyspy_summary.table(pyspy_summary.parse(text, "ingest"), "self", 12))
                parts.append("")
            ingest = Path(p["path"]).with_suffix(".ingest.txt")
            if ingest.exists():
                iprof = pyspy_summary.parse(ingest.read_text())
                iidle = 100 * (iprof.main_total - iprof.main_busy) / max(1, iprof.main_total)
                parts.append(
                    f"The worker's ingest process (main thread idle {iidle:.0f}%; "
                    "librdkafka's own threads are native, not sampled by py-spy):\n"
                )
                parts.append(pyspy_summary.thread_lines(iprof) + "\n")
                parts.append(pyspy_summary.table(iprof, "self", 12) + "\n")
        else:
            parts.append(f"{head})\n")
            parts.append(pyspy_summary.cprofile_tables(p["path"], p["events"], p["records"]) + "\n")
            if p.get("naive_path") and Path(p["naive_path"]).exists():
                parts.append(
                    "What the pipeline's main thread spends per input record beyond the naive "
                    "Faust agent's (the agent under cProfile too, over the same topic): the "
                    "functions whose self time differs most, and the total.\n"
                )
                parts.append(
                    pyspy_summary.cprofile_diff(p["path"], p["naive_path"], p["records"]) + "\n"
                )
    return "\n".join(parts)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - read-only
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "pipeline", "operators", "config"],  # noqa: S607
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def errors_section(res: Results) -> str:
    if not res.errors:
        return ""
    items = "\n".join(f"* {e.splitlines()[0]}" for e in res.errors)
    return f"\n## Sections that failed in this run\n\n{items}\n"


def kept_section(path: Path, label: str) -> str:
    kept = kept_profiles(path, label)
    if not kept:
        return ""
    return (
        "Profile sections with other labels are kept from earlier runs; their commits say "
        "which layout they measured (before the ingest of issue 14, stage 1 read the users' "
        "topic itself, record by record).\n\n" + kept
    )


def kept_profiles(path: Path, label: str) -> str:
    """Profile sections of an existing document whose label differs from ``label``."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    keep = []
    for m in re.finditer(r"^## Profile: (.+?)$(.*?)(?=^## |\Z)", text, re.M | re.S):
        if m.group(1).strip() != label:
            keep.append(m.group(0).rstrip() + "\n")
    return "\n".join(keep)


def pipeline_description(args: argparse.Namespace) -> str:
    base = base_config(args.config)
    stats = ", ".join(
        f"{st.get('name')} ({st.get('kind', 'count')}, tau {st.get('tau', 'auto')}"
        f"{', key ' + st['key'] if st.get('key') else ''})"
        for st in base.get("statistics", [])
    )
    source = f"`{args.config}`" if args.config else "`config/demo.yaml`"
    return f"{source}: {stats}"


def command_line(args: argparse.Namespace) -> str:
    """The run's command, less where it wrote (``--out``, ``--json``, ``--workdir``)."""
    local = ("--out", "--json", "--workdir")
    kept = [a for a in args.argv if a.partition("=")[0] not in local]
    return " ".join([".venv/bin/python -m bench.throughput", *kept])


def document(res: Results) -> str:
    a, info = res.args, res.info
    ds_lines = "\n".join(
        f"* {shape_name(b)}: {d.events:,} events in {d.records:,} records over {d.partitions} "
        f"source partitions, pre-produced in {d.produce_seconds:.1f} s "
        f"({fmt_rate(d.events / max(d.produce_seconds, 1e-9))} events/s)"
        for b, d in res.datasets.items()
    )
    mode = (
        "**Quick mode** (`--quick`: small sizes, one run)."
        if a.quick
        else f"Full mode ({a.runs} runs, {a.singles:,} single events, {a.envelope_events:,} "
        "events per envelope shape)."
    )
    loaded = (
        "**Measured while other work shared the machine: not final numbers.**"
        if a.under_load
        else "Measured with the machine otherwise quiet."
    )
    return f"""# dpstream throughput, latency and memory against a real Kafka broker

Generated by `bench/throughput.py` (issues 7 and 14). Regenerate with

    {command_line(a)}

{mode} {loaded} Load average (1/5/15 min) at the start {res.load_start}, at the end
{res.load_end}. Wall time {res.wall / 60:.1f} min. Commit `{res.commit}`, run started {res.date}.

Machine: {info["cores"]} cores ({info["cpu"]}), {info["ram"]} RAM, {info["platform"]};
{info["python"]}; {info["libs"]}; Kafka: {res.kafka}. The broker, the contender and (for
latency) the producer share the same cores.

## Throughput

Each run, on the same events in a pre-produced source topic ({a.users:,} users, Zipf-like
activity, `pipeline/synthetic.py`; pipeline = {pipeline_description(a)}, keyed noise):

{ds_lines}

{throughput_table(res)}

{decomposition_table(res)}

{spans_table(res)}

Ratio = the contender's events/s over the aiokafka (or confluent-kafka) ceiling's **in the
same run on the same events** (median over runs of that per-run ratio). CPU µs/event = the
process's CPU time (all threads; for the pipeline the worker and its ingest process) over
the timed span, per event. Peak RSS = VmHWM of the contender's process (the worker's, not
its ingest process's). Per-run numbers are at the end.

## Targets

{targets_section(res)}

{ceiling_budget(res)}

## What dominates end to end (single-event records)

{dominates_section(res)}

## Release latency

A fresh worker (tick {a.tick:g} s, ingest {a.ingest_modes[0]}); once it has released its first
tick and its ingest holds every source partition, this process produces into the source topic
at the target rate for {a.latency_seconds:g} s with a plain confluent-kafka Producer (lz4,
otherwise defaults; every 50 ms what is due: single-event records keyed by user, or batch
envelopes of up to the batch size). Latency of a release = its CreateTime minus its
`tick_end_unix`, for every statistic and every tick lying wholly inside the production window.
Percentiles are nearest-rank (with fewer than 100 samples, p99 is the maximum). After
production this process waits at most {a.latency_wait or max(15.0, a.latency_seconds):g} s for
the last of those ticks; a tick still unreleased then counts with the lower bound (give-up time
minus tick end). Growth = median latency of the last third of the released ticks minus that of
the first third (per tick, its slowest statistic): a worker slower than the input piles up a
backlog and its latency grows by about (1 - its rate / input rate) s per second. Kept up =
every tick released and growth under one tick.

{latency_table(res)}

The floor of this latency is the clock: the leader writes tick t's markers into the
events topic on its next timer firing after the tick ends (every min(I/4, 1 s)), then
stage 1 must reach them behind the ingest's envelopes, report through the stage-2 topic,
and stage 2 must send. An event's tick is the one in which the ingest's envelope holding it
reached the events topic.

## Memory

{memory_section(res)}

Worker memory = a start-up baseline (Python, Faust, aiokafka; the intercept above)
+ the per-user constant x users (stage-1 `users` table, Faust memory store: the Python
objects above plus the dict slot) + per statistic its stage-2 state (O(log t) integers)
+ the keyed-noise cache, bounded by its `maxsize` entries whatever the traffic.

## The ingest's and stage 1's own cost, without Kafka

{micro_section(res)}

## How it is measured

* **One broker, one run, same events.** Each input shape gets one source topic (the
  users' topic: {a.partitions} partitions, broker defaults), pre-produced once with a plain
  confluent-kafka `Producer` (lz4, otherwise its defaults): single-event JSON records keyed
  by user id (librdkafka's default partitioner, CRC32, not Kafka's murmur2), or our batch
  envelopes (JSON arrays, header `dpstream: batch`, no key). The ceilings and the naive
  agent read that topic from offset 0, one after the other, each in its own process. Each
  pipeline run reads its own copy of it (below).
* **Ceiling** (`bench/ceiling.py`): aiokafka `getmany` / confluent-kafka `consume(10000)`
  with assigned partitions (no group), `orjson.loads` of every record, events counted.
  A pass is timed from the first fetch request (connected, offsets known) to the last
  record parsed; passes repeat from offset 0 until 2 s have been timed (mean per pass).
  Only non-default client setting: fetch max wait 10 ms (else every pass after the first
  starts with a 500 ms long-poll left over from the previous one); the third ceiling also
  sets `fetch.queue.backoff.ms=10` (as the ingest's consumer does: librdkafka's default,
  1 s, idles the fetcher whenever a partition's queue holds `queued.min.messages`, 100,000
  records). So the plain confluent-kafka ceiling, and the 13% target's ratio with it,
  depend on the topic's size: a topic whose partitions hold fewer than 100,000 records each
  is prefetched whole at full speed, a larger one is read at a fraction of it (then
  compare the third ceiling).
* **Naive peer** (`bench/naive_agent.py`): a Faust app with the worker's settings and one
  agent (`stream.events()`, raw serializers) that reads the header, skips tick markers,
  `orjson.loads` the value and counts. Time = first record the agent sees to the last
  event counted. Three diagnostic variants of it (not in `--quick`): **+ stage 1's table
  writes** (one Faust table write per distinct user per record plus one per partition,
  i.e. the pipeline's state writes without any DP logic), **changelog as 1 batch per
  record** (the same writes put into the memory store directly, their changelog entries
  sent as one aiokafka record batch per input record instead of one Faust `send_soon`
  each), and **changelog by aiokafka's send()** (each entry sent with the underlying
  aiokafka producer's `send`, which still batches across records). They split the
  pipeline's cost into "Faust", "state writes" and "DP logic", and measure two ways to
  make the writes cheap.
* **Pipeline**: a real `dpstream worker` (`--ingest` as given, log level
  `{a.worker_loglevel}`) with a source topic of its own, written with the same records and
  producer settings plus a `transactional.id`, the transaction left open: the worker's
  ingest (read_committed, librdkafka's default) sees nothing yet. Once the worker has
  released a first tick and its ingest group holds every source partition, the bench
  commits the transaction: the whole backlog becomes visible at once. Time = from that
  commit to the release (CreateTime, every statistic) of the tick holding the last event:
  in each events partition, the first clock marker after the last envelope, the latest of
  those. So it includes the ingest (consume, validate, route, send, acknowledge, commit),
  stage 1, stage 2, the releases, and the wait for that tick to end if stage 1 had caught
  up with the ingest (per run: "marker wait"). events/s = events / that time. Start-up is
  excluded and shown per run; every run checks that the dead-letter topic stayed empty.
* All contenders therefore exclude connection set-up and include everything from the
  first record to the last; the events are identical across contenders.
* Several runs (`--runs`), medians, the spread is min-max over runs.

## Per-run numbers

{runs_table(res)}
{errors_section(res)}
{profile_section(res) if res.profiles else ""}
{kept_section(a.out, a.profile_label)}"""


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, 1 run (~2 minutes)")
    p.add_argument("--runs", type=int, help="throughput runs (default 3; quick 1)")
    p.add_argument("--users", type=int, default=10_000, help="distinct users in the events")
    p.add_argument("--singles", type=int, help="events for single-event records (0: skip)")
    p.add_argument("--envelope-events", type=int, help="events for each envelope shape")
    p.add_argument("--batch", default="100", help="envelope sizes, comma-separated (empty: none)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--tick", type=float, default=1.0, help="tick interval in seconds")
    p.add_argument(
        "--ingest-mode",
        default="default",
        help="the pipeline's `dpstream worker --ingest`: process, thread, or default (the "
        "worker's); comma-separated to compare them in the same run (the first is used for "
        "latency, memory and profiles)",
    )
    p.add_argument(
        "--contenders",
        help=f"comma-separated, from {','.join(CONTENDERS)} (default all; quick: not "
        f"{' and '.join(EXPERIMENTS)})",
    )
    p.add_argument(
        "--latency-rate",
        help="events/s, comma-separated (default 20000: the target of issue 14)",
    )
    p.add_argument("--latency-seconds", type=float, help="default 30; quick 10")
    p.add_argument("--latency-wait", type=float, help="max wait for the last release")
    p.add_argument(
        "--latency-batch",
        help="input shapes for latency (1 = single events; default 1, full 1,100)",
    )
    p.add_argument("--memory-users", help="user counts for the RSS runs, comma-separated")
    p.add_argument("--memory-events", type=int, help="events in each RSS run (default 100000)")
    p.add_argument("--memory-per-user", type=int, default=2, help="for the in-process constant")
    p.add_argument("--state-users", type=int, help="users for the in-process per-user bytes")
    p.add_argument("--state-ticks", help="ticks for the per-statistic state, comma-separated")
    p.add_argument("--profile", action="store_true", help="py-spy the worker (extra runs)")
    p.add_argument("--profile-label", default="before")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples/s")
    p.add_argument("--profile-tools", default="pyspy,cprofile", help="pyspy and/or cprofile")
    p.add_argument("--config", type=Path, help="pipeline YAML (default config/demo.yaml)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--json", type=Path, help="also write every number as JSON here")
    p.add_argument("--workdir", type=Path, help="configs, logs, profiles (default: temp)")
    p.add_argument("--under-load", action="store_true", help="say so in the document")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--worker-loglevel", default="info", help="for the Faust processes")
    args = p.parse_args(argv)
    args.argv = argv
    q = args.quick
    args.runs = args.runs or (1 if q else 3)
    args.singles = args.singles if args.singles is not None else (50_000 if q else 200_000)
    if args.envelope_events is None:
        args.envelope_events = 50_000 if q else 200_000
    args.latency_seconds = args.latency_seconds or (10.0 if q else 20.0)
    if args.latency_batch is None:
        args.latency_batch = "1" if q else "1,100"
    if args.memory_users is None:
        args.memory_users = "" if q else "1000,10000,50000"
    args.memory_events = args.memory_events or 100_000
    args.state_users = args.state_users or (20_000 if q else 100_000)
    args.state_ticks = [
        int(t) for t in (args.state_ticks or ("1000" if q else "1000,10000")).split(",")
    ]
    args.batches = [int(b) for b in args.batch.split(",") if b.strip()]
    args.latency_batches = [int(b) for b in args.latency_batch.split(",") if b.strip()]
    if args.latency_rate is None:
        args.latency_rate = "20000"
    args.latency_rates = [float(r) for r in args.latency_rate.split(",") if r.strip()]
    args.memory_list = [int(u) for u in args.memory_users.split(",") if u.strip()]
    if args.contenders is None:
        args.contenders = ",".join(c for c in CONTENDERS if not (q and c in EXPERIMENTS))
    args.contenders = [c for c in args.contenders.split(",") if c]
    args.profile_tools = [t for t in args.profile_tools.split(",") if t]
    args.ingest_modes = [m for m in args.ingest_mode.split(",") if m]
    if not args.ingest_modes or set(args.ingest_modes) - {"default", *INGEST_MODES}:
        p.error("--ingest-mode: default, process and/or thread")
    if set(args.profile_tools) - {"pyspy", "cprofile"}:
        p.error("--profile-tools: pyspy and/or cprofile")
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    if "aiokafka" not in args.contenders:
        p.error("aiokafka (the ceiling every ratio refers to) must be among the contenders")
    if args.workdir is None:
        args.workdir = Path(tempfile.mkdtemp(prefix="dpstream-bench-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args


def render(path: Path, out: Path | None) -> int:
    """Write the document again from a run's ``--json`` file (after a template change)."""
    data = orjson.loads(path.read_bytes())
    args = parse_args(data["argv"] + ([f"--out={out}"] if out else []))
    res = Results(
        args=args,
        info=data["machine"],
        kafka=data["kafka"],
        load_start=data["load_start"],
        load_end=data["load_end"],
        runs=data["runs"],
        latency=data["latency"],
        memory=data["memory"],
        constants=data["constants"],
        micro=data["stage1_micro"],
        ingest_micro=data.get("ingest_micro"),
        profiles=data["profiles"],
        errors=data["errors"],
        wall=data["wall"],
        commit=data.get("commit", "unknown"),
        date=data.get("date", "unknown"),
    )
    args.argv = data["argv"]
    for b, d in data["datasets"].items():
        d["ends"] = {int(p): e for p, e in d["ends"].items()}
        res.datasets[int(b)] = Dataset(**d)
    args.out.write_text(document(res))
    log(f"wrote {args.out} from {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--render"]:
        return render(Path(argv[1]), Path(argv[2]) if len(argv) > 2 else None)
    args = parse_args(argv)
    from dpstream.deploy.broker import BOOTSTRAP_ENV, KAFKA_VERSION, kafka_broker

    started = time.monotonic()
    WORKER["loglevel"] = args.worker_loglevel
    base = base_config(args.config)
    env = {KEY_ENV: secrets.token_hex(32)}
    external = os.environ.get(BOOTSTRAP_ENV, "").strip()
    kafka = (
        f"external broker at {external} (version not checked)"
        if external
        else f"Apache Kafka {KAFKA_VERSION} (KRaft, single node, from Kafka's jars)"
    )
    res = Results(args=args, info=machine(), kafka=kafka, load_start=loadavg())
    res.commit, res.date = git_commit(), time.strftime("%Y-%m-%d %H:%M %Z")
    log(f"workdir {args.workdir}")

    def attempt(what: str, fn: Callable[[], None]) -> None:
        """Optional sections: a failure is reported in the document, not fatal."""
        try:
            fn()
        except Exception as exc:
            log(f"{what} failed: {exc}")
            res.errors.append(f"{what}: {type(exc).__name__}: {str(exc)[:2000]}")

    shapes = ([1] if args.singles > 0 else []) + [b for b in args.batches if b > 1]
    payloads: dict[int, list[Message]] = {}
    mode = args.ingest_modes[0]
    ingest = None if mode == "default" else mode
    with kafka_broker() as bootstrap:
        log(f"broker {bootstrap}")
        for batch in shapes:
            n = args.singles if batch == 1 else args.envelope_events
            msgs, n = messages(synthetic(args.users, n, args.seed), batch)
            topic = f"bench-d{batch}-{uuid.uuid4().hex[:6]}.source"
            ds = preproduce(bootstrap, topic, args.partitions, msgs, n, batch)
            res.datasets[batch], payloads[batch] = ds, msgs
            log(f"{shape_name(batch)}: {ds.events:,} events in {ds.records:,} records")
        for run in range(args.runs):
            for batch, ds in res.datasets.items():
                for contender in res.contenders():
                    if contender in ("aiokafka", "confluent", "confluent-backoff"):
                        r = run_ceiling(contender, bootstrap, ds)
                    elif contender.startswith("faust-"):
                        tables = {
                            "faust-tables": "faust",
                            "faust-batched": "batched",
                            "faust-direct": "direct",
                        }
                        r = run_naive(bootstrap, ds, args.workdir, tables.get(contender, "none"))
                    else:
                        m = contender.partition("-")[2] or mode
                        r = run_pipeline(
                            bootstrap,
                            base,
                            ds,
                            payloads[batch],
                            args.workdir,
                            args.tick,
                            env,
                            ingest=None if m == "default" else m,
                        )
                    r.update(run=run, batch=batch, contender=contender)
                    r["rate"] = r["events"] / r["seconds"]
                    res.runs.append(r)
                    log(
                        f"run {run + 1}/{args.runs} {shape_name(batch)} {contender}: "
                        f"{fmt_rate(r['rate'])} events/s ({r['seconds']:.2f} s)"
                    )
        for batch in args.latency_batches:
            for rate in args.latency_rates:

                def latency(batch: int = batch, rate: float = rate) -> None:
                    r = run_latency(
                        bootstrap,
                        base,
                        args.workdir,
                        env,
                        batch=batch,
                        rate=rate,
                        seconds=args.latency_seconds,
                        tick=args.tick,
                        users=args.users,
                        partitions=args.partitions,
                        seed=args.seed + 1,
                        wait=args.latency_wait or max(15.0, args.latency_seconds),
                        ingest=ingest,
                    )
                    res.latency.append(r)
                    log(
                        f"latency {shape_name(batch)} at {fmt_rate(rate)}/s: p50 "
                        f"{r['p50']:.3f} s, p99 {r['p99']:.3f} s, kept up: {r['kept_up']}"
                    )

                attempt(f"latency, {shape_name(batch)} at {rate:g}/s", latency)
        for users in args.memory_list:

            def memory(users: int = users) -> None:
                r = run_memory(
                    bootstrap,
                    base,
                    args.workdir,
                    env,
                    users=users,
                    events=args.memory_events,
                    batch=max(args.batches or [100]),
                    tick=args.tick,
                    partitions=args.partitions,
                    ingest=ingest,
                )
                res.memory.append(r)
                log(f"memory {users:,} users: RSS {fmt_bytes(r['rss'])}")

            attempt(f"memory, {users} users", memory)
        if args.profile:
            for batch, ds in res.datasets.items():
                for tool in args.profile_tools:

                    def profile(batch: int = batch, ds: Dataset = ds, tool: str = tool) -> None:
                        if tool == "pyspy" and py_spy() is None:
                            raise RuntimeError("--profile needs py-spy (pip install py-spy)")
                        suffix = "txt" if tool == "pyspy" else "pstats"
                        path = args.workdir / f"profile-{tool}-{batch}.{suffix}"
                        r = run_pipeline(
                            bootstrap,
                            base,
                            ds,
                            payloads[batch],
                            args.workdir,
                            args.tick,
                            env,
                            ingest=ingest,
                            profile=(tool, path),
                            profile_rate=args.profile_rate,
                        )
                        naive = None
                        if tool == "cprofile":  # the same for the naive agent, to diff
                            naive = args.workdir / f"profile-cprofile-naive-{batch}.pstats"
                            run_naive(bootstrap, ds, args.workdir, cprofile=naive)
                        res.profiles.append(
                            {
                                "tool": tool,
                                "batch": batch,
                                "path": str(path),
                                "naive_path": str(naive) if naive else None,
                                "events": ds.events,
                                "records": ds.records,
                                "rate": ds.events / r["seconds"],
                                "cpu_us": 1e6 * r["cpu_seconds"] / ds.events,
                            }
                        )
                        log(f"profiled ({tool}) {shape_name(batch)}: {path}")

                    attempt(f"profile ({tool}), {shape_name(batch)}", profile)

    def constants() -> None:
        log("state constants (in process)")
        res.constants = state_constants(
            base, args.state_users, args.memory_per_user, args.state_ticks
        )

    attempt("state constants", constants)

    def micro() -> None:
        log("ingest and stage-1 micro-benchmarks (in process)")
        n = max(args.singles, args.envelope_events)
        res.ingest_micro = ingest_micro(base, args.users, n, [1, *args.batches], args.seed)
        res.micro = stage1_micro(base, args.users, n, 1, args.seed)

    attempt("ingest and stage-1 micro-benchmarks", micro)
    res.load_end = loadavg()
    res.wall = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(document(res))
    print(throughput_table(res))
    print()
    print(targets_section(res))
    if res.latency:
        print()
        print(latency_table(res))
    log(f"wrote {args.out}")
    if args.json:
        args.json.write_bytes(
            orjson.dumps(
                {
                    "argv": args.argv,
                    "commit": res.commit,
                    "date": res.date,
                    "kafka": res.kafka,
                    "load_start": res.load_start,
                    "load_end": res.load_end,
                    "wall": res.wall,
                    "machine": res.info,
                    "runs": res.runs,
                    "latency": res.latency,
                    "memory": res.memory,
                    "constants": res.constants,
                    "stage1_micro": res.micro,
                    "ingest_micro": res.ingest_micro,
                    "profiles": res.profiles,
                    "errors": res.errors,
                    "datasets": {str(b): vars(d) for b, d in res.datasets.items()},
                },
                option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
                default=str,
            )
        )
    for err in res.errors:
        log(f"ERROR {err.splitlines()[0]}")
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main())
