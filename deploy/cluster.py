"""A three-broker KRaft cluster from Kafka's jars, whose brokers a test can kill and restart.

Combined mode: each of the three JVMs is a broker and a controller, and the three
controllers form the metadata quorum (static voters). One controller and three brokers
would be four JVMs on machines that have two cores, and would test less: a node killed here
may be the active controller, whose loss the quorum of the other two survives, as a
production quorum of three controllers does. Kafka advises dedicated controllers for
production clusters; for what dpstream is tested against (partition leaders, the group
coordinator and the controller moving while data flows) the layout is the same.

Replication as production sets it for every topic: replication factor 3,
``min.insync.replicas`` 2, so a write acknowledged by ``acks=all`` is on two brokers and one
broker may be lost without stopping writes. A killed broker is fenced, and its partitions
get new leaders, after ``broker.session.timeout.ms`` (3 s here, 9 s by default).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .broker import (
    BROKER_DEFAULTS,
    BrokerError,
    LocalKafka,
    _cluster_id,
    _free_ports,
    _write_properties,
    fetch_jars,
    wait_for_metadata,
)

logger = logging.getLogger(__name__)

SIZE = 3

CLUSTER_DEFAULTS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
}
"""Over :data:`~dpstream.deploy.broker.BROKER_DEFAULTS`: three replicas, two in sync."""


def cluster_settings(
    node_id: int, ports: Sequence[tuple[int, int]], log_dir: Path
) -> dict[str, str]:
    """Node ``node_id``'s settings (1-based), ``ports``: every node's (client, controller)."""
    port, controller_port = ports[node_id - 1]
    voters = ",".join(f"{i}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports, start=1))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        **BROKER_DEFAULTS,
        **CLUSTER_DEFAULTS,
    }


@dataclass
class KafkaCluster:
    """Three brokers (see the module docstring) on loopback, data in a temp dir.

    Attributes:
        nodes: The brokers' JVMs; ``nodes[i]`` is node ``i + 1``.
        base: Holds ``node<id>/`` (each with its ``server.properties``, log and data).
        cluster_id: The KRaft cluster id every node was formatted with.
    """

    nodes: list[LocalKafka]
    base: Path
    cluster_id: str
    owns_base: bool = True
    _jars: Path = field(default_factory=Path, repr=False)
    _down: set[int] = field(default_factory=set, repr=False)  # killed on purpose

    @property
    def bootstrap(self) -> str:
        """Every broker's address, for ``bootstrap.servers``."""
        return ",".join(node.bootstrap for node in self.nodes)

    @classmethod
    def start(cls, *, size: int = SIZE, timeout: float = 120.0) -> KafkaCluster:
        """Format and start ``size`` nodes; wait until the metadata lists all of them.

        Raises:
            BrokerError: A node exited or the cluster did not form in time.
        """
        jars = fetch_jars()
        base = Path(tempfile.mkdtemp(prefix="dpstream-kafka-cluster-")).resolve()
        free = _free_ports(2 * size)
        ports = [(free[2 * i], free[2 * i + 1]) for i in range(size)]
        cluster = cls([], base, _cluster_id(), True, jars)
        started = time.monotonic()
        try:
            for node_id in range(1, size + 1):
                node_dir = base / f"node{node_id}"
                node_dir.mkdir()
                settings = cluster_settings(node_id, ports, node_dir / "data")
                _write_properties(node_dir / "server.properties", settings)
                cluster.nodes.append(LocalKafka.launch(jars, node_dir, False, cluster.cluster_id))
            cluster.wait_for_brokers(size, timeout)
        except BaseException:
            cluster.stop()
            raise
        atexit.register(cluster._atexit_stop)
        logger.info(
            "Kafka cluster of %d up at %s in %.1f s",
            size,
            cluster.bootstrap,
            time.monotonic() - started,
        )
        return cluster

    def wait_for_brokers(self, count: int, timeout: float = 60.0) -> None:
        """Wait until the metadata lists ``count`` brokers (every live node's JVM running).

        Raises:
            BrokerError: A node that should run exited, or not in time.
        """

        def running() -> None:
            for node_id, node in enumerate(self.nodes, start=1):
                if node_id not in self._down:
                    node.check_running()

        wait_for_metadata(self.bootstrap, timeout, brokers=count, check=running)

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id - 1]

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id`` (a crash); its data stays for :meth:`restart`."""
        self.node(node_id).kill()
        self._down.add(node_id)
        logger.info("killed Kafka node %d", node_id)

    def restart(self, node_id: int, timeout: float = 60.0) -> None:
        """Start node ``node_id`` again on its data and ports; wait until it is listed."""
        node = self.node(node_id)
        if node.is_alive():
            raise BrokerError(f"Kafka node {node_id} is running")
        node = LocalKafka.launch(self._jars, node.data_dir, False, self.cluster_id)
        self.nodes[node_id - 1] = node
        self._down.discard(node_id)
        # Its own answer first: the others may still list it from before the kill.
        node.wait_ready(timeout, brokers=len(self.nodes))
        logger.info("restarted Kafka node %d", node_id)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node at once (one by one, the last would wait for a quorum that is
        gone); remove the data. Safe to call twice."""
        atexit.unregister(self._atexit_stop)
        live = [node for node in self.nodes if node.is_alive()]
        if live:
            with ThreadPoolExecutor(len(live)) as pool:
                list(pool.map(lambda node: node.stop(timeout=timeout), live))
        if self.owns_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=10.0)
