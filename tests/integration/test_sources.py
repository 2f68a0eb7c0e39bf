"""Source topics are the users' (docs/reliability.md, "Source topics"): a missing one stops
the worker and the ingest at start, naming ``input.topics``, and is never created (before,
a typo made an empty six-partition topic and the worker released pure noise); a worker
told to wait for it (``input.wait_for_topics_seconds``) starts once it exists; and a
source whose every record is dead-lettered says so with a WARNING and its top reasons
(before, a mistyped ``input.user_id_field`` showed only as an INFO line)."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka.topics import create_source_topics
from dpstream.pipeline.worker.processes import spawn_worker
from dpstream.testing import unique_names
from tests.integration.support import WorkerProcess, pipeline_config, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]


def exists(bootstrap: str, topic: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return topic in admin.list_topics(timeout=30).topics


@pytest.mark.parametrize("command", ["worker", "ingest"])
def test_a_missing_source_topic_stops_the_start_and_is_not_created(bootstrap, tmp_path, command):
    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    cfg = parse_config(data)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    (source,) = cfg.input.topics
    out = subprocess.run(
        [*CLI, command, "--config", str(path), "--bootstrap", bootstrap],
        capture_output=True,
        timeout=180,
    )
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert f"config error: input.topics: source topic {source!r} does not exist" in err
    assert not exists(bootstrap, source)
    assert not exists(bootstrap, cfg.events_topic)  # refused before it made anything


def test_a_worker_waits_for_its_source_and_warns_when_every_record_is_dead_lettered(
    bootstrap, tmp_path
):
    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    data["input"] |= {"wait_for_topics_seconds": 300, "user_id_field": "actor.uid"}  # a typo
    cfg = parse_config(data)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    log = tmp_path / "worker.log"
    worker = WorkerProcess(cfg, path, log, spawn_worker(path, bootstrap, log))
    try:
        wait_until(lambda: b"input.topics: waiting up to 300 s" in log.read_bytes(), 120, "wait")
        create_source_topics(cfg, bootstrap)  # as the users' producer setup would, later
        wait_until(lambda: b"ingest assigned" in log.read_bytes(), 120, "the ingest", worker)
        producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        for i in range(50):
            event = {"actor": {"id": f"u{i}"}, "key": "view"}
            producer.produce(cfg.input.topics[0], orjson.dumps(event))
        producer.flush(30)
        wait_until(lambda: b"was dead-lettered" in log.read_bytes(), 120, "the warning", worker)
    finally:
        worker.stop()
    text = log.read_text(errors="replace")
    [line] = {ln for ln in text.splitlines() if "was dead-lettered" in ln}
    assert "(50 records; the statistics receive none); top reasons: " in line
    assert "actor.uid" in line and "u1" not in line  # names the field, never a user id
