"""What users would write instead of dpstream: the peers among the contenders (issue 16).

A running per-user count over a Kafka topic of single-event JSON records keyed by user id:

* **Kafka Streams** 4.1.1 (``bench/kstreams/``): ``groupByKey().count()`` with the default
  RocksDB store, ``at_least_once`` or ``exactly_once_v2``. Built from Maven Central by
  :func:`build_kafka_streams`, once, into ``.dpstream/bench/kstreams-<version>/``.
* **Quix Streams** (``bench/quix_count.py``): a stateful ``apply`` counting per key,
  ``at-least-once`` or ``exactly-once``. quixstreams (the pin of the ``bench-quix`` extra in
  pyproject.toml) is installed by :func:`quix_python`, once, into a venv of its own,
  ``.dpstream/bench/quixstreams-<version>/``: it pins confluent-kafka < 2.13 and
  pydantic < 2.14, which would otherwise replace the versions dpstream itself is measured
  with. ``make install`` (and so CI) does not install it.

Each run is a fresh process (a new application id / consumer group, a fresh state dir) that
reads the pre-produced topic from the earliest offset and stops itself after ``n`` records.
It reports the first-to-last-record span, wall seconds from process start to the last
record, CPU seconds of the process (start-up and shutdown included) and its peak RSS.
``bench.throughput`` runs them as contenders, on the same topic as the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import orjson

from bench.common import proc_cpu_seconds, proc_status

ROOT = Path(__file__).resolve().parents[2]
KSTREAMS_DIR = ROOT / "bench" / "kstreams"
QUIX_SCRIPT = ROOT / "bench" / "quix_count.py"
CACHE_DIR = ROOT / ".dpstream" / "bench"  # git-ignored, removed by `make clean`
QUIX_EXTRA = "bench-quix"
KSTREAMS_MAIN = "dpstream.bench.PeerCount"
KSTREAMS_GUARANTEES = ("at_least_once", "exactly_once_v2")
QUIX_GUARANTEES = ("at-least-once", "exactly-once")
PEERS = (
    *(f"kafka-streams:{g}" for g in KSTREAMS_GUARANTEES),
    *(f"quix:{g}" for g in QUIX_GUARANTEES),
)
_MARKER = ".complete"
# The harness's own admin clients: warnings and errors only (not librdkafka's notices).
ADMIN = {"log_level": 4}


class PeerUnavailable(RuntimeError):
    """A peer cannot be built or installed here (no JDK/Maven/network, pip failed)."""


class PeerFailed(RuntimeError):
    """A peer ran but did not count all its records (or crashed)."""


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _complete(target: Path, digest: str) -> bool:
    try:
        return (target / _MARKER).read_text(encoding="utf-8").strip() == digest
    except OSError:
        return False


def _setup_step(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    # Fixed argument lists, no shell: our own paths, pins and constants only.
    result = subprocess.run(  # noqa: S603
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise PeerUnavailable(
            f"{what} failed (exit {result.returncode}):\n{_tail(result.stdout + result.stderr)}"
        )


# --------------------------------------------------------------------------- Kafka Streams


def _kafka_version() -> str:
    from dpstream.deploy.broker import KAFKA_VERSION

    return KAFKA_VERSION


def kstreams_dir() -> Path:
    """Where :func:`build_kafka_streams` puts the app's jar and its ``lib/`` classpath."""
    return CACHE_DIR / f"kstreams-{_kafka_version()}"


def _kstreams_digest() -> str:
    h = hashlib.sha256(_kafka_version().encode())
    for path in sorted([KSTREAMS_DIR / "pom.xml", *(KSTREAMS_DIR / "src").rglob("*.java")]):
        h.update(path.relative_to(KSTREAMS_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _tool(name: str, hint: str) -> str:
    from dpstream.deploy import broker

    try:
        return broker.require_tool(name, hint)
    except broker.BrokerError as exc:
        raise PeerUnavailable(str(exc)) from None


def build_kafka_streams() -> Path:
    """Build the Kafka Streams app with Maven (``mvn -q package``), once.

    Into :func:`kstreams_dir` unless a marker there holds the digest of the pom, the Java
    source and the Kafka version; concurrent callers serialise on a lock file.

    Returns:
        The directory holding ``peer-count.jar`` and ``lib/*.jar`` (its runtime classpath).

    Raises:
        PeerUnavailable: no JDK or Maven, or Maven failed (e.g. Maven Central unreachable).
    """
    target = kstreams_dir()
    digest = _kstreams_digest()
    if _complete(target, digest):
        return target
    mvn = _tool("mvn", "Apache Maven 3.6+ builds the Kafka Streams peer (apt-get install maven)")
    _tool("java", "a JDK 17+ builds and runs the Kafka Streams peer")
    with _locked(CACHE_DIR / ".kstreams.lock"):
        if _complete(target, digest):
            return target
        shutil.rmtree(target, ignore_errors=True)
        log(f"building the Kafka Streams peer with Maven into {target}")
        started = time.monotonic()
        _setup_step(
            [
                mvn,
                "-q",
                "-B",
                "-Dstyle.color=never",
                "-f",
                str(KSTREAMS_DIR / "pom.xml"),
                "package",
                f"-Dkafka.version={_kafka_version()}",
                f"-Dout.dir={target}",
            ],
            "Maven (building bench/kstreams)",
            cwd=KSTREAMS_DIR,
        )
        if not (target / "peer-count.jar").is_file() or not list(
            target.glob("lib/kafka-streams-*.jar")
        ):
            raise PeerUnavailable(f"Maven succeeded but {target} lacks the jar or its lib/")
        (target / _MARKER).write_text(digest + "\n", encoding="utf-8")
        log(f"Kafka Streams peer built in {time.monotonic() - started:.1f} s")
    return target


def kafka_streams_command(
    bootstrap: str, topic: str, n: int, guarantee: str, app_id: str, state_dir: Path, timeout: float
) -> list[str]:
    home = build_kafka_streams()
    java = _tool("java", "a JDK 17+ runs the Kafka Streams peer")
    return [
        java,
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        os.pathsep.join([str(home / "peer-count.jar"), str(home / "lib" / "*")]),
        KSTREAMS_MAIN,
        bootstrap,
        topic,
        str(n),
        guarantee,
        app_id,
        str(state_dir),
        str(int(timeout)),
    ]


# --------------------------------------------------------------------------- Quix Streams


def quix_requirement() -> str:
    """The quixstreams pin of the ``bench-quix`` extra in pyproject.toml."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (req,) = data["project"]["optional-dependencies"][QUIX_EXTRA]
    return req


def quix_venv() -> Path:
    return CACHE_DIR / quix_requirement().replace("==", "-")


def quix_python() -> str:
    """A Python with the pinned quixstreams: its own venv, created (pip install) once.

    Raises:
        PeerUnavailable: the venv could not be made or pip could not install quixstreams.
    """
    req = quix_requirement()
    target = quix_venv()
    python = target / "bin" / "python"
    digest = hashlib.sha256(f"{req} {sys.version}".encode()).hexdigest()
    if _complete(target, digest):
        return str(python)
    with _locked(CACHE_DIR / ".quix.lock"):
        if _complete(target, digest):
            return str(python)
        shutil.rmtree(target, ignore_errors=True)
        log(f"installing {req} into {target}")
        started = time.monotonic()
        _setup_step([sys.executable, "-m", "venv", str(target)], "python -m venv")
        _setup_step(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", req],
            f"pip install {req}",
        )
        (target / _MARKER).write_text(digest + "\n", encoding="utf-8")
        log(f"{req} installed in {time.monotonic() - started:.1f} s")
    return str(python)


def quix_command(
    bootstrap: str, topic: str, n: int, guarantee: str, group: str, state_dir: Path, timeout: float
) -> list[str]:
    return [
        quix_python(),
        str(QUIX_SCRIPT),
        bootstrap,
        topic,
        str(n),
        guarantee,
        f"--group={group}",
        f"--state-dir={state_dir}",
        f"--timeout={timeout}",
    ]


# --------------------------------------------------------------------------- clean-up


def delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    """Delete topics and ignore failures (the benchmark's own leftovers)."""
    if not names:
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(ADMIN | {"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(list(names), operation_timeout=30).values():
        with contextlib.suppress(Exception):
            future.result(timeout=60)


def _leftovers(bootstrap: str, marker: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(ADMIN | {"bootstrap.servers": bootstrap})
    return [t for t in admin.list_topics(timeout=30).topics if marker in t]


def _drop_group(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(ADMIN | {"bootstrap.servers": bootstrap})
    with contextlib.suppress(Exception):
        for future in admin.delete_consumer_groups([group], request_timeout=30).values():
            future.result(timeout=60)


# --------------------------------------------------------------------------- running


def _run_peer(cmd: list[str], n: int, log_path: Path | None, timeout: float) -> dict:
    """Run one peer process to completion; its JSON line plus what /proc saw of it."""
    with contextlib.ExitStack() as stack:
        if log_path is None:
            log_path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "stderr.log"
        with open(log_path, "w") as stderr_file:
            started = time.monotonic()
            # Fixed argument lists built above from our own paths and the caller's names.
            proc = subprocess.Popen(  # noqa: S603
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr_file, text=True
            )
            hwm, cpu = 0, None
            deadline = started + timeout + 90
            while proc.poll() is None:
                hwm = max(hwm, proc_status(proc.pid).get("VmHWM", 0))
                cpu = proc_cpu_seconds(proc.pid) or cpu
                if time.monotonic() > deadline:
                    proc.kill()
                    break
                time.sleep(0.1)
            out = proc.communicate()[0]
            process_seconds = time.monotonic() - started
        err = log_path.read_text(errors="replace")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise PeerFailed(f"{cmd[0]} exited {proc.returncode} with no report:\n{_tail(err)}")
    rep = orjson.loads(lines[-1])
    records, span = rep["records"], rep["span_seconds"]
    if proc.returncode != 0 or records != n:
        raise PeerFailed(
            f"{rep.get('peer')} {rep.get('guarantee')} counted {records} of {n} records "
            f"(exit {proc.returncode}):\n{_tail(err)}"
        )
    peak = max(rep.get("peak_rss") or 0, hwm) or None
    return {
        **rep,
        "rate": (records - 1) / span if span else None,
        "cpu_us_per_record": rep["cpu_seconds"] * 1e6 / records,
        "peak_rss": peak,
        "process_seconds": process_seconds,
        "harness_cpu_seconds": cpu,
    }


def run_peer(
    peer: str,
    bootstrap: str,
    topic: str,
    n: int,
    *,
    timeout: float = 600,
    log_path: Path | None = None,
) -> dict:
    """Count ``n`` records of ``topic`` per user with ``peer`` (``kafka-streams:<guarantee>``
    or ``quix:<guarantee>``) in a fresh process (a JVM for Kafka Streams).

    Returns:
        rate (records/s, first to last record), wall_seconds (process start to the last
        record), cpu_us_per_record (process CPU at exit / n), peak_rss (bytes), the raw
        report and group (the run's application id / consumer group; its internal topics
        are deleted afterwards).
    """
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
    family, _, guarantee = peer.partition(":")
    short = "kstreams" if family == "kafka-streams" else family
    group = f"bench-{short}-{guarantee.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    make = kafka_streams_command if family == "kafka-streams" else quix_command
    return _run_fresh(
        bootstrap,
        group,
        n,
        log_path,
        timeout,
        lambda state_dir: make(bootstrap, topic, n, guarantee, group, state_dir, timeout),
    )


def _run_fresh(
    bootstrap: str,
    group: str,
    n: int,
    log_path: Path | None,
    timeout: float,
    command: Callable[[Path], list[str]],
) -> dict:
    """One peer run in a fresh process with a state directory of its own; afterwards its
    state, internal topics and consumer group are removed."""
    state_dir = Path(tempfile.mkdtemp(prefix=f"{group}-"))
    try:
        return {**_run_peer(command(state_dir), n, log_path, timeout), "group": group}
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
        delete_topics(bootstrap, _leftovers(bootstrap, group))
        _drop_group(bootstrap, group)
