"""The bytes of a release on its topic, as ``outputs.format`` says: JSON (``orjson``), or
Avro in a Schema Registry's wire format (a zero byte, the schema id as 4 bytes big-endian,
the Avro binary payload: what confluent-kafka's ``AvroDeserializer`` and every other
registry client read).

With Avro, each release topic's schema (``statistics/avro_schemas.py``: its statistic's
release shape or the exhausted release) is registered once, when the worker starts, under
the TopicNameStrategy subject ``<topic>-value`` of ``outputs.schema_registry``; the id the
registry answers is kept, so a release costs one Avro encoding and no registry call. A
registry that refuses the schema (unreachable, no write access, or a subject whose
compatibility rule rejects it) stops the worker before it releases anything.
"""

from __future__ import annotations

import io
import json
import logging
import struct
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from dpstream.config.base import ConfigError
from dpstream.config.schema import PipelineConfig
from dpstream.statistics import avro_schemas, registry

log = logging.getLogger(__name__)

SECTION = "outputs.schema_registry"
MAGIC = b"\x00"

Encode = Callable[[Mapping[str, Any]], bytes]


def subject(topic: str) -> str:
    """The TopicNameStrategy subject of a topic's values."""
    return f"{topic}-value"


def release_encoders(cfg: PipelineConfig) -> dict[str, Encode]:
    """Each statistic's release encoder, by statistic name (Avro: the schemas registered).

    Raises:
        ConfigError: the registry cannot be reached or refuses a schema; the message names
            ``outputs.schema_registry`` and the subject.
    """
    if cfg.outputs.format == "json" or cfg.outputs.schema_registry is None:
        return {s.name: orjson.dumps for s in cfg.statistics}
    # Imported here: the Schema Registry's client and fastavro are an extra
    # (pyproject.toml) that a pipeline publishing JSON does without.
    from fastavro import parse_schema

    from ..kafka.schema_registry import describe, make_client

    reg = cfg.outputs.schema_registry
    log.info("outputs.format avro, schemas registered in %s", describe(reg))
    client = make_client(reg, SECTION)
    out: dict[str, Encode] = {}
    for stat in cfg.statistics:
        schema = avro_schemas.topic_schema(registry.release_fields(stat, cfg))
        name = subject(cfg.release_topic(stat.name))
        schema_id = _register(client, name, json.dumps(schema))
        out[stat.name] = avro_encoder(parse_schema(schema), schema_id)
    return out


def _register(client: Any, name: str, text: str) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryError

    try:
        return int(client.register_schema(name, Schema(text, "AVRO")))
    except SchemaRegistryError as exc:
        raise ConfigError(
            f"{SECTION}: the registry refused the schema of subject {name} "
            f"(HTTP {exc.http_status_code}, error {exc.error_code}: {exc.error_message})"
        ) from None
    except Exception as exc:  # the client's transport errors (httpx) have no common base
        raise ConfigError(
            f"{SECTION}.url: registering the schema of subject {name} failed ({type(exc).__name__})"
        ) from None


def avro_encoder(parsed: Any, schema_id: int) -> Encode:
    """A release's value: the framing and the Avro binary of ``parsed`` (fastavro's)."""
    from fastavro import schemaless_writer

    prefix = MAGIC + struct.pack(">I", schema_id)

    def encode(release: Mapping[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(prefix)
        schemaless_writer(out, parsed, release)
        return out.getvalue()

    return encode
