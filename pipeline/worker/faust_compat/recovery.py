"""Faust's table recovery, watched: a recovery that stops receiving changelog records is
restarted, and if that does not help the worker stops.

Faust's ``Recovery._restart_recovery`` (faust-streaming 0.15.3) waits for the active
changelog partitions without a time limit: it awaits ``signal_recovery_end``, which
``_slurp_changelogs`` sets only once every active changelog partition has been read up to
the highwater measured when the recovery started. If the consumer never delivers a
partition's records, Faust only logs "No event received for active tp ... since recovery
start" every 5 s, and the worker processes nothing, forever. Seen after rebalances
(docs/reliability.md): ``test_two_workers_one_dies_the_survivor_takes_over`` (the survivor,
after the other worker's SIGKILL, read its kept changelog partitions to their highwater and
received not one record of the partitions it took over; 1 of 20 local runs) and in the
ingest's crash test. faust-streaming #74 (the stream buffer full during recovery) is one
way in; 0.15.3 has its fix (``Consumer.on_buffer_full`` keeps partitions fetched during
recovery), and the hang remained.

The cause was in Faust's consumer (``transport.py`` explains it and holds the fix): a
fetch call under way across a rebalance took the changelog records fetched between the
recovery's seek and its resume, and Faust dropped them. Every stall seen was of
partitions read from offset 0: aiokafka keeps a fetch under way across a seek only when
its offset is the one sought, which it always is there. docs/reliability.md has the runs
before and after the fix; the watchdog stays, as a backstop.

:class:`RecoveryWatchdog` looks every few seconds. A partition is *stalled* when Faust is
in recovery, the partition still has records to read (``Recovery.active_remaining``), and
no record of it arrived for ``stall_after`` seconds (since the recovery started, or since
its last record). Then, once per recovery, it does again what Faust did at the recovery's
start: resume the partitions in Faust's consumer and seek them to the offset Faust wants
next (aiokafka drops what it had buffered for them and fetches anew). If they are still
stalled ``stall_after`` seconds later, it ends the worker at once (``exits.exit_now``:
exit status 70, no Faust shutdown, which can hang), and a restarted one (whatever restarts
a failed worker) recovers its tables from the changelogs, which any SIGKILL already
requires (the crash tests of ``tests/integration/test_faults.py``). Before its seek it logs
where aiokafka and Faust stand on the stalled partitions (:func:`fetch_state`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import faust

from ..exits import exit_now

if TYPE_CHECKING:
    # The class behind the app's tables: Faust types them by an interface without
    # ``recovery``.
    from faust.tables.manager import TableManager
    from faust.tables.recovery import Recovery

log = logging.getLogger(__name__)

STALL_SECONDS = 15.0
"""Seconds without a changelog record, while records remain, before the watchdog acts. A
recovery that progresses receives every partition's records in each fetch round (aiokafka
fetches all partitions with records left at once), well under a second apart."""


class RecoveryWatchdog:
    """Watches Faust's table recovery of ``app`` (see the module docstring)."""

    def __init__(
        self,
        app: faust.App,
        stall_after: float = STALL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.stall_after = stall_after
        self._clock = clock
        self._reseek: tuple[float | None, float] | None = None  # (the recovery's start, when)
        self.task: asyncio.Future | None = None

    async def run(self, interval: float) -> None:
        """:meth:`check` every ``interval`` seconds until the app stops."""
        while not self.app.should_stop:
            await self.app.sleep(interval)
            try:
                await self.check()
            except Exception:  # a failed seek is tried again; the worker must not stop here
                log.exception("table recovery watchdog")

    def _recovery(self) -> Recovery:
        return cast("TableManager", self.app.tables).recovery

    def stalled(self, now: float) -> dict[Any, int]:
        """The active changelog partitions of the running recovery that still have records
        to read and received none for ``stall_after`` seconds, each with the offset Faust
        wants to read next (as Faust's own seek at the recovery's start: -1 is 0)."""
        recovery = self._recovery()
        started = recovery._recovery_started_at
        if not recovery.in_recovery or started is None:
            return {}
        received = recovery._active_events_received_at
        offsets = recovery.active_offsets
        return {
            tp: max(offsets[tp], 0)
            for tp, left in recovery.active_remaining().items()
            if left > 0 and now - received.get(tp, started) >= self.stall_after
        }

    async def check(self) -> None:
        """Seek stalled partitions again, once per recovery; end the worker if that did not
        help."""
        now = self._clock()
        stalled = self.stalled(now)
        if not stalled:
            return
        started = self._recovery()._recovery_started_at
        names = ", ".join(f"{tp.topic}[{tp.partition}]@{at}" for tp, at in sorted(stalled.items()))
        if self._reseek is None or self._reseek[0] != started:
            self._reseek = (started, now)
            log.warning(
                "table recovery: no changelog record for %.0f s from %s; seeking them again",
                self.stall_after,
                names,
            )
            consumer = self.app.consumer
            log.warning("table recovery: before the seek, %s", fetch_state(consumer, stalled))
            consumer.resume_partitions(set(stalled))
            await consumer.seek_wait(stalled)
        elif now - self._reseek[1] >= self.stall_after:
            log.critical(
                "table recovery still stalled at %s after a new seek; stopping the worker",
                names,
            )
            exit_now()


def fetch_state(consumer: Any, tps: Iterable[Any]) -> str:
    """Where the fetching of ``tps`` stands, for the log: Faust's flow, then per partition
    aiokafka's position and highwater (``None`` if unknown) and whether Faust's consumer
    asks for it (its active partitions). Read from the consumer thread's state without a
    lock: a snapshot that may be a moment old."""
    subscription = consumer._thread._ensure_consumer()._subscription.subscription
    assignment = subscription.assignment if subscription is not None else None
    active = consumer._active_partitions or ()
    parts = []
    for tp in sorted(tps):
        state = assignment.state_value(tp) if assignment is not None else None
        position = state.position if state is not None and state.has_valid_position else None
        highwater = state.highwater if state is not None else None
        asked = "fetched" if tp in active else "paused"
        parts.append(f"{tp.topic}[{tp.partition}] at {position} of {highwater}, {asked}")
    flow = "on" if consumer.flow_active else "stopped"
    return f"Faust's flow {flow}; " + "; ".join(parts)


def watch_recovery(app: faust.App, stall_after: float = STALL_SECONDS) -> RecoveryWatchdog:
    """Run a :class:`RecoveryWatchdog` on ``app`` from its first partition assignment on
    (Faust starts app timers only after the first recovery: too late for that one)."""
    watchdog = RecoveryWatchdog(app, stall_after)

    async def start(*_args: Any, **_kwargs: Any) -> None:
        if watchdog.task is None:
            watchdog.task = app.add_future(watchdog.run(stall_after / 4))

    app.on_partitions_assigned.connect(start)
    return watchdog
