"""pipeline/faust_fixes.py's delivery without a task per record, against mode's own
``Service.wait_first`` semantics (no Kafka: the consumer's ``wait_first`` is called as
Faust's ``_drain_messages`` calls it)."""

from __future__ import annotations

import asyncio
import types
import warnings

import pytest
from faust.transport.consumer import Consumer

from dpstream.pipeline.faust_fixes import deliver_without_a_task_per_record

deliver_without_a_task_per_record()


def consumer() -> types.SimpleNamespace:
    """What ``Service.wait_first`` reads of its service."""
    return types.SimpleNamespace(
        _stopped=asyncio.Event(), _crashed=asyncio.Event(), loop=asyncio.get_running_loop()
    )


def run(coro):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" fails the test
        return asyncio.run(coro)


def test_a_callback_that_does_not_wait_runs_without_a_task():
    async def main():
        flow = asyncio.Event()
        tasks_before = len(asyncio.all_tasks())
        seen = []

        async def callback():
            seen.append(len(asyncio.all_tasks()))
            return "put"

        res = await Consumer.wait_first(consumer(), callback(), flow.wait())
        return res, seen, tasks_before

    res, seen, before = run(main())
    assert (res.results, res.stopped) == (["put"], False)
    assert seen == [before]  # ran inside the caller's task: no task was made for it


def test_a_callback_that_waits_goes_on_as_a_task_and_returns_its_result():
    async def main():
        flow, gate = asyncio.Event(), asyncio.get_running_loop().create_future()
        steps = []

        async def callback():
            steps.append("first")
            value = await gate  # a full queue
            steps.append(value)
            await asyncio.sleep(0)
            return value * 2

        asyncio.get_running_loop().call_later(0.01, gate.set_result, 21)
        res = await Consumer.wait_first(consumer(), callback(), flow.wait())
        return res, steps

    res, steps = run(main())
    assert res.results == [42] and not res.stopped
    assert steps == ["first", 21]


def test_a_suspended_flow_still_abandons_a_waiting_callback():
    async def main():
        flow, gate = asyncio.Event(), asyncio.get_running_loop().create_future()
        cancelled = []

        async def callback():
            try:
                await gate
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        asyncio.get_running_loop().call_later(0.01, flow.set)
        res = await Consumer.wait_first(consumer(), callback(), flow.wait())
        await asyncio.sleep(0)
        return res, cancelled

    res, cancelled = run(main())
    assert res.results == [True] and not res.stopped  # the flow waiter won
    assert cancelled == [True]


@pytest.mark.parametrize("waits_first", [False, True])
def test_a_callback_error_reaches_the_caller(waits_first):
    async def main():
        async def callback():
            if waits_first:
                await asyncio.sleep(0)
            raise ValueError("bad record")

        await Consumer.wait_first(consumer(), callback(), asyncio.Event().wait())

    with pytest.raises(ValueError, match="bad record"):
        run(main())


def test_a_stopping_consumer_takes_mode_s_own_path():
    async def main():
        svc = consumer()
        svc._stopped.set()

        async def callback():
            return "put"

        return await Consumer.wait_first(svc, callback(), asyncio.Event().wait())

    assert run(main()).stopped
