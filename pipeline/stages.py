"""The two stages' bookkeeping, free of Kafka so the worker and ``dpstream replay`` share it.

Stage 1 (keyed by user, one state per events-topic partition): truncates each user's events to
tau per statistic and pre-aggregates the kept units per tick. Stage 2 (keyed by
statistic): waits until every stage-1 partition has reported tick t, then advances the
statistic's tree counter one step and releases. All DP math lives in ``operators``;
this module only routes numbers.

States are plain JSON-able dicts with string keys, because they live in Faust tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpstream.config.schema import Neighbours, PipelineConfig, StatisticConfig
from dpstream.operators import accounting, truncation, user_level
from dpstream.operators.errors import DpStreamError
from dpstream.operators.noise import CachedNoise, NoiseSource, ScopedNoise
from dpstream.operators.release import interval
from dpstream.operators.whole_user_mean import WholeUserMeanSpec

from .means import WholeUserMeanCounter, whole_user_mean_spec, whole_user_mean_weights
from .mechanisms import (
    Counter,
    UserLevelCounter,
    counter_for,
    expiration_curve,
    user_level_counter_for,
    user_statistic_for,
)
from .records import Event, partition_for
from .statistic import Report, Users, UserStatistic

log = logging.getLogger(__name__)

# 3: the default kind mean (whole-user mean) releases noisy samples, no exact counts.
SCHEMA_VERSION = 3


class StatisticChanged(DpStreamError):
    """Stage 2 found a statistic's state made under other parameters: continuing would
    re-draw noise it has released (the worker stops)."""


def _add(into: dict[str, int], weights: dict[str, int]) -> None:
    for key, value in weights.items():
        into[key] = into.get(key, 0) + value


@dataclass(frozen=True, slots=True)
class _Counted:
    """How stage 1 counts one statistic: which events, and what they contribute."""

    name: str
    key: str | None
    kind: str
    fixed: truncation.TruncationSpec | None  # None: user-level (rank bands) or a mean
    deletions: bool
    mean: WholeUserMeanSpec | None = None  # the whole-user mean (its own first-m cap)

    @classmethod
    def of(cls, stat: StatisticConfig, cfg: PipelineConfig) -> _Counted:
        if cfg.whole_user_mean(stat):
            mean = whole_user_mean_spec(stat, cfg)
            return cls(stat.name, stat.key, stat.kind, None, False, mean)
        fixed = None if stat.user_level else truncation.make_truncation(stat.fixed_tau)
        return cls(stat.name, stat.key, stat.kind, fixed, stat.deletions)

    def stream(self, event: Event) -> str | None:
        """ "+" (insertions) or "-" (deletions) if this statistic counts ``event``."""
        if self.key is not None and event.key != self.key:
            return None
        if event.delete:
            return "-" if self.deletions else None
        return "+"

    def add(self, events: list[Event], used: dict[str, int], kept: dict[str, dict]) -> None:
        """Count one user's ``events`` of a record: advance ``used`` (units per stream
        slot: the statistic's name, ``<name>/-`` for deletions) and add what they
        contribute to ``kept[self.name]`` (created only when non-empty).

        A count or sum contributes per stream what its events' total would as one item:
        Alg. 3 keeps clip(tau - used, 0, units) of them however they are split, rank bands
        and crossed powers of consecutive unit ranges add up (``band_units``,
        ``crossed_powers``). Other kinds depend on each event's value: ``contribution``.
        """
        if self.kind not in ("count", "sum"):
            for event in events:
                self.add_event(event, used, kept)
            return
        plus = minus = 0
        for event in events:
            if self.key is None or event.key == self.key:
                units = 1 if self.kind == "count" else int(event.value)  # type: ignore[arg-type]
                if not event.delete:
                    plus += units
                elif self.deletions:
                    minus += units
        if plus:
            before = used.get(self.name, 0)
            used[self.name] = before + plus
            if self.fixed is None:
                self._add_ranks("+", before, plus, kept)
            elif before < self.fixed.tau:
                kept[self.name] = {"w": truncation.admit(self.fixed, before, plus)}
        if minus:  # deletions: user-level statistics only
            slot = self.name + "/-"
            before = used.get(slot, 0)
            used[slot] = before + minus
            self._add_ranks("-", before, minus, kept)

    def add_event(self, event: Event, used: dict[str, int], kept: dict[str, dict]) -> None:
        """``add`` for one event, by its definition (``contribution``)."""
        stream = self.stream(event)
        if stream is None:
            return
        slot = self.name if stream == "+" else f"{self.name}/-"
        units, weights = self.contribution(stream, used.get(slot, 0), event)
        used[slot] = used.get(slot, 0) + units
        if weights:  # never holds zeros
            _add(kept.setdefault(self.name, {}), weights)

    def _add_ranks(self, stream: str, before: int, units: int, kept: dict[str, dict]) -> None:
        # user_level.crossed_powers and band_units (column 0), inlined: per user per record.
        out = kept.setdefault(self.name, {})
        after = before + units
        if after > 1:
            for j in range(
                0 if before <= 1 else (before - 1).bit_length(), (after - 1).bit_length()
            ):
                key = f"{stream}x{j}"
                out[key] = out.get(key, 0) + 1
        rank = before + 1
        while rank <= after:
            band = (rank - 1).bit_length()  # rank_band(rank); the band's last rank is 2^band
            last = min(after, 1 << band)
            key = f"{stream}b{band}/0"
            out[key] = out.get(key, 0) + last - rank + 1
            rank = last + 1

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        """(units, weights) of ``event`` for a user who has sent ``used`` units before;
        weights holds no zero entries.

        Fixed tau: "w" = the kept units (Alg. 3, partial for a straddling sum item).
        Whole-user mean: "c" = 1 and "s" = its grid units for one of the user's first m
        samples (``means.whole_user_mean_weights``); units count samples.
        User-level: "<stream>b<band>/<bin>" = units by rank band (operators.user_level),
        "<stream>x<j>" = 1 when the user's total passes 2^j (Count(D_t, 2^j) gains the
        user); distinct count: "b<band>/<value>" for the value instead of a bin.
        """
        if self.mean is not None:
            return 1, whole_user_mean_weights(self.mean, used, event.value)  # type: ignore[arg-type]
        units = int(event.value) if self.kind == "sum" else 1  # type: ignore[arg-type]
        if self.fixed is not None:
            kept = truncation.admit(self.fixed, used, units)
            return units, ({"w": kept} if kept else {})
        out = {f"{stream}x{j}": 1 for j in user_level.crossed_powers(used, used + units)}
        if self.kind == "distinct":
            out[f"b{user_level.rank_band(used + 1)}/{event.value!r}"] = 1
            return units, out
        column = int(event.value) - 1 if self.kind in ("histogram", "kselect") else 0  # type: ignore[arg-type]
        for band, n in user_level.band_units(used, units):
            out[f"{stream}b{band}/{column}"] = out.get(f"{stream}b{band}/{column}", 0) + n
        return units, out


class Stage1:
    """Per-user contribution counts (on the original stream) and per-tick pre-aggregation:
    kept units for a fixed tau (Dong-Luo-Yi Alg. 3), units by rank band and the users
    crossing each power of two for the user-level mechanisms (Alg. 5)."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self._stats = [_Counted.of(s, cfg) for s in cfg.statistics if not cfg.user_state(s)]
        self._user_stats = [user_statistic_for(s, cfg) for s in cfg.statistics if cfg.user_state(s)]

    @staticmethod
    def new_partition_state() -> dict:
        return {"last_offset": -1, "last_tick": None, "pending": {}}

    def add_events(
        self,
        pstate: dict,
        users: MutableMapping[str, dict],
        events: list[Event],
        offset: int,
        partition: int = 0,
    ) -> None:
        """Count record ``offset``'s events against their users' totals; add what they
        contribute to this tick's pending sums.

        Idempotent per record, whichever of the table writes (user entries, then the
        partition state) survived a crash: a user entry remembers the offset it last
        applied and what it contributed then, so a re-delivered record
        * re-counts a user whose entry missed it (else the user could exceed tau), and
        * re-adds the contribution of a user whose entry has it but whose units the
          partition's pending sums lost (else the count would lose them).
        pipeline/app.py keeps both kinds of entry in one changelog partition and
        pipeline/changelog.py sends them in windows that Kafka keeps whole or not at all,
        so a crash keeps the table as it stood at some moment: only the LAST record's user
        entries can be ahead of the partition state, which is what this handles.

        A ``UserStatistic`` keeps its user's state in the entry ("state") and what the
        record did to the partition's state ("redo"), re-applied in the same case.
        """
        in_pending = offset <= pstate["last_offset"]
        pending: dict[str, dict[str, int]] = pstate["pending"]
        by_user: dict[str, list[Event]] = {}
        for event in events:
            group = by_user.get(event.user_id)
            if group is None:
                by_user[event.user_id] = [event]
            else:
                group.append(event)
        # One table write per user per record (one changelog entry per user per window).
        for user_id, user_events in by_user.items():
            stored = users.get(user_id)
            if stored is not None and stored["offset"] >= offset:
                if stored["offset"] == offset and not in_pending:
                    for name, weights in stored["kept"].items():
                        _add(pending.setdefault(name, {}), weights)
                    self._redo(pstate, stored.get("redo", {}), partition)
                continue
            used = {} if stored is None else stored["used"].copy()
            kept_now: dict[str, dict[str, int]] = {}
            for stat in self._stats:
                stat.add(user_events, used, kept_now)
            if not in_pending:
                for name, weights in kept_now.items():
                    _add(pending.setdefault(name, {}), weights)
            entry = {"used": used, "offset": offset, "kept": kept_now}
            if self._user_stats:
                self._apply_user_stats(
                    pstate, stored or {}, entry, user_events, partition, in_pending
                )
            users[user_id] = entry

    def _apply_user_stats(
        self,
        pstate: dict,
        stored: dict,
        entry: dict,
        events: list[Event],
        partition: int,
        in_pending: bool,
    ) -> None:
        # in_pending (the partition state has the record, this user's entry does not)
        # cannot follow from the one-changelog write order; the user's state is still
        # advanced, the partition's is not touched twice.
        slots = pstate.setdefault("stats", {})
        states, redos = dict(stored.get("state", {})), {}
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

    def _redo(self, pstate: dict, redos: dict, partition: int) -> None:
        if not redos:
            return
        slots = pstate.setdefault("stats", {})
        for stat in self._user_stats:
            if stat.name in redos:
                slots[stat.name] = stat.redo(slots.get(stat.name), redos[stat.name], partition)

    def close_tick(
        self,
        pstate: dict,
        partition: int,
        tick: int,
        users: Callable[[], Iterable[tuple[str, dict]]] = tuple,
    ) -> list[Report]:
        """Handle tick marker ``tick``; a duplicate or stale marker yields nothing.

        ``users`` returns the (user id, entry) pairs of this partition's users; it is
        called only by a ``UserStatistic`` that needs them (a median, a cell's close).
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
        slots = pstate.setdefault("stats", {}) if self._user_stats else {}
        for stat in self._user_stats:
            slots[stat.name], payload = stat.close_tick(
                slots.get(stat.name), partition, from_tick, tick, _states_of(stat.name, users)
            )
            reports.append(Report(stat.name, partition, from_tick, tick, {}, payload))
        pstate["pending"] = {}
        pstate["last_tick"] = tick
        return reports


def users_of_partition(
    users: Mapping[str, dict], partition: int, partitions: int
) -> Callable[[], Iterable[tuple[str, dict]]]:
    """For ``Stage1.close_tick``: the entries in ``users`` of the partition's users (a
    worker's table holds every partition it owns)."""
    return lambda: (
        (user_id, entry)
        for user_id, entry in users.items()
        if partition_for(user_id, partitions) == partition
    )


def _states_of(name: str, users: Callable[[], Iterable[tuple[str, dict]]]) -> Users:
    def states() -> Iterable[tuple[str, Any]]:
        for user_id, entry in users():
            state = entry.get("state", {}).get(name)
            if state is not None:
                yield user_id, state

    return states


class Stage2:
    """Tick barrier across stage-1 partitions, then one tree-counter step per tick."""

    def __init__(self, cfg: PipelineConfig, noise: NoiseSource, partitions: int) -> None:
        self._cfg = cfg
        # Keyed noise is deterministic per node, so remembering live nodes is safe.
        self._noise = CachedNoise(noise, maxsize=1 << 14)
        self._partitions = partitions
        self._stats = {s.name: s for s in cfg.statistics}
        self._counters = {s.name: self._counter_for(s) for s in cfg.statistics}
        self._params = {s.name: cfg.statistic_parameters(s) for s in cfg.statistics}
        self._fingerprints = {
            name: accounting.fingerprint(params) for name, params in self._params.items()
        }
        statement = cfg.privacy_statement()
        self._charges = {c.statistic: c for c in statement.charges}

    def _counter_for(
        self, stat: StatisticConfig
    ) -> Counter | UserLevelCounter | WholeUserMeanCounter | UserStatistic:
        if self._cfg.user_state(stat):
            return user_statistic_for(stat, self._cfg)
        if self._cfg.whole_user_mean(stat):
            return WholeUserMeanCounter(whole_user_mean_spec(stat, self._cfg))
        relation = self._cfg.privacy.neighbours.value
        if stat.user_level:
            return user_level_counter_for(stat, relation == Neighbours.any_subset)
        return counter_for(stat, accounting.sensitivity_multiplier(relation) * stat.fixed_tau)

    def _check_identity(self, sstate: dict, name: str) -> None:
        identity = sstate.get("identity")
        if identity is None:
            if sstate["last_closed"] is not None:
                raise StatisticChanged(
                    f"statistic {name}: its state has released ticks but no identity (made "
                    "by an older dpstream); its noise cannot be re-derived: run it under a "
                    "new app_id or name"
                )
            return
        if identity["fingerprint"] != self._fingerprints[name]:
            changed = accounting.changed_fields(identity.get("parameters", {}), self._params[name])
            raise StatisticChanged(
                f"statistic {name}: its state was made with other parameters "
                f"({', '.join(changed) or 'fingerprint'} changed); a changed statistic is a "
                "new statistic: give it a new name"
            )

    def _noise_of(self, sstate: dict, name: str) -> NoiseSource:
        identity = sstate["identity"]
        scope = (self._cfg.app_id, name, identity["fingerprint"], identity["start_tick"])
        return ScopedNoise(self._noise, scope)

    @staticmethod
    def new_state() -> dict:
        return {
            "reported": {},  # partition -> last tick reported
            "first": {},  # partition -> first tick reported
            "pending": {},  # tick -> summed weight of the partitions that reported it
            "last_closed": None,
            "tree": None,  # the mechanism's state, once the first tick closes
            "identity": None,  # fingerprint, parameters and start tick, at the first close
        }

    def on_report(self, sstate: dict, report: Report) -> tuple[list[dict], list[dict]]:
        """Absorb one report; return (releases, ledger entries) for every tick it closes."""
        self._check_identity(sstate, report.statistic)
        part = str(report.partition)
        last = sstate["reported"].get(part)
        if last is not None and report.tick <= last:
            return [], []  # re-delivered report: already counted
        sstate["first"].setdefault(part, report.from_tick)
        sstate["reported"][part] = report.tick
        if report.weights:
            _add(sstate["pending"].setdefault(str(report.tick), {}), report.weights)
        if report.payload is not None:
            counter = self._counters[report.statistic]
            for tick, payload in counter.payload_ticks(report):  # type: ignore[union-attr]
                key = str(min(max(tick, report.from_tick), report.tick))
                old = sstate["pending"].get(key)
                merged = payload if old is None else counter.merge(old, payload)  # type: ignore[union-attr]
                sstate["pending"][key] = merged
        if len(sstate["reported"]) < self._partitions:
            return [], []
        origin = min(sstate["first"].values())
        upto = min(sstate["reported"].values())
        start = origin if sstate["last_closed"] is None else sstate["last_closed"] + 1
        releases, ledger = [], []
        for tick in range(start, upto + 1):
            if sstate["last_closed"] is None:
                sstate["identity"] = {
                    "fingerprint": self._fingerprints[report.statistic],
                    "parameters": self._params[report.statistic],
                    "start_tick": tick,
                }
                ledger.append(self._ledger_entry(report.statistic, tick))
            weights = sstate["pending"].pop(str(tick), {})
            sstate["last_closed"] = tick
            if sstate.get("exhausted"):
                continue  # its budget is spent: nothing more is released, ever
            if self._budget_spent_before(report.statistic, tick - origin + 1):
                sstate["exhausted"] = tick
                releases.append(self._exhausted_marker(report.statistic, tick))
                ledger.append(self._exhausted_entry(report.statistic, tick))
                continue
            out, entries = self._advance(sstate, report.statistic, tick, weights)
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
        stat = self._stats[name]
        return {
            "schema_version": SCHEMA_VERSION,
            "statistic": name,
            "tick": tick,
            "event": "exhausted",
            "epsilon_spent": float(self._charges[name].epsilon),
            "horizon_ticks": stat.horizon_ticks,
            "total_epsilon": self._cfg.privacy.total_epsilon,
        }

    def _advance(
        self, sstate: dict, name: str, tick: int, pending: Any
    ) -> tuple[list[dict], list[dict]]:
        """One closed tick: (releases, ledger entries). ``pending`` is the tick's summed
        weights, or a UserStatistic's merged payload (None or {} when nothing came)."""
        counter, stat = self._counters[name], self._stats[name]
        noise = self._noise_of(sstate, name)
        if isinstance(counter, UserLevelCounter):
            sstate["tree"], fields, spent = counter.step(sstate["tree"], pending, noise)
            entries = [] if spent is None else [self._spent_entry(stat, tick, fields, spent)]
            return [self._release_record(stat, tick, fields)], entries
        if isinstance(counter, WholeUserMeanCounter):
            sstate["tree"], fields = counter.step(sstate["tree"], pending, noise)
            return [self._release_record(stat, tick, fields)], []
        if not isinstance(counter, Counter):
            sstate["tree"], out, entries = counter.step(
                sstate["tree"], pending or None, tick, noise
            )
            common = {"schema_version": SCHEMA_VERSION, "statistic": name, "tick": tick}
            total = {"total_epsilon": self._cfg.privacy.total_epsilon}
            return (
                [self._release_record(stat, tick, fields) for fields in out],
                [{**common, **entry, **total} for entry in entries],
            )
        sstate["tree"], rel = counter.step(sstate["tree"], pending.get("w", 0), noise)
        fields = {
            "step": rel.t,
            "value": rel.value,
            "std": rel.std,
            "interval": interval(rel.value, rel.ci95),
            "tau": stat.tau,
        }
        return [self._release_record(stat, tick, fields)], []

    def _tick_end(self, tick: int) -> float:
        return (tick + 1) * self._cfg.ticks.interval_seconds

    def _release_record(self, stat: StatisticConfig, tick: int, fields: dict) -> dict:
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
        return getattr(self._counters[name], "neighbours", self._cfg.privacy.neighbours.value)

    def _spent_entry(self, stat: StatisticConfig, tick: int, fields: dict, spent: dict) -> dict:
        """The accountant: what the tracker and instance series have committed so far."""
        return {
            "schema_version": SCHEMA_VERSION,
            "statistic": stat.name,
            "tick": tick,
            "event": "budget",
            **spent,
            "epsilon_spent": spent["tracker_epsilon"] + spent["instances_epsilon"],
            "epsilon": stat.epsilon,
            "tau": fields["tau"],
            "svt_index": fields.get("svt_index"),
            "instance": fields.get("instance"),
            "total_epsilon": self._cfg.privacy.total_epsilon,
        }

    def _ledger_entry(self, name: str, tick: int) -> dict:
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
        if not isinstance(counter, Counter | UserLevelCounter):
            del entry["tau"]  # its own caps bound each user
            return {**entry, **counter.ledger_start()}
        if isinstance(counter, UserLevelCounter):
            entry["note"] = (
                "Dong-Luo-Yi Alg. 5 over the whole infinite stream: tracker series below "
                "epsilon/2, instance series below epsilon/2; budget entries follow"
            )
            return entry
        curve = expiration_curve(counter)
        if curve:
            entry["note"] = (
                "loss of an item decays with its age (Andersson et al. 2024); see expiration"
            )
            entry["expiration"] = curve
        return entry
