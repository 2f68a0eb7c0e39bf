"""The worker's app (pipeline/worker/app.py): both its agents end the worker at once on an
exception, and so does an ended ingest."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dpstream.config.schema import parse_config
from dpstream.pipeline.worker import agents
from dpstream.pipeline.worker import app as app_module
from dpstream.pipeline.worker.app import create_app
from dpstream.pipeline.worker.keys import PipelineKey
from tests.pipeline.worker.support import Exited, Stream, event, raising_exit


@pytest.fixture
def exits(monkeypatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(app_module, "exit_now", raising_exit(calls))
    monkeypatch.setattr(agents, "exit_now", raising_exit(calls))
    return calls


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

    def __init__(self, alive: bool, exitcode: int | None, stopping: bool = False) -> None:
        self.alive, self.exitcode, self.stopping = alive, exitcode, stopping

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


def test_an_ingest_that_ends_because_the_worker_stops_it_leaves_the_stop_alone(exits, caplog):
    # The worker stops its ingest first (lifecycle.Worker.on_stop); the ingest's end
    # during that stop is no failure, and status 70 would hide a clean stop.
    with caplog.at_level(logging.DEBUG):
        app_module.stop_if_ingest_ended(EndedIngest(alive=False, exitcode=0, stopping=True))
    assert exits == [] and caplog.records == []
