"""The published JSON Schemas of what a pipeline writes: its releases, its ledger entries
and its dead letters, one file per record family and schema version in docs/schemas/
(``release.v5.json``, ``ledger.v5.json``, ``dead-letter.v1.json``, and the earlier
versions), shipped in the wheel as the package ``dpstream.schemas``.

They are generated from the ``TypedDict``\\ s the records are built by
(``statistics/releases.py``; ``DeadLetterRecord`` in ``pipeline/wire/records.py``), with the
kinds the registry maps to each release shape (``registry.release_shapes``):
``python -m dpstream.client.schemas`` (``make schemas``) writes the current versions (and
the release topics' Avro schemas, ``statistics/avro_schemas.py``); the
files of earlier versions stay, for records written under them. Each schema is exact: it
lists every field, requires those always present and allows no other, so any change of
shape changes the generated file, and tests/client/test_schemas.py refuses that until the
version is bumped (a new file beside the old).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import re
import types
from pathlib import Path
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

from jsonschema import Draft202012Validator

from dpstream.config.statistic import KINDS
from dpstream.pipeline.wire.records import DEAD_LETTER_SCHEMA_VERSION, DeadLetterRecord
from dpstream.statistics import avro_schemas, registry
from dpstream.statistics.releases import (
    LEDGER_ENTRIES,
    LEDGER_SCHEMA_VERSION,
    SCHEMA_VERSION,
    ExhaustedFields,
    Items,
    ReleaseHeader,
    Signature,
    fields_of,
)

RELEASE, LEDGER, DEAD_LETTER = "release", "ledger", "dead-letter"
CURRENT = {
    RELEASE: SCHEMA_VERSION,
    LEDGER: LEDGER_SCHEMA_VERSION,
    DEAD_LETTER: DEAD_LETTER_SCHEMA_VERSION,
}
"""The schema version of each record family that this code writes."""

PACKAGE = "dpstream.schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def file_name(family: str, version: int) -> str:
    return f"{family}.v{version}.json"


def generate() -> dict[str, dict[str, Any]]:
    """The current version of each family's schema, by file name."""
    return {
        file_name(RELEASE, SCHEMA_VERSION): release_schema(),
        file_name(LEDGER, LEDGER_SCHEMA_VERSION): ledger_schema(),
        file_name(DEAD_LETTER, DEAD_LETTER_SCHEMA_VERSION): dead_letter_schema(),
    }


def release_schema() -> dict[str, Any]:
    """One of the kinds' release shapes inside the common header, or the last release of
    a statistic whose budget is spent."""
    version = {"const": SCHEMA_VERSION}
    variants = [
        object_schema((ReleaseHeader, fields), {"schema_version": version, "kind": kinds_of(kinds)})
        for fields, kinds in registry.release_shapes().items()
    ]
    exhausted = {"schema_version": version, "kind": kinds_of(list(KINDS))}
    variants.append(object_schema((ReleaseHeader, ExhaustedFields), exhausted))
    return document(
        RELEASE,
        SCHEMA_VERSION,
        "One release of one statistic at one tick, on its topic dp.<statistic> (the "
        "common fields around its kind's own: statistics/releases.py).",
        {"oneOf": variants},
    )


def ledger_schema() -> dict[str, Any]:
    """One of the ledger's entries, each signed."""
    version = {"const": LEDGER_SCHEMA_VERSION}
    variants = [
        object_schema((*parts, Signature), {"schema_version": version}, parts[-1])
        for parts in LEDGER_ENTRIES
    ]
    return document(
        LEDGER,
        LEDGER_SCHEMA_VERSION,
        "One entry of the ledger topic: a worker's privacy statement, a statistic's start, "
        "or an expenditure; each names its app id and carries a MAC under the pipeline's "
        "key (statistics/releases.py).",
        {"oneOf": variants},
    )


def dead_letter_schema() -> dict[str, Any]:
    return document(
        DEAD_LETTER,
        DEAD_LETTER_SCHEMA_VERSION,
        "One record of the dead-letter topic (no schema_version field: version 1). Its "
        "payload is the rejected record's text: user data.",
        object_schema((DeadLetterRecord,), {}),
    )


def kinds_of(kinds: list[str]) -> dict[str, Any]:
    return {"const": kinds[0]} if len(kinds) == 1 else {"enum": kinds}


def document(family: str, version: int, description: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": DIALECT,
        "$id": file_name(family, version),
        "title": f"dpstream {family}, schema version {version}",
        "description": description,
        **body,
    }


def object_schema(
    parts: tuple[type, ...], fixed: dict[str, dict[str, Any]], named: type | None = None
) -> dict[str, Any]:
    """The exact object schema of the ``TypedDict``\\ s ``parts`` merged, in their fields'
    order (``fixed``: a field's schema given instead of its type's), titled and described
    by ``named`` (default: the last part)."""
    named = named or parts[-1]
    out: dict[str, Any] = {"title": named.__name__.removesuffix("Fields")}
    doc = inspect.getdoc(named)
    if doc:
        out["description"] = " ".join(doc.split("\n\n")[0].split()).replace("``", "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, hint, always in fields_of(parts):
        properties[name] = fixed.get(name) or type_schema(hint)
        if always:
            required.append(name)
    out.update(type="object", properties=properties, required=required)
    out["additionalProperties"] = False
    return out


_SIMPLE: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def type_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a type annotation of a record's field."""
    origin = get_origin(hint)
    args = get_args(hint)
    if origin in (NotRequired, Required):
        return type_schema(args[0])
    if origin is Annotated:
        out = type_schema(args[0])
        for meta in args[1:]:
            if isinstance(meta, Items):
                out.update(minItems=meta.count, maxItems=meta.count)
        return out
    if hint is Any:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if origin is Literal:
        return {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [type_schema(a) for a in args]
        if all(list(o) == ["type"] for o in options):
            return {"type": [o["type"] for o in options]}
        return {"anyOf": options}
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1])}
    if is_typeddict(hint):
        return object_schema((hint,), {})
    raise TypeError(f"no JSON Schema for the annotation {hint!r}")


def folder() -> Path:
    """Where this installation's schema files are: the folder of ``dpstream.schemas`` (a
    package of data files only, so a namespace package, whose path an editable install
    lists beside a placeholder that ``importlib.resources`` refuses)."""
    paths = importlib.import_module(PACKAGE).__path__
    return next(Path(p) for p in paths if Path(p).is_dir())


@functools.cache
def known_versions(family: str) -> tuple[int, ...]:
    """The schema versions of ``family`` this installation has a file for."""
    pattern = re.compile(rf"{re.escape(family)}\.v(\d+)\.json")
    found = (pattern.fullmatch(f.name) for f in folder().iterdir())
    return tuple(sorted(int(m.group(1)) for m in found if m))


@functools.cache
def validator(family: str, version: int) -> Draft202012Validator:
    """The validator of ``family``'s schema ``version`` (its published file)."""
    schema = json.loads((folder() / file_name(family, version)).read_text("utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def dumps(schema: dict[str, Any] | list[dict[str, Any]]) -> str:
    """A schema file's text (how ``main`` writes it and the test compares it)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpstream.client.schemas",
        description="write the current JSON Schemas of the releases, ledger entries and "
        "dead letters, and the Avro schemas of the release topics",
    )
    repository = Path(__file__).resolve().parents[1] / "docs" / "schemas"
    parser.add_argument("--out", type=Path, default=repository, help=f"default: {repository}")
    out = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Any] = {**generate(), **avro_schemas.generate()}
    for name, schema in written.items():
        path = out / name
        text = dumps(schema)
        changed = not path.exists() or path.read_text("utf-8") != text
        path.write_text(text, "utf-8")
        print(f"{path}: {'written' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
