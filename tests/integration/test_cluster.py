"""dpstream on a three-broker cluster (the plugin's ``kafka_cluster``) that loses a broker:
its topics get three replicas and ``min.insync.replicas`` 2; the broker leading events and
changelog partitions is SIGKILLed mid-stream and restarted, and the worker, never
restarted, loses and doubles nothing: zero-noise releases equal the truncated counts of the
exported log, the log holds every event produced once, and the releases equal its replay."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

import orjson
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from dpstream.deploy.cluster import KafkaCluster
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.kafka.topics import topic_plan
from dpstream.pipeline.tools.export import export_log
from dpstream.pipeline.tools.synthetic import synthetic_events
from tests.integration.support import (
    TICK,
    deduplicated,
    pipeline_config,
    readers,
    replayed_releases,
    truncated_counts,
    wait_for_first_release,
    wait_for_tick,
    worker_pool,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PARTITIONS = 3  # with three brokers, each leads one partition of each topic
BEFORE, DOWN, AFTER = 4.0, 10.0, 4.0  # seconds of traffic around the kill and the restart


def leaders(cluster: KafkaCluster, topics: list[str]) -> dict[str, dict[int, int]]:
    """Per topic, partition -> the node id of its leader."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    metadata = admin.list_topics(timeout=30).topics
    return {t: {p: m.leader for p, m in metadata[t].partitions.items()} for t in topics}


def new_leaders(
    cluster: KafkaCluster, topics: list[str], gone: int, timeout: float = 30.0
) -> dict[str, dict[int, int]]:
    """The leaders once no partition of ``topics`` is led by ``gone`` or leaderless (-1),
    or as they stand after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = leaders(cluster, topics)
        led = {leader for partitions in found.values() for leader in partitions.values()}
        if not led & {gone, -1} or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def replicas(
    cluster: KafkaCluster, topics: list[str]
) -> dict[str, tuple[set[int], dict[str, str]]]:
    """Per topic: the replica counts of its partitions, and its configuration."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    metadata = admin.list_topics(timeout=30).topics
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    configs = {r.name: f.result(timeout=30) for r, f in admin.describe_configs(resources).items()}
    return {
        t: (
            {len(p.replicas) for p in metadata[t].partitions.values()},
            {name: entry.value for name, entry in configs[t].items()},
        )
        for t in topics
    }


class Traffic(threading.Thread):
    """Rounds of events, one per tick, through dpstream's producer until stopped."""

    def __init__(self, bootstrap: str, cfg) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.cfg = bootstrap, cfg
        self.sent: list[dict] = []
        self.stopped = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            producer = make_producer(self.bootstrap)
            events = synthetic_events(40, 1_000_000, seed=5)
            while not self.stopped.is_set():
                batch = [next(events) for _ in range(25)]
                produce_events(producer, self.cfg, batch, batch=1 + len(self.sent) % 2 * 4)
                self.sent += batch
                time.sleep(TICK)
            assert producer.flush(60) == 0
        except BaseException as exc:
            self.failure = exc


@pytest.fixture(scope="module")
def cluster_run(kafka_cluster, tmp_path_factory):
    """A zero-noise worker on the cluster; traffic; the leader of events partition 0 killed
    and, after DOWN seconds, restarted; the releases up to the tick after the traffic."""
    bootstrap = kafka_cluster.bootstrap
    data = pipeline_config({"mode": "insecure_zero"})
    data["input"] = {**data["input"], "partitions": PARTITIONS}
    with worker_pool(bootstrap, tmp_path_factory.mktemp("cluster")) as start:
        worker = start(data)
        cfg = worker.cfg
        rd = readers(bootstrap, worker)
        try:
            wait_for_first_release(worker, rd["views"])
            watched = [cfg.events_topic, *cfg.changelog_topics]
            before = leaders(kafka_cluster, watched)
            victim = before[cfg.events_topic][0]
            traffic = Traffic(bootstrap, cfg)
            traffic.start()
            time.sleep(BEFORE)
            kafka_cluster.kill(victim)
            killed = time.monotonic()
            try:
                # Its partitions get new leaders once the controller has fenced it (3 s of
                # session timeout; more where it was the active controller, whose quorum
                # elects another first); then releases go on while it is down.
                during = new_leaders(kafka_cluster, watched, victim)
                moved = time.monotonic() - killed
                names = [s.name for s in cfg.statistics]
                halfway = {name: len(rd[name].drain()) for name in names}
                time.sleep(DOWN / 2)
                down = {name: len(rd[name].drain()) for name in names}
            finally:
                kafka_cluster.restart(victim)
            time.sleep(AFTER)
            traffic.stopped.set()
            traffic.join(120)
            assert traffic.failure is None, traffic.failure
            wait_for_tick(worker, rd, math.floor(time.time() / TICK) + 1)
            worker.assert_running()  # never restarted: the same process all along
            yield {
                "cfg": cfg,
                "victim": victim,
                "before": before,
                "during": during,
                "moved": moved,
                "released_while_down": {name: down[name] - halfway[name] for name in down},
                "sent": traffic.sent,
                "releases": {s.name: rd[s.name].records[:] for s in cfg.statistics},
                "dead": rd["_dead"].drain(),
                "log": list(export_log(cfg, bootstrap)),
                "replayed": replayed_releases(cfg, bootstrap),
                "replicas": replicas(kafka_cluster, list(topic_plan(cfg))),
            }
        finally:
            for r in rd.values():
                r.close()


def test_dpstreams_topics_have_three_replicas_two_in_sync(cluster_run):
    for topic, (counts, config) in cluster_run["replicas"].items():
        assert counts == {3}, topic
        assert config["min.insync.replicas"] == "2", topic


def test_the_changelogs_are_compacted_and_close_a_segment_every_ten_minutes(cluster_run):
    """Kafka compacts closed segments only (1 GiB or 7 days by default): without a
    segment.ms, a restore reads every write since the changelog began."""
    changelogs = cluster_run["cfg"].changelog_topics
    for topic, (_, config) in cluster_run["replicas"].items():
        if topic in changelogs:
            assert (config["cleanup.policy"], config["segment.ms"]) == ("compact", "600000")
        else:
            assert config["cleanup.policy"] == "delete", topic
            assert config["segment.ms"] == "604800000", topic  # the broker's default


def test_the_killed_broker_led_events_and_changelog_partitions(cluster_run):
    victim, before, during = cluster_run["victim"], cluster_run["before"], cluster_run["during"]
    live = {1, 2, 3} - {victim}
    for topic, partitions in before.items():
        assert victim in partitions.values(), topic  # it led a partition of every one
        assert set(during[topic].values()) <= live, topic  # others led them all meanwhile
    assert cluster_run["moved"] < 30


def test_releases_went_on_while_the_broker_was_down(cluster_run):
    """With one replica per partition they stop until it is back (its partitions have no
    leader), and the worker waits for them."""
    for name, count in cluster_run["released_while_down"].items():
        assert count >= DOWN / 2 / TICK / 2, name  # at least half the ticks of that time


def test_no_event_lost_or_counted_twice(cluster_run):
    def event(e: dict) -> tuple:
        return e["user_id"], e["key"], float(e["value"])

    logged = [e for e in map(orjson.loads, cluster_run["log"]) if "user_id" in e]
    assert Counter(map(event, logged)) == Counter(map(event, cluster_run["sent"]))
    assert cluster_run["dead"] == []
    cfg = cluster_run["cfg"]
    truth = truncated_counts(cluster_run["log"], cfg)
    for name, raw in cluster_run["releases"].items():
        released = [orjson.loads(r) for r in deduplicated(name, raw)]
        assert len(released) >= (BEFORE + DOWN + AFTER) / TICK, name
        for record in released:
            assert record["value"] == truth[name].get(record["tick"], 0), (name, record["tick"])
    assert max(truth["views"].values()) > 0


def test_the_releases_equal_the_replay(cluster_run):
    for name, raw in cluster_run["releases"].items():
        released = deduplicated(name, raw)
        assert cluster_run["replayed"][name][: len(released)] == released, name
