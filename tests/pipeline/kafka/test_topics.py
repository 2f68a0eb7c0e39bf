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
