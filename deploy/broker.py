"""A real Apache Kafka broker for tests, the demo and the CLI, without installing Kafka.

Three ways to get a broker, tried in this order by :func:`kafka_broker`:

1. ``KAFKA_BOOTSTRAP_SERVERS`` is set: use that cluster, start nothing.
2. A Docker engine answers: run ``$DPSTREAM_KAFKA_IMAGE`` (default
   ``apache/kafka:<KAFKA_VERSION>``) through testcontainers. If that container cannot start
   (no registry, no reaper image, no published port) a warning says why and 3. follows,
   unless ``DPSTREAM_REQUIRE_CONTAINERS=1``.
3. Otherwise: :class:`LocalKafka`, a single-node KRaft broker run straight from Kafka's own
   jars, which Maven fetches once into ``deploy/.cache/kafka-<version>/`` (:func:`fetch_jars`).
   Needs only a JDK (17+) and Maven.

``dpstream broker start|stop|status`` keeps one :class:`LocalKafka` running in the background;
its whereabouts live in ``.dpstream/broker.json`` (see :func:`start_detached`).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import gc
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstream.operators.errors import DpStreamError

from .processes import ServiceProcess, read_state, reap, write_state

logger = logging.getLogger(__name__)

REPO_ROOT: Path = Path(__file__).resolve().parents[1]
"""The source checkout (``pip install -e .`` keeps ``pipeline/`` inside it); in an
installed wheel, the ``dpstream`` package directory."""

KAFKA_VERSION = "4.1.1"
"""The one Kafka version of dpstream: jars, the test container image and the compose file."""

DEPLOY_DIR: Path = REPO_ROOT / "deploy"
POM_FILE: Path = DEPLOY_DIR / "pom.xml"
LOG4J_CONFIG: Path = DEPLOY_DIR / "log4j2.properties"
KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
HOME_ENV = "DPSTREAM_HOME"
LOG_LEVEL_ENV = "DPSTREAM_KAFKA_LOG_LEVEL"

_MARKER = ".complete"
_JVM_HEAP = ("-Xms128m", "-Xmx512m")
_BIND_ERROR = "Address already in use"

# Broker settings shared by LocalKafka and the test container (the container gets them as
# KAFKA_* environment variables, so keys must not contain '_' or '-').
BROKER_DEFAULTS: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.network.threads": "2",
    "num.io.threads": "2",
}


class BrokerError(DpStreamError):
    """A Kafka broker could not be fetched, started, reached or stopped."""


# --------------------------------------------------------------------------- jars


def source_checkout() -> bool:
    """Whether dpstream runs from its source checkout (an editable install), not from an
    installed wheel (whose ``deploy/`` holds the pom and the log config as package data)."""
    return (REPO_ROOT / "pyproject.toml").is_file()


def home_dir() -> Path:
    """Where dpstream keeps its local state (``.dpstream/``: the detached broker's and
    registry's whereabouts; from a wheel, the fetched jars too): ``$DPSTREAM_HOME`` if set,
    else the source checkout, else the user's home directory (never site-packages)."""
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home)
    return REPO_ROOT if source_checkout() else Path.home()


def cache_dir() -> Path:
    """Where fetched jars go: ``deploy/.cache`` in a source checkout, else
    ``<home_dir>/.dpstream/cache``."""
    return DEPLOY_DIR / ".cache" if source_checkout() else home_dir() / ".dpstream" / "cache"


def jar_dir() -> Path:
    """Where :func:`fetch_jars` puts the jars of :data:`KAFKA_VERSION`."""
    return cache_dir() / f"kafka-{KAFKA_VERSION}"


def require_tool(name: str, hint: str) -> str:
    """The path of ``name`` (``java``: under $JAVA_HOME first); BrokerError with ``hint``."""
    if name == "java" and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise BrokerError(f"'{name}' was not found on PATH. {hint}")
    return found


def _java() -> str:
    return require_tool(
        "java", "The local Kafka broker needs a JDK 17+ (e.g. apt-get install openjdk-17-jdk)."
    )


def _pom_digest() -> str:
    return hashlib.sha256(POM_FILE.read_bytes()).hexdigest()


def _jars_complete(target: Path) -> bool:
    marker = target / _MARKER
    try:
        return marker.read_text(encoding="utf-8").strip() == _pom_digest()
    except OSError:
        return False


def fetch_jars(*, quiet: bool = True) -> Path:
    """Fetch the Kafka broker jars with Maven, once.

    Runs ``mvn dependency:copy-dependencies`` on ``deploy/pom.xml`` (package data) into
    :func:`jar_dir` unless a marker file from an earlier successful
    run (holding a digest of the pom) is present. Concurrent callers serialise on a lock file.

    Args:
        quiet: Pass ``-q`` to Maven and capture its output (shown only on failure).

    Returns:
        The directory holding the jars (use it as ``<dir>/*`` on a Java classpath).

    Raises:
        BrokerError: ``deploy/pom.xml`` is missing (a broken install), ``mvn`` or
            ``java`` is not installed, or Maven failed.
    """
    if not POM_FILE.is_file():
        raise BrokerError(
            f"{POM_FILE} not found: reinstall dpstream, or set KAFKA_BOOTSTRAP_SERVERS to use "
            "an existing broker."
        )
    target = jar_dir()
    if _jars_complete(target):
        return target
    mvn = require_tool(
        "mvn", "Install Apache Maven 3.6+ (e.g. apt-get install maven) to fetch the Kafka jars."
    )
    _java()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _jars_complete(target):  # another process finished while we waited
            return target
        cmd = [
            mvn,
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(POM_FILE),
            "dependency:copy-dependencies",
            f"-Dkafka.version={KAFKA_VERSION}",
            f"-Djars.dir={target}",
        ]
        if quiet:
            cmd.insert(1, "-q")
        logger.info("fetching Kafka %s jars with Maven into %s", KAFKA_VERSION, target)
        started = time.monotonic()
        # Fixed argument list, no shell: the only inputs are our own paths and constants.
        result = subprocess.run(  # noqa: S603
            cmd,
            cwd=target.parent,  # writable, where an installed package may not be
            stdin=subprocess.DEVNULL,
            capture_output=quiet,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            output = ((result.stdout or "") + (result.stderr or "")).strip()
            raise BrokerError(
                f"Maven could not fetch the Kafka jars (exit {result.returncode}):\n"
                + _tail_text(output, 40)
            )
        for jar in ("kafka_2.13-*.jar", "kafka-tools-[0-9]*.jar"):
            if not list(target.glob(jar)):
                raise BrokerError(f"Maven succeeded but no {jar} is in {target}")
        (target / _MARKER).write_text(_pom_digest() + "\n", encoding="utf-8")
        logger.info("Kafka jars ready in %.1f s", time.monotonic() - started)
    return target


CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
"""Kafka's ``kafka-console-producer.sh`` (in ``kafka-tools``, see ``deploy/pom.xml``)."""


def kafka_tool_command(main_class: str, *args: str) -> list[str]:
    """The command line that runs one of Kafka's own tools from the jars of :func:`fetch_jars`.

    What ``bin/kafka-run-class.sh <main_class> <args>`` does in a Kafka download: a JVM on
    the jar directory, logging through ``deploy/log4j2.properties`` (WARN and above to
    stdout). The jars are fetched first if needed.

    Args:
        main_class: E.g. :data:`CONSOLE_PRODUCER`.
        *args: The tool's own arguments (``--help`` lists them).

    Returns:
        An argument list for :func:`subprocess.run` (no shell).

    Raises:
        BrokerError: No JDK, no Maven where the jars must be fetched, or Maven failed.
    """
    jars = fetch_jars()
    return [
        _java(),
        "-XX:TieredStopAtLevel=1",  # a short-lived JVM: skip the optimising compiler
        "-Xmx256m",
        "-cp",
        f"{jars}/*",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        main_class,
        *args,
    ]


# --------------------------------------------------------------------------- helpers


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            return _tail_text(fh.read().decode("utf-8", "replace"), lines)
    except OSError:
        return "(no broker log)"


def listener_ports(props: Path) -> list[int]:
    """The ports of the ``listeners`` of a ``server.properties``, in their order (none if
    there is no such file)."""
    try:
        found = re.search(r"^listeners=(.*)$", props.read_text("utf-8"), re.M)
    except OSError:
        return []
    return [int(p) for p in re.findall(r"://[^:,]+:(\d+)", found.group(1))] if found else []


def _free_ports(count: int) -> list[int]:
    """Ports that were free on 127.0.0.1 a moment ago (all held open until all are chosen)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _cluster_id() -> str:
    """A Kafka-style cluster id: 16 random bytes, base64url without padding, no leading '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cid.startswith("-"):
            return cid


def _admin_config(bootstrap: str, client: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "log_level": 0,  # librdkafka otherwise prints every refused connection to stderr
        "socket.connection.setup.timeout.ms": 1000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 250,
        **(client or {}),
    }


def _wait_ready(
    bootstrap: str,
    timeout: float,
    check: Callable[[], None] | None = None,
    client: Mapping[str, str] | None = None,
    brokers: int = 1,
) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    admin = AdminClient(_admin_config(bootstrap, client))
    last_error = "no answer"
    while True:
        if check is not None:
            check()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerError(
                f"Kafka at {bootstrap} did not answer within {timeout:.0f} s ({last_error})"
            )
        try:
            metadata = admin.list_topics(timeout=max(0.2, min(1.0, remaining)))
        except KafkaException as exc:
            last_error = str(exc)
        else:
            if len(metadata.brokers) >= brokers:
                return
            last_error = f"metadata lists {len(metadata.brokers)} of {brokers} brokers"
        time.sleep(0.1)


def wait_for_metadata(
    bootstrap: str,
    timeout: float,
    brokers: int = 1,
    check: Callable[[], None] | None = None,
) -> None:
    """Block until a Kafka cluster answers a metadata request that lists ``brokers`` brokers.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        timeout: Seconds to keep trying.
        brokers: How many brokers the answer must list.
        check: Called before each try; raises to give up (a broker process exited).

    Raises:
        BrokerError: No such answer within ``timeout``.
    """
    _wait_ready(bootstrap, timeout, check, brokers=brokers)


def plaintext_settings(ports: Sequence[int], log_dir: Path) -> dict[str, str]:
    """A single node's settings: broker and controller in one JVM, PLAINTEXT on loopback
    (``ports``: the client listener's, the controller's)."""
    port, controller_port = ports
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        **BROKER_DEFAULTS,
    }


@dataclass(frozen=True)
class NodeSpec:
    """What a :class:`LocalKafka` node runs with.

    Attributes:
        settings: Its ``server.properties`` from its ports and its log dir; the first port is
            the client listener :attr:`LocalKafka.bootstrap` names.
        ports: How many ports ``settings`` takes.
        format_args: Extra arguments of the storage format (``--add-scram ...``).
        client: librdkafka settings a client needs to reach the first listener (the
            readiness check's).
    """

    settings: Callable[[Sequence[int], Path], dict[str, str]] = plaintext_settings
    ports: int = 2
    format_args: tuple[str, ...] = ()
    client: Mapping[str, str] = field(default_factory=dict)


def _write_properties(path: Path, settings: Mapping[str, str]) -> None:
    lines = ["# written by dpstream.deploy.broker"]
    lines += [f"{key}={value}" for key, value in settings.items()]
    path.write_text("\n".join(lines) + "\n", "utf-8")


def _format_storage(
    java: str, classpath: str, props: Path, cwd: Path, cluster_id: str, extra: Sequence[str] = ()
) -> None:
    """Format a new KRaft log dir (``kafka-storage.sh format``) for the cluster ``cluster_id``."""
    # Fixed argument list, no shell: java from PATH/JAVA_HOME, our own paths.
    fmt = subprocess.run(  # noqa: S603
        [
            java,
            "-XX:TieredStopAtLevel=1",  # a short-lived JVM: skip the optimising compiler
            "-cp",
            classpath,
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(props),
            *extra,
        ],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if fmt.returncode != 0:
        raise BrokerError(
            f"formatting Kafka storage in {cwd} failed (exit {fmt.returncode}):\n"
            + _tail_text(fmt.stdout + fmt.stderr, 30)
        )


# --------------------------------------------------------------------------- LocalKafka


@dataclass
class LocalKafka(ServiceProcess):
    """A single-node KRaft broker from Kafka's own jars on free loopback ports, data in a temp dir.

    Attributes:
        bootstrap: ``127.0.0.1:<port>`` for clients.
        pid: The broker's JVM; it leads its own process group.
        data_dir: Holds ``server.properties``, ``broker.log`` and the log segments (``data/``).
        log_file: The broker's stdout/stderr (WARN and above, see ``deploy/log4j2.properties``).
    """

    bootstrap: str
    pid: int
    data_dir: Path
    log_file: Path
    owns_data_dir: bool = False
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def start(
        cls,
        *,
        data_dir: Path | None = None,
        timeout: float = 60.0,
        spec: NodeSpec | None = None,
        owns_data_dir: bool | None = None,
    ) -> LocalKafka:
        """Fetch the jars if needed, format storage, start the broker and wait until it answers.

        Args:
            data_dir: Where to keep config, log and data. Default: a new temp dir that
                :meth:`stop` removes. A given dir is kept (and reused if already formatted).
            timeout: Seconds to wait for the broker to answer a metadata request.
            spec: Its settings (default: :func:`plaintext_settings`).
            owns_data_dir: Whether :meth:`stop` removes ``data_dir`` (default: only the
                temp dir made here).

        Returns:
            The running broker.

        Raises:
            BrokerError: Missing java/mvn, a failed format, or the broker exited early or did
                not answer in time (the message carries the end of the broker log).
        """
        spec = spec or NodeSpec()
        jars = fetch_jars()
        owns = data_dir is None if owns_data_dir is None else owns_data_dir
        base = (
            Path(tempfile.mkdtemp(prefix="dpstream-kafka-")) if data_dir is None else Path(data_dir)
        )
        base = base.resolve()
        attempts = 3
        try:
            for attempt in range(1, attempts + 1):
                try:
                    return cls._start_once(jars, base, owns, timeout, spec, attempt == 1)
                except BrokerError as exc:
                    if _BIND_ERROR not in str(exc) or attempt == attempts:
                        raise
                    logger.warning("port taken while starting Kafka, retrying with new ports")
        except BaseException:
            if owns:
                shutil.rmtree(base, ignore_errors=True)
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def _start_once(
        cls, jars: Path, base: Path, owns: bool, timeout: float, spec: NodeSpec, reuse_ports: bool
    ) -> LocalKafka:
        started = time.monotonic()
        base.mkdir(parents=True, exist_ok=True)
        props = base / "server.properties"
        # A restart on the same data keeps the broker's address: its clients (a running
        # worker) know only that one. Fresh ports only if it is gone or taken.
        previous = listener_ports(props) if reuse_ports else []
        ports = previous if len(previous) == spec.ports else _free_ports(spec.ports)
        _write_properties(props, spec.settings(ports, base / "data"))
        kafka = cls.launch(jars, base, owns, _cluster_id(), spec.format_args)
        try:
            kafka.wait_ready(timeout, spec.client)
        except BaseException:
            kafka._kill_quietly(keep_dir=True)
            raise
        atexit.register(kafka._atexit_stop)
        logger.info(
            "Kafka %s up at %s (pid %d) in %.1f s",
            KAFKA_VERSION,
            kafka.bootstrap,
            kafka.pid,
            time.monotonic() - started,
        )
        return kafka

    @classmethod
    def launch(
        cls,
        jars: Path,
        base: Path,
        owns: bool,
        cluster_id: str,
        format_args: Sequence[str] = (),
    ) -> LocalKafka:
        """Start the JVM on ``base/server.properties`` (formatting ``base/data`` first if it
        is new) and return at once; :meth:`wait_ready` waits for it. Its :attr:`bootstrap`
        is the first address of the file's ``listeners``."""
        java = _java()
        props = base / "server.properties"
        ports = listener_ports(props)
        if not ports:
            raise BrokerError(f"{props} names no listener")
        classpath = f"{jars}/*"
        if not (base / "data" / "meta.properties").is_file():
            _format_storage(java, classpath, props, base, cluster_id, format_args)
        log_file = base / "broker.log"
        level = os.environ.get(LOG_LEVEL_ENV, "WARN")
        cmd = [
            java,
            *_JVM_HEAP,
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            f"-Ddpstream.kafka.loglevel={level}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(props),
        ]
        with open(log_file, "ab") as log:
            # Fixed argument list, no shell: java from PATH/JAVA_HOME, our own paths.
            proc = subprocess.Popen(  # noqa: S603
                cmd,
                cwd=base,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: survives a detaching parent
            )
        return cls(
            bootstrap=f"127.0.0.1:{ports[0]}",
            pid=proc.pid,
            data_dir=base,
            log_file=log_file,
            owns_data_dir=owns,
            _proc=proc,
        )

    def check_running(self) -> None:
        """Raise BrokerError with the end of its log if the JVM has exited."""
        code = self._proc.poll() if self._proc is not None else None
        if code is not None or not self.is_alive():
            raise BrokerError(
                f"Kafka exited during startup (exit {code}); end of {self.log_file}:\n"
                + _tail(self.log_file)
            )

    def wait_ready(
        self,
        timeout: float,
        client: Mapping[str, str] | None = None,
        bootstrap: str | None = None,
        brokers: int = 1,
    ) -> None:
        """Wait until a metadata answer through ``bootstrap`` (default: its own address,
        reached with the librdkafka settings ``client``) lists ``brokers`` brokers.

        Raises:
            BrokerError: It exited or did not answer in time (with the end of its log).
        """
        try:
            _wait_ready(bootstrap or self.bootstrap, timeout, self.check_running, client, brokers)
        except BrokerError as exc:
            if "exited during startup" in str(exc):
                raise
            raise BrokerError(f"{exc}; end of {self.log_file}:\n{_tail(self.log_file)}") from None

    def _is_ours(self, cmdline: str) -> bool:
        return "kafka.Kafka" in cmdline and str(self.data_dir) in cmdline

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the broker down cleanly (SIGTERM), SIGKILL if it takes longer than ``timeout``.

        Removes the data dir if :meth:`start` created it. Safe to call twice.

        Args:
            timeout: Seconds to wait for a clean shutdown before SIGKILL.
        """
        started = time.monotonic()
        was_alive = self.is_alive()
        if not self._terminate(timeout, "Kafka"):
            raise BrokerError(f"Kafka pid {self.pid} survived SIGKILL")
        if was_alive:
            logger.info("Kafka at %s stopped in %.1f s", self.bootstrap, time.monotonic() - started)
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the broker (a crash); its data dir stays, for a restart on it."""
        self._kill_quietly(keep_dir=True)

    def _kill_quietly(self, *, keep_dir: bool) -> None:
        if self.is_alive():
            self._signal(signal.SIGKILL)
            self._wait_exit(10.0)
        reap(self.pid)
        if self.owns_data_dir and not keep_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# --------------------------------------------------------------------------- Docker


def docker_available() -> bool:
    """Whether a Docker engine answers a ping within about two seconds. Never raises.

    Looks for the engine where testcontainers would (its ``get_docker_host``: testcontainers
    properties, ``DOCKER_HOST``, the current docker context), else docker's default socket.
    """
    with warnings.catch_warnings():
        # A failed connection attempt leaves an unclosed socket behind in the docker SDK;
        # its ResourceWarning must not reach pytest's filterwarnings=error.
        warnings.simplefilter("ignore")
        try:
            import docker

            host: str | None = None
            with contextlib.suppress(ImportError):
                from testcontainers.core.docker_client import get_docker_host

                host = get_docker_host()
            client = (
                docker.DockerClient(base_url=host, timeout=2)
                if host
                else docker.from_env(timeout=2)
            )
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # any failure means "no usable engine"
            return False
        finally:
            gc.collect()  # drop the failed client's socket while warnings are still ignored


IMAGE_ENV = "DPSTREAM_KAFKA_IMAGE"
"""Names the broker image :func:`kafka_broker` runs (default :data:`KAFKA_IMAGE`)."""

REQUIRE_CONTAINERS_ENV = "DPSTREAM_REQUIRE_CONTAINERS"
"""Set to 1 where a containerized broker must be used (CI's container tests): no fallback."""

_CONTAINER_SCRIPT = "/tmp/dpstream-start.sh"  # noqa: S108 - a path inside the container
_CONTAINER_PORT = 9092
_TRUE = frozenset({"1", "true", "yes", "on"})


def kafka_image() -> str:
    """The broker image for containers: ``$DPSTREAM_KAFKA_IMAGE``, else :data:`KAFKA_IMAGE`."""
    return os.environ.get(IMAGE_ENV, "").strip() or KAFKA_IMAGE


def containers_required() -> bool:
    """Whether ``$DPSTREAM_REQUIRE_CONTAINERS`` forbids falling back to the jar broker."""
    return os.environ.get(REQUIRE_CONTAINERS_ENV, "").strip().lower() in _TRUE


def _container_env(cluster_id: str) -> dict[str, str]:
    """The apache/kafka image's KAFKA_* variables (advertised listeners come at start)."""
    env = {
        "CLUSTER_ID": cluster_id,
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093,"
        "CONTROLLER://0.0.0.0:9094",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,"
        "CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9094",
        "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",  # noqa: S108 - inside the container
    }
    for key, value in BROKER_DEFAULTS.items():
        env["KAFKA_" + key.upper().replace(".", "_")] = value
    return env


def _container_script(host: str, port: int) -> str:
    return (
        "#!/bin/bash\n"
        f'export KAFKA_ADVERTISED_LISTENERS="PLAINTEXT://{host}:{port},BROKER://$(hostname):9093"\n'
        "exec /etc/kafka/docker/run\n"
    )


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an error, cut short: a fallback warning must stay one line."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _script_archive(script: bytes) -> bytes:
    """A tar holding the container's start script (``put_archive`` takes tar bytes)."""
    import io
    import tarfile

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(name=_CONTAINER_SCRIPT.lstrip("/"))
        info.size = len(script)
        info.mode = 0o755
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(script))
    return archive.getvalue()


@dataclass
class KafkaContainer:
    """A single-node KRaft broker in a container started through testcontainers.

    testcontainers' own ``KafkaContainer`` drives Confluent's cp-kafka scripts and rejects
    ``apache/kafka:4.x`` in KRaft mode (its version check wants >= 7.0.0), so this uses its
    generic ``DockerContainer`` the way testcontainers-java does for apache/kafka: the
    container waits for a start script that is written once the mapped port is known. Any
    image that configures itself from ``KAFKA_*`` variables through ``/etc/kafka/docker/run``
    works: apache/kafka, or dpstream's own (``deploy/kafka-image/``).

    Attributes:
        bootstrap: ``host:port`` for clients on this machine.
        image: The image it runs.
    """

    bootstrap: str
    image: str
    _container: Any = field(repr=False, compare=False)

    @classmethod
    def start(cls, image: str | None = None, *, timeout: float = 120.0) -> KafkaContainer:
        """Start the container and wait until the broker answers through its mapped port.

        Args:
            image: The broker image; default :func:`kafka_image`.
            timeout: Seconds to wait for a metadata answer once the container runs.

        Returns:
            The running broker.

        Raises:
            BrokerError: The image could not be pulled, the container (or the Ryuk reaper)
                did not start, its port was not published, or the broker did not answer.
        """
        image = image or kafka_image()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from testcontainers.core.container import DockerContainer

        container = DockerContainer(image)
        for key, value in _container_env(_cluster_id()).items():
            container.with_env(key, value)
        container = container.with_exposed_ports(_CONTAINER_PORT).with_command(
            [
                "sh",
                "-c",
                f"while [ ! -f {_CONTAINER_SCRIPT} ]; do sleep 0.1; done; "
                f"exec bash {_CONTAINER_SCRIPT}",
            ]
        )
        started = time.monotonic()
        try:
            container.start()
        except Exception as exc:  # docker SDK and testcontainers raise many kinds
            with contextlib.suppress(Exception):
                container.stop()
            raise BrokerError(f"could not start the {image} container: {_one_line(exc)}") from exc
        try:
            bootstrap = cls._configure(container, timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                container.stop()
            raise
        logger.info(
            "Kafka container %s up at %s in %.1f s", image, bootstrap, time.monotonic() - started
        )
        return cls(bootstrap=bootstrap, image=image, _container=container)

    @staticmethod
    def _configure(container: Any, timeout: float) -> str:
        """Hand the container its advertised address, then wait for the broker."""
        try:
            host = container.get_container_host_ip()
            port = int(container.get_exposed_port(_CONTAINER_PORT))
            script = _container_script(host, port).encode()
            container.get_wrapped_container().put_archive("/", _script_archive(script))
        except Exception as exc:
            raise BrokerError(f"the Kafka container's port was not published: {exc}") from exc
        bootstrap = f"{host}:{port}"
        try:
            wait_for_metadata(bootstrap, timeout)
        except BrokerError as exc:
            out, err = container.get_logs()
            logs = _tail_text((out + err).decode("utf-8", "replace"), 30)
            raise BrokerError(f"{exc}; container log:\n{logs}") from None
        return bootstrap

    def stop(self) -> None:
        """Stop and remove the container. Safe to call twice."""
        with contextlib.suppress(Exception):
            self._container.stop()


def _try_container() -> KafkaContainer | None:
    """A broker container if Docker answers and it starts; ``None`` means "use the jars".

    Raises:
        BrokerError: Containers are required (:func:`containers_required`) but no engine
            answers or the container did not start.
    """
    required = containers_required()
    if not docker_available():
        if required:
            raise BrokerError(f"{REQUIRE_CONTAINERS_ENV} is set but no Docker engine answers")
        return None
    try:
        return KafkaContainer.start()
    except BrokerError as exc:
        if required:
            raise
        # A pull that a proxy, an air gap or Docker Hub's rate limit refused must not fail a
        # run that Kafka's own jars can serve: say why, once, and go on without Docker.
        hint = " (TESTCONTAINERS_RYUK_DISABLED=true skips the reaper)" if "ryuk" in str(exc) else ""
        logger.warning("%s%s; using the local jar broker instead", _one_line(exc), hint)
        return None


@contextmanager
def kafka_broker() -> Iterator[str]:
    """Yield the bootstrap string of a running Kafka broker; stop it afterwards if started here.

    Order: ``$KAFKA_BOOTSTRAP_SERVERS`` if set and non-empty (nothing is started or stopped);
    else a :class:`KafkaContainer` of :func:`kafka_image` when :func:`docker_available`;
    else :meth:`LocalKafka.start` (fetching the jars first). A container that cannot start
    (image not pullable, reaper not pullable, port not published) is logged as one warning
    and the jar broker starts instead, unless ``$DPSTREAM_REQUIRE_CONTAINERS`` is set.

    Yields:
        ``host:port[,...]`` for ``bootstrap.servers``.

    Raises:
        BrokerError: No broker could be started.
    """
    configured = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if configured:
        logger.info("using Kafka at %s from %s", configured, BOOTSTRAP_ENV)
        yield configured
        return
    container = _try_container()
    if container is not None:
        try:
            yield container.bootstrap
        finally:
            container.stop()
        return
    kafka = LocalKafka.start()
    try:
        yield kafka.bootstrap
    finally:
        kafka.stop()


# --------------------------------------------------------------------------- detached broker


def state_file() -> Path:
    """``.dpstream/broker.json`` under :func:`home_dir`."""
    return home_dir() / ".dpstream" / "broker.json"


def _read_state() -> dict[str, Any] | None:
    return read_state(state_file(), "broker")


def _from_state(state: Mapping[str, Any]) -> LocalKafka:
    return LocalKafka(
        bootstrap=str(state["bootstrap"]),
        pid=int(state["pid"]),
        data_dir=Path(state["data_dir"]),
        log_file=Path(state["log_file"]),
        owns_data_dir=bool(state.get("owns_data_dir", True)),
    )


def status_detached() -> dict[str, Any] | None:
    """The broker recorded by :func:`start_detached`.

    Returns:
        ``{bootstrap, pid, data_dir, log_file, owns_data_dir, alive}``, or ``None`` if no
        broker is recorded.
    """
    state = _read_state()
    if state is None:
        return None
    try:
        alive = _from_state(state).is_alive()
    except (KeyError, TypeError, ValueError):
        alive = False
    return {**state, "alive": alive}


def running_detached() -> LocalKafka | None:
    """The live broker recorded by :func:`start_detached`, if any."""
    state = _read_state()
    try:
        kafka = _from_state(state) if state is not None else None
    except (KeyError, TypeError, ValueError):
        return None
    return kafka if kafka is not None and kafka.is_alive() else None


def start_detached(
    timeout: float = 60.0,
    start: Callable[[float], LocalKafka] | None = None,
    data_dir: Path | None = None,
) -> dict[str, Any]:
    """Start a background :class:`LocalKafka` that outlives this process, or reuse a live one.

    Args:
        timeout: Seconds to wait for a new broker to answer.
        start: Starts the broker, given ``timeout`` (default: :meth:`LocalKafka.start`;
            a secured one: ``deploy/secure_broker.py``).
        data_dir: Keep the broker's data there (:func:`start_on_data`); default a temp dir
            that :func:`stop_detached` removes.

    Returns:
        ``{bootstrap, pid, data_dir, log_file, owns_data_dir}`` plus ``already_running``.

    Raises:
        BrokerError: The broker could not be started.
    """
    status = status_detached()
    if status is not None:
        if status.pop("alive"):
            return {**status, "already_running": True}
        stale = _read_state()
        if stale is not None:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                _from_state(stale).stop()  # dead: only removes its temp data dir
        state_file().unlink(missing_ok=True)
    if start is None:
        start = start_on_data(data_dir)
    kafka = start(timeout)
    kafka.detach()
    state = {
        "bootstrap": kafka.bootstrap,
        "pid": kafka.pid,
        "data_dir": str(kafka.data_dir),
        "log_file": str(kafka.log_file),
        "owns_data_dir": kafka.owns_data_dir,
    }
    write_state(state_file(), state)
    return {**state, "already_running": False}


def start_on_data(data_dir: Path | None) -> Callable[[float], LocalKafka]:
    """A start of :class:`LocalKafka` on ``data_dir``, kept when it stops: started again on
    the same directory, the broker has its topics, offsets and ports back (its clients know
    only its old address); fresh ports only if the old ones are taken. None: a temp
    directory, removed when it stops."""

    def start(timeout: float) -> LocalKafka:
        if data_dir is None:
            return LocalKafka.start(timeout=timeout)
        return LocalKafka.start(data_dir=data_dir, timeout=timeout, owns_data_dir=False)

    return start


def stop_detached(timeout: float = 20.0) -> bool:
    """Stop the broker recorded by :func:`start_detached` and forget it.

    Args:
        timeout: Seconds to wait for a clean shutdown before SIGKILL.

    Returns:
        ``False`` if no broker was recorded, else ``True`` (also when it had already died).
    """
    state = _read_state()
    if state is None:
        state_file().unlink(missing_ok=True)
        return False
    try:
        kafka = _from_state(state)
    except (KeyError, TypeError, ValueError):
        logger.warning("broker state %s is malformed; removing it", state_file())
    else:
        kafka.stop(timeout=timeout)
    state_file().unlink(missing_ok=True)
    return True
