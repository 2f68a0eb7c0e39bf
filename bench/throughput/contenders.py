"""The contenders of a throughput run, each in a fresh process, and the latency and memory
runs of the dpstream worker.

Every function here starts its process(es), waits for them and returns one row of numbers;
nothing is kept between calls. A row has at least ``events`` (the span it measured),
``seconds`` (first to last record), ``cpu_seconds``, ``wall_seconds`` (process start to
the last record) and ``peak_rss``.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson

from bench.common import median, percentile, proc_status
from bench.throughput import peers
from bench.throughput.datasets import (
    AVRO,
    ENVELOPES,
    SOURCE_PRODUCER,
    Dataset,
    Message,
    cycle_users,
    end_offsets,
    hold_source,
    messages,
    produce_nowait,
    synthetic,
)
from bench.throughput.workers import (
    ROOT,
    Harness,
    Watcher,
    children,
    ingest_assigned,
    py_spy,
    run_config,
    spawn,
    stop,
    tail,
    tree_cpu_seconds,
    write_config,
)

CEILINGS = ("aiokafka", "confluent", "confluent-backoff")
NAIVE = {  # contender -> bench/naive_agent.py --tables
    "faust-naive": "none",
    "faust-tables": "faust",
    "faust-batched": "batched",
    "faust-direct": "direct",
}
# Diagnostic variants of the naive agent, run only when named in --contenders: at a few
# thousand records/s each, they would add ~15 min per run on a million single events.
EXPERIMENTS = ("faust-tables", "faust-batched", "faust-direct")
PIPELINE = "dpstream"
# The ingest alone (bench/ingest_only.py), on JSON and on Avro: the same events.
INGEST = "ingest"
CONTENDERS = (*CEILINGS, *NAIVE, *peers.PEERS, PIPELINE, INGEST)
# The peers count single-event records keyed by user id; they do not read envelopes.
SINGLE_ONLY = (*peers.PEERS, INGEST)
# The Avro records are read by the ingest alone.
AVRO_READERS = (INGEST,)
LABELS = {
    "aiokafka": "aiokafka consumer + orjson (ceiling)",
    "confluent": "confluent-kafka consumer + orjson",
    "confluent-backoff": "confluent-kafka consumer, fetch.queue.backoff.ms=10, + orjson",
    "faust-naive": "naive Faust agent (parse + count)",
    "faust-tables": "naive agent + stage 1's table writes, no DP",
    "faust-batched": "same writes, changelog sent as 1 batch per record",
    "faust-direct": "same writes, changelog sent by aiokafka's send()",
    "kafka-streams:at_least_once": "Kafka Streams groupByKey().count(), at_least_once",
    "kafka-streams:exactly_once_v2": "Kafka Streams groupByKey().count(), exactly_once_v2",
    "quix:at-least-once": "Quix Streams stateful count, at-least-once",
    "quix:exactly-once": "Quix Streams stateful count, exactly-once",
    "dpstream": "dpstream pipeline (ingest + stage 1 + 2 + releases)",
    "ingest": "dpstream ingest alone (decode, validate, route, envelopes acknowledged)",
}
INGEST_MODES = ("process", "thread")


def run_contender(
    contender: str, ds: Dataset, harness: Harness, msgs: list[Message], ingest: str | None
) -> dict:
    """One run of ``contender`` over ``ds`` (``ingest``: the pipeline's ``--ingest``)."""
    if contender in CEILINGS:
        return run_ceiling(contender, ds, harness)
    if contender in NAIVE:
        return run_naive(ds, harness, NAIVE[contender])
    if contender in peers.PEERS:
        return run_peer(contender, ds, harness)
    if contender == INGEST:
        return run_ingest(ds, harness)
    return run_pipeline(harness, ds, msgs, ingest)


def run_ingest(ds: Dataset, harness: Harness) -> dict:
    """The ingest alone over ``ds`` in a fresh process (bench/ingest_only.py), with a
    consumer group and an events topic of its own; Avro through the run's registry."""
    data = run_config(harness.base, "i", ds.topic, harness.tick, ds.partitions)
    if ds.shape == AVRO:
        data["input"] |= {"format": "avro", "schema_registry": {"url": harness.registry}}
    cfg, path = write_config(data, harness.workdir)
    cmd = [sys.executable, "-m", "bench.ingest_only", "--bootstrap", harness.bootstrap]
    cmd += ["--config", str(path), "--expect", str(ds.events)]
    spawned = time.time()
    out = subprocess.run(  # noqa: S603 - fixed argument list
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"the ingest ({ds.shape}) failed:\n{out.stderr[-3000:]}")
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    if res["dead_letters"]:
        raise RuntimeError(f"the ingest ({ds.shape}) dead-lettered {res['dead_letters']} events")
    res["wall_seconds"] = res["first_batch_end"] - spawned + res["seconds"]
    return res


def run_ceiling(client: str, ds: Dataset, harness: Harness) -> dict:
    ends = orjson.dumps({str(p): e for p, e in ds.ends.items()}).decode()
    cmd = [sys.executable, "-m", "bench.ceiling", client, "--bootstrap", harness.bootstrap]
    cmd += ["--topic", ds.topic, "--ends", ends]
    spawned = time.time()
    out = subprocess.run(  # noqa: S603 - fixed argument list
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{client} ceiling failed:\n{out.stderr[-3000:]}")
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    if res["events"] != ds.events:
        raise RuntimeError(f"{client} read {res['events']} events, expected {ds.events}")
    res["wall_seconds"] = res.pop("first_pass_end") - spawned
    return res


def run_naive(
    ds: Dataset, harness: Harness, tables: str = "none", cprofile: Path | None = None
) -> dict:
    """``cprofile``: also write a cProfile of the agent's main thread (first record to last
    event) there (``NAIVE_CPROFILE``, bench/naive_agent.py)."""
    result = harness.workdir / f"naive-{uuid.uuid4().hex[:8]}.json"
    env = {**os.environ, **({"NAIVE_CPROFILE": str(cprofile)} if cprofile else {})}
    logf = result.with_suffix(".log")
    cmd = [sys.executable, "-m", "bench.naive_agent", "--bootstrap", harness.bootstrap]
    cmd += ["--topic", ds.topic, "--partitions", str(ds.partitions)]
    cmd += ["--expect", str(ds.events), "--result", str(result)]
    cmd += ["--loglevel", harness.loglevel, "--tables", tables]
    spawned = time.time()
    with open(logf, "wb") as fh:
        proc = subprocess.Popen(  # noqa: S603 - fixed argument list
            cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 1800
        while not result.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"naive Faust agent exited:\n{tail(logf)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"naive Faust agent did not finish:\n{tail(logf)}")
            time.sleep(0.05)
        res = orjson.loads(result.read_bytes())
        res["wall_seconds"] = res.pop("last_epoch") - spawned
        res["peak_rss"] = proc_status(proc.pid).get("VmHWM")
        return res
    finally:
        stop(proc)


def run_peer(peer: str, ds: Dataset, harness: Harness) -> dict:
    """Kafka Streams or Quix Streams counting the whole of ``ds`` in a fresh process, with
    an application id / consumer group of its own."""
    log_path = harness.workdir / f"{peer.replace(':', '-')}-{uuid.uuid4().hex[:6]}.log"
    timeout = max(300.0, ds.events / 5_000)
    rep = peers.run_peer(
        peer, harness.bootstrap, ds.topic, ds.events, timeout=timeout, log_path=log_path
    )
    return {
        "events": rep["records"],
        "records": rep["records"],
        "seconds": rep["span_seconds"],
        "wall_seconds": rep["wall_seconds"],
        # The whole process's CPU, start-up, JIT and shutdown included (see the document).
        "cpu_seconds": rep["cpu_seconds"],
        "peak_rss": rep["peak_rss"],
        "group": rep["group"],
    }


def run_pipeline(
    harness: Harness,
    ds: Dataset,
    msgs: list[Message],
    ingest: str | None = None,
    profile: tuple[str, Path] | None = None,
    profile_rate: int = 100,
) -> dict:
    """A dpstream worker over a topic of its own holding ``msgs``.

    Single-event records (and source batches): a source topic written in a transaction
    left open (``hold_source``); once the worker runs (its first release is out, its ingest
    holds every source partition), the transaction is committed: the whole backlog becomes
    visible at once. Our envelopes (``ds.shape == ENVELOPES``): the worker runs with
    ``--ingest off``; once it has released a first tick, this process writes the columnar
    envelopes straight into its events topic (Faust's consumer reads uncommitted records,
    so a held transaction would not hide them; writing ~1,000 records of up to 2,000
    events each takes a fraction of a second and is inside the timed span). Time = from
    that commit (or the first envelope sent) to the release of the tick holding the last
    event (the first marker after the last envelope in every events partition:
    ``Watcher.closing``).

    ``profile``: ("pyspy", raw output file) attaches py-spy over that span (and a second
    one to a process-mode ingest, ``<file>.ingest``); ("cprofile", stats file) runs the
    worker under ``bench/cprofile_worker.py`` and switches cProfile on and off at the same
    two moments (its main thread only).
    """
    from confluent_kafka import Producer

    from dpstream.pipeline.kafka.topics import ensure_topics

    envelopes = ds.shape == ENVELOPES
    ingest = "off" if envelopes else ingest
    bootstrap = harness.bootstrap
    cfg, path = write_config(
        run_config(harness.base, "p", None, harness.tick, ds.partitions), harness.workdir
    )
    ensure_topics(cfg, bootstrap)  # the source topic too
    producer = (
        Producer({"bootstrap.servers": bootstrap, **SOURCE_PRODUCER})
        if envelopes
        else hold_source(bootstrap, cfg.input.topics[0], ds.partitions, msgs)
    )
    watcher = Watcher(bootstrap, cfg, events=ds.events)
    logf = harness.workdir / f"{cfg.app_id}.log"
    spawned = time.time()
    kind, out = profile or ("", Path())
    proc = spawn(path, harness, logf, ingest, out if kind == "cprofile" else None)
    spies: list[subprocess.Popen] = []
    try:
        watcher.wait(watcher.any_release, 180, "a first release", proc, logf)
        if not envelopes:
            ingest_assigned(bootstrap, cfg)
        ready = time.time()
        cpu0 = tree_cpu_seconds(proc.pid)
        ingest_cpu0 = sum(tree_cpu_seconds(c) for c in children(proc.pid))
        if kind == "pyspy":
            spies = attach_py_spy(proc.pid, out, profile_rate)
        elif kind == "cprofile":
            proc.send_signal(signal.SIGRTMIN + 1)
        start = time.time()  # every event is visible to the worker from now on
        if envelopes:
            produce_nowait(producer, cfg.events_topic, msgs)
            producer.flush(300)
        else:
            producer.commit_transaction(30)
            start = time.time()
        watcher.wait(lambda: watcher.closing() is not None, 1800, "every event", proc, logf)
        last, marker = watcher.closing() or (-1, 0.0)
        watcher.wait(lambda: watcher.released(last), 600, f"release of tick {last}", proc, logf)
        watcher.wait(lambda: watcher.ready(last) is not None, 60, "its reports", proc, logf)
        cpu1, wall1 = tree_cpu_seconds(proc.pid), time.time()
        ingest_cpu1 = sum(tree_cpu_seconds(c) for c in children(proc.pid))
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
    end = watcher.ready(last) or math.nan
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
        # Of which the ingest's child process (0 when the ingest is a thread or off).
        "ingest_cpu_seconds": ingest_cpu1 - ingest_cpu0,
        "cpu_wall_seconds": wall1 - start,
        "startup_seconds": ready - spawned,
        # Start-up plus the span: the worker waits, started, until the backlog is visible.
        "wall_seconds": ready - spawned + end - start,
        "peak_rss": mem.get("VmHWM"),
        "rss": mem.get("VmRSS"),
        "ingest_peak_rss": max((m.get("VmHWM", 0) for m in ingest_mem), default=None),
        "dead_letters": dead,
    }


def attach_py_spy(pid: int, out: Path, rate: int) -> list[subprocess.Popen]:
    """py-spy on the worker (into ``out``) and on a process-mode ingest."""
    targets = [(pid, out)] + [(child, out.with_suffix(".ingest.txt")) for child in children(pid)]
    spies = []
    for target, to in targets:
        cmd = [py_spy() or "py-spy", "record", "--pid", str(target), "--threads"]
        cmd += ["--idle", "-f", "raw", "-r", str(rate), "-o", str(to)]
        spies.append(
            subprocess.Popen(  # noqa: S603 - fixed argument list
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    time.sleep(0.5)  # attached
    return spies


def run_latency(
    harness: Harness,
    *,
    batch: int,
    rate: float,
    seconds: float,
    users: int,
    partitions: int,
    seed: int,
    wait: float,
    ingest: str | None = None,
) -> dict:
    """Produce ``rate`` events/s for ``seconds`` into a running worker's source topic
    (a plain confluent-kafka Producer, as ``preproduce``: single events keyed by user, or
    source batches); for every tick that lies wholly inside the production window,
    latency = release CreateTime - tick end. Waits at most ``wait`` s after production for
    the last of those ticks."""
    from confluent_kafka import Producer

    from dpstream.pipeline.kafka.topics import ensure_topics

    tick = harness.tick
    cfg, path = write_config(run_config(harness.base, "l", None, tick, partitions), harness.workdir)
    ensure_topics(cfg, harness.bootstrap)
    source = cfg.input.topics[0]
    watcher = Watcher(harness.bootstrap, cfg)
    logf = harness.workdir / f"{cfg.app_id}.log"
    proc = spawn(path, harness, logf, ingest)
    producer = Producer({"bootstrap.servers": harness.bootstrap, **SOURCE_PRODUCER})
    total = int(rate * seconds)
    step = 0.05  # produce every 50 ms what is due: batches hold <= rate*step events
    events = list(synthetic(users, total, seed))
    try:
        watcher.wait(watcher.any_release, 180, "a first release", proc, logf)
        ingest_assigned(harness.bootstrap, cfg)
        cpu0 = tree_cpu_seconds(proc.pid)
        start = time.time()
        sent = 0
        while sent < total:
            due = min(total, int((time.time() - start) * rate)) - sent
            if due > 0:
                msgs, n = messages(iter(events[sent : sent + due]), batch)
                produce_nowait(producer, source, msgs)
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


def run_memory(
    harness: Harness,
    *,
    users: int,
    events: int,
    batch: int,
    partitions: int,
    ingest: str | None = None,
) -> dict:
    """A worker over ``events`` events from ``users`` users in source batches of
    ``batch``; its RSS once the last event's tick is released."""
    msgs, n = messages(cycle_users(users, events), batch)
    ds = Dataset(f"memory-{users}", "batches", "", partitions, n, len(msgs), {}, 0.0)
    return {"users": users, **run_pipeline(harness, ds, msgs, ingest)}
