"""Releases published as Avro through a real Schema Registry (``outputs.format: avro``,
issue 29): a worker with zero noise over a real broker registers each release topic's
schema in the local Apicurio Registry (the ``schema_registry`` fixture), and a downstream
consumer written as a user would write it, knowing nothing of dpstream (confluent-kafka's
``Consumer`` and ``AvroDeserializer`` with a ``SchemaRegistryClient``), reads releases
that are the exact counts and equal the replay of the exported log; dpstream's client and
``dpstream tail`` read the same releases from the Avro topic.

Run them alone with ``pytest -m registry``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from dpstream.client import releases
from dpstream.config.schema import parse_config
from dpstream.pipeline.worker.processes import spawn_worker
from dpstream.testing import unique_names
from tests.integration import producers
from tests.integration.scenarios import shop_events
from tests.integration.support import WorkerProcess, replayed_releases

pytestmark = [pytest.mark.integration, pytest.mark.registry]

MAX_VALUE = 5


def pipeline(url: str) -> dict:
    names = unique_names({})
    return {
        **names,
        "input": {"topics": [f"{names['app_id']}.src"], "partitions": 2},
        "outputs": {"format": "avro", "schema_registry": {"url": url}},
        "ticks": {"interval_seconds": 0.5},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 3.0},
        "statistics": [
            {"name": "views", "epsilon": 1.0, "tau": 100_000, "key": "view"},
            {"name": "spend", "kind": "sum", "epsilon": 1.0, "tau": 100_000, "key": "buy",
             "max_value": MAX_VALUE},
            {"name": "views_auto", "epsilon": 1.0, "tau": "auto", "key": "view"},
        ],
    }  # fmt: skip


def consume_as_a_user_does(bootstrap: str, url: str, topics: list[str], done, timeout: float):
    """A downstream consumer: confluent-kafka's Consumer and AvroDeserializer, nothing of
    dpstream; {topic: [release dict, ...]} once ``done`` holds of them."""
    registry = SchemaRegistryClient({"url": url})
    deserializer = AvroDeserializer(registry)
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"downstream-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    })  # fmt: skip
    got: dict[str, list[dict]] = {topic: [] for topic in topics}
    consumer.subscribe(topics)
    deadline = time.monotonic() + timeout
    try:
        while not done(got):
            last = {t: r[-1:] for t, r in got.items()}
            assert time.monotonic() < deadline, f"timed out; last releases: {last}"
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            assert msg.value()[:1] == b"\x00"  # the Schema Registry's framing
            context = SerializationContext(msg.topic(), MessageField.VALUE)
            got[msg.topic()].append(deserializer(msg.value(), context))
    finally:
        consumer.close()
        registry.close()
    return got


def without_absent_fields(url: str, topic: str, releases: list[dict]) -> list[dict]:
    """The documented mapping back to the JSON release: a field with a null default that
    reads null was not in the release (from the schema the registry holds)."""
    with SchemaRegistryClient({"url": url}) as client:
        schema = json.loads(client.get_latest_version(f"{topic}-value").schema.schema_str)
    optional = {f["name"] for record in schema for f in record["fields"] if "default" in f}
    return [{k: v for k, v in r.items() if not (v is None and k in optional)} for r in releases]


def test_a_downstream_avro_consumer_reads_the_releases_replay_makes(
    bootstrap, schema_registry, tmp_path: Path
):
    data = pipeline(schema_registry)
    cfg = parse_config(data)
    source = cfg.input.topics[0]
    producers.create_source_topic(bootstrap, source, partitions=2)
    events = shop_events(29, 300, MAX_VALUE)
    path = tmp_path / f"{cfg.app_id}.yaml"
    path.write_text(yaml.safe_dump(data))
    log = tmp_path / f"{cfg.app_id}.log"
    worker = WorkerProcess(cfg, path, log, spawn_worker(path, bootstrap, log))
    topics = {s.name: cfg.release_topic(s.name) for s in cfg.statistics}
    views = sum(e["key"] == "view" for e in events)
    spend = sum(e.get("value", 0) for e in events if e["key"] == "buy")

    def exact(got: dict[str, list[dict]]) -> bool:
        worker.assert_running()
        latest = {t: r[-1]["value"] for t, r in got.items() if r}
        return (latest.get(topics["views"]), latest.get(topics["spend"])) == (views, spend) and (
            topics["views_auto"] in latest
        )

    try:
        producers.produce_confluent_default(bootstrap, source, events, keyed=True)
        got = consume_as_a_user_does(bootstrap, schema_registry, list(topics.values()), exact, 180)
    finally:
        worker.stop()
    replayed = {name: [orjson.loads(r) for r in rs]
                for name, rs in replayed_releases(cfg, bootstrap).items()}  # fmt: skip
    for name, topic in topics.items():
        released = without_absent_fields(schema_registry, topic, got[topic])
        assert released, name
        assert replayed[name][: len(released)] == released, name
        if name == "views":
            views_released = released
    # dpstream's own readers of the topic (the worker has stopped: it holds what the
    # consumer read and maybe more): the client and `dpstream tail`, the same typed
    # records and JSON lines as from a JSON topic.
    typed = [dict(r.fields) for r in releases("views", bootstrap, cfg)]
    assert typed[: len(views_released)] == views_released
    tail = subprocess.run(
        [sys.executable, "-m", "dpstream.pipeline.tools.cli", "tail", "views", "--config",
         str(path), "--bootstrap", bootstrap, "--from-beginning", "--max", str(len(typed)),
         "--timeout", "120"],
        capture_output=True, text=True, timeout=180, check=True,
    )  # fmt: skip
    assert [orjson.loads(line) for line in tail.stdout.splitlines()] == typed
    # The user-level count's topic has its own shape (tau, instance, svt_index, ...).
    auto = without_absent_fields(schema_registry, topics["views_auto"], got[topics["views_auto"]])
    assert {"tau", "svt_index", "epsilon_spent"} <= set(auto[-1])
