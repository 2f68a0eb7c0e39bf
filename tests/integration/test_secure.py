"""dpstream against a secured broker (deploy/secure_broker.py: SASL_SSL with SCRAM, mutual
TLS, ACLs enforced), one broker for the session (the plugin's ``secure_kafka_broker``).

* Least privilege, over SASL_SSL and over mutual TLS: the worker (its Faust side and its
  confluent-kafka ingest), ``produce``, ``tail``, ``export-log``, ``replay`` and ``lag``,
  each as the principal of its role with exactly the ACLs of ``pipeline/acls.py`` (over
  SASL_SSL applied by running the ``kafka-acls`` commands docs/security.md shows, through
  Kafka's own tool): zero-noise releases equal the truncated counts of the exported log and
  its replay, every event counted once, lag 0.
* The plugin's ``dpstream_secure_pipeline`` on both listeners.
* Refusals: a wrong password, an untrusted CA, an expired client certificate each stop the
  worker at start within seconds with one line naming the setting and no traceback; a
  plaintext client gets nothing; a principal without ACLs is refused by name.
* ``dpstream broker start --secure`` prints settings that connect.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from dpstream.config.kafka import KafkaSecurityConfig
from dpstream.config.schema import parse_config
from dpstream.deploy import broker
from dpstream.deploy.secure_broker import SecureKafka
from dpstream.pipeline.kafka.acls import Principals, all_args, bindings
from dpstream.pipeline.kafka.security import check_connection, confluent_config
from dpstream.pipeline.kafka.topics import adopt_former_worker_offsets, ensure_topics, group_id
from dpstream.pipeline.tools.synthetic import synthetic_events
from dpstream.pipeline.worker.processes import spawn_worker, stop_worker
from dpstream.testing import unique_names
from tests.integration.scenarios import zero_noise_count_of_clicks
from tests.integration.support import (
    PARTITIONS,
    TICK,
    TopicReader,
    WorkerProcess,
    deduplicated,
    pipeline_config,
    truncated_counts,
    wait_for_first_release,
    wait_for_tick,
)

pytestmark = [pytest.mark.integration, pytest.mark.secure]

CLI = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]
ROLES = {"dpstream": "worker", "producer": "producer", "reader": "reader"}
PRINCIPALS = Principals("User:dpstream", "User:reader", "User:producer")
ROUNDS = 3


def cli(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"dpstream {args[0]} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def create_sources(secured: SecureKafka, topics: list[str]) -> None:
    """The source topics, made by the admin (a platform team would): the worker may only
    read them."""
    admin = AdminClient({**secured.admin_client_config(), "log_level": 0})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        future.result(timeout=30)


def run_secured(secured: SecureKafka, listener: str, directory: Path, grant: str) -> dict:
    """One pipeline on ``listener``: its ACLs granted (``grant``: "commands" runs the
    kafka-acls commands, "bindings" the same list through the admin client), a worker as
    ``dpstream``, rounds of events by ``dpstream produce`` as ``producer``; then ``tail``
    as ``reader``, ``export-log``, ``replay`` and ``lag`` as ``dpstream``."""
    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    configs: dict[str, Path] = {}
    for user in ROLES:
        configs[user] = directory / f"{user}.yaml"
        section = secured.kafka_section(user, listener)  # type: ignore[arg-type]
        configs[user].write_text(yaml.safe_dump({**data, "kafka": section}))
    cfg = parse_config(yaml.safe_load(configs["dpstream"].read_text()))
    create_sources(secured, cfg.input.topics)
    if grant == "commands":
        for argv in all_args(cfg, PRINCIPALS):
            secured.kafka_acls(argv)
    else:
        admin = AdminClient({**secured.admin_client_config(), "log_level": 0})
        for future in admin.create_acls(bindings(cfg, PRINCIPALS)).values():
            future.result(timeout=30)
    bootstrap = secured.bootstrap(listener)  # type: ignore[arg-type]
    proc = spawn_worker(configs["dpstream"], bootstrap, directory / "worker.log")
    worker = WorkerProcess(cfg, configs["dpstream"], directory / "worker.log", proc)
    reader_conf = {
        **confluent_config(KafkaSecurityConfig(**secured.kafka_section("reader", listener))),  # type: ignore[arg-type]
        "group.id": group_id(cfg.app_id, "tail-test"),
    }
    rd = {
        s.name: TopicReader(bootstrap, cfg.release_topic(s.name), reader_conf)
        for s in cfg.statistics
    }
    events = list(synthetic_events(30, 40 * ROUNDS, seed=3))
    try:
        wait_for_first_release(worker, rd["views"])
        for i in range(ROUNDS):
            path = directory / f"round{i}.jsonl"
            path.write_bytes(b"\n".join(orjson.dumps(e) for e in events[i * 40 : (i + 1) * 40]))
            cli("produce", "--config", str(configs["producer"]), "--bootstrap", bootstrap,
                "--events", str(path), "--batch", str(1 + i % 2 * 7))  # fmt: skip
            time.sleep(TICK)
        wait_for_tick(worker, rd, math.floor(time.time() / TICK) + 1)
        worker.assert_running()
        releases = {name: r.records[:] for name, r in rd.items()}
        most = str(len(releases["views"]))
        tail = cli("tail", "views", "--config", str(configs["reader"]), "--bootstrap", bootstrap,
                   "--from-beginning", "--max", most, "--timeout", "60")  # fmt: skip
        log = directory / "events.jsonl"
        cli("export-log", "--config", str(configs["dpstream"]), "--bootstrap", bootstrap,
            "--out", str(log))  # fmt: skip
        replayed = cli("replay", "--config", str(configs["dpstream"]), "--events", str(log))
        lag = cli("lag", "--config", str(configs["dpstream"]), "--bootstrap", bootstrap)
    finally:
        for r in rd.values():
            r.close()
        stop_worker(proc)
    admin = AdminClient({**secured.admin_client_config(), "log_level": 0})
    groups = [g.group_id for g in admin.list_consumer_groups().result(timeout=30).valid]
    return {
        "groups": [g for g in groups if g.startswith(cfg.app_id)],
        "cfg": cfg,
        "events": events,
        "releases": releases,
        "tail": tail.encode().splitlines(),
        "log": log.read_bytes().splitlines(),
        "replayed": replayed.encode().splitlines(),
        "lag": lag,
        "worker_log": worker.log_path.read_text(errors="replace"),
    }


@pytest.fixture(scope="module", params=["SASL_SSL", "SSL"])
def secured_run(request, secure_kafka_broker, tmp_path_factory) -> dict:
    listener = request.param
    # Over SASL_SSL the kafka-acls commands of docs/security.md, through Kafka's own tool;
    # over mutual TLS the same list through the admin client (the plugin's way; faster).
    grant = "commands" if listener == "SASL_SSL" else "bindings"
    return run_secured(secure_kafka_broker, listener, tmp_path_factory.mktemp(listener), grant)


def test_least_privilege_releases_equal_the_truth_and_the_replay(secured_run):
    cfg = secured_run["cfg"]
    truth = truncated_counts(secured_run["log"], cfg)
    replayed: dict[str, list[bytes]] = {}
    for line in secured_run["replayed"]:
        replayed.setdefault(orjson.loads(line)["statistic"], []).append(line)
    busy = set()
    for name, raw in secured_run["releases"].items():
        released = deduplicated(name, raw)
        assert len(released) >= ROUNDS, name
        assert replayed[name][: len(released)] == released, name  # byte for byte
        for record in map(orjson.loads, released):
            assert record["value"] == truth[name].get(record["tick"], 0), (name, record["tick"])
            busy.add(record["value"])
    assert max(busy) > 0  # the events were counted, not only empty ticks


def test_every_event_produced_is_counted_once(secured_run):
    counted = [e for e in map(orjson.loads, secured_run["log"]) if "user_id" in e]
    assert len(counted) == len(secured_run["events"])
    key = lambda e: (e["user_id"], e["key"])  # noqa: E731
    assert sorted(map(key, counted)) == sorted(map(key, secured_run["events"]))


def test_tail_and_lag_work_as_their_principals(secured_run):
    assert secured_run["tail"] == secured_run["releases"]["views"]
    assert secured_run["lag"].splitlines()[-1] == "total lag: 0"
    # No right was missing on the way (a missing one is logged, then retried or fatal).
    denied = re.findall(r"(?:WARNING|ERROR|CRITICAL).*AUTHORIZATION", secured_run["worker_log"])
    assert denied == []


def test_every_consumer_group_is_the_apps(secured_run):
    """Faust's group too (its default is the app id itself, which the prefixed ACL on
    "<app_id>-" does not cover): one prefixed ACL covers them all."""
    app = secured_run["cfg"].app_id
    # tail reads through dpstream.client, which assigns partitions and joins no group.
    assert {f"{app}-worker", f"{app}-ingest"} <= set(secured_run["groups"])
    assert all(g.startswith(f"{app}-") for g in secured_run["groups"])


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_the_plugin_fixtures_on_the_secured_broker(dpstream_secure_pipeline, listener):
    zero_noise_count_of_clicks(lambda config: dpstream_secure_pipeline(config, listener=listener))


# ------------------------------------------------------------------------------ refusals


def refused_start(secured: SecureKafka, tmp_path: Path, listener: str, **changes: str):
    """A worker started with ``changes`` to the ``dpstream`` user's settings: its exit
    code, its output and how long it ran."""
    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    data["kafka"] = {**secured.kafka_section("dpstream", listener), **changes}  # type: ignore[arg-type]
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(data))
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, "worker", "--config", str(config), "--bootstrap", secured.bootstrap(listener)],  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_a_wrong_password_stops_the_worker_naming_the_setting(secure_kafka_broker, tmp_path):
    (tmp_path / "wrong").write_text("not-the-password\n")
    code, out, took = refused_start(
        secure_kafka_broker, tmp_path, "SASL_SSL", password_file=str(tmp_path / "wrong")
    )
    assert_one_refusal(code, out, took, "kafka.password_file: the broker refused the SCRAM-SHA-512")


def test_an_untrusted_ca_stops_the_worker_naming_the_setting(secure_kafka_broker, tmp_path):
    untrusted = str(secure_kafka_broker.certificates.untrusted_ca)
    for listener in ("SASL_SSL", "SSL"):
        code, out, took = refused_start(
            secure_kafka_broker, tmp_path, listener, ssl_cafile=untrusted
        )
        assert_one_refusal(code, out, took, "kafka.ssl_cafile: the broker's certificate is not")


def test_a_refused_client_certificate_stops_the_worker_naming_the_setting(
    secure_kafka_broker, tmp_path
):
    certs = secure_kafka_broker.certificates
    expired, key = certs.expired
    code, out, took = refused_start(
        secure_kafka_broker, tmp_path, "SSL", ssl_certfile=str(expired), ssl_keyfile=str(key)
    )
    assert_one_refusal(code, out, took, "kafka.ssl_certfile: the certificate")
    assert "expired on 2020-01-02" in out
    # One the broker refuses for itself: signed by a CA it does not trust.
    foreign, key = certs.untrusted_client
    code, out, took = refused_start(
        secure_kafka_broker, tmp_path, "SSL", ssl_certfile=str(foreign), ssl_keyfile=str(key)
    )
    assert_one_refusal(code, out, took, "kafka.ssl_certfile: the broker refused the client")


def assert_one_refusal(code: int, out: str, took: float, message: str) -> None:
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # no retry storm, no traceback, no log line
    assert lines[0].startswith(f"dpstream: config error: {message}"), out
    assert took < 20, took  # within seconds: the worker's start takes about 2


def test_a_plaintext_client_is_refused(secure_kafka_broker):
    for bootstrap in (secure_kafka_broker.sasl_bootstrap, secure_kafka_broker.ssl_bootstrap):
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=3)


def test_a_principal_without_acls_may_not_create_its_topics(secure_kafka_broker, tmp_path):
    from dpstream.operators.errors import DpStreamError

    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    data["kafka"] = secure_kafka_broker.kafka_section("reader")
    cfg = parse_config(data)
    assert check_connection(cfg.kafka, secure_kafka_broker.sasl_bootstrap) == 1
    with pytest.raises(DpStreamError, match="may not create it"):
        ensure_topics(cfg, secure_kafka_broker.sasl_bootstrap)


# ------------------------------------------------------------------------------ the CLI


def test_broker_start_secure_prints_settings_that_connect(tmp_path, monkeypatch):
    """The command a user runs: its sections are valid configs, the password is in none of
    them (only the variable and the file that holds it), and both connect."""
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path))  # the CLI's and this process's
    try:
        out = cli("broker", "start", "--secure", timeout=180)
        again = cli("broker", "start", "--secure")
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in out.splitlines()
            if line.startswith("export ")
        )
        # Each section follows a comment line saying what it is.
        sections = [yaml.safe_load(p.split("\n", 1)[1])["kafka"] for p in out.split("\n# ")[1:]]
        password_file = Path(exports["DPSTREAM_KAFKA_PASSWORD"][len('"$(cat ') : -len(')"')])
        password = password_file.read_text().strip()
        monkeypatch.setenv("DPSTREAM_KAFKA_PASSWORD", password)
        sasl, mtls = (KafkaSecurityConfig(**s) for s in sections)
        assert check_connection(sasl, exports["KAFKA_BOOTSTRAP_SERVERS"], timeout=10) == 1
        mtls_bootstrap = out.split("# or over mutual TLS (bootstrap ")[1].split(")")[0]
        assert check_connection(mtls, mtls_bootstrap, timeout=10) == 1
        granted = grant_with_the_cli(tmp_path, sections[0])
    finally:
        cli("broker", "stop")
    assert "already running" in again
    assert granted
    assert sasl.password_env == "DPSTREAM_KAFKA_PASSWORD" and sasl.password_file is None
    assert password not in out
    assert mtls.security_protocol == "SSL" and mtls.ssl_certfile is not None


def grant_with_the_cli(tmp_path: Path, kafka: dict) -> bool:
    """``dpstream acls --apply`` for a pipeline's worker: its ACLs are then on the broker."""
    data = unique_names(pipeline_config({"mode": "insecure_zero"}))
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({**data, "kafka": kafka}))
    out = cli("acls", "--config", str(config), "--apply", "--reader", "", "--producer", "")
    cfg = parse_config(data)
    node = SecureKafka.found_in(broker.running_detached())
    admin = AdminClient({**node.admin_client_config(), "log_level": 0})
    found = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:dpstream", None,
        AclOperation.ANY, AclPermissionType.ANY)).result(timeout=30)  # fmt: skip
    expected = bindings(cfg, Principals("User:dpstream"))
    return out.startswith("granted 6 ACL commands") and set(found) >= set(expected)


# ------------------------------------------------------------------------------ the rename


def group_offsets(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    request = [ConsumerGroupTopicPartitions(group)]
    found = admin.list_consumer_group_offsets(request)[group].result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions if tp.offset >= 0}


def commit(secured: SecureKafka, group: str, offsets: list[TopicPartition]) -> None:
    """Commit ``offsets`` for ``group`` as the admin, with a consumer: it waits for the
    group coordinator of a new broker, where the admin client's call can hang (librdkafka
    stops looking for the coordinator after three tries, and destroying that client later
    blocks)."""
    consumer = Consumer({**secured.admin_client_config(), "group.id": group, "log_level": 0})
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def test_the_former_worker_groups_offsets_are_taken_over_once(secure_kafka_broker, caplog):
    """A worker of a version whose Faust group was the app id goes on where it stopped."""
    secured = secure_kafka_broker
    admin = AdminClient({**secured.admin_client_config(), "log_level": 0})

    def app_with_former_offsets(user: str, offset: int):
        data = unique_names(pipeline_config({"mode": "insecure_zero"}))
        cfg = parse_config({**data, "kafka": secured.kafka_section("admin")})
        ensure_topics(cfg, secured.sasl_bootstrap)
        former = [TopicPartition(t, p, offset + p) for t in (cfg.events_topic, cfg.stage2_topic)
                  for p in range(PARTITIONS)]  # fmt: skip
        commit(secured, cfg.app_id, former)
        return parse_config({**data, "kafka": secured.kafka_section(user)})

    caplog.set_level(logging.INFO, "dpstream.pipeline.kafka.topics")
    cfg = app_with_former_offsets("admin", 0)
    adopt_former_worker_offsets(cfg, secured.sasl_bootstrap)
    taken = group_offsets(admin, group_id(cfg.app_id, "worker"))
    assert taken == group_offsets(admin, cfg.app_id) and len(taken) == 2 * PARTITIONS
    assert f"took over the offsets of {cfg.app_id}" in caplog.text
    # Once: a group that has offsets keeps them.
    commit(secured, cfg.app_id, [TopicPartition(cfg.events_topic, 0, 99)])
    adopt_former_worker_offsets(cfg, secured.sasl_bootstrap)
    assert group_offsets(admin, group_id(cfg.app_id, "worker")) == taken
    # Under least privilege the former group is not the worker's to see: the worker reads
    # its topics from their start.
    cfg = app_with_former_offsets("dpstream", 5)
    for future in admin.create_acls(bindings(cfg, Principals("User:dpstream"))).values():
        future.result(timeout=30)
    adopt_former_worker_offsets(cfg, secured.sasl_bootstrap)
    assert group_offsets(admin, group_id(cfg.app_id, "worker")) == {}
    assert "were not taken over" not in caplog.text
