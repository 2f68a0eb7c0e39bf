"""The stage-1 input: validated events, one at a time (``Event``) or as numpy columns
(``Batch``), and what a statistic needs of an event's value (``ValueRule``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

Scalar = str | int | float | bool
"""A JSON scalar: what a ``where`` compares and a ``value_field`` holds."""


class Event(NamedTuple):
    """A validated event. A tuple: built once per event on the hot path, where a frozen
    dataclass's ``__init__`` cost four times as much."""

    user_id: str
    key: str | None
    value: float | None
    delete: bool = False
    # (attribute, cell key) for each configured cell attribute the event carries.
    cells: tuple[tuple[str, str], ...] = ()
    # (dotted path, JSON scalar) for each field a statistic reads by path (its
    # ``value_field``, its ``where`` fields) that the event carries.
    attrs: tuple[tuple[str, Scalar], ...] = ()

    def cell(self, field: str) -> str | None:
        """The event's cell key in attribute ``field`` (None: it has none)."""
        for name, value in self.cells:
            if name == field:
                return value
        return None

    def attr(self, path: str) -> Scalar | None:
        """The event's field at dotted ``path`` (None: it has none)."""
        for name, value in self.attrs:
            if name == path:
                return value
        return None


Where = tuple[tuple[str, frozenset[tuple[str, object]]], ...]
"""A statistic's filter: (dotted path, the values it accepts as ``scalar_tag``s) per
field, sorted by path; an event matches when each field holds one of its values."""


def scalar_tag(value: object) -> tuple[str, object] | None:
    """How a filter compares a scalar: by kind and value, numbers as floats (1 == 1.0),
    booleans apart from numbers (true is not 1); None for anything else."""
    kind = type(value)
    if kind is str:
        return ("s", value)
    if kind is bool:
        return ("b", value)
    if kind is int or kind is float:
        return ("n", float(value))  # type: ignore[arg-type]
    return None


@dataclass(frozen=True, slots=True)
class ValueRule:
    """What a statistic needs of the events it counts. An event it selects (by ``key``
    and op) but cannot use (no value where it needs one, no cell key, a cell key outside
    the domain) is its rule failure: the statistic skips the event and the others that
    select it still count it (it is dead-lettered only when none can use it). A value
    outside ``bounds`` is clipped into them by the kind (and counted), never refused."""

    statistic: str
    key: str | None  # the events it counts: this key, or every event when None
    needs_value: bool
    # A sum's R (values in [0, R]) or bins (values in [1, R]); kept apart from ``bounds``
    # for the rules fingerprint, which it has always been part of.
    max_value: int | None
    deletions: bool  # it counts "op": "delete" events (as its deletion stream)
    cell_field: str | None = None  # cell_mean: the attribute holding the cell key
    cell_keys: frozenset[str] | None = None  # cell_mean: the public cell domain, if any
    # [lower, upper] its values are clipped into; None: any finite value is used as is.
    bounds: tuple[float, float] | None = None
    # Where its value is (a dotted path; None: the event's "value") and which events it
    # selects beyond ``key`` (None: all).
    value_path: str | None = None
    where: Where | None = None


NO_VALUE = float("nan")  # a value column's "no value" (events' values are finite)


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """Events as columns, for stage 1's numpy path: ``user`` indexes ``user_ids`` (the
    distinct users), ``key`` indexes ``keys`` (-1: no key), ``value`` is NaN for no value.
    Iterating gives the ``Event``s (built on demand: the count and sum kinds never do)."""

    user_ids: list[str]
    user: np.ndarray  # int64 per event
    keys: list[str]
    key: np.ndarray  # int64 per event
    value: np.ndarray  # float64 per event
    delete: np.ndarray  # bool per event
    cells: tuple[tuple[str, list[str | None]], ...] = ()  # (attribute, key per event)
    attrs: tuple[tuple[str, list[Scalar | None]], ...] = ()  # (path, field per event)

    def __len__(self) -> int:
        return len(self.user)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events(range(len(self.user))))

    def events(self, rows: Iterable[int]) -> list[Event]:
        """The ``Event``s of these rows, in row order."""
        user_ids, keys, cells, attrs = self.user_ids, self.keys, self.cells, self.attrs
        user, key, delete = self.user.tolist(), self.key.tolist(), self.delete.tolist()
        value = [None if v != v else v for v in self.value.tolist()]  # NaN: no value
        return [
            Event(
                user_ids[user[i]],
                None if key[i] < 0 else keys[key[i]],
                value[i],
                delete[i],
                tuple((a, cell) for a, column in cells if (cell := column[i]) is not None),
                tuple((p, x) for p, column in attrs if (x := column[i]) is not None),
            )
            for i in rows
        ]

    def by_user(self) -> tuple[list[str], np.ndarray]:
        """(the batch's users in order of their first event, each event's user as an
        index into that list)."""
        user = self.user
        if not len(user):
            return [], user
        seen = np.maximum.accumulate(user)
        if user[0] == 0 and bool((np.diff(seen) <= 1).all()):  # as encoded: no reordering
            return self.user_ids[: int(seen[-1]) + 1], user
        present, first = np.unique(user, return_index=True)
        order = present[np.argsort(first)]
        rank = np.empty(len(self.user_ids), dtype=np.int64)
        rank[order] = np.arange(len(order))
        return [self.user_ids[u] for u in order.tolist()], rank[user]

    def tail(self, start: int) -> Batch:
        """The events from row ``start`` on."""
        cells = tuple((a, column[start:]) for a, column in self.cells)
        attrs = tuple((p, column[start:]) for p, column in self.attrs)
        return Batch(
            self.user_ids,
            self.user[start:],
            self.keys,
            self.key[start:],
            self.value[start:],
            self.delete[start:],
            cells,
            attrs,
        )

    def take(self, keep: np.ndarray) -> Batch:
        """The events of the rows where ``keep`` (bool per event) is true."""
        kept = keep.tolist()
        cells = tuple(
            (a, [c for c, k in zip(column, kept, strict=True) if k]) for a, column in self.cells
        )
        attrs = tuple(
            (p, [x for x, k in zip(column, kept, strict=True) if k]) for p, column in self.attrs
        )
        return Batch(
            self.user_ids,
            self.user[keep],
            self.keys,
            self.key[keep],
            self.value[keep],
            self.delete[keep],
            cells,
            attrs,
        )

    @classmethod
    def of(cls, events: Iterable[Event]) -> Batch:
        """The columns of ``events`` (a list of ``Event``s or already a ``Batch``)."""
        if isinstance(events, Batch):
            return events
        events = list(events)
        user_index: dict[str, int] = {}
        key_index: dict[str | None, int] = {None: -1}
        user = [user_index.setdefault(e.user_id, len(user_index)) for e in events]
        key = [key_index.setdefault(e.key, len(key_index) - 1) for e in events]
        cell_fields = sorted({a for e in events for a, _ in e.cells})
        paths = sorted({p for e in events for p, _ in e.attrs})
        return cls(
            list(user_index),
            np.array(user, dtype=np.int64),
            [k for k in key_index if k is not None],
            np.array(key, dtype=np.int64),
            np.array([NO_VALUE if e.value is None else e.value for e in events], np.float64),
            np.array([e.delete for e in events], dtype=bool),
            tuple((a, [e.cell(a) for e in events]) for a in cell_fields),
            tuple((p, [e.attr(p) for e in events]) for p in paths),
        )
