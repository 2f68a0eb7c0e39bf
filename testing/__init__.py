"""pytest support for people who test their own dpstream pipelines.

Installed with dpstream and loaded by pytest through the ``pytest11`` entry point, so a test
module needs no import to use its fixtures:

* ``kafka_broker`` (session): the bootstrap string of a real Kafka broker --
  ``$KAFKA_BOOTSTRAP_SERVERS`` if set, else a container where a Docker engine answers and
  the image (``$DPSTREAM_KAFKA_IMAGE``, default apache/kafka) can start, else a single-node
  broker from Kafka's own jars (see :func:`dpstream.deploy.broker.kafka_broker`).
* ``schema_registry`` (session): the URL of a real Schema Registry that serves Confluent's
  API -- ``$DPSTREAM_SCHEMA_REGISTRY_URL`` if set, else Apicurio Registry's application
  from Maven Central (see :func:`dpstream.deploy.registry.schema_registry`).
* ``dpstream_pipeline``: a factory ``dpstream_pipeline(config, env=None) -> Pipeline`` that
  starts a ``dpstream worker`` on the config (a dict as in YAML, or a path), with its own app
  id and topics, and gives a producer and a reader of releases. Give the config
  ``noise: {mode: insecure_zero}`` to get exact, noise-free releases.

See README.md ("Testing your own pipeline") for an example test.
"""

from __future__ import annotations

from .pipeline import Pipeline, unique_names

__all__ = [
    "Pipeline",
    "unique_names",
]
