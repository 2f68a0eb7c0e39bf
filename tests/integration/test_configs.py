"""Configs that cannot crash the worker (issue 27 item 5), on a real broker: a worker
started on a generated config (tests/config_strategies.py) that ``parse_config`` accepts
runs to a first release of every statistic without an internal error. Five accepted
configs (the refused are drawn again), derandomized: tests/config/test_schema_properties.py
covers many more without a broker, refusals too."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, example, given, settings

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.kafka.topics import create_source_topics
from dpstream.pipeline.worker.processes import spawn_worker, stop_worker
from tests.config_strategies import config_documents, synthetic_events
from tests.integration.support import TICK, TopicReader, wait_until

pytestmark = pytest.mark.integration


def namespaced(data: dict[str, Any], run: str) -> dict[str, Any]:
    """``data`` with ``run`` before its app id and every topic name and prefix it names,
    so that examples share the broker: a common prefix keeps every collision (also after
    '.' to '_') and every name's relation to ``<app_id>-`` as it was."""
    outputs = {
        "dead_letter_topic": run + "dpstream.dead-letter",  # the defaults, in ``run`` too
        "ledger_topic": run + "dpstream.ledger",
        **{name: run + value for name, value in data["outputs"].items()},
    }
    topics = [run + topic for topic in data["input"]["topics"]]
    return {
        **data,
        "app_id": run + data["app_id"],
        "input": {**data["input"], "topics": topics},
        "outputs": outputs,
        "ticks": {"interval_seconds": TICK},
    }


# Issue 27's reproduction: a release topic that is the events topic passed check-config,
# and the worker crashed at start (aiokafka: "AssertionError: Unrecognized partition").
ISSUE_27 = {
    "app_id": "dpstream",
    "input": {"topics": ["clicks"], "partitions": 2},
    "outputs": {"release_topic_prefix": "dpstream-"},
    "noise": {"mode": "insecure_zero"},
    "privacy": {"total_epsilon": 1.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 4}],
}


@settings(
    max_examples=5,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(document=config_documents(max_statistics=2))
@example(document=ISSUE_27)
def test_a_worker_on_any_accepted_config_runs_to_its_first_releases(
    document: dict[str, Any], bootstrap: str, tmp_path: Path
) -> None:
    data = namespaced(document, f"t{uuid.uuid4().hex[:8]}")
    try:
        cfg = parse_config(data)
    except ConfigError:
        assume(False)  # refused naming a field: the unit property test's side
        return
    event(
        " ".join(sorted(s.kind for s in cfg.statistics))
    )  # what ran (--hypothesis-show-statistics)
    config_path = tmp_path / f"{cfg.app_id}.yaml"
    config_path.write_text(yaml.safe_dump(data))
    log_path = tmp_path / f"{cfg.app_id}.log"
    create_source_topics(cfg, bootstrap)  # as a user's producer setup would: never the worker
    proc = spawn_worker(config_path, bootstrap, log_path)
    releases = {s.name: TopicReader(bootstrap, cfg.release_topic(s.name)) for s in cfg.statistics}
    producer = make_producer(bootstrap)

    def released() -> bool:
        assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
        # Events keep coming until every statistic has released.
        produce_events(producer, cfg, synthetic_events(int(time.time())))
        producer.flush(5)
        return all(reader.drain() for reader in releases.values())

    try:
        wait_until(released, 120, "a first release of every statistic")
    finally:
        stop_worker(proc)
        for reader in releases.values():
            reader.close()
    log = log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
