"""The worker's Faust worker (pipeline/worker/lifecycle.py): no terminal codes in a log
that is not a terminal, the Kafka transport's lines rate-limited on every handler, and a
stop that arms its deadline and stops the ingest first."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest

from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka.client_logs import RateLimitedLogs
from dpstream.pipeline.worker.app import create_app
from dpstream.pipeline.worker.exits import StopDeadline
from dpstream.pipeline.worker.keys import PipelineKey
from dpstream.pipeline.worker.lifecycle import STOP_SECONDS, Worker

CFG = {
    "privacy": {"total_epsilon": 1},
    "noise": {"mode": "insecure_zero"},
    "statistics": [{"name": "e", "epsilon": 1, "tau": 1}],
}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def app(tmp_path):
    return create_app(parse_config(CFG), "127.0.0.1:9", PipelineKey.insecure_zero(), tmp_path)


def logged_at_warning(worker: Worker) -> str:
    """What the worker's stdout receives when a WARNING is logged once its root logger is
    set up at level WARNING (Faust's spinner runs at WARNING and above)."""
    logger = logging.getLogger("lifecycle-test")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(io.StringIO()))
    try:
        worker.on_setup_root_logger(logger, logging.WARNING)
        logger.warning("a warning")
    finally:
        logger.handlers.clear()
    return worker.stdout.getvalue()


def test_no_spinner_codes_when_stdout_is_not_a_terminal(app):
    # faust.Worker's spinner wrote "\x1b[?25l" (hide the cursor) to a log file here.
    assert "\x1b" not in logged_at_warning(Worker(app, stdout=io.StringIO(), quiet=True))
    on_a_terminal = Worker(app, stdout=Terminal(), quiet=True)
    assert on_a_terminal.spinner is not None  # a terminal keeps Faust's spinner


def test_the_root_loggers_handlers_rate_limit_the_kafka_transport(app):
    worker = Worker(app, stdout=io.StringIO(), quiet=True)
    logger = logging.getLogger("lifecycle-test-handlers")
    handlers = [logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())]
    for h in handlers:
        logger.addHandler(h)
    try:
        worker.on_setup_root_logger(logger, logging.INFO)
    finally:
        logger.handlers.clear()
    filters = [f for h in handlers for f in h.filters if isinstance(f, RateLimitedLogs)]
    assert len(filters) == 2 and filters[0] is filters[1]  # one limiter: a record counts once


class Ingest:
    def __init__(self) -> None:
        self.asked = 0

    def request_stop(self) -> None:
        self.asked += 1


def test_a_stop_arms_its_deadline_and_stops_the_ingest_first(app, monkeypatch):
    armed: list[float] = []
    monkeypatch.setattr(StopDeadline, "arm", lambda self: armed.append(self.seconds))
    ingest = Ingest()
    worker = Worker(app, ingest=ingest, stdout=io.StringIO(), quiet=True)  # type: ignore[arg-type]
    asyncio.run(worker.on_stop())
    assert armed == [STOP_SECONDS] and ingest.asked == 1
