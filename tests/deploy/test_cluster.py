"""deploy/cluster.py without brokers: three nodes, each a broker and a controller, one
quorum, three replicas with two in sync. (Running: tests/integration/test_cluster.py.)"""

from __future__ import annotations

from pathlib import Path

from dpstream.deploy.cluster import cluster_settings

PORTS = [(9001, 9101), (9002, 9102), (9003, 9103)]


def test_each_node_is_a_voter_of_one_quorum():
    settings = [cluster_settings(n, PORTS, Path(f"/d{n}")) for n in (1, 2, 3)]
    voters = {s["controller.quorum.voters"] for s in settings}
    assert voters == {"1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"}
    assert [s["node.id"] for s in settings] == ["1", "2", "3"]
    assert settings[1]["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    assert settings[1]["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9002"
    assert all(s["process.roles"] == "broker,controller" for s in settings)


def test_every_topic_is_replicated_three_times_two_in_sync():
    settings = cluster_settings(1, PORTS, Path("/d"))
    assert settings["default.replication.factor"] == "3"
    assert settings["min.insync.replicas"] == "2"
    assert settings["offsets.topic.replication.factor"] == "3"
    assert settings["transaction.state.log.min.isr"] == "2"
    # A killed broker loses its partitions' leadership after 3 s, not 9.
    assert settings["broker.session.timeout.ms"] == "3000"
