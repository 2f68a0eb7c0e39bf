"""The pytest plugin (entry point ``pytest11``): the ``kafka_broker``, ``schema_registry`` and
``dpstream_pipeline`` fixtures, the secured twins ``secure_kafka_broker`` and
``dpstream_secure_pipeline``, and ``kafka_cluster`` (three brokers that a test can kill and
restart). Imports stay inside the fixtures: pytest loads this module in every run of the
environment, also where no test uses Kafka."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from .pipeline import Access, Pipeline

if TYPE_CHECKING:
    from dpstream.deploy.cluster import KafkaCluster
    from dpstream.deploy.secure_broker import Listener, SecureKafka

PipelineFactory = Callable[..., Pipeline]


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """A real Kafka broker for the whole session: its ``bootstrap.servers`` string.

    ``$KAFKA_BOOTSTRAP_SERVERS`` if set; else a container of ``$DPSTREAM_KAFKA_IMAGE``
    (default apache/kafka) where Docker answers and it starts; else Kafka's own jars.
    """
    from dpstream.deploy.broker import kafka_broker as choose_broker

    with choose_broker() as servers:
        yield servers


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """A real Schema Registry for the whole session, serving Confluent's API: its URL (a
    ``SchemaRegistryClient``'s ``url``, a pipeline's ``input.schema_registry.url``).

    ``$DPSTREAM_SCHEMA_REGISTRY_URL`` if set; else Apicurio Registry's application from
    Maven Central, run with the JDK on the machine (see
    :func:`dpstream.deploy.registry.schema_registry`).
    """
    from dpstream.deploy.registry import schema_registry as choose_registry

    with choose_registry() as url:
        yield url


@pytest.fixture(scope="session")
def secure_kafka_broker() -> Iterator[SecureKafka]:
    """A secured broker for the whole session, from Kafka's jars
    (``dpstream.deploy.secure_broker.SecureKafka``): SASL_SSL with SCRAM-SHA-512 users
    ``dpstream``, ``reader`` and ``producer`` (``.sasl_bootstrap``), mutual TLS with client
    certificates of the same names (``.ssl_bootstrap``), ACLs enforced (the users may do
    nothing until granted), a super user ``admin`` (``.admin_client_config()``).
    ``.kafka_section(user, listener)`` is a config's ``kafka:`` section for a user;
    ``.certificates`` holds the CA, the clients' certificates, an expired one and an
    untrusted CA."""
    from dpstream.deploy.secure_broker import SecureKafka

    secured = SecureKafka.start()
    try:
        yield secured
    finally:
        secured.stop()


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """Three brokers from Kafka's jars for a test module
    (``dpstream.deploy.cluster.KafkaCluster``): ``.bootstrap`` for clients, ``.kill(node_id)``
    and ``.restart(node_id)`` (1-based) to lose a broker and bring it back. Topics are
    replicated 3 times with ``min.insync.replicas`` 2. One cluster per module: three JVMs
    are not left running for the rest of a session, and a module that loses brokers
    leaves no damage to the next."""
    from dpstream.deploy.cluster import KafkaCluster

    cluster = KafkaCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _pipelines(
    bootstrap: Callable[[str], str],
    tmp_path: Path,
    access: Callable[[str], Access | None],
) -> Iterator[PipelineFactory]:
    started: list[Pipeline] = []

    def start(
        config: dict[str, Any] | Path | str,
        env: dict[str, str] | None = None,
        listener: str = "SASL_SSL",
    ) -> Pipeline:
        import yaml

        data = config if isinstance(config, dict) else yaml.safe_load(Path(config).read_text())
        pipeline = Pipeline.start(bootstrap(listener), data, tmp_path, env, access(listener))
        started.append(pipeline)
        return pipeline

    try:
        yield start
    finally:
        for pipeline in started:
            pipeline.stop()


@pytest.fixture
def dpstream_pipeline(kafka_broker: str, tmp_path: Path) -> Iterator[PipelineFactory]:
    """Start dpstream workers: ``dpstream_pipeline(config, env=None) -> Pipeline``.

    ``config`` is a pipeline config as a dict (as in YAML) or a YAML file; each call gets its
    own app id and topics. ``env`` adds environment variables (e.g. the noise key) for the
    worker. Every worker started here is stopped at the end of the test.
    """
    yield from _pipelines(lambda _listener: kafka_broker, tmp_path, lambda _listener: None)


@pytest.fixture
def dpstream_secure_pipeline(
    secure_kafka_broker: SecureKafka, tmp_path: Path
) -> Iterator[PipelineFactory]:
    """``dpstream_pipeline`` on ``secure_kafka_broker``, least privilege:
    ``dpstream_secure_pipeline(config, env=None, listener="SASL_SSL") -> Pipeline``.

    The worker runs as ``dpstream`` over ``listener`` (``SASL_SSL``, or ``SSL`` for mutual
    TLS) with exactly the ACLs ``dpstream acls`` prints for its config; ``produce`` runs as
    ``producer`` and ``releases`` as ``reader``, each with its own ACLs. The source topics
    are created by the admin user.
    """
    from .pipeline import secured_access

    def listener_of(name: str) -> Listener:
        if name not in ("SASL_SSL", "SSL"):
            raise ValueError(f"listener must be SASL_SSL or SSL, got {name!r}")
        return cast("Listener", name)

    yield from _pipelines(
        lambda name: secure_kafka_broker.bootstrap(listener_of(name)),
        tmp_path,
        lambda name: secured_access(secure_kafka_broker, listener_of(name)),
    )
