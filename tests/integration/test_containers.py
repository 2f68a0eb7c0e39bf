"""The broker chooser's container branch, for real: a Kafka broker started through
testcontainers from ``$DPSTREAM_KAFKA_IMAGE`` (apache/kafka, or dpstream's own image built by
``make images`` where no registry answers).

Without a Docker engine these tests skip; CI runs them in a second pass with an engine and
``DPSTREAM_REQUIRE_CONTAINERS=1``, where a skip is a failure (``.ci/run``). The pipeline
tests are scenarios the jar-broker suite runs too (crashes.py, scenarios.py), run again
against the container.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from dpstream.deploy import broker
from dpstream.deploy.broker import (
    KafkaContainer,
    LocalKafka,
    containers_required,
    kafka_broker,
    kafka_image,
)
from tests.integration.crashes import worker_sigkill_restarts_zero_noise
from tests.integration.scenarios import (
    pipeline_equals_replay_with_the_same_key,
    zero_noise_count_of_clicks,
)
from tests.integration.support import require_docker, round_trip

pytestmark = [pytest.mark.integration, pytest.mark.containers]


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Before any broker fixture: skip (or fail, in CI) where no engine answers."""
    require_docker()


@pytest.fixture(scope="module")
def container_broker() -> Iterator[KafkaContainer]:
    require_docker()
    try:
        container = KafkaContainer.start()
    except broker.BrokerError as exc:
        if containers_required():
            raise
        pytest.skip(f"Docker answers but the broker image did not start: {exc}")
    try:
        yield container
    finally:
        container.stop()


@pytest.fixture(scope="module")
def bootstrap(container_broker: KafkaContainer) -> str:
    """This module's broker is the container (conftest's worker fixtures use it)."""
    return container_broker.bootstrap


def test_container_round_trip(container_broker):
    assert container_broker.image == kafka_image()
    round_trip(container_broker.bootstrap)


def test_container_is_what_the_chooser_picks_where_docker_answers(monkeypatch):
    require_docker()

    def forbidden(*_args, **_kwargs):
        raise AssertionError("the jar broker must not start where the container can")

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(LocalKafka, "start", classmethod(forbidden))
    with kafka_broker() as bootstrap:
        round_trip(bootstrap, n=10)


def test_container_image_not_pullable_falls_back_to_the_jar_broker(monkeypatch, caplog):
    """An engine with no registry (here, or behind a proxy): one warning, then the jars."""
    require_docker()
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("DPSTREAM_KAFKA_IMAGE", "registry.invalid/dpstream/no-such-kafka:0")
    monkeypatch.delenv(broker.REQUIRE_CONTAINERS_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=broker.__name__), kafka_broker() as bootstrap:
        round_trip(bootstrap, n=10)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "no-such-kafka" in warned[0] and "jar broker" in warned[0]
    monkeypatch.setenv(broker.REQUIRE_CONTAINERS_ENV, "1")
    with pytest.raises(broker.BrokerError, match="no-such-kafka"), kafka_broker():
        pass


def test_container_pipeline_equals_replay(bootstrap, worker_factory, tmp_path):
    pipeline_equals_replay_with_the_same_key(bootstrap, worker_factory, tmp_path)


def test_container_worker_sigkill_restarts_equal_truncated_counts(bootstrap, tmp_path):
    worker_sigkill_restarts_zero_noise(bootstrap, tmp_path)


def test_container_under_the_plugin_fixtures(docker_engine, dpstream_pipeline):
    """The users' fixtures (kafka_broker, dpstream_pipeline) on the chooser's container; in
    CI, where containers are required, the chooser cannot have fallen back to the jars."""
    zero_noise_count_of_clicks(dpstream_pipeline)
