"""Operator states to and from JSON-able dicts (Faust tables, changelogs).

States are frozen dataclasses of ints, Fractions-free plain data and (nested) tuples;
JSON turns tuples into lists, so loading turns them back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from .errors import StateSchemaError

S = TypeVar("S")


def to_json(state: object) -> dict[str, Any]:
    return dataclasses.asdict(state)  # type: ignore[call-overload]


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def from_json(cls: type[S], data: dict[str, Any]) -> S:
    """Rebuild a ``cls`` state; raise StateSchemaError if the fields do not match."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if set(data) != names:
        raise StateSchemaError(
            f"state of {cls.__name__} must have fields {sorted(names)}, got {sorted(data)}"
        )
    return cls(**{k: _tuplify(v) for k, v in data.items()})
