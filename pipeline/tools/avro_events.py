"""Events as Avro for ``dpstream produce --format avro``: the schema, made from the events
unless a file gives it, and confluent-kafka's AvroSerializer over the pipeline's Schema
Registry (``input.schema_registry``), registering it under the topic's subject
(``<topic>-value``, TopicNameStrategy) as any producer with that serializer does.

The schema made from the events is a record ``dpstream.produce.Event`` with one field per
field the events have, each optional (a union with null, default null), typed from the
values: strings ``string``, booleans ``boolean``, integers ``long`` (``double`` where some
event has a fraction), objects a nested record (``actor.id``). A field whose values
disagree, or a list, has no such type: the command stops and names it; write the schema
yourself (``--schema``). Changing the events' fields between two runs changes the schema:
the registry decides whether the new version is compatible with the subject's last one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.operators.errors import DpStreamError

NAMESPACE = "dpstream.produce"


def avro_schema(events: Iterable[dict], name: str = "Event", where: str = "") -> dict:
    """The Avro record schema of ``events`` (see the module docstring).

    Raises:
        DpStreamError: a field's values have no one Avro type; the message names it.
    """
    types: dict[str, Any] = {}
    nested: dict[str, list[dict]] = {}
    for event in events:
        for field, value in event.items():
            path = f"{where}{field}"
            if value is None:
                types.setdefault(field, None)
                continue
            if isinstance(value, dict):
                nested.setdefault(field, []).append(value)
                kind: Any = "record"
            else:
                kind = _scalar(value, path)
            types[field] = _join(types.get(field), kind, path)
    fields = []
    for field, kind in types.items():
        if kind == "record":
            kind = avro_schema(nested[field], _record_name(field), f"{where}{field}.")
        elif kind is None:
            kind = "string"  # only ever null: any type will do
        fields.append({"name": field, "type": ["null", kind], "default": None})
    return {"type": "record", "name": name, "namespace": NAMESPACE, "fields": fields}


def _scalar(value: object, path: str) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    raise DpStreamError(f"events: field {path} holds a {type(value).__name__}; pass --schema")


def _join(seen: Any, kind: Any, path: str) -> Any:
    if seen is None or seen == kind:
        return kind
    if {seen, kind} == {"long", "double"}:
        return "double"
    raise DpStreamError(f"events: field {path} holds both {seen} and {kind}; pass --schema")


def _record_name(field: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in field)
    return cleaned[:1].upper() + cleaned[1:] if cleaned[:1].isalpha() else f"R_{cleaned}"


def avro_serializer(
    cfg: PipelineConfig, events: list[dict], schema_file: Path | None
) -> Callable[[dict], bytes]:
    """event -> its Avro record value (Schema Registry framing) for the first source topic.

    Raises:
        ConfigError: the config has no ``input.schema_registry``, or its secrets or files
            cannot be read.
        DpStreamError: no schema can be made from the events (see ``avro_schema``).
    """
    from dpstream.config.base import ConfigError

    from ..kafka.schema_registry import make_client

    if cfg.input.schema_registry is None:
        raise ConfigError("input.schema_registry: required to produce Avro (--format avro)")
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    if schema_file is not None:
        schema = schema_file.read_text(encoding="utf-8")
    else:
        schema = json.dumps(avro_schema(events))
    client = make_client(cfg.input.schema_registry)
    serialize = AvroSerializer(client, schema)
    ctx = SerializationContext(cfg.input.topics[0], MessageField.VALUE)
    # Every field of the schema, absent ones as null (the serializer wants them all).
    names = [f["name"] for f in json.loads(schema).get("fields", [])]
    return lambda event: serialize({n: event.get(n) for n in names} | event, ctx)
