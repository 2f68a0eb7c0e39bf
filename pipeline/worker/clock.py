"""The public clock: the leader's timer writes each tick's marker into every partition of
the events topic when the tick ends, and its release marker into every partition of the
stage-2 topic at its deadline (docs/design.md section 1).

Tick n covers [n*I, (n+1)*I) of Unix time; its release deadline is (n+1)*I + delay. Both
depend on the clock only. A new leader starts at the current tick: a tick marker after a
gap closes the ticks between (stage 1), a release marker publishes every tick closed
before it (stage 2), so none is lost.
"""

from __future__ import annotations

import math
import time

import faust

from dpstream.config.schema import PipelineConfig

from ..wire.records import HEADER, RELEASE, TICK, encode_tick


def last_ended_tick(now: float, interval: float) -> int:
    """The latest tick that has ended at Unix time ``now``."""
    return math.floor(now / interval) - 1


def last_due_tick(now: float, interval: float, delay: float) -> int:
    """The latest tick whose release deadline (its end plus ``delay``) has passed at ``now``."""
    return math.floor((now - delay) / interval) - 1


class PublicClock:
    """The markers written so far, by kind (None: none yet by this leader)."""

    def __init__(self, cfg: PipelineConfig, events: faust.TopicT, stage2: faust.TopicT) -> None:
        self._interval = cfg.ticks.interval_seconds
        self._delay = cfg.ticks.release_delay
        self._partitions = cfg.input.partitions
        self._events = events
        self._stage2 = stage2
        self._last: dict[bytes, int | None] = {TICK: None, RELEASE: None}

    async def tick(self) -> None:
        """Write the markers of every tick that has ended, and of every deadline that has
        passed, since the last call."""
        now = time.time()
        await self._write(self._events, TICK, last_ended_tick(now, self._interval))
        await self._write(self._stage2, RELEASE, last_due_tick(now, self._interval, self._delay))

    async def _write(self, topic: faust.TopicT, kind: bytes, upto: int) -> None:
        last = self._last[kind]
        for tick in range(upto if last is None else last + 1, upto + 1):
            for partition in range(self._partitions):
                await topic.send(
                    value=encode_tick(tick), partition=partition, headers=[(HEADER, kind)]
                )
            self._last[kind] = tick
