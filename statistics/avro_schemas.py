"""The Avro schemas of the release topics (``outputs.format: avro``), one per release shape,
committed in docs/schemas/ as ``release-<shape>.v<version>.avsc``.

They are made from the same walk of the same ``TypedDict``\\ s as the JSON Schemas
(``releases.fields_of``): a release topic's value schema is
the union of two records, its kind's release (``ReleaseHeader`` around the kind's
``RELEASE_FIELDS``) and the last release of a statistic whose budget is spent
(``ExhaustedFields``), so the one subject ``<topic>-value`` holds every record of the
topic. ``python -m dpstream.client.schemas`` (``make schemas``) writes them with the JSON
Schemas; tests/statistics/test_avro_schemas.py fails when the committed ones differ.

The mapping (docs/design.md section 7a): fields in the release's key order (the header's
first ``LEADING`` fields, the kind's, the header's others, as ``Records.release`` writes
them); ``bool`` boolean, ``int`` long, ``float`` double, ``str`` and string literals
string, ``Literal[True]`` boolean; ``int | float`` double (the value of a count or a sum:
one numeric type for every consumer, exact below 2^53, and equal in Python to the int);
``X | None`` the union ``["null", X]``; a ``NotRequired`` field the same union with default
null, so a release without it reads back with it null (``from_avro`` drops it again); a
nested ``TypedDict`` a record, named once and referred to by name after; a list an array,
a ``dict[str, X]`` a map.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    is_typeddict,
)

from dpstream.statistics import registry
from dpstream.statistics.releases import (
    SCHEMA_VERSION,
    ExhaustedFields,
    ReleaseHeader,
    fields_of,
)

NAMESPACE = f"dpstream.release.v{SCHEMA_VERSION}"
LEADING = 6
"""How many of ``ReleaseHeader``'s fields come before the kind's (up to tick_end_unix)."""


def shape_name(fields: type) -> str:
    """A release shape's name: ``CounterFields`` -> ``Counter``."""
    return fields.__name__.removesuffix("Fields")


def file_name(fields: type, version: int = SCHEMA_VERSION) -> str:
    words = re.sub(r"(?<!^)(?=[A-Z][a-z])", "-", shape_name(fields)).lower()
    return f"release-{words}.v{version}.avsc"


def generate() -> dict[str, list[dict[str, Any]]]:
    """The current Avro schema of each release shape's topics, by file name."""
    return {file_name(fields): topic_schema(fields) for fields in registry.release_shapes()}


def topic_schema(fields: type) -> list[dict[str, Any]]:
    """The value schema of a release topic whose kind releases in ``fields``: the union of
    its release record and the exhausted release record."""
    named: set[str] = set()
    return [release_record(fields, named), release_record(ExhaustedFields, named)]


def release_record(fields: type, named: set[str]) -> dict[str, Any]:
    header = fields_of((ReleaseHeader,))
    walk = header[:LEADING] + fields_of((fields,)) + header[LEADING:]
    return {
        "type": "record",
        "name": f"{shape_name(fields)}Release",
        "namespace": NAMESPACE,
        "doc": _doc(fields),
        "fields": [_field(name, hint, always, named) for name, hint, always in walk],
    }


def _doc(fields: type) -> str:
    doc = inspect.getdoc(fields) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "")


def _field(name: str, hint: Any, always: bool, named: set[str]) -> dict[str, Any]:
    avro = avro_type(hint, named)
    if always:
        return {"name": name, "type": avro}
    return {"name": name, "type": _nullable(avro), "default": None}


def _nullable(avro: Any) -> list[Any]:
    """``avro`` or null, null first (an Avro union's default is of its first branch)."""
    options = avro if isinstance(avro, list) else [avro]
    return ["null", *(o for o in options if o != "null")]


_SIMPLE: dict[Any, str] = {bool: "boolean", int: "long", float: "double", str: "string"}


def avro_type(hint: Any, named: set[str]) -> Any:
    """The Avro type of a type annotation of a release's field (``named``: the full names
    of the records defined so far in this schema; a record is defined once)."""
    origin = get_origin(hint)
    args = get_args(hint)
    if origin in (NotRequired, Required, Annotated):
        return avro_type(args[0], named)
    if hint is None or hint is type(None):
        return "null"
    if hint in _SIMPLE:
        return _SIMPLE[hint]
    if origin is Literal:
        return avro_type(type(args[0]), named)
    if origin in (Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        has_null = len(others) < len(args)
        if set(others) == {int, float}:
            others = [float]
        options = [avro_type(a, named) for a in others]
        chosen = options[0] if len(options) == 1 else options
        return _nullable(chosen) if has_null else chosen
    if origin is list:
        return {"type": "array", "items": avro_type(args[0], named)}
    if origin is dict:
        return {"type": "map", "values": avro_type(args[1], named)}
    if is_typeddict(hint):
        full = f"{NAMESPACE}.{hint.__name__}"
        if full in named:
            return full
        named.add(full)
        return {
            "type": "record",
            "name": hint.__name__,
            "namespace": NAMESPACE,
            "fields": [_field(n, h, a, named) for n, h, a in fields_of((hint,))],
        }
    raise TypeError(f"no Avro schema for the annotation {hint!r}")


@functools.cache
def optional_fields() -> dict[str, frozenset[str]]:
    """The fields each release record may lack, by the record's full name: those with a
    null default, which a record without them reads back null."""
    out: dict[str, frozenset[str]] = {}
    for schema in generate().values():
        for record in schema:
            full = f"{record['namespace']}.{record['name']}"
            out[full] = frozenset(f["name"] for f in record["fields"] if "default" in f)
    return out


def from_avro(decoded: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A release as its JSON reads, from what confluent-kafka's ``AvroDeserializer`` with
    ``return_record_name=True`` gives for it: (the record's full name, its fields). The
    fields the release did not have (null, with a null default) are dropped, and a nested
    record is its fields."""
    name, fields = decoded
    absent = optional_fields().get(name, frozenset())
    return {k: _unnamed(v) for k, v in fields.items() if not (v is None and k in absent)}


def _unnamed(value: Any) -> Any:
    """``value`` without the (name, record) pairs ``return_record_name`` makes of a record
    in every union, a nested one (the tree) too: Avro decodes no other tuple."""
    if isinstance(value, tuple):
        return _unnamed(value[1])
    if isinstance(value, dict):
        return {k: _unnamed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unnamed(v) for v in value]
    return value
