"""The two stages' bookkeeping, free of Kafka so the worker and ``dpstream replay`` share it.

Stage 1 (keyed by user, one state per events-topic partition): bounds each user's
contribution per statistic and pre-aggregates it per tick. Stage 2 (keyed by statistic):
waits until every stage-1 partition has reported tick t, then steps the statistic once;
its releases are published at tick t's deadline (``drivers.Stage2Driver``). Each
statistic is a ``statistic.Statistic`` built by the registry of kinds (``kinds.py``);
this module calls only the contract, never a kind. All DP math lives in ``operators``;
this module only routes numbers.

Stage 1's states are the JSON dicts its Faust table holds, declared in ``stage1_state.py``
(``PartitionState``, ``UserEntry``); stage 2's is a ``Stage2State``, stored as its JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import numpy as np

from dpstream.config.schema import PipelineConfig, StatisticConfig
from dpstream.operators import accounting
from dpstream.operators.errors import DpStreamError
from dpstream.operators.noise import CachedNoise, NoiseSource, ScopedNoise

from .counting import UnitColumns, add_weights
from .kinds import identity_parameters, statistic_for
from .records import Batch, Event, partition_for
from .stage1_state import PartitionState, UserEntry
from .stage2_state import OFFLINE_RUN, Stage2State, StatisticIdentity, StatisticRun
from .statistic import PerUserStatistic, Report, Statistic

log = logging.getLogger(__name__)

# 3: the default kind mean (whole-user mean) releases noisy samples, no exact counts.
SCHEMA_VERSION = 3
# The ledger's records. 4: every record names its app id and is authenticated (``mac``,
# ``key_commitment``); statements carry runs, sources and the user id field; a statistic's
# first entry is ``"event": "start"`` with its run (docs/design.md section 4a).
LEDGER_SCHEMA_VERSION = 4


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
        self._partitions = cfg.input.partitions
        self._indexes: dict[int, _ScanIndex] = {}  # per stage-1 partition

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
        user_id: str,
        index: _ScanIndex | None,
    ) -> None:
        """The kinds counted per user, for one user's events of a record (``index``: the
        partition's scan index, when a statistic has per-user state)."""
        kept_now: dict[str, dict[str, int]] = {}
        for stat in self._per_user:
            stat.add(events, entry["used"], kept_now)
        if not in_pending:
            for name, weights in kept_now.items():
                add_weights(pstate["pending"].setdefault(name, {}), weights)
        if kept_now:
            entry["kept"] = kept_now
        if index is not None:
            self._apply_user_stats(pstate, stored, entry, events, partition, in_pending)
            index.update(self._user_stats, pstate["stats"], user_id, entry["state"])

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
        self, pstate: PartitionState, users: Mapping[str, UserEntry], partition: int
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

    pstate: PartitionState
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


class Stage2:
    """Tick barrier across stage-1 partitions, then one step of the statistic per tick."""

    def __init__(
        self,
        cfg: PipelineConfig,
        noise: NoiseSource,
        partitions: int,
        runs: Mapping[str, StatisticRun] | None = None,
    ) -> None:
        """Stage 2 of ``cfg``'s statistics.

        Args:
            cfg: the pipeline.
            noise: the key's noise source.
            partitions: the stage-1 partitions (the events topic's).
            runs: each statistic's run as the ledger states it (the worker's); None:
                every statistic under ``OFFLINE_RUN`` (replay of a log without recorded
                runs, tests).
        """
        self._cfg = cfg
        # Keyed noise is deterministic per node, so remembering live nodes is safe.
        self._noise = CachedNoise(noise, maxsize=1 << 14)
        self._partitions = partitions
        self._stats = {s.name: s for s in cfg.statistics}
        self._counters: dict[str, Statistic] = {
            s.name: statistic_for(s, cfg) for s in cfg.statistics
        }
        self._params = {s.name: identity_parameters(s, cfg) for s in cfg.statistics}
        self._fingerprints = {
            name: accounting.fingerprint(params) for name, params in self._params.items()
        }
        self._runs = {s.name: (runs or {}).get(s.name, OFFLINE_RUN) for s in cfg.statistics}
        statement = cfg.privacy_statement()
        self._charges = {c.statistic: c for c in statement.charges}

    def _check_identity(self, state: Stage2State, name: str) -> None:
        """Refuse a state this worker must not continue: another run's (its state lost
        and begun again, or a key changed: continuing would draw fresh noise for what
        was released), another key's, other parameters'. A state of a run the ledger
        started anew (charged again) is discarded."""
        identity = state.identity
        if identity is None:
            return
        run = self._runs[name]
        if identity.run_id in run.replaces:
            log.warning("statistic %s: run %s starts anew (charged again)", name, run.run_id)
            state.clear()
            return
        if identity.run_id != run.run_id:
            raise StatisticChanged(
                f"statistic {name}: its state belongs to run {identity.run_id}, the ledger's "
                f"run is {run.run_id}; continuing either would re-draw released noise: "
                f"restore the ledger, or start it anew with `dpstream ledger --charge-again "
                f"{name}` (charged again)"
            )
        if run.key_commitment is not None and identity.key_commitment != run.key_commitment:
            raise StatisticChanged(
                f"statistic {name}: its releases were drawn under another noise key; a "
                "changed key re-draws the noise of every released node: restore the key"
            )
        if identity.fingerprint != self._fingerprints[name]:
            changed = accounting.changed_fields(identity.parameters, self._params[name])
            raise StatisticChanged(
                f"statistic {name}: its state was made with other parameters "
                f"({', '.join(changed) or 'fingerprint'} changed); a changed statistic is a "
                "new statistic: give it a new name"
            )

    def _check_born(self, state: Stage2State, report: Report) -> None:
        """Refuse a stage-1 partition whose state began again: every user's contribution
        bound began again with it, inside trees that already hold their contributions."""
        if report.born is None:
            return
        born = state.born.setdefault(report.partition, report.born)
        if born != report.born:
            raise StatisticChanged(
                f"statistic {report.statistic}: stage-1 partition {report.partition} lost its "
                f"state (it began at tick {born}, now at tick {report.born}): each user's "
                "contribution bound began again inside the same trees; restore the stage-1 "
                "changelog, or start the statistic anew with `dpstream ledger --charge-again "
                f"{report.statistic}` (charged again)"
            )

    def _new_identity(self, name: str, tick: int) -> StatisticIdentity:
        """The statistic's identity at its first closed tick, which must be the tick its
        run first released at, if it has: a state that is gone and begun again at another
        tick would release the same data under fresh noise."""
        run = self._runs[name]
        if run.start_tick is not None and run.start_tick != tick:
            raise StatisticChanged(
                f"statistic {name}: run {run.run_id} released from tick {run.start_tick}, "
                f"but its state is gone (it would begin again at tick {tick} and release the "
                "same data under fresh noise): restore the stage-2 changelog, or start it "
                f"anew with `dpstream ledger --charge-again {name}` (charged again)"
            )
        return StatisticIdentity(
            self._fingerprints[name], self._params[name], tick, run.run_id, run.key_commitment
        )

    def _noise_of(self, identity: StatisticIdentity, name: str) -> NoiseSource:
        scope = (
            self._cfg.app_id,
            name,
            identity.fingerprint,
            identity.run_id,
            identity.start_tick,
        )
        return ScopedNoise(self._noise, scope)

    @staticmethod
    def new_state() -> Stage2State:
        return Stage2State()

    def on_report(self, state: Stage2State, report: Report) -> tuple[list[dict], list[dict]]:
        """Absorb one report; return (releases, ledger entries) for every tick it closes."""
        name = report.statistic
        self._check_identity(state, name)
        self._check_born(state, report)
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
                state.identity = self._new_identity(name, tick)
                ledger.append(self._first_ledger_entry(name, state.identity))
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
            "schema_version": LEDGER_SCHEMA_VERSION,
            "app_id": self._cfg.app_id,
            "statistic": name,
            "tick": tick,
            **fields,
            "total_epsilon": self._cfg.privacy.total_epsilon,
        }

    def _first_ledger_entry(self, name: str, identity: StatisticIdentity) -> dict:
        """The statistic's first ledger entry, at its first closed tick: what it charges
        and its identity (the run's start, which the worker checks a recreated state
        against), completed by the kind (``Statistic.ledger_start``)."""
        stat = self._stats[name]
        counter = self._counters[name]
        entry = {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "app_id": self._cfg.app_id,
            "event": "start",
            "statistic": name,
            "instance": 0,
            "tick": identity.start_tick,
            "epsilon": stat.epsilon,
            "mechanism": counter.mechanism,
            "tau": stat.tau,
            "neighbours": self._neighbours(name),
            "note": "whole infinite stream (parallel composition over periods)",
            "total_epsilon": self._cfg.privacy.total_epsilon,
            "charged": float(self._charges[name].epsilon),
            "fingerprint": identity.fingerprint,
            "run_id": identity.run_id,
            "start_tick": identity.start_tick,
        }
        return counter.ledger_start(entry)
