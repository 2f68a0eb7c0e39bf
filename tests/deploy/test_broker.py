"""The broker chooser (deploy/broker.py) without a broker: KAFKA_BOOTSTRAP_SERVERS is used
as given, an image that cannot be pulled falls back to the jar broker unless containers are
required, the image and the Kafka version come from one place."""

from __future__ import annotations

import re

import docker
import pytest

from dpstream.deploy import broker
from dpstream.deploy.broker import (
    KAFKA_VERSION,
    REPO_ROOT,
    LocalKafka,
    docker_available,
    kafka_broker,
)


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


def test_docker_available_asks_with_a_short_timeout_and_never_raises(monkeypatch):
    # The broker chooser calls it on every test session: an engine that does not answer
    # must cost about two seconds, not the SDK's default minute, and must read as "none".
    timeouts = []

    class Silent:
        def __init__(self, base_url: str | None = None, timeout: int | None = None) -> None:
            timeouts.append(timeout)

        def ping(self) -> bool:
            raise ConnectionError("no answer")

        def close(self) -> None:
            pass

    monkeypatch.setattr(docker, "DockerClient", Silent)
    monkeypatch.setattr(docker, "from_env", lambda timeout: Silent(timeout=timeout))
    assert docker_available() is False
    assert timeouts == [2]


def test_an_installed_package_keeps_its_state_and_jars_out_of_site_packages(monkeypatch, tmp_path):
    # From a wheel, REPO_ROOT is site-packages/dpstream: no pyproject.toml there.
    installed = tmp_path / "site-packages" / "dpstream"
    (installed / "deploy").mkdir(parents=True)
    monkeypatch.setattr(broker, "REPO_ROOT", installed)
    monkeypatch.setattr(broker, "DEPLOY_DIR", installed / "deploy")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DPSTREAM_HOME", raising=False)
    assert not broker.source_checkout()
    assert broker.state_file() == tmp_path / "home" / ".dpstream" / "broker.json"
    assert broker.jar_dir() == tmp_path / "home" / ".dpstream" / "cache" / f"kafka-{KAFKA_VERSION}"
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "elsewhere"))
    assert broker.jar_dir().parent == tmp_path / "elsewhere" / ".dpstream" / "cache"


def test_a_source_checkout_keeps_its_jar_cache_in_deploy(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path))
    assert broker.source_checkout()
    assert broker.jar_dir() == REPO_ROOT / "deploy" / ".cache" / f"kafka-{KAFKA_VERSION}"
    assert broker.state_file() == tmp_path / ".dpstream" / "broker.json"


def test_the_wheel_declares_what_broker_fetch_needs_as_package_data():
    import tomllib

    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]["dpstream.deploy"]
    for needed in (broker.POM_FILE, broker.LOG4J_CONFIG):
        assert needed.name in data and needed.parent == broker.DEPLOY_DIR
