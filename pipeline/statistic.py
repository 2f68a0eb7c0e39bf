"""The contracts between the stages: what stage 1 reports to stage 2 (``Report``) and what
a statistic with per-user state implements (``UserStatistic``).

They live apart from the code that drives the stages (``stages.py``) and from their
implementations (``means.py``, ``cells.py``), so that each of those imports this module
and none imports another's: no import cycles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from dpstream.operators.noise import NoiseSource

from .records import Event


@dataclass(frozen=True, slots=True)
class Report:
    """Stage 1 -> stage 2: partition ``partition`` closed ticks ``from_tick..tick``.

    Ticks before ``tick`` in that range were empty (caught-up markers); ``weights`` holds
    what the partition's users contributed in ``tick`` (see ``Stage1`` for the keys), and
    ``payload`` the tick's message of a ``UserStatistic`` (None: nothing to say).
    """

    statistic: str
    partition: int
    from_tick: int
    tick: int
    weights: dict[str, int]
    payload: Any = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "statistic": self.statistic,
            "partition": self.partition,
            "from_tick": self.from_tick,
            "tick": self.tick,
            "weights": self.weights,
        }
        if self.payload is not None:
            out["payload"] = self.payload
        return out

    @classmethod
    def from_json(cls, obj: dict) -> Report:
        return cls(
            statistic=str(obj["statistic"]),
            partition=int(obj["partition"]),
            from_tick=int(obj["from_tick"]),
            tick=int(obj["tick"]),
            weights={str(k): int(v) for k, v in obj["weights"].items()},
            payload=obj.get("payload"),
        )


Users = Callable[[], Iterable[tuple[str, Any]]]
"""The (user id, state) pairs of one statistic over one stage-1 partition's users."""


class UserStatistic(Protocol):
    """A statistic whose stage-1 state is per user and per partition, not unit weights
    (continual means, per-cell means). Every state, redo record and payload is plain JSON.

    Stage 1 calls ``apply`` once per (record, user) with the user's events that
    ``counts``, ``redo`` when a re-delivered record's user entry survived a crash but the
    partition state did not (see ``Stage1.add_events``), and ``close_tick`` at a marker.
    Stage 2 ``merge``s the partitions' payloads of a tick and calls ``step`` once per
    closed tick (payload None: no partition had anything), in tick order.
    """

    name: str
    mechanism: str

    def counts(self, event: Event) -> bool: ...

    def apply(
        self, pstate: Any, ustate: Any, events: list[Event], partition: int
    ) -> tuple[Any, Any, Any]:
        """(partition state, user state, redo record) after the user's events."""
        ...

    def redo(self, pstate: Any, redo: Any, partition: int) -> Any: ...

    def close_tick(
        self, pstate: Any, partition: int, from_tick: int, tick: int, users: Users
    ) -> tuple[Any, Any]:
        """(partition state, payload or None) at the marker of ``tick``; the ticks
        ``from_tick..tick-1`` were empty (markers caught up after a gap)."""
        ...

    def merge(self, a: Any, b: Any) -> Any: ...

    def step(
        self, sstate: Any, payload: Any, tick: int, noise: NoiseSource
    ) -> tuple[Any, list[dict], list[dict]]:
        """(state, release fields, ledger entries) of one closed tick."""
        ...

    def ledger_start(self) -> dict[str, Any]:
        """What the statistic's first ledger entry says beyond the common fields."""
        ...

    def payload_ticks(self, report: Report) -> list[tuple[int, Any]]:
        """The report's payload as (tick, part) pairs, ticks in ``from_tick..tick``: a
        cell's slot sent at the marker after a gap is stepped at the slot's last tick."""
        ...
