"""The noise key stays secret, and no key means no start (issue 6, item 6).

* A worker runs with a keyed-noise key from an environment variable, at DEBUG log level,
  through good and bad traffic; then ``check-config``, ``export-log`` and ``replay`` run
  with the same key. The key is searched for, as raw bytes, hex (both cases) and base64
  (standard and URL-safe), in: the worker's whole log, the tools' output, every record
  (key, value, headers) of every topic of the pipeline -- input, stage 2, releases,
  dead letters, ledger, the table changelogs -- and of Kafka's consumer-offsets topic,
  the worker's data directory and the config file. Both the key material the operator
  supplies and the 32-byte key derived from it are searched, and halves of each encoded
  form, so a truncated or partly printed key is found too.
* Without a key (variable unset, key too short, key file missing) the worker exits at
  once with a config error naming the field, before it creates a topic.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.kafka.topics import create_source_topics
from dpstream.pipeline.tools.synthetic import synthetic_events
from dpstream.pipeline.worker.processes import spawn_worker, stop_worker
from dpstream.testing import unique_names
from tests.integration.support import (
    TICK,
    WorkerProcess,
    pipeline_config,
    readers,
    wait_for_first_release,
    wait_for_tick,
    wait_until,
)

pytestmark = pytest.mark.integration

KEY_ENV = "DPSTREAM_TEST_SECRET_KEY"
CLI = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]


def secret_forms(material: bytes) -> dict[str, bytes]:
    """Every spelling of the key a leak could take, and the first and second half of each."""
    derived = hashlib.sha256(b"dpstream-noise-key\0" + material).digest()  # load_noise's key
    forms: dict[str, bytes] = {}
    for name, raw in (("material", material), ("derived", derived)):
        forms[f"{name} raw"] = raw
        forms[f"{name} hex"] = raw.hex().encode()
        forms[f"{name} HEX"] = raw.hex().upper().encode()
        forms[f"{name} base64"] = base64.b64encode(raw).rstrip(b"=")
        forms[f"{name} base64url"] = base64.urlsafe_b64encode(raw).rstrip(b"=")
    for name, value in list(forms.items()):
        half = len(value) // 2
        forms[f"{name} (first half)"] = value[:half]
        forms[f"{name} (second half)"] = value[half:]
    # Halves of the key's raw bytes are 16 bytes: still far too long to occur by chance.
    assert min(len(v) for v in forms.values()) >= 16
    return forms


def leaks(blob: bytes, forms: dict[str, bytes]) -> list[str]:
    return [name for name, value in forms.items() if value in blob]


def dump_topic(bootstrap: str, topic: str) -> bytes:
    """Every record of every partition of ``topic``: keys, values and headers."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "t-secrets",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    chunks: list[bytes] = []
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {}
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high > low:
                ends[p] = (low, high)
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
        remaining = set(ends)
        while remaining:
            msg = consumer.poll(30)
            assert msg is not None, f"reading {topic}: nothing within 30 s"
            if msg.error():
                continue
            chunks += [msg.key() or b"", msg.value() or b""]
            chunks += [k.encode() + b"=" + (v or b"") for k, v in msg.headers() or []]
            if msg.offset() >= ends[msg.partition()][1] - 1:
                remaining.discard(msg.partition())
        return b"\n".join(chunks)
    finally:
        consumer.close()


def topics_of(bootstrap: str, prefix: str) -> list[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return sorted(t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix))


def test_the_noise_key_is_in_no_log_topic_changelog_or_file(bootstrap, tmp_path):
    material = np.random.default_rng(2024).bytes(32).hex().encode()  # what the operator sets
    forms = secret_forms(material)
    data = unique_names(pipeline_config({"mode": "keyed", "key_env": KEY_ENV}))
    cfg = parse_config(data)
    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(data))
    log_path = tmp_path / "worker.log"
    workdir = tmp_path / "tmp"  # the worker's TMPDIR: its Faust data directory lands here
    workdir.mkdir()
    env = {KEY_ENV: material.decode(), "TMPDIR": str(workdir)}
    create_source_topics(cfg, bootstrap)
    proc = spawn_worker(config_path, bootstrap, log_path, env, loglevel="debug")
    worker = WorkerProcess(cfg, config_path, log_path, proc)
    rd = readers(bootstrap, worker)
    try:
        wait_for_first_release(worker, rd["views"])
        producer = make_producer(bootstrap)
        raw = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        events = list(synthetic_events(30, 240, seed=3))
        for i in range(6):
            produce_events(producer, cfg, events[i * 40 : (i + 1) * 40], batch=1 if i % 2 else 8)
            # Bad records take the dead-letter path (and the worker's rejection log line).
            raw.produce(cfg.input.topics[0], value=b'{"user_id": "x", "value": NaN', partition=0)
            raw.produce(cfg.input.topics[0], value=b'{"user_id": 5}', partition=1)
            producer.flush(10)
            raw.flush(10)
            time.sleep(TICK)
        wait_for_tick(worker, rd, int(time.time() / TICK) + 1)
        releases = [r for s in cfg.statistics for r in rd[s.name].drain()]
        dead = rd["_dead"].drain()
        # Wait for the worker's "dead-lettered records so far" line (every 10 s).
        wait_until(
            lambda: b"dead-lettered records" in log_path.read_bytes(), 30, "the rejection log"
        )
        worker.assert_running()
    finally:
        for r in rd.values():
            r.close()
        stop_worker(proc)
    assert releases and all("insecure" not in r for r in releases)  # the key was in use
    assert len(dead) == 12

    # The operator's tools, with the same key.
    tool_env = {**os.environ, KEY_ENV: material.decode()}
    events_log = tmp_path / "events.jsonl"
    outputs = b""
    for args in (
        ["check-config", str(config_path)],
        ["export-log", "--config", str(config_path), "--bootstrap", bootstrap],
        ["replay", "--config", str(config_path), "--events", str(events_log)],
    ):
        out = subprocess.run(
            [*CLI, "-v", *args], capture_output=True, env=tool_env, timeout=120, check=True
        )
        outputs += out.stdout + out.stderr
        if args[0] == "export-log":
            events_log.write_bytes(out.stdout)
    replayed = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert len(replayed) >= len(releases) > 0

    # Everything the pipeline wrote or logged.
    log_text = log_path.read_bytes()
    assert b"DEBUG" in log_text  # the debug log was on
    assert not leaks(log_text, forms), "worker log"
    assert not leaks(outputs, forms), "tool output"
    assert not leaks(config_path.read_bytes(), forms), "config file"
    topics = topics_of(bootstrap, cfg.app_id)  # t-<run>.* and t-<run>-*: all of this run's
    assert {
        *cfg.input.topics,
        cfg.events_topic,
        cfg.stage2_topic,
        f"{cfg.app_id}-stage1-changelog",
        f"{cfg.app_id}-stage2-changelog",
        cfg.outputs.dead_letter_topic,
        cfg.outputs.ledger_topic,
        *(cfg.release_topic(s.name) for s in cfg.statistics),
    } <= set(topics)
    for topic in [*topics, "__consumer_offsets"]:
        blob = dump_topic(bootstrap, topic)
        assert not leaks(blob, forms), topic
    files = [p for p in workdir.rglob("*") if p.is_file()]
    for path in files:
        assert not leaks(path.read_bytes(), forms), path

    # The search itself works: each form is found where it is.
    assert leaks(material, forms) and leaks(forms["derived base64"], forms)


def refuses(bootstrap: str, tmp_path: Path, noise: dict, env: dict[str, str]) -> str:
    """Start a worker with ``noise``; it must exit with a config error before any topic."""
    data = unique_names(pipeline_config(noise))
    config_path = tmp_path / f"{data['app_id']}.yaml"
    config_path.write_text(yaml.safe_dump(data))
    clean = {k: v for k, v in os.environ.items() if k != "DPSTREAM_NOISE_KEY"}
    out = subprocess.run(
        [*CLI, "worker", "--config", str(config_path), "--bootstrap", bootstrap],
        capture_output=True,
        env={**clean, **env},
        timeout=60,
    )
    assert out.returncode == 2, out.stderr.decode()
    assert topics_of(bootstrap, data["app_id"]) == []  # refused before touching Kafka
    return out.stderr.decode()


def test_without_a_key_the_worker_refuses_to_start(bootstrap, tmp_path):
    err = refuses(bootstrap, tmp_path, {"mode": "keyed"}, {})
    assert "config error: noise.key_env: environment variable DPSTREAM_NOISE_KEY is not set" in err
    err = refuses(bootstrap, tmp_path, {"mode": "keyed"}, {"DPSTREAM_NOISE_KEY": "short"})
    assert "noise.key_env: the noise key must be at least 256 bits" in err
    missing = tmp_path / "no-such-key"
    err = refuses(bootstrap, tmp_path, {"mode": "keyed", "key_file": str(missing)}, {})
    assert "noise.key_file: cannot read key file" in err


def test_the_insecure_mode_needs_no_key_and_stamps_every_release(bootstrap, tmp_path):
    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    cfg = parse_config(data)
    config_path = tmp_path / "insecure.yaml"
    config_path.write_text(yaml.safe_dump(data))
    clean = {k: v for k, v in os.environ.items() if k != "DPSTREAM_NOISE_KEY"}
    log_path = tmp_path / "worker.log"
    create_source_topics(cfg, bootstrap)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(  # no key anywhere in its environment
            [*CLI, "worker", "--config", str(config_path), "--bootstrap", bootstrap],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean,
        )
    worker = WorkerProcess(cfg, config_path, log_path, proc)
    rd = readers(bootstrap, worker)
    try:
        producer = make_producer(bootstrap)
        produce_events(producer, cfg, list(synthetic_events(10, 50, seed=4)))
        producer.flush(10)
        wait_until(
            lambda: all(len(rd[s.name].drain()) >= 3 for s in cfg.statistics),
            90,
            "three releases of every statistic",
            worker,
        )
        releases = [r for s in cfg.statistics for r in rd[s.name].drain()]
    finally:
        for r in rd.values():
            r.close()
        stop_worker(proc)
    assert releases and all(r["insecure"] == "insecure_zero" for r in releases)
