"""The shared Kafka broker helper: a real broker, a real round trip, a clean stop."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpstream.deploy import broker
from dpstream.deploy.broker import (
    KAFKA_VERSION,
    REPO_ROOT,
    LocalKafka,
    docker_available,
    kafka_broker,
    start_detached,
    status_detached,
    stop_detached,
)
from tests.integration.support import round_trip

QUIET = {"log_level": 0}


def _port_closed(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) != 0


def _process_gone(pid: int) -> bool:
    """No such process, or only a zombie left for a parent that is not us to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


# --------------------------------------------------------------------------- fast


def test_kafka_broker_uses_env_bootstrap_and_starts_nothing(monkeypatch):
    def forbidden(*_args, **_kwargs):
        raise AssertionError("kafka_broker() must not start a broker when the env var is set")

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka.example:19092,other:9092")
    monkeypatch.setattr(broker, "docker_available", forbidden)
    monkeypatch.setattr(broker, "fetch_jars", forbidden)
    monkeypatch.setattr(LocalKafka, "start", classmethod(forbidden))
    with kafka_broker() as bootstrap:
        assert bootstrap == "kafka.example:19092,other:9092"


class _FakeJarBroker:
    bootstrap = "127.0.0.1:1"
    stopped = False

    def stop(self) -> None:
        type(self).stopped = True


def _engine_without_registry(monkeypatch) -> list[str]:
    """An engine that answers but whose image cannot be pulled; the jar broker is a fake."""
    started: list[str] = []
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(broker, "docker_available", lambda: True)

    def no_pull(cls, image=None, **_kwargs):
        raise broker.BrokerError(
            f"could not start the {image or broker.kafka_image()} container: 404 Client Error"
            "\nsecond line of a long docker error"
        )

    def jar_start(cls, **_kwargs):
        started.append("jar")
        return _FakeJarBroker()

    monkeypatch.setattr(broker.KafkaContainer, "start", classmethod(no_pull))
    monkeypatch.setattr(LocalKafka, "start", classmethod(jar_start))
    return started


def test_an_unpullable_image_falls_back_to_the_jar_broker_with_one_warning(monkeypatch, caplog):
    monkeypatch.delenv("DPSTREAM_REQUIRE_CONTAINERS", raising=False)
    monkeypatch.setenv("DPSTREAM_KAFKA_IMAGE", "registry.invalid/kafka:0")
    started = _engine_without_registry(monkeypatch)
    with caplog.at_level("WARNING", logger=broker.__name__), kafka_broker() as bootstrap:
        assert bootstrap == _FakeJarBroker.bootstrap
    assert started == ["jar"] and _FakeJarBroker.stopped
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert "registry.invalid/kafka:0" in warned[0] and "jar broker" in warned[0]


def test_a_required_image_never_falls_back(monkeypatch):
    monkeypatch.setenv("DPSTREAM_REQUIRE_CONTAINERS", "1")
    started = _engine_without_registry(monkeypatch)
    with pytest.raises(broker.BrokerError, match="could not start"), kafka_broker():
        pass
    monkeypatch.setattr(broker, "docker_available", lambda: False)
    with pytest.raises(broker.BrokerError, match="no Docker engine answers"), kafka_broker():
        pass
    assert started == []


def test_the_broker_image_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("DPSTREAM_KAFKA_IMAGE", raising=False)
    assert broker.kafka_image() == f"apache/kafka:{KAFKA_VERSION}"
    monkeypatch.setenv("DPSTREAM_KAFKA_IMAGE", " dpstream/kafka:x ")
    assert broker.kafka_image() == "dpstream/kafka:x"


def test_kafka_version_is_the_same_everywhere():
    pom = (REPO_ROOT / "deploy" / "pom.xml").read_text()
    assert re.search(r"<kafka\.version>(.+?)</kafka\.version>", pom).group(1) == KAFKA_VERSION
    compose = (REPO_ROOT / "deploy" / "docker-compose.yml").read_text()
    assert f"apache/kafka:{KAFKA_VERSION}" in compose


def test_fetch_jars_explains_missing_maven(monkeypatch, tmp_path):
    monkeypatch.setattr(broker, "jar_dir", lambda: tmp_path / "jars")
    monkeypatch.setattr(broker.shutil, "which", lambda _name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(broker.BrokerError, match="'mvn' was not found"):
        broker.fetch_jars()


def test_docker_available_is_fast_and_never_raises():
    started = time.monotonic()
    assert isinstance(docker_available(), bool)
    assert time.monotonic() - started < 5


# --------------------------------------------------------------------------- real broker


@pytest.mark.integration
def test_kafka_broker_round_trip_and_clean_stop(monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    started: list[LocalKafka] = []
    original_start = LocalKafka.start.__func__

    def spy(cls, **kwargs):
        kafka = original_start(cls, **kwargs)
        started.append(kafka)
        return kafka

    monkeypatch.setattr(LocalKafka, "start", classmethod(spy))

    with kafka_broker() as bootstrap:
        if started:
            assert started[0].is_alive()
        round_trip(bootstrap)

    assert _port_closed(bootstrap)
    if started:  # the local-jar broker (no Docker engine here)
        kafka = started[0]
        assert not kafka.is_alive()
        assert _process_gone(kafka.pid)
        assert not kafka.data_dir.exists()


@pytest.mark.integration
def test_detached_broker_lifecycle(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path))
    state_file = tmp_path / ".dpstream" / "broker.json"
    assert status_detached() is None
    assert stop_detached() is False

    # Start it from another process, as `dpstream broker start` would: that process must
    # exit promptly (the JVM must not hold its stdout) and the broker must outlive it.
    code = (
        "import json; from dpstream.deploy.broker import start_detached; "
        "print(json.dumps(start_detached()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "DPSTREAM_HOME": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["already_running"] is False
    assert json.loads(state_file.read_text())["pid"] == info["pid"]

    try:
        status = status_detached()
        assert status is not None and status["alive"] is True
        assert status["bootstrap"] == info["bootstrap"]

        again = start_detached()
        assert again["already_running"] is True
        assert again["pid"] == info["pid"]

        broker.wait_for_metadata(info["bootstrap"], timeout=10)
    finally:
        assert stop_detached() is True

    assert not state_file.exists()
    assert status_detached() is None
    assert stop_detached() is False
    assert _process_gone(info["pid"])
    assert _port_closed(info["bootstrap"])
    assert not Path(info["data_dir"]).exists()


@pytest.mark.integration
def test_restart_on_the_same_data_keeps_the_address_and_the_data(tmp_path):
    """Clients (a running worker) know one address: a restarted broker must keep it."""
    from confluent_kafka.admin import AdminClient, NewTopic

    data_dir = tmp_path / "kafka"
    kafka = LocalKafka.start(data_dir=data_dir)
    try:
        first = kafka.bootstrap
        admin = AdminClient({"bootstrap.servers": first, **QUIET})
        for future in admin.create_topics([NewTopic("kept", 1, 1)]).values():
            future.result(timeout=30)
        kafka.stop()
        kafka = LocalKafka.start(data_dir=data_dir)
        assert kafka.bootstrap == first
        topics = AdminClient({"bootstrap.servers": first, **QUIET}).list_topics(timeout=30).topics
        assert "kept" in topics
    finally:
        kafka.stop()
