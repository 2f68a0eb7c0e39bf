"""A statistic's identity on the real broker: the worker states its privacy statement in
the ledger at start, and refuses to start when a statistic changed under its name."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
import yaml
from confluent_kafka import KafkaException

from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka.clients import read_topic
from dpstream.pipeline.kafka.topics import create_source_topics
from dpstream.pipeline.worker.processes import spawn_worker, stop_worker
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]


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


# ------------------------------------------------------------------------------------
# Issue 24: the ledger's memory, a statistic's run, the key, pipelines sharing a source.

KEY = "4a540f0c7fd7821214e2ea99964629e862506fa2b7b5cd0baa5bc3b5cda53248"  # fixed, random
KEYED = {**CONFIG, "noise": {"mode": "keyed", "key_env": "DPSTREAM_TEST_KEY"}}


def start(bootstrap: str, path, key: str | None = KEY) -> subprocess.CompletedProcess:
    """A worker start that is expected to be refused (the refusal comes before Faust)."""
    env = {"PATH": "/usr/bin:/bin"} | ({"DPSTREAM_TEST_KEY": key} if key else {})
    return subprocess.run(
        [*CLI, "worker", "--config", str(path), "--bootstrap", bootstrap],
        capture_output=True,
        timeout=120,
        env=env,
    )


def cli(bootstrap: str, *args: str, key: str = KEY) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args, "--bootstrap", bootstrap],
        capture_output=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "DPSTREAM_TEST_KEY": key},
    )


def ran_once(bootstrap: str, worker_factory, data: dict = KEYED) -> tuple[dict, object]:
    """A worker that released its first tick, stopped: (its config, the worker)."""
    worker = worker_factory(data, env={"DPSTREAM_TEST_KEY": KEY})
    data = yaml.safe_load(worker.config_path.read_text())
    ledger = data["outputs"]["ledger_topic"]

    def started() -> bool:
        try:
            entries = [orjson.loads(v) for _, _, v, _ in read_topic(bootstrap, ledger, 1)[0]]
        except KafkaException:
            return False
        return any(e.get("event") == "start" for e in entries)

    wait_until(started, 90, "the statistic's first release (its start entry)", worker)
    worker.stop()
    return data, worker


def test_a_ledger_topic_that_could_forget_is_refused(bootstrap, tmp_path):
    from confluent_kafka.admin import AdminClient, NewTopic

    from dpstream.testing.pipeline import unique_names

    data = unique_names(KEYED)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    ledger = data["outputs"]["ledger_topic"]
    admin.create_topics([NewTopic(ledger, 1, 1)])[ledger].result()  # the broker's 7 days
    create_source_topics(parse_config(data), bootstrap)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    out = start(bootstrap, path)
    assert out.returncode == 2, out.stderr.decode()
    assert (
        f"outputs.ledger_topic: topic '{ledger}' has retention.ms=604800000" in out.stderr.decode()
    )


def test_a_lost_stage2_changelog_is_refused_until_charged_again(
    bootstrap, tmp_path, worker_factory
):
    from confluent_kafka.admin import AdminClient

    data, worker = ran_once(bootstrap, worker_factory)
    changelog = f"{data['app_id']}-stage2-changelog"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([changelog])[changelog].result()
    wait_until(lambda: changelog not in admin.list_topics(timeout=10).topics, 30, "deletion")
    out = start(bootstrap, worker.config_path)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert "statistics ['events'] have released under their current runs" in err
    assert f"[{changelog!r}]" in err and "--charge-again events" in err
    # Charged again: a new run, the old one stays charged (1 + 1 of total_epsilon 2).
    again = cli(
        bootstrap, "ledger", "--config", str(worker.config_path), "--charge-again", "events"
    )
    assert again.returncode == 0, again.stderr.decode()
    text = again.stdout.decode()
    assert "events: new run" in text and "one user can lose at most 2 " in text
    restarted = spawn_worker(
        worker.config_path, bootstrap, tmp_path / "again.log", {"DPSTREAM_TEST_KEY": KEY}
    )
    try:
        wait_until(lambda: len(starts(bootstrap, data)) == 2, 90, "the new run's first release")
    finally:
        stop_worker(restarted)
    old_run, new_run = (entry["run_id"] for entry in starts(bootstrap, data))
    assert old_run != new_run
    history = cli(bootstrap, "ledger", "--config", str(worker.config_path)).stdout.decode()
    # What each statistic spent over its runs, and what is left (dpstream ledger).
    assert f"  events: 2 (run {new_run}: 1, released from tick" in history, history
    assert f"; earlier runs: {old_run} 1)" in history, history
    assert "left: 0 of total_epsilon=2 (spent 2, retired runs included" in history, history
    # Three statements with their times: the first start, the charge again, the restart.
    assert history.count(" UTC: events 1") == 3 and "; begun anew: events ->" in history, history


def starts(bootstrap: str, data: dict) -> list[dict]:
    records = read_topic(bootstrap, data["outputs"]["ledger_topic"], 1).get(0, [])
    return [e for _, _, v, _ in records if (e := orjson.loads(v)).get("event") == "start"]


def test_another_key_and_a_forged_statement_are_refused(bootstrap, tmp_path, worker_factory):
    from confluent_kafka import Producer

    data, worker = ran_once(bootstrap, worker_factory)
    other = start(
        bootstrap,
        worker.config_path,
        key="bab249b4253814a875520366d4acc8f03ef25344cb5b15daa751c54ebd58e80f",
    )
    assert other.returncode == 2, other.stderr.decode()
    assert "config error: noise: the ledger record" in other.stderr.decode()
    assert "written under another noise key" in other.stderr.decode()
    # Someone who can write the ledger topic, without the key: a statement that forgets.
    (statement,) = statements(bootstrap, data)
    forged = {**statement, "retired": [], "per_user_total": 0.0, "mac": "00" * 32}
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(data["outputs"]["ledger_topic"], orjson.dumps(forged))
    assert producer.flush(10) == 0
    out = start(bootstrap, worker.config_path)
    assert out.returncode == 2, out.stderr.decode()
    assert "MAC does not verify under this pipeline's key" in out.stderr.decode()


def test_a_public_counts_pipeline_over_a_whole_user_pipeline_s_source_is_refused(
    bootstrap, tmp_path, worker_factory
):
    data, _ = ran_once(bootstrap, worker_factory)
    public = {
        **data,
        "app_id": data["app_id"] + "-public",
        "privacy": {"total_epsilon": 2.0, "public_counts": True},
        "statistics": [
            {
                "name": "latency",
                "kind": "mean",
                "epsilon": 1.0,
                "mean": {"max_users": 100, "max_samples_per_user": 4},
            }
        ],
    }
    path = tmp_path / "public.yaml"
    path.write_text(yaml.safe_dump(public))
    out = start(bootstrap, path)
    assert out.returncode == 2, out.stderr.decode()
    assert f"privacy.public_counts: pipeline {data['app_id']!r} reads" in out.stderr.decode()


def test_check_config_live_refuses_what_the_worker_would_and_writes_nothing(
    bootstrap, tmp_path, worker_factory
):
    # Before, check-config said OK where the worker then refused (no key, a statistic
    # changed in place, another key), and had no way to ask Kafka.
    data, worker = ran_once(bootstrap, worker_factory)
    path = str(worker.config_path)
    ok = cli(bootstrap, "check-config", path, "--live")
    assert ok.returncode == 0, ok.stderr.decode()
    out = ok.stdout.decode()
    assert f"ledger {data['outputs']['ledger_topic']}: 1 statement(s) of app_id" in out, out
    assert "one user can lose at most 1 over the whole stream" in out, out
    no_key = subprocess.run(
        [*CLI, "check-config", path, "--live", "--bootstrap", bootstrap],
        capture_output=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert no_key.returncode == 2
    assert (
        "noise.key_env: environment variable DPSTREAM_TEST_KEY is not set" in no_key.stderr.decode()
    )
    other = cli(
        bootstrap,
        "check-config",
        path,
        "--live",
        key="bab249b4253814a875520366d4acc8f03ef25344cb5b15daa751c54ebd58e80f",
    )
    assert other.returncode == 2 and "written under another noise key" in other.stderr.decode()
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        yaml.safe_dump({**data, "statistics": [{**data["statistics"][0], "epsilon": 0.5}]})
    )
    refused = cli(bootstrap, "check-config", str(changed), "--live")
    assert refused.returncode == 2
    assert "statistics[0].epsilon: statistic 'events' ran under app_id" in refused.stderr.decode()
    assert len(statements(bootstrap, data)) == 1  # nothing was written
