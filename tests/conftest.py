"""Shared fixtures. Integration tests get one real broker per session (see deploy/broker.py:
KAFKA_BOOTSTRAP_SERVERS, else testcontainers when Docker answers, else Kafka's own jars)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.pipeline.worker_support import spawn_worker, stop_worker
from dpstream.testing.pipeline import unique_names  # the plugin's: one way to name a test's topics


@pytest.fixture(scope="session")
def bootstrap(kafka_broker: str) -> str:
    """The session's broker: the ``kafka_broker`` fixture of dpstream's pytest plugin
    (``dpstream.testing``), the one users get."""
    return kafka_broker


@dataclass
class WorkerProcess:
    cfg: PipelineConfig
    config_path: Path
    log_path: Path
    proc: subprocess.Popen

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def assert_running(self) -> None:
        assert self.proc.poll() is None, f"worker exited:\n{self.log_tail()}"

    def stop(self) -> None:
        stop_worker(self.proc)


@contextmanager
def worker_pool(bootstrap: str, directory: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``dpstream worker`` subprocesses on demand; stop them all on exit."""
    started: list[WorkerProcess] = []

    def start(data: dict, env: dict[str, str] | None = None) -> WorkerProcess:
        data = unique_names(data)
        cfg = parse_config(data)
        config_path = directory / f"{cfg.app_id}.yaml"
        config_path.write_text(yaml.safe_dump(data))
        log_path = directory / f"{cfg.app_id}.log"
        proc = spawn_worker(config_path, bootstrap, log_path, env)
        worker = WorkerProcess(cfg, config_path, log_path, proc)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture
def worker_factory(bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_pool(bootstrap, tmp_path) as start:
        yield start


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, worker: WorkerProcess | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker is not None:
            worker.assert_running()
        if predicate():
            return
        time.sleep(0.25)
    tail = f"\nworker log:\n{worker.log_tail()}" if worker else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{tail}")
