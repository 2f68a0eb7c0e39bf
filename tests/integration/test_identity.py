"""A statistic's identity on the real broker: the worker states its privacy statement in
the ledger at start, and refuses to start when a statistic changed under its name."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
import yaml
from confluent_kafka import KafkaException

from dpstream.pipeline.clients import read_topic
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "dpstream.pipeline.cli"]


CONFIG = {
    "input": {"partitions": 2},
    "noise": {"mode": "insecure_zero"},
    "privacy": {"total_epsilon": 2.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 8}],
}


def statements(bootstrap: str, data: dict) -> list[dict]:
    try:
        records = read_topic(bootstrap, data["outputs"]["ledger_topic"], 1).get(0, [])
    except KafkaException:  # the worker has not created the topic yet
        return []
    entries = [orjson.loads(value) for _, _, value, _ in records]
    return [e for e in entries if e.get("event") == "statement"]


def test_epsilon_changed_in_place_is_refused_at_start(bootstrap, tmp_path, worker_factory):
    worker = worker_factory(CONFIG)  # its own app id and topics
    data = yaml.safe_load(worker.config_path.read_text())
    wait_until(lambda: statements(bootstrap, data) != [], 60, "the statement", worker)
    worker.stop()
    (statement,) = statements(bootstrap, data)
    assert statement["app_id"] == data["app_id"] and statement["per_user_total"] == 1.0
    assert statement["identities"]["events"]["parameters"]["statistic"]["epsilon"] == 1.0

    data["statistics"][0]["epsilon"] = 0.5
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run(
        [*CLI, "worker", "--config", str(path), "--bootstrap", bootstrap],
        capture_output=True,
        timeout=120,
    )
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert "config error: statistics[0].epsilon: statistic 'events' ran under app_id" in err
    assert "give it a new name" in err
    assert len(statements(bootstrap, data)) == 1  # the refused start stated nothing
