"""pipeline/topics.py without a broker: names, the plan, replication and its warnings.
(On a real broker: ensure_topics in every integration test, three replicas on a cluster in
tests/integration/test_cluster.py, the former group's offsets in test_secure.py.)"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from dpstream.config.schema import parse_config
from dpstream.pipeline.kafka import topics
from dpstream.pipeline.kafka.topics import (
    group_id,
    replication,
    topic_plan,
)

CFG = parse_config(
    {
        "app_id": "prod",
        "input": {"topics": ["clicks"], "partitions": 3},
        "privacy": {"total_epsilon": 2.0},
        "statistics": [
            {"name": "a", "epsilon": 1.0, "tau": 2},
            {"name": "b", "epsilon": 1.0, "tau": 2},
        ],
    }
)


def test_the_plan_holds_every_topic_dpstream_writes_and_faust_would_create():
    assert topic_plan(CFG) == {
        "prod-events": 3,
        "prod-stage2": 3,
        "prod-stage1-changelog": 3,
        "prod-stage2-changelog": 3,
        "prod-__assignor-__leader": 1,  # Faust's leader election (the public clock's holder)
        "dp.a": 1,
        "dp.b": 1,
        "dpstream.dead-letter": 1,
        "dpstream.ledger": 1,
    }
    assert "clicks" not in topic_plan(CFG)  # the source is the users', read only


def test_every_internal_name_starts_with_the_app_id_and_a_dash():
    internal = [CFG.events_topic, CFG.stage2_topic, *CFG.changelog_topics, CFG.leader_topic]
    groups = [group_id(CFG.app_id, role) for role in ("worker", "ingest", "tools", "tail-a")]
    for name in internal + groups:
        assert name.startswith("prod-"), name
    assert topics.former_worker_group(CFG) == "prod"  # Faust's default: not under "prod-"


@pytest.mark.parametrize(
    ("brokers", "expected"), [(0, (1, 1)), (1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (9, (3, 2))]
)
def test_replication_is_three_and_two_in_sync_where_the_cluster_has_the_brokers(brokers, expected):
    assert replication(brokers) == expected


def metadata(brokers: int, replicas: dict[str, int]) -> SimpleNamespace:
    """What AdminClient.list_topics answers, as far as the warnings read it."""
    partition = lambda n: SimpleNamespace(replicas=list(range(n)))  # noqa: E731
    return SimpleNamespace(
        brokers=dict.fromkeys(range(brokers)),
        topics={
            t: SimpleNamespace(partitions={0: partition(n), 1: partition(n)})
            for t, n in replicas.items()
        },
    )


def test_a_small_cluster_and_an_under_replicated_topic_are_warned_about(caplog):
    caplog.set_level(logging.WARNING, "dpstream.pipeline.kafka.topics")
    topics._warn_under_replicated(CFG, metadata(3, {"prod-events": 3, "dp.a": 3}))
    assert caplog.records == []
    topics._warn_under_replicated(CFG, metadata(3, {"prod-events": 1, "clicks": 1}))
    assert [r.getMessage() for r in caplog.records] == [
        "topic prod-events has 1 replica(s) where the cluster allows 3: under-replicated "
        "(add replicas with kafka-reassign-partitions)"
    ]  # the source topic is the users' business
    caplog.clear()
    topics._warn_under_replicated(CFG, metadata(1, {}))
    assert "the cluster has 1 broker(s): dpstream's new topics get replication factor 1" in (
        caplog.records[0].getMessage()
    )


class Admin:
    """An AdminClient's list_topics, the topics appearing after ``appear_after`` calls."""

    def __init__(self, existing: set[str], later: set[str] = frozenset(), appear_after: int = 0):
        self.existing, self.later, self.appear_after, self.calls = existing, later, appear_after, 0

    def list_topics(self, timeout: float) -> SimpleNamespace:
        self.calls += 1
        shown = self.existing | (self.later if self.calls > self.appear_after else set())
        return SimpleNamespace(topics=dict.fromkeys(shown))


def with_sources(*names: str, wait: float = 0.0):
    return parse_config(
        {
            "input": {"topics": list(names), "wait_for_topics_seconds": wait},
            "privacy": {"total_epsilon": 1.0},
            "statistics": [{"name": "a", "epsilon": 1.0, "tau": 2}],
        }
    )


def test_a_missing_source_topic_stops_the_start_naming_input_topics(monkeypatch):
    # Before, ensure_topics created it (6 partitions from a typo) and the worker released
    # pure noise from an empty topic.
    monkeypatch.setattr(topics, "admin", lambda *a: Admin({"clicks"}))
    with pytest.raises(topics.ConfigError) as raised:
        topics.check_source_topics(with_sources("clicks", "clikcs"), "b:9092")
    assert str(raised.value).startswith(
        "input.topics: source topic 'clikcs' does not exist (1 of 2 missing: clikcs); "
        "dpstream never creates source topics"
    )
    topics.check_source_topics(with_sources("clicks"), "b:9092")  # present: no error


def test_input_wait_for_topics_seconds_waits_for_a_source_created_later(monkeypatch, caplog):
    admin = Admin(set(), later={"clicks"}, appear_after=2)
    monkeypatch.setattr(topics, "admin", lambda *a: admin)
    monkeypatch.setattr(topics, "SOURCE_POLL_SECONDS", 0.01)
    with caplog.at_level(logging.WARNING):
        topics.check_source_topics(with_sources("clicks", wait=30), "b:9092")
    assert admin.calls == 3
    assert [r.getMessage() for r in caplog.records] == [
        "input.topics: waiting up to 30 s for clicks"
    ]
    monkeypatch.setattr(topics, "admin", lambda *a: Admin(set()))
    with pytest.raises(topics.ConfigError, match="'clicks' does not exist after waiting 0.05 s"):
        topics.check_source_topics(with_sources("clicks", wait=0.05), "b:9092")


def test_dpstreams_own_topic_creation_never_includes_a_source(monkeypatch):
    created: list[str] = []

    def create(client, cfg, metadata, plan, timeout):
        created.extend(name for name in plan if name not in metadata.topics)
        return created

    metadata = SimpleNamespace(topics={}, brokers={1: None})
    admin = SimpleNamespace(list_topics=lambda timeout: metadata)
    monkeypatch.setattr(topics, "admin", lambda *a: admin)
    monkeypatch.setattr(topics, "_create_missing", create)
    monkeypatch.setattr(topics, "_check_timestamps", lambda *a: None)
    topics.ensure_topics(CFG, "b:9092")
    assert "clicks" not in created and set(created) == set(topic_plan(CFG))
    created.clear()
    topics.create_source_topics(CFG, "b:9092")  # the producer tools' and the test kit's
    assert created == ["clicks"]
