"""Stage 1 of the kinds whose users contribute unit weights: what one user's events add
to the tick, and the engine that adds it up.

Each such kind has its own ``UnitBounding`` in its module (``fixed_tau``, ``user_level``,
``histogram``, ``kselect``, ``distinct``, ``whole_user_mean``): which events count and what
one event contributes given what the user sent before (``contribution``). This module
holds what they share: the event-at-a-time loop (``UnitBounding.add``), the rank-band
weights of Dong-Luo-Yi Alg. 5 (``rank_band_weights``), and ``UnitColumns``, which counts the
kinds whose weights depend only on each user's unit totals (count and sum: a
``ColumnarBounding``) a whole batch at a time in numpy. Both equal the event-at-a-time
definition. The weights' keys are built by ``weights.py``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from dpstream.config.statistic import StatisticConfig
from dpstream.operators.noise import snapping
from dpstream.operators.noise.post_processing import Shown
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import truncation

from .events import Batch, Event
from .weights import DELETES, INSERTS, KEPT_UNITS, band_key, crossing_key

Views = dict[str, tuple[np.ndarray, np.ndarray]]
"""Per statistic name: (the rows of a batch it selects, its value column)."""


def add_weights(into: dict[str, int], weights: dict[str, int]) -> None:
    for key, value in weights.items():
        into[key] = into.get(key, 0) + value


def clamped_units(value: float, low: int, bound: int) -> int:
    """``value`` clipped into [low, R], then the nearest integer (ties upward): values
    become units or columns within the declared bound (the ingest counts the clipped ones,
    ``records.parse_event``). Clipped first, so ``value + 0.5`` is exact for R < 2^52: the
    same value gives the same units on every machine."""
    return math.floor(min(max(value, low), bound) + 0.5)


@dataclass(frozen=True, slots=True)
class ValueGrid:
    """A sum's real values: clipped into [lower, upper] and snapped to whole units of the
    public grid step g = (upper - lower) / resolution (``operators.noise.snapping``: exact,
    ties upward), so the tree counts integers and the release is units * g."""

    lower: float
    upper: float
    grid: snapping.Grid

    def units(self, value: float) -> int:
        return snapping.to_units(self.grid, min(max(value, self.lower), self.upper))

    @property
    def bound(self) -> int:
        """The most grid units one event moves the sum: max(|lower|, |upper|) in units."""
        return max(abs(self.units(self.lower)), abs(self.units(self.upper)))


def value_grid(stat: StatisticConfig) -> ValueGrid | None:
    """The grid of a sum given ``lower``/``upper``/``resolution``; None for any other
    statistic (a ``max_value`` sum counts whole units)."""
    if stat.upper is None or stat.resolution is None:
        return None
    lower, upper = stat.value_bounds
    step = (Fraction(repr(upper)) - Fraction(repr(lower))) / stat.resolution  # as written
    return ValueGrid(lower, upper, snapping.make_grid(step))


def rank_band_weights(stream: str, used: int, units: int, column: int) -> dict[str, int]:
    """Dong-Luo-Yi Alg. 5's weights of ``units`` units of a user who sent ``used`` before:
    1 for each 2^j the user's total passes (Count(D_t, 2^j) gains the user), then the units
    by rank band, in ``column`` (a histogram's bin; 0 for a count or a sum)."""
    out = {crossing_key(stream, j): 1 for j in ul.crossed_powers(used, used + units)}
    for band, n in ul.band_units(used, units):
        key = band_key(stream, band, column)
        out[key] = out.get(key, 0) + n
    return out


@dataclass(frozen=True, slots=True)
class UnitBounding(ABC):
    """How stage 1 counts one statistic whose users contribute unit weights: which events
    (``key``, and the deletion stream with ``deletions``), and what they contribute (a
    ``Statistic``'s ``bounding``)."""

    name: str
    key: str | None
    deletions: bool

    # Counted a whole batch at a time by ``UnitColumns`` (a ``ColumnarBounding``).
    columnar: ClassVar[bool] = False

    @property
    def needs_value(self) -> bool:
        """Whether it counts only events with a value (the others are its rule failures,
        ``events.ValueRule``: counted by the statistics that can use them)."""
        return True

    def stream(self, event: Event) -> str | None:
        """``INSERTS`` or ``DELETES``: the stream of ``event`` if this statistic counts it."""
        if self.key is not None and event.key != self.key:
            return None
        if event.value is None and self.needs_value:
            return None
        if event.delete:
            return DELETES if self.deletions else None
        return INSERTS

    def add(self, events: list[Event], used: dict[str, int], kept: dict[str, dict]) -> None:
        """Count one user's ``events`` of a record: advance ``used`` (units per stream
        slot: the statistic's name, ``<name>/-`` for deletions) and add what they
        contribute to ``kept[self.name]`` (created only when non-empty), an event at a
        time (``contribution``)."""
        for event in events:
            self.add_event(event, used, kept)

    def add_event(self, event: Event, used: dict[str, int], kept: dict[str, dict]) -> None:
        """``add`` for one event, by its definition (``contribution``)."""
        stream = self.stream(event)
        if stream is None:
            return
        slot = self.name if stream == INSERTS else f"{self.name}/-"
        units, weights = self.contribution(stream, used.get(slot, 0), event)
        used[slot] = used.get(slot, 0) + units
        if weights:  # never holds zeros
            add_weights(kept.setdefault(self.name, {}), weights)

    @abstractmethod
    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        """(units, weights) of ``event`` for a user who has sent ``used`` units before on
        ``stream``; weights holds no zero entries."""


@dataclass(frozen=True, slots=True)
class ColumnarBounding(UnitBounding):
    """A count or a sum: each event is 1 unit, or its value clamped to [0, R]
    (``max_value``), and the weights depend only on the user's unit totals, so
    ``UnitColumns`` counts it over a whole batch. With a fixed tau (``fixed``) the kept
    units (Dong-Luo-Yi Alg. 3, partial for a straddling sum item); without, the rank bands
    of tau: auto (Alg. 5)."""

    fixed: truncation.TruncationSpec | None = None
    max_value: int | None = None  # a sum's R; None: every event is one unit

    columnar: ClassVar[bool] = True

    @property
    def needs_value(self) -> bool:
        return self.max_value is not None

    def units_of(self, value: float | None) -> int:
        return 1 if self.max_value is None else clamped_units(value or 0.0, 0, self.max_value)

    def units_column(self, values: np.ndarray) -> np.ndarray:
        """``units_of`` over a value column (NaN: no value), as int64."""
        if self.max_value is None:
            return np.ones(len(values), dtype=np.int64)
        # fmax first: NaN (no value) and negatives become 0, then at most R; R < 2^52, so
        # + 0.5 is exact (``clamped_units``).
        return np.floor(np.fmin(np.fmax(values, 0.0), self.max_value) + 0.5).astype(np.int64)

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        units = self.units_of(event.value)
        if self.fixed is not None and stream == INSERTS:
            kept = truncation.admit(self.fixed, used, units)
            return units, ({KEPT_UNITS: kept} if kept else {})
        return units, rank_band_weights(stream, used, units, 0)


def grid_fields(grid: ValueGrid, seen: Shown, std: float, unbiased: int) -> dict[str, Any]:
    """A grid sum's release in the user's units (post-processing of the noisy units): the
    shown value, its std, its interval and the unbiased estimate times the grid step, which
    the release states."""
    step = float(grid.grid.step)
    low, high = seen.interval
    return {
        "value": snapping.from_units(grid.grid, seen.value),
        "std": std * step,
        "interval": [low * step, high * step],
        "unbiased": snapping.from_units(grid.grid, unbiased),
        "grid_step": step,
    }


@dataclass(frozen=True, slots=True)
class GridSumBounding(UnitBounding):
    """A sum of real values on a grid (``ValueGrid``), an event at a time: each event's
    clipped value in grid units. With a fixed tau (``tau``) a user's first tau events are
    kept (Dong-Luo-Yi Alg. 3 over events: the sensitivity is tau times ``grid.bound``, and
    values may be negative); with tau: auto (``tau`` None) the units go by rank band
    (Alg. 5, which needs them non-negative: the config refuses a negative lower)."""

    grid: ValueGrid | None = None
    tau: int | None = None

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        assert self.grid is not None and event.value is not None  # ``stream`` checked it
        units = self.grid.units(event.value)
        if self.tau is not None:
            return 1, ({KEPT_UNITS: units} if units and used < self.tau else {})
        return units, rank_band_weights(stream, used, units, 0)


def _rank_keys(stream: str, before: np.ndarray, units: np.ndarray) -> list[tuple[str, int, int]]:
    """(key, total, first row with it) of the rank-band weights of the rows with
    ``before`` and ``units`` (users crossing 2^j, units in band b of bin 0), crossed
    powers then bands, each in increasing order."""
    rows = np.flatnonzero(units)
    if not len(rows):
        return []
    before, units = before[rows], units[rows]
    out = []
    crossed = ul.crossed_powers_many(before, before + units)
    for j in np.flatnonzero(crossed.any(axis=0)).tolist():
        column = crossed[:, j]
        out.append((crossing_key(stream, j), int(column.sum()), int(rows[column.argmax()])))
    bands = ul.band_units_many(before, units)
    for band in np.flatnonzero(bands.any(axis=0)).tolist():
        column = bands[:, band]
        out.append((band_key(stream, band, 0), int(column.sum()), int(rows[(column > 0).argmax()])))
    return out


class UnitColumns:
    """Stage 1 of the count and sum statistics (``ColumnarBounding``) over a whole
    batch in numpy: each user's units per stream slot with ``bincount``, then the kept
    units (fixed tau, Alg. 3) or the rank bands and crossed powers (tau: auto, Alg. 5)
    of all users at once, from their units before the batch and in it. This is the
    event-at-a-time definition (``ColumnarBounding.contribution``) because a user's events
    of one stream in a batch act as one item of their total: Alg. 3 keeps
    clip(tau - used, 0, units) of them however they are split, and the rank bands and
    crossed powers of consecutive unit ranges add up (the tests check it on random
    records).

    The tick's pending sums get their keys in the order the per-user form gave them
    (users in order of first event; per user its insertions' slot, then its deletions', each
    crossed powers then bands), so the reports stay byte for byte what they were."""

    def __init__(self, stats: list[ColumnarBounding]) -> None:
        self.stats = stats
        # Stream slots: (slot, statistic, stream); a slot is a key of the users' "used".
        self.slots: list[tuple[str, ColumnarBounding, str]] = []
        for stat in stats:
            self.slots.append((stat.name, stat, INSERTS))
            if stat.deletions:
                self.slots.append((stat.name + "/-", stat, DELETES))
        self.names = [slot for slot, _, _ in self.slots]

    def units(
        self, batch: Batch, rows: np.ndarray, users: int, views: Views | None = None
    ) -> np.ndarray:
        """(users x slots) int64: each user's units per slot in ``batch`` (``rows``: the
        user of each event, 0 .. users - 1). ``views``: for a statistic with a ``where`` or
        a ``value_field``, (the rows it selects, its values), by name."""
        out = np.zeros((users, len(self.slots)), dtype=np.int64)
        for column, (_, stat, stream) in enumerate(self.slots):
            mask = batch.delete if stream == DELETES else ~batch.delete
            if stat.key is not None:
                if stat.key not in batch.keys:
                    continue
                mask = mask & (batch.key == batch.keys.index(stat.key))
            values = batch.value
            view = None if views is None else views.get(stat.name)
            if view is not None:
                mask, values = mask & view[0], view[1]
            if stat.max_value is not None:  # a sum: int(value) in [0, R], as the definition
                weights = stat.units_column(values[mask]).astype(np.float64)
                totals = np.bincount(rows[mask], weights=weights, minlength=users)
                out[:, column] = totals.astype(np.int64)
            else:
                out[:, column] = np.bincount(rows[mask], minlength=users)
        return out

    def before(self, used: list[dict[str, int]]) -> np.ndarray:
        """(users x slots) int64: the users' units so far (their entries' "used")."""
        names = self.names
        flat = [u.get(name, 0) for u in used for name in names]
        return np.array(flat, dtype=np.int64).reshape(len(used), len(names))

    def changed(self, after: np.ndarray, units: np.ndarray) -> list[dict[str, int]]:
        """Per user, {slot: units after} of the slots the batch added to (a column at a
        time: the users' entries are the only Python objects built per user)."""
        out: list[dict[str, int]] = [{} for _ in range(len(units))]
        for column, name in enumerate(self.names):
            rows = np.flatnonzero(units[:, column])
            for row, total in zip(rows.tolist(), after[rows, column].tolist(), strict=True):
                out[row][name] = total
        return out

    def add_pending(
        self, pending: dict[str, dict[str, int]], before: np.ndarray, units: np.ndarray
    ) -> None:
        """Add what users with units ``before`` and ``units`` (rows in the order of their
        first event) contribute to the tick's pending sums."""
        keyed: dict[str, list[tuple[str, int, int]]] = {}
        for column, (_, stat, stream) in enumerate(self.slots):
            if stat.fixed is None or stream == DELETES:
                found = _rank_keys(stream, before[:, column], units[:, column])
                keyed.setdefault(stat.name, []).extend(found)
                continue
            kept = int(truncation.admit_many(stat.fixed, before[:, column], units[:, column]).sum())
            if kept:
                into = pending.setdefault(stat.name, {})
                into[KEPT_UNITS] = into.get(KEPT_UNITS, 0) + kept
        for name, found in keyed.items():
            if not found:
                continue
            into = pending.setdefault(name, {})
            # New keys in the order the rows would have inserted them (per row: the
            # order of ``found``), old keys where they are.
            canonical = {key: i for i, (key, _, _) in enumerate(found)}
            found.sort(key=lambda item: (item[2], canonical[item[0]]))
            for key, total, _ in found:
                into[key] = into.get(key, 0) + total
