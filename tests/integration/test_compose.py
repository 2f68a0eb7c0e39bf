"""deploy/docker-compose.yml brought up for real: the broker and worker images, events from
the host, releases read with ``dpstream tail``, the worker container SIGKILLed and restarted,
and the releases equal to ``dpstream replay`` of ``dpstream export-log``, byte for byte.

Needs a Docker engine, docker compose (or docker-compose) and the images (``make images``,
or apache/kafka where Docker Hub answers); skips without them, fails in CI
(``DPSTREAM_REQUIRE_CONTAINERS=1``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from dpstream.config.schema import load_config
from dpstream.deploy.broker import (
    REPO_ROOT,
    _free_ports,
    containers_required,
    kafka_image,
    wait_for_metadata,
)
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.kafka.topics import create_source_topics, ensure_topics
from dpstream.pipeline.tools.synthetic import synthetic_events
from tests.integration.support import FAST_REJOIN, TopicReader, deduplicated, require_docker

pytestmark = [pytest.mark.integration, pytest.mark.containers]

COMPOSE_FILE = REPO_ROOT / "deploy" / "docker-compose.yml"
DEMO_CONFIG = REPO_ROOT / "config" / "demo.yaml"  # the worker image runs the same file
WORKER_IMAGE_ENV = "DPSTREAM_WORKER_IMAGE"
CLI = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]
USERS = 40
PER_ROUND = 20
ROUND_SECONDS = 0.25


def unavailable(reason: str) -> None:
    """Skip, or fail where containers are required (CI)."""
    if containers_required():
        pytest.fail(reason)
    pytest.skip(reason)


def compose_command() -> list[str] | None:
    """``docker compose`` (the plugin) if it answers, else ``docker-compose`` (v1)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def image_present(image: str) -> bool:
    """Local, or pulled now (fails fast where no registry answers)."""
    for cmd in (["docker", "image", "inspect", image], ["docker", "pull", "-q", image]):
        if subprocess.run(cmd, capture_output=True, check=False, timeout=300).returncode == 0:
            return True
    return False


@dataclass
class Compose:
    """One compose project (its own name, volume and host port) on deploy/docker-compose.yml."""

    command: list[str]
    files: list[Path]
    project: str
    env: dict[str, str]
    bootstrap: str

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        files = [arg for f in self.files for arg in ("-f", str(f))]
        cmd = [*self.command, *files, "-p", self.project, *args]
        done = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def logs(self) -> str:
        try:
            return self("logs", "--no-color", "--tail", "40").stdout
        except AssertionError as exc:
            return str(exc)


@pytest.fixture
def compose(tmp_path: Path) -> Iterator[Compose]:
    require_docker()
    command = compose_command()
    if command is None:
        unavailable("neither docker compose nor docker-compose is installed")
    worker_image = os.environ.get(WORKER_IMAGE_ENV, "dpstream/worker:latest")
    for image in (kafka_image(), worker_image):
        if not image_present(image):
            unavailable(f"image {image} is not available (make images builds it)")
    # Faust's default 60 s session timeout would hold the killed worker's partitions.
    override = tmp_path / "fast-rejoin.yml"
    override.write_text(yaml.safe_dump({"services": {"worker": {"environment": FAST_REJOIN}}}))
    port = _free_ports(1)[0]
    env = {
        **os.environ,
        "DPSTREAM_KAFKA_IMAGE": kafka_image(),
        WORKER_IMAGE_ENV: worker_image,
        "DPSTREAM_KAFKA_HOST_PORT": str(port),
        "DPSTREAM_NOISE_KEY": np.random.default_rng(17).bytes(32).hex(),
    }
    project = Compose(
        command,
        [COMPOSE_FILE, override],
        f"dpstream-t{uuid.uuid4().hex[:8]}",
        env,
        f"localhost:{port}",
    )
    try:
        yield project
    finally:
        try:
            project("down", "-v", "--remove-orphans", "-t", "5", timeout=120)
        except AssertionError as exc:
            print(f"compose down failed: {exc}")


class Traffic(threading.Thread):
    """Synthetic events from the host, one round every ROUND_SECONDS, until stopped."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="compose-traffic", daemon=True)
        self._servers = bootstrap
        self._stop_event = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            cfg = load_config(DEMO_CONFIG)
            producer = make_producer(self._servers)
            events = list(synthetic_events(USERS, 10_000, seed=17))
            for start in range(0, len(events), PER_ROUND):
                if self._stop_event.is_set():
                    break
                self.sent += produce_events(producer, cfg, events[start : start + PER_ROUND])
                producer.flush(10)
                time.sleep(ROUND_SECONDS)
            assert producer.flush(60) == 0
        except BaseException as exc:  # re-raised by stop() in the test's thread
            self.error = exc

    def halt(self) -> None:
        """Stop sending, without the checks of :meth:`stop` (a test already failed)."""
        self._stop_event.set()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(90)
        if self.error is not None:
            raise self.error
        assert self.sent > 0


def wait_for_tick(reader: TopicReader, tick: int, compose: Compose, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        released = reader.drain()
        if released and released[-1]["tick"] >= tick:
            return
        time.sleep(0.5)
    raise AssertionError(f"no release of tick {tick} within {timeout} s\n{compose.logs()}")


def cli(*args: str, env: dict[str, str] | None = None) -> bytes:
    done = subprocess.run(
        [*CLI, *args], capture_output=True, timeout=180, check=False, env=env or dict(os.environ)
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def test_compose_worker_sigkill_restart_releases_equal_replay(compose, tmp_path):
    cfg = load_config(DEMO_CONFIG)
    compose("up", "-d", "--no-build")
    wait_for_metadata(compose.bootstrap, 120)
    create_source_topics(cfg, compose.bootstrap)
    ensure_topics(cfg, compose.bootstrap)  # the same topics the worker creates
    traffic = Traffic(compose.bootstrap)
    traffic.start()
    reader = TopicReader(compose.bootstrap, cfg.release_topic("events"))
    try:
        wait_for_tick(reader, int(time.time() / cfg.ticks.interval_seconds) + 3, compose)
        compose("kill", "-s", "SIGKILL", "worker")
        time.sleep(3)  # events keep arriving while no worker runs
        compose("start", "worker")
        restarted = time.time()
        # Progress after the restart: ticks that ended after it were closed by the new worker.
        wait_for_tick(reader, int(restarted / cfg.ticks.interval_seconds) + 3, compose)
        traffic.stop()
        wait_for_tick(reader, int(time.time() / cfg.ticks.interval_seconds) + 2, compose)
    finally:
        traffic.halt()
        reader.close()

    config, at = ["--config", str(DEMO_CONFIG)], ["--bootstrap", compose.bootstrap]
    tailed = {
        s.name: cli("tail", s.name, *config, *at, "--from-beginning", "--timeout", "6").splitlines()
        for s in cfg.statistics
    }
    log_path = tmp_path / "events.jsonl"
    cli("export-log", *config, *at, "--out", str(log_path), env=compose.env)  # signed
    replayed_lines = cli("replay", *config, "--events", str(log_path), env=compose.env).splitlines()
    replayed: dict[str, list[bytes]] = {s.name: [] for s in cfg.statistics}
    for line in replayed_lines:
        replayed[orjson.loads(line)["statistic"]].append(line)

    assert sum(b'"user_id"' in x for x in log_path.read_bytes().splitlines()) == traffic.sent
    for name, raw in tailed.items():
        released = deduplicated(name, raw)  # a tick re-sent after the kill: identical copies
        assert len(released) >= 8, name
        assert len(replayed[name]) >= len(released), name
        assert released == replayed[name][: len(released)], name  # byte for byte
