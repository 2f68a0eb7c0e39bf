"""Shared fixtures. Integration tests get one real broker per session (see deploy/broker.py:
KAFKA_BOOTSTRAP_SERVERS, else testcontainers when Docker answers, else Kafka's own jars)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.support import WorkerProcess, worker_pool


@pytest.fixture(scope="session")
def bootstrap(kafka_broker: str) -> str:
    """The session's broker: the ``kafka_broker`` fixture of dpstream's pytest plugin
    (``dpstream.testing``), the one users get."""
    return kafka_broker


@pytest.fixture
def worker_factory(bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_pool(bootstrap, tmp_path) as start:
        yield start
