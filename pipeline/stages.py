"""The two stages' bookkeeping, free of Kafka so the worker and ``dpstream replay`` share it.

Stage 1 (keyed by user, one state per input partition): truncates each user's events to
tau per statistic and pre-aggregates the kept units per tick. Stage 2 (keyed by
statistic): waits until every stage-1 partition has reported tick t, then advances the
statistic's tree counter one step and releases. All DP math lives in ``operators``;
this module only routes numbers.

States are plain JSON-able dicts with string keys, because they live in Faust tables.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime

from dpstream.config.schema import Neighbours, PipelineConfig, StatisticConfig
from dpstream.operators import truncation
from dpstream.operators.noise import CachedNoise, NoiseSource
from dpstream.operators.release import TreeRelease

from .mechanisms import counter_for, expiration_curve
from .records import Event

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Report:
    """Stage 1 -> stage 2: partition ``partition`` closed ticks ``from_tick..tick``.

    Ticks before ``tick`` in that range were empty (caught-up markers); ``weight`` is the
    sum of kept units in ``tick``.
    """

    statistic: str
    partition: int
    from_tick: int
    tick: int
    weight: int

    def to_json(self) -> dict[str, object]:
        return {
            "statistic": self.statistic,
            "partition": self.partition,
            "from_tick": self.from_tick,
            "tick": self.tick,
            "weight": self.weight,
        }

    @classmethod
    def from_json(cls, obj: dict) -> Report:
        return cls(
            statistic=str(obj["statistic"]),
            partition=int(obj["partition"]),
            from_tick=int(obj["from_tick"]),
            tick=int(obj["tick"]),
            weight=int(obj["weight"]),
        )


class Stage1:
    """Per-user truncation (spec 001 Alg. 3) and per-tick pre-aggregation."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self._stats = [(s.name, s.key, truncation.make_truncation(s.tau)) for s in cfg.statistics]

    @staticmethod
    def new_partition_state() -> dict:
        return {"last_offset": -1, "last_tick": None, "pending": {}}

    def add_events(
        self, pstate: dict, users: MutableMapping[str, dict], events: list[Event], offset: int
    ) -> None:
        """Count record ``offset``'s events against their users' bounds; add the kept units
        to this tick's pending sums.

        Idempotent per record, whichever of the two table writes (user entries, then the
        partition state) survived a crash: a user entry remembers the offset it last
        applied and the units it kept then, so a re-delivered record
        * re-counts a user whose entry missed it (else the user could exceed tau), and
        * re-adds the kept units of a user whose entry has it but whose units the
          partition's pending sums lost (else the count would lose them).
        """
        in_pending = offset <= pstate["last_offset"]
        pending: dict[str, int] = pstate["pending"]
        by_user: dict[str, list[Event]] = {}
        for event in events:
            by_user.setdefault(event.user_id, []).append(event)
        # One table write per user per record: each write is a changelog message.
        for user_id, user_events in by_user.items():
            stored = users.get(user_id) or {"used": {}, "offset": -1, "kept": {}}
            if stored["offset"] >= offset:
                if stored["offset"] == offset and not in_pending:
                    for name, kept in stored["kept"].items():
                        pending[name] = pending.get(name, 0) + kept
                continue
            used, kept_now = dict(stored["used"]), {}
            for event in user_events:
                for name, key, spec in self._stats:
                    if key is not None and event.key != key:
                        continue
                    before = used.get(name, 0)
                    used[name] = before + 1
                    kept = truncation.admit(spec, before, 1)
                    if kept:
                        kept_now[name] = kept_now.get(name, 0) + kept
            if not in_pending:
                for name, kept in kept_now.items():
                    pending[name] = pending.get(name, 0) + kept
            users[user_id] = {"used": used, "offset": offset, "kept": kept_now}

    def close_tick(self, pstate: dict, partition: int, tick: int) -> list[Report]:
        """Handle tick marker ``tick``; a duplicate or stale marker yields nothing."""
        last = pstate["last_tick"]
        if last is not None and tick <= last:
            return []
        from_tick = tick if last is None else last + 1
        pending = pstate["pending"]
        reports = [
            Report(name, partition, from_tick, tick, pending.get(name, 0))
            for name, _, _ in self._stats
        ]
        pstate["pending"] = {}
        pstate["last_tick"] = tick
        return reports


class Stage2:
    """Tick barrier across stage-1 partitions, then one tree-counter step per tick."""

    def __init__(self, cfg: PipelineConfig, noise: NoiseSource, partitions: int) -> None:
        self._cfg = cfg
        # Keyed noise is deterministic per node, so remembering live nodes is safe.
        self._noise = CachedNoise(noise, maxsize=1 << 14)
        self._partitions = partitions
        self._stats = {s.name: s for s in cfg.statistics}
        factor = 2 if cfg.privacy.neighbours is Neighbours.any_subset else 1
        self._counters = {s.name: counter_for(s, factor * s.tau) for s in cfg.statistics}

    @staticmethod
    def new_state() -> dict:
        return {
            "reported": {},  # partition -> last tick reported
            "first": {},  # partition -> first tick reported
            "pending": {},  # tick -> summed weight of the partitions that reported it
            "last_closed": None,
            "tree": None,  # the mechanism's state, once the first tick closes
        }

    def on_report(self, sstate: dict, report: Report) -> tuple[list[dict], list[dict]]:
        """Absorb one report; return (releases, ledger entries) for every tick it closes."""
        part = str(report.partition)
        last = sstate["reported"].get(part)
        if last is not None and report.tick <= last:
            return [], []  # re-delivered report: already counted
        sstate["first"].setdefault(part, report.from_tick)
        sstate["reported"][part] = report.tick
        if report.weight:
            key = str(report.tick)
            sstate["pending"][key] = sstate["pending"].get(key, 0) + report.weight
        if len(sstate["reported"]) < self._partitions:
            return [], []
        origin = min(sstate["first"].values())
        upto = min(sstate["reported"].values())
        start = origin if sstate["last_closed"] is None else sstate["last_closed"] + 1
        releases, ledger = [], []
        for tick in range(start, upto + 1):
            if sstate["last_closed"] is None:
                ledger.append(self._ledger_entry(report.statistic, tick))
            weight = sstate["pending"].pop(str(tick), 0)
            releases.append(self._advance(sstate, report.statistic, tick, weight))
            sstate["last_closed"] = tick
        return releases, ledger

    def _advance(self, sstate: dict, name: str, tick: int, weight: int) -> dict:
        sstate["tree"], rel = self._counters[name].step(sstate["tree"], weight, self._noise)
        return self._release_record(self._stats[name], tick, rel)

    def _tick_end(self, tick: int) -> float:
        return (tick + 1) * self._cfg.ticks.interval_seconds

    def _release_record(self, stat: StatisticConfig, tick: int, rel: TreeRelease) -> dict:
        end = self._tick_end(tick)
        record = {
            "schema_version": SCHEMA_VERSION,
            "statistic": stat.name,
            "kind": stat.kind,
            "tick": tick,
            "step": rel.t,
            "tick_end": datetime.fromtimestamp(end, UTC).isoformat(),
            "tick_end_unix": end,
            "value": rel.value,
            "std": rel.std,
            "interval": [rel.value - rel.ci95, rel.value + rel.ci95],
            "confidence": 0.95,
            "epsilon": stat.epsilon,
            "tau": stat.tau,
            "neighbours": self._cfg.privacy.neighbours.value,
            "mechanism": self._counters[stat.name].mechanism,
        }
        if self._cfg.noise.mode.value != "keyed":
            record["insecure"] = self._cfg.noise.mode.value
        return record

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
            "neighbours": self._cfg.privacy.neighbours.value,
            "note": "whole infinite stream (parallel composition over periods)",
            "total_epsilon": self._cfg.privacy.total_epsilon,
        }
        curve = expiration_curve(counter)
        if curve:
            entry["note"] = "loss of an item decays with its age (spec 004); see expiration"
            entry["expiration"] = curve
        return entry
