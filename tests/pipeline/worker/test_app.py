"""The worker ends at once (pipeline/worker/app.py): on an exception in a stage agent (crash_only)
and when its ingest has ended; a release deadline reaches Kafka as its exact millisecond."""

from __future__ import annotations

import asyncio
import logging
import random
from types import SimpleNamespace

import pytest

from dpstream.config.schema import parse_config
from dpstream.pipeline.worker import app as app_module
from dpstream.pipeline.worker.app import HoleUnread, crash_only, create_app, faust_timestamp
from dpstream.pipeline.worker.keys import PipelineKey


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


@pytest.fixture
def exits(monkeypatch) -> list[int]:
    calls: list[int] = []

    def exit_now() -> None:
        calls.append(1)
        raise Exited

    monkeypatch.setattr(app_module, "exit_now", exit_now)
    return calls


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


@pytest.mark.parametrize("agent", ["stage1", "stage2"])
def test_both_agents_of_the_worker_app_end_the_worker_on_an_exception(
    agent, tmp_path, exits, caplog
):
    cfg = parse_config({"privacy": {"total_epsilon": 1}, "noise": {"mode": "insecure_zero"},
                        "statistics": [{"name": "e", "epsilon": 1, "tau": 1}]})  # fmt: skip
    app = create_app(cfg, "127.0.0.1:9", PipelineKey.insecure_zero(), tmp_path)
    fun = app.agents[agent].fun
    # Not a JSON report, and tables that never started: a bug either way, not bad input.
    with caplog.at_level(logging.CRITICAL), pytest.raises(Exited):
        asyncio.run(fun(Stream(event(3, 11))))
    assert exits == [1]
    stage = "stage 1" if agent == "stage1" else "stage 2"
    assert f"{stage}: internal error on events[3] offset 11: " in caplog.text


class EndedIngest:
    """The part of an ``IngestHandle`` the worker's ingest watch uses."""

    def __init__(self, alive: bool, exitcode: int | None) -> None:
        self.alive, self.exitcode = alive, exitcode

    def is_alive(self) -> bool:
        return self.alive


@pytest.mark.parametrize(
    ("exitcode", "how"), [(-9, "exit code -9"), (1, "exit code 1"), (None, "its thread ended")]
)
def test_an_ended_ingest_ends_the_worker_at_once_saying_how_it_ended(exits, caplog, exitcode, how):
    # Faust's app.crash stopped the worker gracefully here, a stop that can hang.
    with caplog.at_level(logging.CRITICAL), pytest.raises(Exited):
        app_module.stop_if_ingest_ended(EndedIngest(alive=False, exitcode=exitcode))
    assert exits == [1]
    [line] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert line.getMessage() == f"the ingest stopped ({how}); stopping the worker"


def test_a_running_ingest_leaves_the_worker_running(exits, caplog):
    with caplog.at_level(logging.DEBUG):
        app_module.stop_if_ingest_ended(EndedIngest(alive=True, exitcode=None))
    assert exits == [] and caplog.records == []


def test_a_release_deadline_reaches_kafka_as_the_exact_millisecond():
    # Faust's send turns seconds into int(timestamp * 1000.0): a plain ms / 1000 loses a
    # millisecond now and then (a 2004 deadline here), the half millisecond never does.
    assert int(1_079_337_347_472 / 1000 * 1000.0) == 1_079_337_347_471
    rng = random.Random(1)
    for ms in [1_079_337_347_472, *(rng.randrange(4 * 10**12) for _ in range(100_000))]:
        assert int(faust_timestamp(ms) * 1000.0) == ms
