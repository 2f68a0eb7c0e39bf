"""A real Schema Registry for tests, the demo and the CLI, without Docker or an install.

Apicurio Registry's application (Apache-2.0) serves Confluent's Schema Registry API under
``/apis/ccompat/v7``: every Confluent client (confluent-kafka's ``SchemaRegistryClient``
and its Avro, Protobuf and JSON Schema serializers) talks to it as to Confluent's. It runs
from Maven Central like the broker (:mod:`dpstream.deploy.broker`): one runner jar and its
``lib/`` folder, fetched once into ``deploy/.cache/apicurio-registry-<version>/``, started
with the JDK on the machine, schemas kept in memory (an in-memory H2 database: a new
registry starts empty).

Two ways to get a registry, tried in this order by :func:`schema_registry`:

1. ``DPSTREAM_SCHEMA_REGISTRY_URL`` is set: use that registry, start nothing.
2. Otherwise :class:`LocalRegistry` on a free loopback port.

``dpstream registry start|stop|status`` keeps one running in the background; its
whereabouts live in ``.dpstream/registry.json``.

The version: 3.0.9, the newest whose application runs on Java 17 (3.1 and later are
compiled for Java 21), and the first that Maven Central serves as a runnable archive (the
``all`` zip). Its parent POM is not on Maven Central, so the archive is fetched by its
coordinates alone (``dependency:get`` without transitive resolution), not through a pom.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstream.operators.errors import DpStreamError

from .broker import (
    _free_ports,
    _java,
    _tail,
    cache_dir,
    home_dir,
    require_tool,
)
from .processes import ServiceProcess, read_state, write_state

logger = logging.getLogger(__name__)

APICURIO_VERSION = "3.0.9"
"""The one Apicurio Registry version of dpstream's tests and demo."""

APICURIO_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:zip:all"
"""Maven coordinates of the application's runnable archive (runner jar + ``lib/``)."""

CCOMPAT_PATH = "/apis/ccompat/v7"
"""Where Apicurio serves Confluent's Schema Registry API: a client's ``url`` ends with it."""

URL_ENV = "DPSTREAM_SCHEMA_REGISTRY_URL"

_MARKER = ".complete"
_RUNNER = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
_JVM = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")


class RegistryError(DpStreamError):
    """A Schema Registry could not be fetched, started, reached or stopped."""


def registry_dir() -> Path:
    """Where :func:`fetch_registry` unpacks the application of :data:`APICURIO_VERSION`."""
    return cache_dir() / f"apicurio-registry-{APICURIO_VERSION}"


def _complete(target: Path) -> bool:
    try:
        return (target / _MARKER).read_text(encoding="utf-8").strip() == APICURIO_ARTIFACT
    except OSError:
        return False


def fetch_registry(*, quiet: bool = True) -> Path:
    """Fetch Apicurio Registry's application with Maven and unpack it, once.

    Concurrent callers serialise on a lock file; a marker naming the artifact says the
    unpacked folder is complete.

    Returns:
        The folder holding the runner jar and ``lib/``.

    Raises:
        BrokerError: ``mvn`` or ``java`` is missing (the broker's check of the tools).
        RegistryError: Maven failed, or the archive holds no runner jar.
    """
    target = registry_dir()
    if _complete(target):
        return target
    mvn = require_tool("mvn", "Install Apache Maven 3.6+ to fetch the Schema Registry.")
    _java()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".fetch-registry.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(target):
            return target
        archive = target.parent / f"apicurio-registry-{APICURIO_VERSION}.zip"
        cmd = [
            mvn,
            "-B",
            "-Dstyle.color=never",
            # 2.8: the last version of the plugin whose get goal writes to a file (dest).
            "org.apache.maven.plugins:maven-dependency-plugin:2.8:get",
            f"-Dartifact={APICURIO_ARTIFACT}",
            "-Dtransitive=false",
            f"-Ddest={archive}",
        ]
        if quiet:
            cmd.insert(1, "-q")
        logger.info("fetching Apicurio Registry %s with Maven into %s", APICURIO_VERSION, target)
        # Fixed argument list, no shell: our own paths and constants.
        result = subprocess.run(  # noqa: S603
            cmd,
            cwd=target.parent,
            stdin=subprocess.DEVNULL,
            capture_output=quiet,
            text=True,
            check=False,
        )
        if result.returncode != 0 or not archive.is_file():
            output = ((result.stdout or "") + (result.stderr or "")).strip()
            tail = "\n".join(output.splitlines()[-40:])
            raise RegistryError(
                f"Maven could not fetch {APICURIO_ARTIFACT} (exit {result.returncode}):\n{tail}"
            )
        shutil.rmtree(target, ignore_errors=True)
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(target)  # noqa: S202 - Maven Central's archive, checksummed
        archive.unlink()
        if not (target / _RUNNER).is_file():
            raise RegistryError(f"the Apicurio archive holds no {_RUNNER}")
        (target / _MARKER).write_text(APICURIO_ARTIFACT + "\n", encoding="utf-8")
    return target


def wait_for_registry(url: str, timeout: float, check: Any = None) -> None:
    """Block until ``url`` (a ccompat base URL) answers ``GET /subjects`` with 200.

    Raises:
        RegistryError: No answer within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise RegistryError(
                f"the Schema Registry at {url} did not answer within {timeout:.0f} s ({last})"
            )
        try:
            # Our own loopback URL or the one the user set: http(s) only.
            with urllib.request.urlopen(f"{url}/subjects", timeout=2) as answer:  # noqa: S310
                if answer.status == 200:
                    return
                last = f"HTTP {answer.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)


@dataclass
class LocalRegistry(ServiceProcess):
    """Apicurio Registry on a free loopback port, schemas in memory.

    Attributes:
        url: The Confluent-compatible API's base URL (a client's ``url``).
        pid: The registry's JVM; it leads its own process group.
        data_dir: Its working folder, holding ``registry.log``.
    """

    url: str
    pid: int
    data_dir: Path
    log_file: Path
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def start(cls, *, timeout: float = 180.0) -> LocalRegistry:
        """Fetch the application if needed, start it and wait until it answers.

        Raises:
            RegistryError: Missing java/mvn, or the registry exited early or did not
                answer in time (the message carries the end of its log).
        """
        home = fetch_registry()
        java = _java()
        base = Path(tempfile.mkdtemp(prefix="dpstream-registry-")).resolve()
        port = _free_ports(1)[0]
        log_file = base / "registry.log"
        cmd = [
            java,
            *_JVM,
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={port}",
            "-Dquarkus.log.level=WARN",
            "-Dquarkus.banner.enabled=false",
            "-jar",
            str(home / _RUNNER),
        ]
        started = time.monotonic()
        with open(log_file, "ab") as log:
            # Fixed argument list, no shell: java from PATH/JAVA_HOME, our own paths.
            proc = subprocess.Popen(  # noqa: S603
                cmd,
                cwd=base,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        registry = cls(f"http://127.0.0.1:{port}{CCOMPAT_PATH}", proc.pid, base, log_file, proc)

        def check() -> None:
            if proc.poll() is not None:
                raise RegistryError(
                    f"the Schema Registry exited during startup (exit {proc.returncode}); "
                    f"end of {log_file}:\n{_tail(log_file)}"
                )

        try:
            wait_for_registry(registry.url, timeout, check)
        except BaseException:
            registry.stop(timeout=5.0)
            raise
        atexit.register(registry._atexit_stop)
        logger.info(
            "Schema Registry (Apicurio %s) up at %s in %.1f s",
            APICURIO_VERSION,
            registry.url,
            time.monotonic() - started,
        )
        return registry

    def _is_ours(self, cmdline: str) -> bool:
        return _RUNNER in cmdline

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, SIGKILL after ``timeout``; removes its folder. Safe to call twice."""
        self._terminate(timeout, "Schema Registry")
        shutil.rmtree(self.data_dir, ignore_errors=True)


@contextmanager
def schema_registry() -> Iterator[str]:
    """Yield the URL of a running Schema Registry; stop it afterwards if started here.

    ``$DPSTREAM_SCHEMA_REGISTRY_URL`` if set (nothing is started or stopped); else a
    :class:`LocalRegistry`.
    """
    configured = os.environ.get(URL_ENV, "").strip()
    if configured:
        logger.info("using the Schema Registry at %s from %s", configured, URL_ENV)
        yield configured
        return
    registry = LocalRegistry.start()
    try:
        yield registry.url
    finally:
        registry.stop()


# --------------------------------------------------------------------------- detached


def state_file() -> Path:
    """``.dpstream/registry.json`` under ``broker.home_dir``."""
    return home_dir() / ".dpstream" / "registry.json"


def _recorded() -> LocalRegistry | None:
    state = read_state(state_file(), "registry")
    if state is None:
        return None
    try:
        return LocalRegistry(
            str(state["url"]), int(state["pid"]), Path(state["data_dir"]), Path(state["log_file"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        logger.warning("ignoring unreadable registry state %s: %s", state_file(), exc)
        return None


def status_detached() -> dict[str, Any] | None:
    """The registry recorded by :func:`start_detached`: ``{url, pid, data_dir, log_file,
    alive}``, or None."""
    registry = _recorded()
    if registry is None:
        return None
    return {
        "url": registry.url,
        "pid": registry.pid,
        "data_dir": str(registry.data_dir),
        "log_file": str(registry.log_file),
        "alive": registry.is_alive(),
    }


def start_detached() -> dict[str, Any]:
    """Start a background :class:`LocalRegistry` that outlives this process, or reuse a
    live one. Returns its status plus ``already_running``."""
    status = status_detached()
    if status is not None and status["alive"]:
        return {**status, "already_running": True}
    stale = _recorded()
    if stale is not None:
        stale.stop()  # dead: only removes its folder
    registry = LocalRegistry.start()
    registry.detach()
    state = {
        "url": registry.url,
        "pid": registry.pid,
        "data_dir": str(registry.data_dir),
        "log_file": str(registry.log_file),
    }
    write_state(state_file(), state)
    return {**state, "already_running": False}


def stop_detached() -> bool:
    """Stop the registry recorded by :func:`start_detached` and forget it; False if none
    was recorded."""
    registry = _recorded()
    if registry is not None:
        registry.stop()
    existed = state_file().exists()
    state_file().unlink(missing_ok=True)
    return registry is not None or existed
