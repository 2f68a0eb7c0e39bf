"""The contract every statistic kind implements (``Statistic``: a ``UnitStatistic`` or a
``PerUserStatistic``), what one closed tick gives (``Step``), what stage 1 reports to
stage 2 (``Report``), and what a kind's module has (``KindModule``).

They live apart from the code that drives the stages (``pipeline.stages``), from the
registry of kinds (``registry.py``) and from the kinds' modules, so that each of those
imports this module and none imports another's: no import cycles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.operators.noise import NoiseSource

from .bounding import UnitBounding
from .events import Event


@dataclass(frozen=True, slots=True)
class Report:
    """Stage 1 -> stage 2: partition ``partition`` closed ticks ``from_tick..tick``.

    Ticks before ``tick`` in that range were empty (caught-up markers); ``weights`` holds
    what the partition's users contributed in ``tick`` (see ``Stage1`` for the keys), and
    ``payload`` the tick's message of a statistic with per-user state (None: nothing
    to say). ``born``: the tick the partition's stage-1 state began at (its first
    marker); stage 2 refuses a partition whose stage-1 state began again (lost: every
    user's contribution bound with it).
    """

    statistic: str
    partition: int
    from_tick: int
    tick: int
    weights: dict[str, int]
    payload: Any = None
    born: int | None = None

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
        if self.born is not None:
            out["born"] = self.born
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
            born=obj.get("born"),
        )


Users = Callable[[], Iterable[tuple[str, Any]]]
"""The (user id, state) pairs of one statistic over one stage-1 partition's users."""


@dataclass(frozen=True, slots=True)
class Step:
    """One closed tick of one statistic: its new stage-2 state, the fields of each release
    and each ledger entry (stage 2 adds the common fields: schema version, statistic,
    tick, kind, epsilon, ...)."""

    state: Any
    releases: tuple[dict[str, Any], ...] = ()
    ledger: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Accuracy:
    """What ``dpstream check-config`` plans of a statistic's releases (``accuracy.py``):
    the std of a release at planned ticks, in the statistic's units, from public parameters
    only (the mechanism's exact per-tick variance); nothing is assumed of the data.

    Attributes:
        unit: what the numbers count ("events", "units of value", ...).
        rows: (what the std is of, its std at each planned tick; None where the
            statistic releases nothing then or the std depends on the data).
        covers: what a release's interval covers, in words (``interval_of``).
    """

    unit: str
    rows: tuple[tuple[str, tuple[float | None, ...]], ...]
    covers: str


# What a mean's interval covers, in words (check-config's plan).
MEAN_COVERS = (
    "the mean of the samples the mechanism covered, each clipped to the bounds; its std "
    "depends on how many there are (data), so none is planned"
)


class StatisticBase(Protocol):
    """What every statistic has, whichever form its stage 1 takes: its names and its
    stage 2. Every state, redo record and payload is plain JSON (they live in Faust
    tables and on the stage-2 topic).

    Stage 2 files each report's ``parts`` under their ticks, ``merge``s the parts of one
    tick, and calls ``step`` once per closed tick (pending None: no partition had
    anything), in tick order. ``ledger_start`` makes the statistic's first ledger entry
    from the common one.
    """

    # Read-only: an implementation holds them as frozen fields or properties, and may
    # narrow them (``neighbours`` always a str).
    @property
    def name(self) -> str: ...

    @property
    def mechanism(self) -> str:
        """The releases' "mechanism" field."""
        ...

    @property
    def neighbours(self) -> str | None:
        """The neighbouring relation its guarantee is stated for (None: the pipeline's)."""
        ...

    @property
    def tree(self) -> tuple[str, int] | None:
        """The counting tree its noise comes from, (name, k) as ``mechanism`` names it:
        ("binary", 2), ("kary_subtract", 13), ...; None: no tree (a per-cell mean's
        releases are one-shot)."""
        ...

    @property
    def interval_of(self) -> str:
        """What its releases' intervals cover (``releases.INTERVAL_OF`` lists the values)."""
        ...

    @property
    def lifetime_steps(self) -> int | None:
        """How many steps its charge covers (``accounting.lifetime_steps``; an expiring
        counter's horizon): stage 2 releases nothing after them. None: no limit."""
        ...

    def parts(self, report: Report) -> list[tuple[int, Any]]:
        """What the report brings, as (tick, part) pairs, ticks in ``from_tick..tick``
        (none: nothing to add): a cell's slot sent at the marker after a gap is stepped
        at the slot's last tick."""
        ...

    def merge(self, a: Any, b: Any) -> Any:
        """Two parts of one tick as one (neither argument is changed)."""
        ...

    def step(self, state: Any, pending: Any, tick: int, noise: NoiseSource) -> Step:
        """Advance one closed tick (``state`` None before the first)."""
        ...

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The statistic's first ledger entry, from the common one (``entry``)."""
        ...

    def accuracy(self, ticks: Sequence[int]) -> Accuracy:
        """The planned std of its releases at ``ticks`` (``dpstream check-config``)."""
        ...


class UnitStatistic(StatisticBase, Protocol):
    """A statistic whose users contribute unit weights: stage 1 counts them with its
    ``bounding`` (``bounding.UnitBounding``, the kind's) and sends their sums as the
    report's ``weights``."""

    @property
    def bounding(self) -> UnitBounding: ...


class PerUserStatistic(StatisticBase, Protocol):
    """A statistic whose state is per user and per partition (continual means, per-cell
    means): stage 1 calls ``counts`` and ``apply`` once per (record, user) with the
    user's events that count, ``redo`` when a re-delivered record's user entry survived
    a crash but the partition state did not (see ``Stage1.add_events``), and
    ``close_tick`` at a marker, whose payload is the report's ``payload``, and
    ``scan_order`` to keep the index of the users a close scans (``stages.Stage1``)."""

    @property
    def bounding(self) -> None: ...

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
        ``from_tick..tick-1`` were empty (markers caught up after a gap). ``users``
        gives the states of the users ``scan_order`` placed, in that order."""
        ...

    def scan_order(self, pstate: Any, ustate: Any) -> int | None:
        """Where a user with state ``ustate`` comes in ``close_tick``'s ``users``, with
        the partition's state ``pstate``, or None: no close needs the user until their
        next event. Asked after each of the user's records and after each close that
        scanned the users: it must say None for no user a later close needs."""
        ...


Statistic = UnitStatistic | PerUserStatistic
"""One statistic of one kind, as both stages see it: stage 1 takes one of two forms,
told apart by ``bounding`` (None: per-user state)."""


class KindModule(Protocol):
    """A kind's module, as the registry (``registry.py``) finds it."""

    RELEASE_FIELDS: type
    """The ``TypedDict`` (``releases.py``) of its releases' own fields."""

    def make_statistic(self, stat: StatisticConfig, cfg: PipelineConfig) -> Statistic:
        """``stat`` as both stages run it."""
        ...

    def describe(self, stat: StatisticConfig, cfg: PipelineConfig) -> str:
        """What ``stat`` computes, in one line (``dpstream check-config``)."""
        ...

    def identity(self, stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
        """What shapes ``stat`` beyond its config, for its fingerprint (``identity.py``)."""
        ...


class WeightsStage2:
    """Stage 2's side of a ``UnitStatistic``: a report's part is its summed weights."""

    @staticmethod
    def parts(report: Report) -> list[tuple[int, Any]]:
        return [(report.tick, dict(report.weights))] if report.weights else []

    @staticmethod
    def merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        out = dict(a)
        for key, value in b.items():
            out[key] = out.get(key, 0) + value
        return out


def own_caps(entry: dict[str, Any], start: dict[str, Any]) -> dict[str, Any]:
    """A first ledger entry of a statistic that bounds each user by its own caps, not a
    tau: ``entry`` without tau, with ``start`` over it."""
    return {**{k: v for k, v in entry.items() if k != "tau"}, **start}
