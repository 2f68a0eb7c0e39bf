"""Running a ``dpstream worker`` for the benchmark: its config, its process, and a watcher
of what it writes (the events topic, the stage-2 topic, the releases)."""

from __future__ import annotations

import importlib.resources
import math
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from bench.common import proc_cpu_seconds
from dpstream.config.schema import PipelineConfig, parse_config

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "DPSTREAM_BENCH_KEY"
# The dpstream worker's and the naive agent's log level unless --worker-loglevel says
# otherwise. At "warning" or above, faust.Worker keeps its terminal spinner, which sets
# the ROOT logger to DEBUG so that every aiokafka/Faust debug call builds a LogRecord
# (measured: 15-18% of the worker's main thread).
DEFAULT_LOGLEVEL = "info"


@dataclass(frozen=True)
class Harness:
    """What every process the benchmark starts shares: the broker, the pipeline's base
    config, where configs and logs go, the worker's environment (its noise key), the tick,
    the Faust processes' log level and the Schema Registry."""

    bootstrap: str
    base: dict
    workdir: Path
    env: dict[str, str]
    tick: float
    loglevel: str = DEFAULT_LOGLEVEL
    # The Schema Registry of the Avro dataset (None: no Avro dataset in this run).
    registry: str | None = None


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
        # tick -> [broker append time in s] of stage-1 reports that end at that tick
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
        from dpstream.pipeline.wire.records import ENVELOPE, RELEASE, TICK, header_kind

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
            if header_kind(msg.headers()) == RELEASE:
                continue  # the clock's release marker in the stage-2 topic, not a report
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

    def ready(self, tick: int) -> float | None:
        """When stage 2 had all of tick ``tick``'s reports (the last one's append time),
        once it has: the pipeline's work on the tick is done then, and its releases
        wait for their deadline, a fixed delay later (docs/design.md section 1)."""
        reports = self.reports.get(tick, [])
        expected = len(self.stats) * self.cfg.input.partitions
        return max(reports) if len(reports) >= expected else None

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
    from dpstream.pipeline.worker.processes import stop_worker

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


def spawn(
    config_path: Path,
    harness: Harness,
    log_path: Path,
    ingest: str | None,
    stats: Path | None = None,
) -> subprocess.Popen:
    """``dpstream worker`` (``ingest``: its ``--ingest`` mode; None: the worker's default);
    with ``stats``, under ``bench/cprofile_worker.py`` writing there."""
    cmd = [sys.executable, "-m"]
    cmd += ["bench.cprofile_worker", str(stats)] if stats else ["dpstream.pipeline.tools.cli"]
    cmd += ["worker", "--config", str(config_path), "--bootstrap", harness.bootstrap]
    cmd += ["--loglevel", harness.loglevel]
    if ingest:
        cmd += ["--ingest", ingest]
    with open(log_path, "wb") as fh:
        return subprocess.Popen(  # noqa: S603 - fixed argument list
            cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **harness.env}
        )
