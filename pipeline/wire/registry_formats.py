"""Source records in a Schema Registry's wire format: Avro, Protobuf and JSON Schema.

Confluent's framing, which every Schema Registry serializer writes (Confluent's, Apicurio's
ccompat, Karapace's): a zero byte, the schema id (4 bytes, big-endian), then the payload
(for Protobuf, first the message's index path in the schema, zigzag varints). A
``RegistryDecoder`` turns such a record into the decoded record that ``parse_event``
reads: a dict with the schema's field names, nested records as dicts, so the user id
(``input.user_id_field``, a dotted path), key, value, ts, op and cell fields are read and
checked exactly as in a JSON event, with the same reasons. It is the step before
``parse_event``; nothing after it knows the format.

A JSON Schema payload is JSON and is read exactly as JSON. In Avro and Protobuf records,
values that are not JSON's become what their JSON text would read as (docs/design.md,
"Schema Registry formats"), on the fields ``parse_event`` reads:
  * an Avro ``decimal`` becomes the nearest float (as the same decimal written in JSON
    would), so ``value: 2.50`` counts as 2.5;
  * a timestamp, date or time (Avro's logical types, Protobuf's
    ``google.protobuf.Timestamp``) becomes its ISO 8601 string: a ``ts``, never a value;
  * a ``uuid`` becomes its canonical string (a user id written as a UUID is the same
    user as the same UUID written as a JSON string);
  * a null (an Avro union with null, the way a schema says "optional") is an absent
    field: ``op: null`` is an insert, as an event without ``op`` is in JSON;
  * an enum becomes its symbol; Protobuf's wrappers (``google.protobuf.DoubleValue``...)
    their value; Avro ``long`` and Protobuf ``int64`` stay exact ints; ``bytes`` and
    ``fixed`` stay bytes, which no rule accepts (a user id must be a string);
  * Protobuf fields without presence (proto3 scalars not marked ``optional``) always have
    a value, their default when unset: an unset ``double value`` reads as 0.0, an unset
    ``string user_id`` as "" (an empty user id). Fields with presence (``optional``,
    messages, oneof members) that are unset are absent.

What is dead-lettered, with a reason (never the bytes), and what is not:
  * a record shorter than the framing, or whose first byte is not zero ("wrong magic
    byte"), or whose payload does not decode with its writer schema;
  * a schema id the registry does not know ("unknown schema id": HTTP 404 with a
    40400-40499 error code), a schema of another format than ``input.format``, or one
    whose references the registry does not have: the registry cannot give it. Ids found
    unknown are remembered (a stream of records with made-up ids asks the registry once
    per id, not once per record);
  * the registry does not answer, answers with an error (5xx, 401, 403, 429), or answers
    404 without a Schema Registry error code (a wrong ``url``): not the record's fault, so
    nothing is dead-lettered; ``RegistryUnavailable`` is raised and the ingest pauses and
    reads the batch again (``ingest/consumer.py``).

Each schema id is fetched once and cached (the client's cache, and the parsed schema in
the deserializer), so a producer that moves to a new compatible version mid-stream is read
from its first record on, without a restart: the new id is fetched when first seen, and
every record is decoded with its own writer schema.

The registry is asked through confluent-kafka's ``SchemaRegistryClient`` (its cache, its
retries). JSON Schema payloads are decoded by its ``JSONDeserializer`` (checked against
their writer schema, as its default is). Avro payloads are read by fastavro with the
writer schema parsed once per id, which is what ``AvroDeserializer`` does without a
subject (no rules, no migrations, the writer schema as the reader's) less its per-record
plumbing: 4.5 µs per event instead of 9.0 (a test pins the two to the same records).
Protobuf is decoded from the writer schema the registry gives: confluent-kafka's
``ProtobufDeserializer`` parses into a message class compiled from the reader's
``.proto``, which dpstream does not have and should not need.
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from fastavro import parse_schema, schemaless_reader
from fastavro.schema import SchemaParseException, UnknownType
from google.protobuf import (
    any_pb2,
    descriptor,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    message,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.message_factory import GetMessageClass

from .records import BadRecord, Limits, RegistryUnavailable

FRAMING_BYTES = 5  # the magic byte and the schema id
MAGIC_BYTE = 0
# The registry's schemaType per format ("AVRO" is also written as no type at all).
SCHEMA_TYPES = {"avro": ("AVRO", None, ""), "protobuf": ("PROTOBUF",), "json_schema": ("JSON",)}
FORMAT_NAMES = {"avro": "Avro", "protobuf": "Protobuf", "json_schema": "JSON Schema"}
# Schema ids found unknown, remembered up to this many (then forgotten all at once).
MAX_REFUSED_IDS = 10_000
_PLAIN = frozenset({str, int, float, bool, type(None)})
# The well-known types a .proto may import without a reference (the serializers register
# none for them): their descriptors come with the protobuf runtime.
_WELL_KNOWN = {
    m.DESCRIPTOR.name: m.DESCRIPTOR
    for m in (
        any_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )
}


def _no_subject(*_args: object) -> None:
    # No subject lookups: each record is read with its own writer schema, and the
    # registry is asked for nothing but schemas by id (and their references).
    return None


class RegistryDecoder:
    """Decodes the values of ``input.format`` (avro, protobuf, json_schema) records into
    dicts for ``parse_event``; one per ingest, its caches live as long as it does.

    Calling it raises BadRecord (dead-letter the record, with the reason) or
    RegistryUnavailable (pause, read again).
    """

    def __init__(self, fmt: str, client: SchemaRegistryClient, limits: Limits) -> None:
        if fmt not in SCHEMA_TYPES:
            raise ValueError(f"input.format must be avro, protobuf or json_schema, got {fmt!r}")
        self.format = fmt
        self._client = client
        self._ready: set[int] = set()  # ids fetched, of the right format, references too
        self._refused: dict[int, str] = {}  # id -> why its records are dead-lettered
        self._files: dict[int, descriptor.FileDescriptor] = {}  # protobuf: id -> its file
        self._avro: dict[int, Any] = {}  # avro: id -> its parsed writer schema
        self._deserialize: Callable[[bytes], object]
        if fmt == "avro":
            self._deserialize = self._avro_record
        elif fmt == "json_schema":
            conf = {"subject.name.strategy": _no_subject}
            self._deserialize = JSONDeserializer(None, schema_registry_client=client, conf=conf)
        else:
            self._deserialize = self._protobuf
        # JSON Schema payloads are JSON: read exactly as JSON is. Avro and Protobuf records
        # have every field of their schema: the fields parse_event reads are made plain.
        self._paths: tuple[tuple[str, ...], ...] = ()
        if fmt != "json_schema":
            self._paths = (limits.user_id_path, ("key",), ("value",), ("ts",), ("op",))
            self._paths += tuple((name,) for name in limits.cell_fields)

    def __call__(self, value: bytes) -> dict[str, Any]:
        if len(value) < FRAMING_BYTES:
            raise BadRecord("truncated record: shorter than the Schema Registry framing")
        if value[0] != MAGIC_BYTE:
            raise BadRecord("wrong magic byte: not in the Schema Registry's wire format")
        schema_id = int.from_bytes(value[1:FRAMING_BYTES], "big")
        if schema_id not in self._ready:
            self._fetch(schema_id)
        try:
            record = self._deserialize(value)
        except BadRecord:
            raise
        except Exception as exc:  # the deserializers raise many kinds for a bad payload
            if _registry_fault(exc):
                raise _unavailable(exc) from None
            reason = f"payload does not decode with its {FORMAT_NAMES[self.format]} schema"
            raise BadRecord(reason) from None
        if type(record) is not dict:
            raise BadRecord("event is not a record")
        for path in self._paths:
            _plain_leaf(record, path)
        return record

    def close(self) -> None:
        """Close the registry client's connections."""
        self._client.close()

    # ------------------------------------------------------------------ schemas

    def _fetch(self, schema_id: int) -> None:
        """Fetch schema ``schema_id`` and its references, check its format; remember it,
        or remember why its records are refused."""
        reason = self._refused.get(schema_id)
        if reason is not None:
            raise BadRecord(reason)
        fmt = "serialized" if self.format == "protobuf" else None
        try:
            schema = self._client.get_schema(schema_id, fmt=fmt)
            if schema.schema_type not in SCHEMA_TYPES[self.format]:
                raise BadRecord(f"schema is not {FORMAT_NAMES[self.format]}")
            references = self._references(schema, fmt, set())
            if self.format == "protobuf":
                files = [_file_proto(ref, name) for name, ref in references]
                self._files[schema_id] = _protobuf_file(schema, files)
            elif self.format == "avro":
                self._avro[schema_id] = _avro_schema(schema, references)
        except BadRecord as exc:
            self._refuse(schema_id, exc.reason)
            raise
        except SchemaRegistryError as exc:
            if _not_found(exc):
                self._refuse(schema_id, "unknown schema id")
                raise BadRecord("unknown schema id") from None
            raise _unavailable(exc) from None
        except Exception as exc:  # transport, TLS, an answer that is not a registry's
            raise _unavailable(exc) from None
        self._ready.add(schema_id)

    def _references(
        self, schema: Schema, fmt: str | None, seen: set[str]
    ) -> list[tuple[str, Schema]]:
        """The schemas ``schema`` references, by the names it references them by,
        dependencies first (depth first; the client caches them for the deserializers)."""
        found: list[tuple[str, Schema]] = []
        for ref in schema.references or []:
            if ref.name is None or ref.subject is None or ref.version is None:
                raise BadRecord("schema reference without a name, subject or version")
            if ref.name in seen:
                continue
            seen.add(ref.name)
            try:
                registered = self._client.get_version(ref.subject, ref.version, fmt=fmt)
            except SchemaRegistryError as exc:
                if _not_found(exc):
                    raise BadRecord("schema reference not in the registry") from None
                raise
            found += self._references(registered.schema, fmt, seen)
            found.append((ref.name, registered.schema))
        return found

    def _refuse(self, schema_id: int, reason: str) -> None:
        if len(self._refused) >= MAX_REFUSED_IDS:
            self._refused.clear()
        self._refused[schema_id] = reason

    # ------------------------------------------------------------------ avro

    def _avro_record(self, value: bytes) -> object:
        # What AvroDeserializer does without a subject (the module docstring), without its
        # per-record plumbing (docs/design.md, "Schema Registry formats").
        schema_id = int.from_bytes(value[1:FRAMING_BYTES], "big")
        return schemaless_reader(io.BytesIO(value[FRAMING_BYTES:]), self._avro[schema_id], None)

    # ------------------------------------------------------------------ protobuf

    def _protobuf(self, value: bytes) -> dict[str, Any]:
        schema_id = int.from_bytes(value[1:FRAMING_BYTES], "big")
        indexes, start = _message_indexes(value, FRAMING_BYTES)
        types = self._files[schema_id].message_types_by_name
        desc = list(types.values())[indexes[0]]
        for index in indexes[1:]:
            desc = desc.nested_types[index]
        msg = GetMessageClass(desc)()
        msg.ParseFromString(value[start:])
        return _message_dict(msg)


def _not_found(exc: SchemaRegistryError) -> bool:
    """The registry's own "not found" (40400-40499), not a 404 of something else."""
    code = exc.error_code if isinstance(exc.error_code, int) else -1
    return exc.http_status_code == 404 and 40400 <= code <= 40499


def _registry_fault(exc: BaseException) -> bool:
    """Whether an error raised while decoding is the registry's (a schema the client had
    to fetch again), not the payload's."""
    if isinstance(exc, SchemaRegistryError | OSError):
        return True
    return type(exc).__module__.partition(".")[0] in ("httpx", "httpx2", "httpcore")


def _unavailable(exc: BaseException) -> RegistryUnavailable:
    # The class and status only: a registry's message may repeat what it was sent.
    if isinstance(exc, SchemaRegistryError):
        what = f"HTTP {exc.http_status_code}, error code {exc.error_code}"
    else:
        what = type(exc).__name__
    return RegistryUnavailable(f"the Schema Registry did not give a schema ({what})")


def _plain_leaf(record: dict[str, Any], path: tuple[str, ...]) -> None:
    """The field at ``path`` as its JSON text would read (see the module docstring)."""
    parent: object = record
    for name in path[:-1]:
        parent = parent.get(name) if type(parent) is dict else None
    if type(parent) is not dict:
        return
    leaf = parent.get(path[-1])
    if leaf is None:
        # An Avro union with null says "optional": its null is an absent field (in JSON a
        # present null op is refused; here every field of the schema is present).
        parent.pop(path[-1], None)
    elif type(leaf) in _PLAIN:
        return
    elif isinstance(leaf, Decimal):
        parent[path[-1]] = float(leaf)
    elif isinstance(leaf, datetime.date | datetime.time):  # datetime is a date
        parent[path[-1]] = leaf.isoformat()
    elif isinstance(leaf, uuid.UUID):
        parent[path[-1]] = str(leaf)


def _avro_schema(schema: Schema, references: list[tuple[str, Schema]]) -> Any:
    """The writer schema parsed by fastavro, its references' named types first."""
    named: dict[str, Any] = {}
    try:
        for _, ref in references:
            parse_schema(json.loads(ref.schema_str or ""), named_schemas=named)
        return parse_schema(json.loads(schema.schema_str or ""), named_schemas=named)
    except (ValueError, TypeError, KeyError, SchemaParseException, UnknownType):
        raise BadRecord("schema does not parse as Avro") from None


# ---------------------------------------------------------------------- protobuf


def _file_proto(schema: Schema, name: str) -> descriptor_pb2.FileDescriptorProto:
    """A Protobuf schema as the registry gives it serialized (base64 of a
    FileDescriptorProto), named as its importers import it."""
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(schema.schema_str or "", validate=True)
        )
    except (ValueError, message.DecodeError):
        raise BadRecord("schema is not a serialized Protobuf file descriptor") from None
    proto.name = name
    return proto


def _protobuf_file(
    schema: Schema, references: list[descriptor_pb2.FileDescriptorProto]
) -> descriptor.FileDescriptor:
    """The writer schema's file, in a pool of its own with its references and the
    well-known types it imports."""
    main = _file_proto(schema, "dpstream-writer-schema.proto")
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    for proto in (*references, main):
        for dependency in proto.dependency:
            if dependency in _WELL_KNOWN and dependency not in added:
                well_known = descriptor_pb2.FileDescriptorProto()
                _WELL_KNOWN[dependency].CopyToProto(well_known)
                pool.Add(well_known)
                added.add(dependency)
        if proto.name not in added:
            try:
                pool.Add(proto)
            except (TypeError, KeyError, ValueError):
                raise BadRecord("schema does not build (a missing or conflicting import)") from None
            added.add(proto.name)
    try:
        file = pool.FindFileByName(main.name)
    except KeyError:
        raise BadRecord("schema does not build (a missing or conflicting import)") from None
    if not file.message_types_by_name:
        raise BadRecord("schema has no message")
    return file


def _message_indexes(value: bytes, start: int) -> tuple[list[int], int]:
    """The message's index path (zigzag varints: a count, then the indexes; a count of 0
    means [0]) and where the payload starts."""
    count, at = _zigzag(value, start)
    if count == 0:
        return [0], at
    if count < 0 or count > 64:
        raise BadRecord("payload does not decode with its Protobuf schema")
    indexes = []
    for _ in range(count):
        index, at = _zigzag(value, at)
        indexes.append(index)
    return indexes, at


def _zigzag(value: bytes, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(value) or shift > 63:
            raise BadRecord("payload does not decode with its Protobuf schema")
        byte = value[at]
        at += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at


_WRAPPERS = frozenset(
    f"google.protobuf.{n}Value"
    for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
)


def _message_dict(msg: message.Message) -> dict[str, Any]:
    """A message as a dict of its fields by their .proto names: the fields without
    presence always, with their defaults; the others only when set."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        if field.has_presence and not msg.HasField(field.name):
            continue
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _field_value(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_field_value(field, v) for v in value]
        else:
            out[field.name] = _field_value(field, value)
    return out


def _field_value(field: descriptor.FieldDescriptor, value: Any) -> Any:
    if field.type == descriptor.FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if field.type != descriptor.FieldDescriptor.TYPE_MESSAGE:
        return value
    name = field.message_type.full_name
    if name == "google.protobuf.Timestamp":
        return value.ToDatetime(tzinfo=datetime.UTC)
    if name in _WRAPPERS:
        return value.value
    return _message_dict(value)
