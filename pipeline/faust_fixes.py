"""Changes to faust-streaming 0.15.3 / aiokafka behaviour, installed by pipeline/app.py.

``seek_uncommitted_to_beginning``: a workaround for a bug that loses input records at a
rebalance (docs/reliability.md, "a worker dies among two").
``deliver_without_a_task_per_record``: Faust's per-record delivery, without its four tasks.

At a rebalance Faust clears the records its agents had buffered but not processed, then
seeks every partition to its committed offset (``Consumer.perform_seek``). aiokafka's
``seek_to_committed`` seeks only when the committed offset is positive: a partition
without one (no commit yet: a worker that had run for less than a commit interval, or
whose commits were discarded at the revocation) keeps its fetch position, which is past
the cleared records. Those records were never processed and never are. Seen in
``test_two_workers_one_dies_the_survivor_takes_over``: the first worker kept partitions 2
and 3 at the second worker's join, had fetched offsets 21-26 and 17-27 of them, and went
on at 27 and 28.

The fix seeks such partitions of the app's own stream topics to their beginning, which is
what ``auto_offset_reset = earliest`` promises; stage 1 and stage 2 are idempotent per
record (``Stage1.add_events``, ``Stage2.on_report``), so records already processed change
nothing. Changelog partitions are left alone (Faust's recovery positions them itself).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine, Generator
from typing import Any

from aiokafka import AIOKafkaConsumer
from faust.transport.consumer import Consumer
from mode.services import WaitResults

_STREAM_TOPICS: set[str] = set()
_PATCHED = "_dpstream_seek_unset_to_beginning"


def seek_uncommitted_to_beginning(topics: set[str]) -> None:
    """Make a seek to committed offsets start ``topics``' partitions that have none at
    their beginning (installed once per process; ``topics`` accumulate)."""
    _STREAM_TOPICS.update(topics)
    original = AIOKafkaConsumer.seek_to_committed
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    async def seek_to_committed(self: AIOKafkaConsumer, *partitions: Any) -> dict:
        committed = await original(self, *partitions)
        for tp, at in committed.items():
            if not at and tp.topic in _STREAM_TOPICS:
                # A plain seek: ``seek_to_beginning`` waits for the fetcher to reset the
                # position, which it cannot while Faust is in this call (a recovery hung
                # for minutes). Offset 0 gone to retention resets to the earliest one
                # (auto_offset_reset).
                self.seek(tp, 0)
        return committed

    setattr(seek_to_committed, _PATCHED, True)
    AIOKafkaConsumer.seek_to_committed = seek_to_committed  # type: ignore[method-assign]


class _Continue:
    """Awaiting it goes on with ``coro`` from where its first step stopped, on ``first``
    (what that step yielded): the rest of what ``yield from coro`` would have done."""

    def __init__(self, coro: Coroutine, first: Any) -> None:
        self._coro, self._first = coro, first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self._coro, self._first
        while True:
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in (a cancellation): pass it on
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(value)
                except StopIteration as stop:
                    return stop.value


async def _rest(coro: Coroutine, first: Any) -> Any:
    return await _Continue(coro, first)


def deliver_without_a_task_per_record() -> None:
    """Faust's consumer hands every fetched record to its stream as
    ``await self.wait_first(callback(message), self.suspend_flow.wait())``: a task for the
    callback, three more waiting on events (flow suspended, stopped, crashed) and an
    ``asyncio.wait``, per record, about half of a naive Faust agent's time per record
    (docs/benchmarks.md). The callback (the conductor putting the record on its stream's
    queue) almost never has to wait. This runs its first step at once; when it finishes
    there, the result is what ``wait_first`` returns when the callback wins (or "stopped",
    as there, when the consumer is stopping), and none of the tasks is made. When it has to
    wait (a full queue, a suspended flow) the rest of it becomes the task and ``wait_first``
    goes on as before, so a suspended flow still abandons it.
    """
    original = Consumer.wait_first
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    async def wait_first(self: Consumer, *coros: Any, timeout: Any = None) -> WaitResults:
        first = coros[0] if coros else None
        if (
            timeout is not None
            or len(coros) != 2
            or not asyncio.iscoroutine(first)
            or self._stopped.is_set()
            or self._crashed.is_set()
        ):
            return await original(self, *coros, timeout=timeout)
        try:
            yielded = first.send(None)
        except StopIteration as done:
            coros[1].close()  # the flow-suspended waiter, never started
            return WaitResults([first], [done.value], False)
        except BaseException:
            coros[1].close()
            raise
        return await original(self, _rest(first, yielded), coros[1])

    setattr(wait_first, _PATCHED, True)
    Consumer.wait_first = wait_first  # type: ignore[method-assign]
