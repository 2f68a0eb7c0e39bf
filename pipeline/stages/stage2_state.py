"""Stage 2's state of one statistic (``Stage2State``) and its JSON form.

The Faust table ``stage2`` stores ``Stage2State.to_json()``, and its changelog is what a
restarted worker recovers and what inspection tools read, so the JSON form is fixed: the
keys, their order and the value types below are the stored bytes. ``to_json`` and
``from_json`` are the only code that knows those keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class StatisticIdentity:
    """What a statistic's noise is bound to, fixed when its first tick closes: the
    fingerprint of its parameters (and the parameters, to name what changed), its run
    (recorded in the ledger when the run was stated: a statistic started anew from empty
    state is another run), the commitment to the key its noise was drawn under, and that
    tick."""

    fingerprint: str
    parameters: dict[str, Any]
    start_tick: int
    run_id: str
    key_commitment: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "parameters": self.parameters,
            "start_tick": self.start_tick,
            "run_id": self.run_id,
            "key_commitment": self.key_commitment,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatisticIdentity:
        return cls(
            data["fingerprint"],
            data["parameters"],
            data["start_tick"],
            data["run_id"],
            data["key_commitment"],
        )


@dataclass(frozen=True, slots=True)
class StatisticRun:
    """The run of a statistic this worker continues, as the ledger records it
    (``pipeline.ledger``): stage 2 refuses a state of another run or key, and a state
    that is gone after the run released (it would re-draw noise for the same data).

    Attributes:
        run_id: the run (random, stated in the ledger when the run began).
        key_commitment: the key's public commitment (None: not checked, offline only).
        start_tick: the tick of the run's first release, when it has released.
        replaces: earlier runs of the statistic that this one starts anew from (charged
            again in the ledger): their stored states are discarded, not continued.
    """

    run_id: str
    key_commitment: str | None
    start_tick: int | None = None
    replaces: frozenset[str] = frozenset()


OFFLINE_RUN = StatisticRun("offline", None)
"""The run of a statistic replayed from a log that records none (tests, hand-written logs):
noise under it is not the pipeline's (docs/security.md)."""


# 2: the kind's state is stored as "statistic_state" (it was "tree", whatever the kind).
VERSION = 2


@dataclass(slots=True)
class Stage2State:
    """One statistic's tick barrier and mechanism state.

    A plain mutable dataclass, not a frozen one: one report changes up to eight of its
    fields, tick after tick of the ticks it closes, and the drivers (the worker, replay)
    hand stage 2 one state that it advances in place. A frozen state would copy its four
    maps on every report for no safety gained: the worker stores the state (its JSON) only
    after every output of the report is acknowledged, and exits on any error before that.

    Partitions and ticks are ints here and strings in the JSON form (JSON object keys).
    """

    reported: dict[int, int] = field(default_factory=dict)
    """Stage-1 partition -> the last tick it reported."""
    first: dict[int, int] = field(default_factory=dict)
    """Stage-1 partition -> the first tick it reported."""
    pending: dict[int, Any] = field(default_factory=dict)
    """Tick -> the merged parts of the partitions that reported it (``Statistic.merge``)."""
    last_closed: int | None = None
    statistic_state: Any = None
    """The kind's own state (plain JSON, ``Step.state``), once the first tick closes."""
    identity: StatisticIdentity | None = None
    offsets: dict[int, int] = field(default_factory=dict)
    """Stage-1 partition -> the stage-2 offset of its last absorbed report."""
    exhausted: int | None = None
    """The tick at which an expiring statistic's lifetime budget was spent."""
    born: dict[int, int] = field(default_factory=dict)
    """Stage-1 partition -> the tick its stage-1 state began (``Report.born``): another
    value means that state was lost and begun again, every user's bound with it."""
    held_releases: list[dict[str, Any]] = field(default_factory=list)
    """Releases of closed ticks, in closing order, held until a release marker of their
    tick or later publishes them (at its deadline)."""
    held_ledger: list[dict[str, Any]] = field(default_factory=list)
    """Ledger entries of closed ticks, held like ``held_releases``."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": VERSION,
            "reported": _string_keys(self.reported),
            "first": _string_keys(self.first),
            "pending": _string_keys(self.pending),
            "last_closed": self.last_closed,
            "statistic_state": self.statistic_state,
            "identity": None if self.identity is None else self.identity.to_json(),
            "offsets": _string_keys(self.offsets),
            "held": {"releases": self.held_releases, "ledger": self.held_ledger},
        }
        if self.exhausted is not None:  # written only once it happened
            out["exhausted"] = self.exhausted
        out["born"] = _string_keys(self.born)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stage2State:
        """The state stored as ``to_json``, version 2, or as version 1 (no ``version``
        key: the kind's state was stored as ``tree``)."""
        identity = data["identity"]
        held = data["held"]
        version = data.get("version", 1)
        if version not in (1, VERSION):
            raise ValueError(f"stage 2 state version {version} (this dpstream reads 1 and 2)")
        return cls(
            reported=_int_keys(data["reported"]),
            first=_int_keys(data["first"]),
            pending=_int_keys(data["pending"]),
            last_closed=data["last_closed"],
            statistic_state=data["tree" if version == 1 else "statistic_state"],
            identity=None if identity is None else StatisticIdentity.from_json(identity),
            offsets=_int_keys(data["offsets"]),
            exhausted=data.get("exhausted"),
            born=_int_keys(data["born"]),
            held_releases=held["releases"],
            held_ledger=held["ledger"],
        )

    def clear(self) -> None:
        """Back to a new statistic's state (a run started anew discards the old run's)."""
        fresh = Stage2State()
        for name in self.__slots__:
            setattr(self, name, getattr(fresh, name))


def _string_keys(by_number: Mapping[int, Any]) -> dict[str, Any]:
    return {str(number): value for number, value in by_number.items()}


def _int_keys(by_string: Mapping[str, Any]) -> dict[int, Any]:
    return {int(key): value for key, value in by_string.items()}
