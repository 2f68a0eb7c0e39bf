"""The worker's agents (pipeline/worker/agents.py) end the worker at once on an exception
(crash_only); a release deadline reaches Kafka as its exact millisecond."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from dpstream.pipeline.worker import agents
from dpstream.pipeline.worker.agents import HoleUnread, faust_timestamp
from tests.pipeline.worker.support import Exited, Stream, event, raising_exit, run


@pytest.fixture
def exits(monkeypatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(agents, "exit_now", raising_exit(calls))
    return calls


def test_an_exception_on_a_record_ends_the_worker_naming_the_record(exits, caplog):
    stream = Stream(event(2, 7), event(2, 8), event(2, 9))
    with caplog.at_level(logging.CRITICAL), pytest.raises(Exited):
        run(stream, fail_at=8)
    assert exits == [1]
    [line] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert line.getMessage() == (
        "stage 1: internal error on events[2] offset 8: RuntimeError('boom'); stopping the "
        "worker (a restarted worker reads the record again)"
    )
    assert line.exc_info is not None


def test_nothing_is_handled_after_the_failing_record(exits):
    handled: list[int] = []
    with pytest.raises(Exited):
        run(Stream(event(0, 7), event(0, 8), event(0, 9)), 8, KeyError("bug"), handled)
    assert handled == [7, 8]


def test_an_exception_of_the_stream_itself_ends_the_worker_too(exits, caplog):
    with caplog.at_level(logging.CRITICAL), pytest.raises(Exited):
        run(Stream(event(1, 3), then=ValueError("stream")))
    assert exits == [1]
    assert "stage 1: internal error outside a record: ValueError('stream')" in caplog.text


def test_a_stop_the_stage_logged_itself_is_not_called_an_internal_error(exits, caplog):
    with caplog.at_level(logging.CRITICAL), pytest.raises(Exited):
        run(Stream(event(0, 4)), fail_at=4, error=HoleUnread("events[0] 1-3"))
    assert exits == [1]
    assert "internal error" not in caplog.text


def test_a_cancellation_is_not_a_crash(exits):
    # A stop or a rebalance cancels the agent: Faust handles that, the worker goes on.
    with pytest.raises(asyncio.CancelledError):
        run(Stream(event(0, 4)), fail_at=4, error=asyncio.CancelledError())
    assert exits == []


def test_a_release_deadline_reaches_kafka_as_the_exact_millisecond():
    # Faust's send turns seconds into int(timestamp * 1000.0): a plain ms / 1000 loses a
    # millisecond now and then (a 2004 deadline here), the half millisecond never does.
    assert int(1_079_337_347_472 / 1000 * 1000.0) == 1_079_337_347_471
    rng = random.Random(1)
    for ms in [1_079_337_347_472, *(rng.randrange(4 * 10**12) for _ in range(100_000))]:
        assert int(faust_timestamp(ms) * 1000.0) == ms
