"""The pytest plugin (entry point ``pytest11``): the ``kafka_broker``, ``schema_registry`` and
``dpstream_pipeline`` fixtures. Imports stay inside the fixtures: pytest loads this module in
every run of the environment, also where no test uses Kafka."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .pipeline import Pipeline

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


@pytest.fixture
def dpstream_pipeline(kafka_broker: str, tmp_path: Path) -> Iterator[PipelineFactory]:
    """Start dpstream workers: ``dpstream_pipeline(config, env=None) -> Pipeline``.

    ``config`` is a pipeline config as a dict (as in YAML) or a YAML file; each call gets its
    own app id and topics. ``env`` adds environment variables (e.g. the noise key) for the
    worker. Every worker started here is stopped at the end of the test.
    """
    started: list[Pipeline] = []

    def start(config: dict[str, Any] | Path | str, env: dict[str, str] | None = None) -> Pipeline:
        import yaml

        data = config if isinstance(config, dict) else yaml.safe_load(Path(config).read_text())
        pipeline = Pipeline.start(kafka_broker, data, tmp_path, env)
        started.append(pipeline)
        return pipeline

    try:
        yield start
    finally:
        for pipeline in started:
            pipeline.stop()
