"""Stage 1 of the kinds whose users contribute unit weights (count, sum, histogram,
kselect, distinct and the whole-user mean): what one user's events add to the tick.

Fixed tau: the kept units (Dong-Luo-Yi Alg. 3). User-level (tau: auto): units by rank
band and the users crossing each power of two (Alg. 5). Whole-user mean: the kept samples
and their grid units. The weights' keys are built by ``pipeline.weight_keys``.

The count and sum kinds are counted a whole batch at a time in numpy (``UnitColumns``);
the others, whose weights depend on each event's value, per user (``UnitCounting.add``).
Both equal the event-at-a-time definition (``UnitCounting.add_event``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpstream.operators.means import whole_user_mean as wum
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import truncation

from .events import Batch, Event
from .weights import (
    DELETES,
    INSERTS,
    KEPT_UNITS,
    MEAN_SAMPLES,
    MEAN_UNITS,
    band_key,
    crossing_key,
    distinct_key,
)


def mean_weights(spec: wum.WholeUserMeanSpec, used: int, x: float) -> dict[str, int]:
    """Stage 1's weights for one sample of a user who sent ``used`` before (no zeros)."""
    samples, units = wum.admit(spec, used, x)
    return {k: v for k, v in ((MEAN_SAMPLES, samples), (MEAN_UNITS, units)) if v}


def add_weights(into: dict[str, int], weights: dict[str, int]) -> None:
    for key, value in weights.items():
        into[key] = into.get(key, 0) + value


@dataclass(frozen=True, slots=True)
class UnitCounting:
    """How stage 1 counts one statistic whose users contribute unit weights: which
    events, and what they contribute (a ``Statistic``'s ``counting``)."""

    name: str
    key: str | None
    kind: str
    fixed: truncation.TruncationSpec | None  # None: user-level (rank bands) or a mean
    deletions: bool
    mean: wum.WholeUserMeanSpec | None = None  # the whole-user mean (its own first-m cap)
    # R: a sum's max_value, a histogram's or kselect's bins. Values are clamped to [0, R]
    # where they become units or columns, whatever reached stage 1 (the checks keep
    # out-of-range values from reaching it: this is the bound where it is used).
    max_value: int | None = None

    @property
    def columnar(self) -> bool:
        """Whether ``UnitColumns`` counts it (a count or sum: its weights depend only on
        its users' unit totals per record, not on each event's value)."""
        return self.kind in ("count", "sum") and self.mean is None

    def stream(self, event: Event) -> str | None:
        """``INSERTS`` or ``DELETES``: the stream of ``event`` if this statistic counts it."""
        if self.key is not None and event.key != self.key:
            return None
        if event.delete:
            return DELETES if self.deletions else None
        return INSERTS

    def add(self, events: list[Event], used: dict[str, int], kept: dict[str, dict]) -> None:
        """Count one user's ``events`` of a record: advance ``used`` (units per stream
        slot: the statistic's name, ``<name>/-`` for deletions) and add what they
        contribute to ``kept[self.name]`` (created only when non-empty), an event at a
        time (``contribution``: these kinds' weights depend on each event's value; the
        count and sum kinds go through ``UnitColumns`` instead)."""
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

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        """(units, weights) of ``event`` for a user who has sent ``used`` units before;
        weights holds no zero entries.

        Fixed tau: the kept units (Alg. 3, partial for a straddling sum item).
        Whole-user mean: 1 sample and its grid units for one of the user's first m
        samples (``mean_weights``); units count samples.
        User-level: the units by rank band and bin (operators.user_level), 1 for each
        2^j the user's total passes (Count(D_t, 2^j) gains the user); distinct count: the
        value at the band of its rank instead of the units. Keys: ``pipeline.weight_keys``.
        """
        if self.mean is not None:
            return 1, mean_weights(self.mean, used, event.value)  # type: ignore[arg-type]
        units = self._clamped(event.value) if self.kind == "sum" else 1  # type: ignore[arg-type]
        if self.fixed is not None:
            kept = truncation.admit(self.fixed, used, units)
            return units, ({KEPT_UNITS: kept} if kept else {})
        out = {crossing_key(stream, j): 1 for j in ul.crossed_powers(used, used + units)}
        if self.kind == "distinct":
            out[distinct_key(ul.rank_band(used + 1), event.value)] = 1
            return units, out
        binned = self.kind in ("histogram", "kselect")
        column = max(self._clamped(event.value) - 1, 0) if binned else 0  # type: ignore[arg-type]
        for band, n in ul.band_units(used, units):
            key = band_key(stream, band, column)
            out[key] = out.get(key, 0) + n
        return units, out

    @property
    def bound(self) -> int:
        """R, which the config schema requires of the kinds that have one."""
        if self.max_value is None:
            raise ValueError(f"statistic {self.name}: kind {self.kind} has no max_value or bins")
        return self.max_value

    def _clamped(self, value: float) -> int:
        """int(value) clamped to [0, R]."""
        return min(max(int(value), 0), self.bound)


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
    """Stage 1 of the count and sum statistics (``UnitCounting.columnar``) over a whole
    batch in numpy: each user's units per stream slot with ``bincount``, then the kept
    units (fixed tau, Alg. 3) or the rank bands and crossed powers (tau: auto, Alg. 5)
    of all users at once, from their units before the batch and in it. This is the
    event-at-a-time definition (``UnitCounting.contribution``) because a user's events
    of one stream in a batch act as one item of their total: Alg. 3 keeps
    clip(tau - used, 0, units) of them however they are split, and the rank bands and
    crossed powers of consecutive unit ranges add up (the tests check it on random
    records).

    The tick's pending sums get their keys in the order the per-user form gave them
    (users in order of first event; per user its insertions' slot, then its deletions', each
    crossed powers then bands), so the reports stay byte for byte what they were."""

    def __init__(self, stats: list[UnitCounting]) -> None:
        self.stats = stats
        # Stream slots: (slot, statistic, stream); a slot is a key of the users' "used".
        self.slots: list[tuple[str, UnitCounting, str]] = []
        for stat in stats:
            self.slots.append((stat.name, stat, INSERTS))
            if stat.deletions:
                self.slots.append((stat.name + "/-", stat, DELETES))
        self.names = [slot for slot, _, _ in self.slots]

    def units(self, batch: Batch, rows: np.ndarray, users: int) -> np.ndarray:
        """(users x slots) int64: each user's units per slot in ``batch`` (``rows``: the
        user of each event, 0 .. users - 1)."""
        out = np.zeros((users, len(self.slots)), dtype=np.int64)
        for column, (_, stat, stream) in enumerate(self.slots):
            mask = batch.delete if stream == DELETES else ~batch.delete
            if stat.key is not None:
                if stat.key not in batch.keys:
                    continue
                mask = mask & (batch.key == batch.keys.index(stat.key))
            if stat.kind == "sum":  # int(value) in [0, R], as the definition
                # fmax first: NaN (no value) and negatives become 0, then at most R.
                values = np.fmin(np.fmax(batch.value[mask], 0.0), stat.bound)
                weights = values.astype(np.int64).astype(np.float64)
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
