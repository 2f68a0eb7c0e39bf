"""The worker's health as Kubernetes' probes ask it (docs/operations.md section 3): pure
rules over a small state, ``HealthState``, which ``operations.py`` takes from the running
worker.

*Live* (``/livez``): the event loop turns. Its heartbeat runs every 0.5 s; a heartbeat
older than ``LIVENESS_STALL_SECONDS`` means something holds the loop (a blocking call, an
endless computation), and only a restart helps. A worker waiting for its broker, its
group or its table recovery is live: its loop turns.

*Ready* (``/readyz``): it does its share of the pipeline's work, up to date. Every
condition of ``CONDITIONS`` holds:

* ``event_loop``: it is live;
* ``partitions_assigned``: it holds partitions of both the events and the stage-2 topics
  (a worker beyond the partition count holds none: never ready, and idle);
* ``tables_recovered``: it has received its first assignment and no rebalance and no
  table recovery is under way (Faust's tables are being read from their changelogs);
* ``ingest_running``: its ingest (a child process or a thread) runs; a worker started with
  ``--ingest off`` has none and passes;
* ``ticks_released``: the last tick released within two ticks: stage 1 has closed, on
  every events partition it holds, every tick up to ``TICKS_BEHIND`` before the latest
  that has ended, and every statistic of the stage-2 partitions it holds has published
  every tick up to ``TICKS_BEHIND`` before the latest whose release deadline has passed.
  A healthy worker is at most one tick behind on both (the clock writes a marker up to
  one marker period after its time); with the broker gone, or the clock's leader gone, or
  another worker's stage 1 stuck (stage 2 waits for every partition), it falls behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LIVENESS_STALL_SECONDS = 10.0
"""A heartbeat older than this: the event loop is stuck (``/livez`` answers 503)."""

TICKS_BEHIND = 2
"""How many ticks a ready worker may be behind the clock (``ticks_released``)."""

CONDITIONS = (
    "event_loop",
    "partitions_assigned",
    "tables_recovered",
    "ingest_running",
    "ticks_released",
)


@dataclass(frozen=True)
class HealthState:
    """What the probes judge, at one moment.

    Attributes:
        heartbeat_age: seconds since the event loop last ran its heartbeat.
        events_partitions: the events topic's partitions this worker holds (stage 1).
        stage2_partitions: the stage-2 topic's partitions it holds.
        tables_recovered: a first assignment came, and no rebalance or table recovery is
            under way.
        ingest_running: its ingest runs (True when it has none).
        stage1_closed: per events partition held, the latest tick stage 1 closed there.
        owned_statistics: the statistics of the stage-2 partitions held.
        released: per statistic, the tick up to which every release is published.
        ended_tick: the latest tick that has ended by the clock.
        due_tick: the latest tick whose release deadline has passed.
    """

    heartbeat_age: float
    events_partitions: frozenset[int]
    stage2_partitions: frozenset[int]
    tables_recovered: bool
    ingest_running: bool
    stage1_closed: Mapping[int, int]
    owned_statistics: frozenset[str]
    released: Mapping[str, int]
    ended_tick: int
    due_tick: int


def live(state: HealthState) -> bool:
    """The event loop has run its heartbeat within ``LIVENESS_STALL_SECONDS``."""
    return state.heartbeat_age <= LIVENESS_STALL_SECONDS


def ticks_released(state: HealthState) -> bool:
    """Stage 1 and stage 2 of this worker are at most ``TICKS_BEHIND`` ticks behind the
    clock (the module docstring); a partition or statistic with no tick yet is behind."""
    closed = state.ended_tick - TICKS_BEHIND
    published = state.due_tick - TICKS_BEHIND
    return all(
        state.stage1_closed.get(p, closed - 1) >= closed for p in state.events_partitions
    ) and all(state.released.get(s, published - 1) >= published for s in state.owned_statistics)


def conditions(state: HealthState) -> dict[str, bool]:
    """Each readiness condition of ``CONDITIONS``, in that order, and whether it holds."""
    return {
        "event_loop": live(state),
        "partitions_assigned": bool(state.events_partitions and state.stage2_partitions),
        "tables_recovered": state.tables_recovered,
        "ingest_running": state.ingest_running,
        "ticks_released": ticks_released(state),
    }


def ready(state: HealthState) -> bool:
    """Every readiness condition holds."""
    return all(conditions(state).values())
