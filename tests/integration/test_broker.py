"""The shared Kafka broker helper: a real broker, a real round trip, a clean stop.
(Its unit tests, without a broker: tests/deploy/test_broker.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dpstream.deploy import broker
from dpstream.deploy.broker import (
    LocalKafka,
    kafka_broker,
    start_detached,
    status_detached,
    stop_detached,
)
from tests.integration.support import round_trip

QUIET = {"log_level": 0}


def _port_closed(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) != 0


def _process_gone(pid: int) -> bool:
    """No such process, or only a zombie left for a parent that is not us to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.integration
def test_kafka_broker_round_trip_and_clean_stop(monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    started: list[LocalKafka] = []
    original_start = LocalKafka.start.__func__

    def spy(cls, **kwargs):
        kafka = original_start(cls, **kwargs)
        started.append(kafka)
        return kafka

    monkeypatch.setattr(LocalKafka, "start", classmethod(spy))

    with kafka_broker() as bootstrap:
        if started:
            assert started[0].is_alive()
        round_trip(bootstrap)

    assert _port_closed(bootstrap)
    if started:  # the local-jar broker (no Docker engine here)
        kafka = started[0]
        assert not kafka.is_alive()
        assert _process_gone(kafka.pid)
        assert not kafka.data_dir.exists()


@pytest.mark.integration
def test_detached_broker_lifecycle(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path))
    state_file = tmp_path / ".dpstream" / "broker.json"
    assert status_detached() is None
    assert stop_detached() is False

    # Start it from another process, as `dpstream broker start` would: that process must
    # exit promptly (the JVM must not hold its stdout) and the broker must outlive it.
    code = (
        "import json; from dpstream.deploy.broker import start_detached; "
        "print(json.dumps(start_detached()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "DPSTREAM_HOME": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["already_running"] is False
    assert json.loads(state_file.read_text())["pid"] == info["pid"]

    try:
        status = status_detached()
        assert status is not None and status["alive"] is True
        assert status["bootstrap"] == info["bootstrap"]

        again = start_detached()
        assert again["already_running"] is True
        assert again["pid"] == info["pid"]

        broker.wait_for_metadata(info["bootstrap"], timeout=10)
    finally:
        assert stop_detached() is True

    assert not state_file.exists()
    assert status_detached() is None
    assert stop_detached() is False
    assert _process_gone(info["pid"])
    assert _port_closed(info["bootstrap"])
    assert not Path(info["data_dir"]).exists()


@pytest.mark.integration
def test_restart_on_the_same_data_keeps_the_address_and_the_data(tmp_path):
    """Clients (a running worker) know one address: a restarted broker must keep it."""
    from confluent_kafka.admin import AdminClient, NewTopic

    data_dir = tmp_path / "kafka"
    kafka = LocalKafka.start(data_dir=data_dir)
    try:
        first = kafka.bootstrap
        admin = AdminClient({"bootstrap.servers": first, **QUIET})
        for future in admin.create_topics([NewTopic("kept", 1, 1)]).values():
            future.result(timeout=30)
        kafka.stop()
        kafka = LocalKafka.start(data_dir=data_dir)
        assert kafka.bootstrap == first
        topics = AdminClient({"bootstrap.servers": first, **QUIET}).list_topics(timeout=30).topics
        assert "kept" in topics
    finally:
        kafka.stop()
