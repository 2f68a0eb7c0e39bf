"""The published schemas (docs/schemas/) are what ``python -m dpstream.client.schemas``
generates from statistics/releases.py, and the generator maps each annotation to the JSON
Schema a record of it meets."""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired, TypedDict

import pytest
from jsonschema import Draft202012Validator

from dpstream.client import schemas
from dpstream.statistics import avro_schemas
from dpstream.statistics.releases import Items


def test_the_committed_schemas_are_the_generated_ones():
    # Fails after any change of a record's shape: run `make schemas`, and bump the
    # family's schema version (statistics/releases.py) when the change is not additive.
    for name, schema in schemas.generate().items():
        committed = (schemas.folder() / name).read_text("utf-8")
        assert committed == schemas.dumps(schema), f"docs/schemas/{name}: run `make schemas`"


def test_every_schema_version_on_disk_is_a_valid_schema():
    for family, current in schemas.CURRENT.items():
        assert current in schemas.known_versions(family)
        for version in schemas.known_versions(family):
            Draft202012Validator.check_schema(schemas.validator(family, version).schema)


def test_the_command_writes_the_current_versions(tmp_path):
    assert schemas.main(["--out", str(tmp_path)]) == 0
    written = {**schemas.generate(), **avro_schemas.generate()}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)


class Inner(TypedDict):
    n: int


class Shape(TypedDict):
    flag: bool
    pair: Annotated[list[float], Items(2)]
    mode: Literal["full", "half"]
    maybe: float | None
    inner: Inner
    counts: dict[str, int]
    later: NotRequired[str]


def test_an_object_schema_is_exact():
    schema = schemas.object_schema((Shape,), {"flag": {"const": True}})
    assert schema["required"] == ["flag", "pair", "mode", "maybe", "inner", "counts"]
    assert schema["properties"]["pair"] == {
        "type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
    }  # fmt: skip
    assert schema["properties"]["maybe"] == {"type": ["number", "null"]}
    validator = Draft202012Validator(schema)
    good = {"flag": True, "pair": [0.5, 1], "mode": "half", "maybe": None,
            "inner": {"n": 3}, "counts": {"a": 1}}  # fmt: skip
    assert validator.is_valid(good) and validator.is_valid({**good, "later": "x"})
    for bad in (
        {**good, "flag": False},  # the fixed schema, not the type's
        {**good, "pair": [1, 2, 3]},
        {**good, "mode": "other"},
        {**good, "inner": {"n": 1.5}},
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "maybe"},
    ):
        assert not validator.is_valid(bad), bad


def test_an_annotation_without_a_schema_is_refused():
    with pytest.raises(TypeError, match="no JSON Schema"):
        schemas.type_schema(set[int])
