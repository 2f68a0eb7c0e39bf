"""What the worker's unit tests share: Faust events and streams as the agents use them, and
an ``exit_now`` that raises instead of ending the process."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from dpstream.pipeline.worker.agents import crash_only


class Exited(BaseException):
    """What the test's ``exit_now`` raises instead of ending the process."""


def event(partition: int, offset: int, value: bytes | None = None) -> SimpleNamespace:
    message = SimpleNamespace(
        topic="events", partition=partition, offset=offset, timestamp=None, headers=None
    )
    return SimpleNamespace(message=message, value=value)


class Stream:
    """The part of a Faust stream an agent uses: ``events()``."""

    def __init__(self, *events: SimpleNamespace, then: BaseException | None = None) -> None:
        self._events, self._then = events, then

    async def events(self):
        for e in self._events:
            yield e
        if self._then is not None:
            raise self._then


def raising_exit(calls: list[int]):
    """An ``exit_now`` that notes the call in ``calls`` and raises ``Exited``."""

    def exit_now() -> None:
        calls.append(1)
        raise Exited

    return exit_now


def run(
    stream: Stream,
    fail_at: int | None = None,
    error: BaseException | None = None,
    handled: list[int] | None = None,
) -> None:
    """``crash_only`` over ``stream``; its handler notes each offset in ``handled`` and
    raises ``error`` at ``fail_at``."""

    async def handle(e) -> None:
        if handled is not None:
            handled.append(e.message.offset)
        if e.message.offset == fail_at:
            raise error or RuntimeError("boom")

    asyncio.run(crash_only("stage 1", stream, handle))
