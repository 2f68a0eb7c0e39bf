"""Stage 1's bookkeeping, free of Kafka so the worker and ``dpstream replay`` share it.

Stage 1 (keyed by user, one state per events-topic partition) bounds each user's
contribution per statistic and pre-aggregates it per tick; at a tick marker it reports each
statistic's tick to stage 2 (``stage2.py``). Each statistic is a
``dpstream.statistics.contract.Statistic`` built by the registry of kinds
(``dpstream.statistics.registry``); this module calls only the contract, never a kind. All
DP math lives in ``operators``; this module only routes numbers.

Stage 1's states are the JSON dicts its Faust table holds, declared in ``stage1_state.py``
(``PartitionEntry``, ``UserEntry``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from dpstream.config.schema import PipelineConfig
from dpstream.statistics.bounding import ColumnarBounding, UnitColumns, Views, add_weights
from dpstream.statistics.contract import PerUserStatistic, Report
from dpstream.statistics.events import Batch, Event
from dpstream.statistics.registry import statistic_for, value_rule

from ..wire.records import matches, partition_for, value_column, value_of, where_rows
from .stage1_state import PartitionEntry, UserEntry, redelivered

log = logging.getLogger(__name__)


_UNUSED: dict[str, int] = {}  # a new user's ``used``


class Stage1:
    """Per-user contribution counts (on the original stream) and per-tick pre-aggregation:
    the unit weights of the statistics with a ``bounding`` (``dpstream.statistics.bounding``),
    the per-user and per-partition states of the others."""

    def __init__(self, cfg: PipelineConfig) -> None:
        stats = [statistic_for(s, cfg) for s in cfg.statistics]
        self._stats = [s.bounding for s in stats if s.bounding is not None]
        self._columns = UnitColumns([s for s in self._stats if isinstance(s, ColumnarBounding)])
        self._per_user = [s for s in self._stats if not s.columnar]
        self._user_stats = [s for s in stats if s.bounding is None]
        self._partitions = cfg.input.partitions
        self._indexes: dict[int, _ScanIndex] = {}  # per stage-1 partition
        # The statistics that read a value field or filter by ``where``: each sees only
        # the events it selects, with its own field as their value.
        self._views = {
            r.statistic: r
            for r in (value_rule(s) for s in cfg.statistics)
            if r.value_path is not None or r.where is not None
        }

    def add_events(
        self,
        pstate: PartitionEntry,
        users: MutableMapping[str, UserEntry],
        events: Batch | list[Event],
        offset: int,
        partition: int = 0,
    ) -> None:
        """Count record ``offset``'s events against their users' totals; add what they
        contribute to this tick's pending sums.

        The count and sum statistics advance over the whole record in numpy
        (``bounding.UnitColumns``); the other kinds per user. One table write per user
        per record, a ``UserEntry`` (units per stream slot so far, the record, the per-user
        kinds' weights from it, and the ``state``/``redo`` below).

        Idempotent per record, whichever of the table writes (user entries, then the
        partition state) survived a crash: a user entry remembers the offset it last
        applied and what it contributed then (a count or sum: the units this same record
        gives it again, before them used - units, ``_readded``; the per-user kinds:
        ``kept``), so a re-delivered record
        * re-counts a user whose entry missed it (else the user could exceed tau), and
        * re-adds the contribution of a user whose entry has it but whose units the
          partition's pending sums lost (else the count would lose them).
        pipeline/worker/app.py keeps both kinds of entry in one changelog partition and
        pipeline/worker/changelog.py sends them in windows that Kafka keeps whole or not at all,
        so a crash keeps the table as it stood at some moment: only the LAST record's user
        entries can be ahead of the partition state, which is what this handles.

        A statistic with per-user state keeps its user's state in the entry (``state``) and
        what the record did to the partition's state (``redo``), re-applied in the same case.
        """
        batch = Batch.of(events)
        if not len(batch):
            return
        in_pending = redelivered(pstate, offset)
        pending: dict[str, dict[str, int]] = pstate["pending"]
        user_ids, rows = batch.by_user()
        stored = [users.get(user_id) for user_id in user_ids]
        columns = self._columns
        units = columns.units(batch, rows, len(user_ids), self._column_views(batch))
        before = columns.before([_UNUSED if e is None else e["used"] for e in stored])
        # Per user: count the record (its entry missed it), re-add it (its entry has it,
        # the pending sums lost it) or neither.
        counts = [entry is None or entry["offset"] < offset for entry in stored]
        readds = None
        if not all(counts):
            readds = [
                not (c or in_pending) and e is not None and e["offset"] == offset
                for c, e in zip(counts, stored, strict=True)
            ]
            before, units = self._readded(stored, counts, readds, before, units)
        if not in_pending:
            columns.add_pending(pending, before, units)
        per_user = self._per_user or self._user_stats
        events_of = self._events_by_user(batch, rows) if per_user else None
        index = self._index(pstate, users, partition) if self._user_stats else None
        changed = columns.changed(before + units, units)
        writes: list[tuple[str, UserEntry]] = []
        for i, (user_id, entry, count) in enumerate(zip(user_ids, stored, counts, strict=True)):
            if not count:
                if readds is not None and readds[i]:
                    assert entry is not None  # not counted: the user has an entry
                    for name, weights in entry.get("kept", {}).items():
                        add_weights(pending.setdefault(name, {}), weights)
                    self._redo(pstate, entry.get("redo", {}), partition)
                continue
            used = changed[i] if entry is None else entry["used"] | changed[i]
            new: UserEntry = {"used": used, "offset": offset}
            if events_of is not None:
                self._add_per_user(
                    pstate, entry, new, events_of[i], partition, in_pending, user_id, index
                )
            writes.append((user_id, new))
        users.update(writes)  # each user once: the record's writes at once

    def _readded(
        self,
        stored: list[UserEntry | None],
        counts: list[bool],
        readds: list[bool],
        before: np.ndarray,
        units: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(units before, units) per user of a re-delivered record for the pending sums:
        a user who counts it as before; one whose entry has it and whose units the
        pending sums lost: the same units (the same record, cut by ``unseen`` against the
        same partition state, the one from before it), before them used - units; any
        other user: none. Never below 0: ``used`` bounds what the user contributes from
        here on."""
        keep = [c or (r and e is not None) for c, r, e in zip(counts, readds, stored, strict=True)]
        mask, counting = np.array(keep)[:, None], np.array(counts)[:, None]
        readded = np.maximum(before - units, 0)
        return np.where(counting, before, readded), np.where(mask, units, 0)

    def _add_per_user(
        self,
        pstate: PartitionEntry,
        stored: UserEntry | None,
        entry: UserEntry,
        events: list[Event],
        partition: int,
        in_pending: bool,
        user_id: str,
        index: _ScanIndex | None,
    ) -> None:
        """The kinds counted per user, for one user's events of a record (``index``: the
        partition's scan index, when a statistic has per-user state)."""
        kept_now: dict[str, dict[str, int]] = {}
        for stat in self._per_user:
            stat.add(self._selected(stat.name, events), entry["used"], kept_now)
        if not in_pending:
            for name, weights in kept_now.items():
                add_weights(pstate["pending"].setdefault(name, {}), weights)
        if kept_now:
            entry["kept"] = kept_now
        if index is not None:
            self._apply_user_stats(pstate, stored, entry, events, partition, in_pending)
            index.update(self._user_stats, pstate["stats"], user_id, entry["state"])

    def _column_views(self, batch: Batch) -> Views | None:
        """``UnitColumns.units``'s views of ``batch``."""
        if not self._views:
            return None
        return {
            name: (
                np.ones(len(batch), dtype=bool)
                if rule.where is None
                else where_rows(batch, rule.where),
                value_column(batch, rule.value_path),
            )
            for name, rule in self._views.items()
        }

    def _selected(self, name: str, events: list[Event]) -> list[Event]:
        """The events statistic ``name`` selects, each with its value field as its value."""
        rule = self._views.get(name)
        if rule is None:
            return events
        out = []
        for event in events:
            if rule.where is not None and not matches(event, rule.where):
                continue
            if rule.value_path is not None:
                event = event._replace(value=value_of(event, rule, None)[0])
            out.append(event)
        return out

    @staticmethod
    def _events_by_user(batch: Batch, rows: np.ndarray) -> list[list[Event]]:
        out: list[list[Event]] = [[] for _ in range(int(rows.max()) + 1)]
        for row, event in zip(rows.tolist(), batch, strict=True):
            out[row].append(event)
        return out

    def _apply_user_stats(
        self,
        pstate: PartitionEntry,
        stored: UserEntry | None,
        entry: UserEntry,
        events: list[Event],
        partition: int,
        in_pending: bool,
    ) -> None:
        # in_pending (the partition state has the record, this user's entry does not)
        # cannot follow from the one-changelog write order; the user's state is still
        # advanced, the partition's is not touched twice.
        slots = pstate.setdefault("stats", {})
        states = dict(stored.get("state", {})) if stored is not None else {}
        redos: dict[str, Any] = {}
        for stat in self._user_stats:
            mine = [e for e in self._selected(stat.name, events) if stat.counts(e)]
            if not mine:
                continue
            slot, states[stat.name], redos[stat.name] = stat.apply(
                slots.get(stat.name), states.get(stat.name), mine, partition
            )
            if not in_pending:
                slots[stat.name] = slot
        entry["state"], entry["redo"] = states, redos

    def _redo(self, pstate: PartitionEntry, redos: dict[str, Any], partition: int) -> None:
        if not redos:
            return
        slots = pstate.setdefault("stats", {})
        for stat in self._user_stats:
            if stat.name in redos:
                slots[stat.name] = stat.redo(slots.get(stat.name), redos[stat.name], partition)

    def close_tick(
        self,
        pstate: PartitionEntry,
        partition: int,
        tick: int,
        users: Mapping[str, UserEntry] | None = None,
    ) -> list[Report]:
        """Handle tick marker ``tick``; a duplicate or stale marker yields nothing.

        ``users``: the user entries (a worker's table holds every partition it owns); a
        statistic with per-user state scans those of the partition's users its index
        holds, and only when it needs them (a median, a cell's close).
        """
        last = pstate["last_tick"]
        if last is not None and tick <= last:
            return []
        from_tick = tick if last is None else last + 1
        born = pstate.setdefault("born", tick)
        pending = pstate["pending"]
        reports = [
            Report(stat.name, partition, from_tick, tick, pending.get(stat.name, {}), born=born)
            for stat in self._stats
        ]
        if self._user_stats:
            entries: Mapping[str, UserEntry] = {} if users is None else users
            index = self._index(pstate, entries, partition)
            slots: dict[str, Any] = pstate.setdefault("stats", {})
            for stat in self._user_stats:
                scan = _Scan(stat.name, entries, index.users[stat.name])
                slots[stat.name], payload = stat.close_tick(
                    slots.get(stat.name), partition, from_tick, tick, scan
                )
                if scan.done:  # what the close sent, no later close needs: out
                    index.prune(stat, slots[stat.name], entries)
                reports.append(Report(stat.name, partition, from_tick, tick, {}, payload, born))
        pstate["pending"] = {}
        pstate["last_tick"] = tick
        return reports

    def _index(
        self, pstate: PartitionEntry, users: Mapping[str, UserEntry], partition: int
    ) -> _ScanIndex:
        """The partition's scan index, built from ``users`` when there is none for this
        partition state: a recovered or re-assigned partition's state is a new object
        (Faust's recovery decodes the changelog into new dicts), the one after a crash in
        a test too."""
        index = self._indexes.get(partition)
        if index is None or index.pstate is not pstate:
            index = _ScanIndex(pstate, {stat.name: {} for stat in self._user_stats})
            slots = pstate.get("stats", {})
            for user_id, entry in users.items():
                states = entry.get("state")
                if states and partition_for(user_id, self._partitions) == partition:
                    index.update(self._user_stats, slots, user_id, states)
            self._indexes[partition] = index
        return index


@dataclass(slots=True)
class _ScanIndex:
    """The users a tick close of one stage-1 partition scans, per statistic with per-user
    state: user id -> place in the scan (``PerUserStatistic.scan_order``).

    A close used to walk every user entry the worker held, so the time from a marker to
    its report grew with the users held, a data-dependent time before a release
    (docs/design.md section 1 has the measurements). The index holds only the users a close may
    need (a cell mean's: those with data no close has sent; a continual mean's: the
    admitted, in rank order). It lives in memory, kept by ``add_events`` and
    ``close_tick``, and is built once from the table per partition state object, so it
    adds no changelog bytes; being a superset is safe (a close reads each user's state),
    missing a user is not, hence the rebuild whenever the state may have come from
    elsewhere."""

    pstate: PartitionEntry
    """The partition state object it was built with and kept along."""
    users: dict[str, dict[str, int]]
    """Statistic -> user id -> scan order."""

    def update(
        self,
        stats: list[PerUserStatistic],
        slots: Mapping[str, Any],
        user_id: str,
        states: Mapping[str, Any],
    ) -> None:
        """File or drop the user, per statistic it has a state of."""
        for stat in stats:
            state = states.get(stat.name)
            if state is None:
                continue
            order = stat.scan_order(slots.get(stat.name), state)
            if order is None:
                self.users[stat.name].pop(user_id, None)
            else:
                self.users[stat.name][user_id] = order

    def prune(self, stat: PerUserStatistic, slot: Any, users: Mapping[str, UserEntry]) -> None:
        """After a close that scanned ``stat``'s users: drop those it is done with."""
        indexed = self.users[stat.name]
        for user_id in list(indexed):
            entry = users.get(user_id)
            state = None if entry is None else entry.get("state", {}).get(stat.name)
            if state is None or stat.scan_order(slot, state) is None:
                del indexed[user_id]


class _Scan:
    """``Users`` of one statistic for one close: the indexed users' states in scan order
    (``done`` once it was called)."""

    def __init__(self, name: str, users: Mapping[str, UserEntry], indexed: dict[str, int]) -> None:
        self._name, self._users, self._indexed = name, users, indexed
        self.done = False

    def __call__(self) -> Iterator[tuple[str, Any]]:
        self.done = True
        return self._states()

    def _states(self) -> Iterator[tuple[str, Any]]:
        for user_id, _ in sorted(self._indexed.items(), key=itemgetter(1)):
            entry = self._users.get(user_id)
            state = None if entry is None else entry.get("state", {}).get(self._name)
            if state is not None:
                yield user_id, state
