"""The two stages' bookkeeping, free of Kafka so the worker and ``dpstream replay`` share it.

Stage 1 (keyed by user, one state per events-topic partition): bounds each user's
contribution per statistic and pre-aggregates it per tick. Stage 2 (keyed by statistic):
waits until every stage-1 partition has reported tick t, then steps the statistic once
and releases. Each statistic is a ``statistic.Statistic`` built by the registry of kinds
(``kinds.py``); this module calls only the contract, never a kind. All DP math lives in
``operators``; this module only routes numbers.

Stage 1's states are the JSON dicts its Faust table holds, declared in ``stage1_state.py``
(``PartitionState``, ``UserEntry``); stage 2's is a ``Stage2State``, stored as its JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

import numpy as np

from dpstream.config.schema import PipelineConfig, StatisticConfig
from dpstream.operators import accounting
from dpstream.operators.errors import DpStreamError
from dpstream.operators.noise import CachedNoise, NoiseSource, ScopedNoise

from .counting import UnitColumns, add_weights
from .kinds import statistic_for
from .records import Batch, Event, partition_for
from .stage1_state import PartitionState, UserEntry
from .stage2_state import Stage2State, StatisticIdentity
from .statistic import Report, Statistic, Users

log = logging.getLogger(__name__)

# 3: the default kind mean (whole-user mean) releases noisy samples, no exact counts.
SCHEMA_VERSION = 3


_UNUSED: dict[str, int] = {}  # a new user's ``used``


class StatisticChanged(DpStreamError):
    """Stage 2 found a statistic's state made under other parameters: continuing would
    re-draw noise it has released (the worker stops)."""


class Stage1:
    """Per-user contribution counts (on the original stream) and per-tick pre-aggregation:
    the unit weights of the ``counting`` statistics (``pipeline.counting``), the
    per-user and per-partition states of the others."""

    def __init__(self, cfg: PipelineConfig) -> None:
        stats = [statistic_for(s, cfg) for s in cfg.statistics]
        self._stats = [s.counting for s in stats if s.counting is not None]
        self._columns = UnitColumns([s for s in self._stats if s.columnar])
        self._per_user = [s for s in self._stats if not s.columnar]
        self._user_stats = [s for s in stats if s.counting is None]

    def add_events(
        self,
        pstate: PartitionState,
        users: MutableMapping[str, UserEntry],
        events: Batch | list[Event],
        offset: int,
        partition: int = 0,
    ) -> None:
        """Count record ``offset``'s events against their users' totals; add what they
        contribute to this tick's pending sums.

        The count and sum statistics advance over the whole record in numpy
        (``counting.UnitColumns``); the other kinds per user. One table write per user
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
        pipeline/app.py keeps both kinds of entry in one changelog partition and
        pipeline/changelog.py sends them in windows that Kafka keeps whole or not at all,
        so a crash keeps the table as it stood at some moment: only the LAST record's user
        entries can be ahead of the partition state, which is what this handles.

        A statistic with per-user state keeps its user's state in the entry (``state``) and
        what the record did to the partition's state (``redo``), re-applied in the same case.
        """
        batch = Batch.of(events)
        if not len(batch):
            return
        in_pending = offset <= pstate["last_offset"]
        pending: dict[str, dict[str, int]] = pstate["pending"]
        user_ids, rows = batch.by_user()
        stored = [users.get(user_id) for user_id in user_ids]
        columns = self._columns
        units = columns.units(batch, rows, len(user_ids))
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
                self._add_per_user(pstate, entry, new, events_of[i], partition, in_pending)
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
        other user: none. An entry written before the count and sum kinds were counted
        in numpy has their weights in ``kept`` (re-added from there). Never below 0:
        ``used`` bounds what the user contributes from here on."""
        names = {stat.name for stat in self._columns.stats}
        keep = [
            c or (r and e is not None and not names & e.get("kept", {}).keys())
            for c, r, e in zip(counts, readds, stored, strict=True)
        ]
        mask, counting = np.array(keep)[:, None], np.array(counts)[:, None]
        readded = np.maximum(before - units, 0)
        return np.where(counting, before, readded), np.where(mask, units, 0)

    def _add_per_user(
        self,
        pstate: PartitionState,
        stored: UserEntry | None,
        entry: UserEntry,
        events: list[Event],
        partition: int,
        in_pending: bool,
    ) -> None:
        """The kinds counted per user, for one user's events of a record."""
        kept_now: dict[str, dict[str, int]] = {}
        for stat in self._per_user:
            stat.add(events, entry["used"], kept_now)
        if not in_pending:
            for name, weights in kept_now.items():
                add_weights(pstate["pending"].setdefault(name, {}), weights)
        if kept_now:
            entry["kept"] = kept_now
        if self._user_stats:
            self._apply_user_stats(pstate, stored, entry, events, partition, in_pending)

    @staticmethod
    def _events_by_user(batch: Batch, rows: np.ndarray) -> list[list[Event]]:
        out: list[list[Event]] = [[] for _ in range(int(rows.max()) + 1)]
        for row, event in zip(rows.tolist(), batch, strict=True):
            out[row].append(event)
        return out

    def _apply_user_stats(
        self,
        pstate: PartitionState,
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
            mine = [e for e in events if stat.counts(e)]
            if not mine:
                continue
            slot, states[stat.name], redos[stat.name] = stat.apply(
                slots.get(stat.name), states.get(stat.name), mine, partition
            )
            if not in_pending:
                slots[stat.name] = slot
        entry["state"], entry["redo"] = states, redos

    def _redo(self, pstate: PartitionState, redos: dict[str, Any], partition: int) -> None:
        if not redos:
            return
        slots = pstate.setdefault("stats", {})
        for stat in self._user_stats:
            if stat.name in redos:
                slots[stat.name] = stat.redo(slots.get(stat.name), redos[stat.name], partition)

    def close_tick(
        self,
        pstate: PartitionState,
        partition: int,
        tick: int,
        users: Callable[[], Iterable[tuple[str, UserEntry]]] = tuple,
    ) -> list[Report]:
        """Handle tick marker ``tick``; a duplicate or stale marker yields nothing.

        ``users`` returns the (user id, entry) pairs of this partition's users; it is
        called only by a statistic with per-user state that needs them (a median, a cell's close).
        """
        last = pstate["last_tick"]
        if last is not None and tick <= last:
            return []
        from_tick = tick if last is None else last + 1
        pending = pstate["pending"]
        reports = [
            Report(stat.name, partition, from_tick, tick, pending.get(stat.name, {}))
            for stat in self._stats
        ]
        slots: dict[str, Any] = pstate.setdefault("stats", {}) if self._user_stats else {}
        for stat in self._user_stats:
            slots[stat.name], payload = stat.close_tick(
                slots.get(stat.name), partition, from_tick, tick, _states_of(stat.name, users)
            )
            reports.append(Report(stat.name, partition, from_tick, tick, {}, payload))
        pstate["pending"] = {}
        pstate["last_tick"] = tick
        return reports


def users_of_partition(
    users: Mapping[str, UserEntry], partition: int, partitions: int
) -> Callable[[], Iterable[tuple[str, UserEntry]]]:
    """For ``Stage1.close_tick``: the entries in ``users`` of the partition's users (a
    worker's table holds every partition it owns)."""
    return lambda: (
        (user_id, entry)
        for user_id, entry in users.items()
        if partition_for(user_id, partitions) == partition
    )


def _states_of(name: str, users: Callable[[], Iterable[tuple[str, UserEntry]]]) -> Users:
    def states() -> Iterable[tuple[str, Any]]:
        for user_id, entry in users():
            state = entry.get("state", {}).get(name)
            if state is not None:
                yield user_id, state

    return states


class Stage2:
    """Tick barrier across stage-1 partitions, then one step of the statistic per tick."""

    def __init__(self, cfg: PipelineConfig, noise: NoiseSource, partitions: int) -> None:
        self._cfg = cfg
        # Keyed noise is deterministic per node, so remembering live nodes is safe.
        self._noise = CachedNoise(noise, maxsize=1 << 14)
        self._partitions = partitions
        self._stats = {s.name: s for s in cfg.statistics}
        self._counters: dict[str, Statistic] = {
            s.name: statistic_for(s, cfg) for s in cfg.statistics
        }
        self._params = {s.name: cfg.statistic_parameters(s) for s in cfg.statistics}
        self._fingerprints = {
            name: accounting.fingerprint(params) for name, params in self._params.items()
        }
        statement = cfg.privacy_statement()
        self._charges = {c.statistic: c for c in statement.charges}

    def _check_identity(self, state: Stage2State, name: str) -> None:
        identity = state.identity
        if identity is None:
            if state.last_closed is not None:
                raise StatisticChanged(
                    f"statistic {name}: its state has released ticks but no identity (made "
                    "by an older dpstream); its noise cannot be re-derived: run it under a "
                    "new app_id or name"
                )
            return
        if identity.fingerprint != self._fingerprints[name]:
            changed = accounting.changed_fields(identity.parameters, self._params[name])
            raise StatisticChanged(
                f"statistic {name}: its state was made with other parameters "
                f"({', '.join(changed) or 'fingerprint'} changed); a changed statistic is a "
                "new statistic: give it a new name"
            )

    def _noise_of(self, identity: StatisticIdentity, name: str) -> NoiseSource:
        scope = (self._cfg.app_id, name, identity.fingerprint, identity.start_tick)
        return ScopedNoise(self._noise, scope)

    @staticmethod
    def new_state() -> Stage2State:
        return Stage2State()

    def on_report(self, state: Stage2State, report: Report) -> tuple[list[dict], list[dict]]:
        """Absorb one report; return (releases, ledger entries) for every tick it closes."""
        name = report.statistic
        self._check_identity(state, name)
        last = state.reported.get(report.partition)
        if last is not None and report.tick <= last:
            return [], []  # re-delivered report: already counted
        state.first.setdefault(report.partition, report.from_tick)
        state.reported[report.partition] = report.tick
        counter = self._counters[name]
        for tick, part in counter.parts(report):
            at = min(max(tick, report.from_tick), report.tick)
            old = state.pending.get(at)
            state.pending[at] = part if old is None else counter.merge(old, part)
        if len(state.reported) < self._partitions:
            return [], []
        origin = min(state.first.values())
        upto = min(state.reported.values())
        start = origin if state.last_closed is None else state.last_closed + 1
        releases, ledger = [], []
        for tick in range(start, upto + 1):
            if state.last_closed is None:
                state.identity = StatisticIdentity(
                    self._fingerprints[name], self._params[name], tick
                )
                ledger.append(self._first_ledger_entry(name, tick))
            pending = state.pending.pop(tick, None)
            state.last_closed = tick
            if state.exhausted is not None:
                continue  # its budget is spent: nothing more is released, ever
            if self._budget_spent_before(name, tick - origin + 1):
                state.exhausted = tick
                releases.append(self._exhausted_marker(name, tick))
                ledger.append(self._exhausted_entry(name, tick))
                continue
            out, entries = self._advance(state, name, tick, pending)
            releases.extend(out)
            ledger.extend(entries)
        return releases, ledger

    def _budget_spent_before(self, name: str, step: int) -> bool:
        """An expiring statistic is charged epsilon * g(horizon_ticks) (config/schema.py):
        a release at a later step would let its oldest item lose more than that."""
        stat = self._stats[name]
        return stat.mechanism == "expiring" and step > (stat.horizon_ticks or step)

    def _exhausted_marker(self, name: str, tick: int) -> dict:
        stat = self._stats[name]
        log.warning(
            "statistic %s: lifetime budget spent at tick %s (horizon_ticks=%s); "
            "no further releases",
            name,
            tick,
            stat.horizon_ticks,
        )
        fields = {
            "exhausted": True,
            "value": None,
            "note": "lifetime budget spent: this statistic releases nothing more",
        }
        return self._release_record(stat, tick, fields)

    def _exhausted_entry(self, name: str, tick: int) -> dict:
        fields = {
            "event": "exhausted",
            "epsilon_spent": float(self._charges[name].epsilon),
            "horizon_ticks": self._stats[name].horizon_ticks,
        }
        return self._ledger_record(name, tick, fields)

    def _advance(
        self, state: Stage2State, name: str, tick: int, pending: Any
    ) -> tuple[list[dict], list[dict]]:
        """One closed tick: (releases, ledger entries). ``pending`` is the tick's merged
        parts (None or empty when nothing came)."""
        counter, stat = self._counters[name], self._stats[name]
        assert state.identity is not None  # set when the first tick closed
        noise = self._noise_of(state.identity, name)
        step = counter.step(state.tree, pending or None, tick, noise)
        state.tree = step.state
        return (
            [self._release_record(stat, tick, fields) for fields in step.releases],
            [self._ledger_record(name, tick, fields) for fields in step.ledger],
        )

    def _tick_end(self, tick: int) -> float:
        return (tick + 1) * self._cfg.ticks.interval_seconds

    def _release_record(self, stat: StatisticConfig, tick: int, fields: dict) -> dict:
        """Every release of every statistic: the common fields around the kind's."""
        end = self._tick_end(tick)
        record = {
            "schema_version": SCHEMA_VERSION,
            "statistic": stat.name,
            "kind": stat.kind,
            "tick": tick,
            "tick_end": datetime.fromtimestamp(end, UTC).isoformat(),
            "tick_end_unix": end,
            **fields,
            "confidence": 0.95,
            "epsilon": stat.epsilon,
            "neighbours": self._neighbours(stat.name),
            "mechanism": self._counters[stat.name].mechanism,
        }
        if self._cfg.privacy.public_counts:
            record["public_counts"] = True  # the statement: counts are not protected
        if self._cfg.noise.mode.value != "keyed":
            record["insecure"] = self._cfg.noise.mode.value
        return record

    def _neighbours(self, name: str) -> str:
        """The neighbouring relation the statistic's guarantee is stated for."""
        return self._counters[name].neighbours or self._cfg.privacy.neighbours.value

    def _ledger_record(self, name: str, tick: int, fields: dict[str, Any]) -> dict:
        """A ledger entry of a statistic after its first: the common fields around the
        entry's own (an expenditure, the budget spent)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "statistic": name,
            "tick": tick,
            **fields,
            "total_epsilon": self._cfg.privacy.total_epsilon,
        }

    def _first_ledger_entry(self, name: str, tick: int) -> dict:
        """The statistic's first ledger entry, at its first closed tick: what it charges
        and its identity, completed by the kind (``Statistic.ledger_start``)."""
        stat = self._stats[name]
        counter = self._counters[name]
        entry = {
            "schema_version": SCHEMA_VERSION,
            "statistic": name,
            "instance": 0,
            "tick": tick,
            "epsilon": stat.epsilon,
            "mechanism": counter.mechanism,
            "tau": stat.tau,
            "neighbours": self._neighbours(name),
            "note": "whole infinite stream (parallel composition over periods)",
            "total_epsilon": self._cfg.privacy.total_epsilon,
            "charged": float(self._charges[name].epsilon),
            "fingerprint": self._fingerprints[name],
            "start_tick": tick,
        }
        return counter.ledger_start(entry)
