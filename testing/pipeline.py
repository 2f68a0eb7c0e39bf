"""A dpstream worker under test: its config, its process, a producer and release readers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

if TYPE_CHECKING:  # pytest imports this module in every run: dpstream's own imports wait
    from dpstream.config.kafka import KafkaSecurityConfig
    from dpstream.config.schema import PipelineConfig
    from dpstream.deploy.secure_broker import Listener, SecureKafka

WAIT_SECONDS = 90.0
"""How long a read waits for releases: a worker's first release takes a few seconds."""


def unique_names(data: dict[str, Any]) -> dict[str, Any]:
    """The config with its own app id and topics, so tests can share one broker."""
    run = uuid.uuid4().hex[:8]
    data = {**data, "app_id": f"t-{run}"}
    data["input"] = {**data.get("input", {}), "topics": [f"t-{run}.events"]}
    data["outputs"] = {
        "release_topic_prefix": f"t-{run}.dp.",
        "dead_letter_topic": f"t-{run}.dead-letter",
        "ledger_topic": f"t-{run}.ledger",
    }
    return data


@dataclass(frozen=True)
class Access:
    """How a pipeline's clients reach a secured broker, least privilege: the worker's
    ``kafka:`` section (written into its config), the producer's and the reader's
    settings, and what readies the broker for a config (its source topics and ACLs)."""

    worker: dict[str, str]
    producer: KafkaSecurityConfig
    reader: KafkaSecurityConfig
    prepare: Callable[[PipelineConfig], None]


def secured_access(secured: SecureKafka, listener: Listener = "SASL_SSL") -> Access:
    """The users ``dpstream`` (worker), ``producer`` and ``reader`` of ``secured`` on
    ``listener``, granted exactly ``dpstream acls`` (``pipeline/acls.py``) for each config;
    the source topics are created by the admin, as a platform team would."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from dpstream.config.kafka import KafkaSecurityConfig
    from dpstream.pipeline.kafka.acls import Principals, bindings

    def prepare(cfg: PipelineConfig) -> None:
        admin = AdminClient({**secured.admin_client_config(), "log_level": 0})
        sources = [NewTopic(t, cfg.input.partitions, 1) for t in cfg.input.topics]
        for future in admin.create_topics(sources).values():
            try:
                future.result(timeout=30)
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
        principals = Principals("User:dpstream", "User:reader", "User:producer")
        for future in admin.create_acls(bindings(cfg, principals)).values():
            future.result(timeout=30)

    def section(user: str) -> KafkaSecurityConfig:
        return KafkaSecurityConfig(**secured.kafka_section(user, listener))

    return Access(
        worker=secured.kafka_section("dpstream", listener),
        producer=section("producer"),
        reader=section("reader"),
        prepare=prepare,
    )


@dataclass
class Pipeline:
    """One ``dpstream worker`` process on one config, with its clients.

    Attributes:
        cfg: The validated config (with the test's own app id and topics).
        config_path: The YAML file the worker runs on.
        log_path: The worker's log.
        bootstrap: The broker it talks to.
    """

    cfg: PipelineConfig
    config_path: Path
    log_path: Path
    bootstrap: str
    _env: dict[str, str] | None = field(default=None, repr=False)
    _access: Access | None = field(default=None, repr=False)
    _proc: Any = field(default=None, repr=False)
    _producer: Any = field(default=None, repr=False)
    _readers: dict[str, Any] = field(default_factory=dict, repr=False)
    _releases: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    @classmethod
    def start(
        cls,
        bootstrap: str,
        data: dict[str, Any],
        directory: Path,
        env: dict[str, str] | None,
        access: Access | None = None,
    ) -> Pipeline:
        """Write the config, create its topics and start the worker (on a secured broker:
        with ``access``, its ACLs granted first)."""
        from dpstream.config.schema import parse_config
        from dpstream.pipeline.kafka.topics import create_source_topics, ensure_topics

        data = unique_names(data)
        if access is not None:
            data["kafka"] = access.worker
        cfg = parse_config(data)
        if access is not None:
            access.prepare(cfg)
        config_path = directory / f"{cfg.app_id}.yaml"
        config_path.write_text(yaml.safe_dump(data), encoding="utf-8")
        # Topics first: events produced before the worker is up are not lost. The source
        # topics as a user's producer setup would make them (the worker never does).
        create_source_topics(cfg, bootstrap)
        ensure_topics(cfg, bootstrap)
        pipeline = cls(cfg, config_path, directory / f"{cfg.app_id}.log", bootstrap, env, access)
        pipeline.restart()
        return pipeline

    def restart(self) -> None:
        """Start the worker (again, after :meth:`kill` or :meth:`stop`) on the same config."""
        from dpstream.pipeline.worker.processes import spawn_worker

        if self.running():
            return
        self._proc = spawn_worker(self.config_path, self.bootstrap, self.log_path, self._env)

    def running(self) -> bool:
        """Whether the worker process runs."""
        return self._proc is not None and self._proc.poll() is None

    def produce(self, events: Iterable[dict[str, Any]]) -> int:
        """Send events (dicts with the user id at ``input.user_id_field``, ``key``, ...) to
        the source topic, keyed by that user id; flushed."""
        from dpstream.pipeline.kafka.clients import make_producer, produce_events

        if self._producer is None:
            producer = self._access.producer if self._access else self.cfg.kafka
            self._producer = make_producer(self.bootstrap, producer)
        sent = produce_events(self._producer, self.cfg, events)
        if self._producer.flush(30) != 0:
            raise AssertionError("events were not delivered within 30 s")
        return sent

    def releases(
        self,
        statistic: str,
        *,
        at_least: int = 1,
        until: Callable[[list[dict[str, Any]]], bool] | None = None,
        timeout: float = WAIT_SECONDS,
    ) -> list[dict[str, Any]]:
        """Every release of ``statistic`` read so far, in order, after waiting for
        ``at_least`` of them and, if given, until ``until(releases)`` holds.

        Raises:
            AssertionError: Not there within ``timeout``, or the worker exited (with the
                end of its log).
        """
        got = self._releases.setdefault(statistic, [])
        deadline = time.monotonic() + timeout
        while len(got) < at_least or (until is not None and not until(got)):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(got)} releases of {statistic} after {timeout:.0f} s\n{self.log_tail()}"
                )
            if self._proc is not None and self._proc.poll() is not None:
                raise AssertionError(f"the worker exited\n{self.log_tail()}")
            msg = self._reader(statistic).poll(0.25)
            if msg is not None and not msg.error():
                got.append(orjson.loads(msg.value()))
        return list(got)

    def _reader(self, statistic: str) -> Any:
        from confluent_kafka import Consumer, TopicPartition

        from dpstream.pipeline.kafka.security import confluent_config
        from dpstream.pipeline.kafka.topics import group_id

        if statistic not in self._readers:
            reader = self._access.reader if self._access else self.cfg.kafka
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    # Assigned, never committed; the reader's ACLs cover <app_id>-tail-.
                    "group.id": group_id(self.cfg.app_id, f"tail-test-{uuid.uuid4().hex[:8]}"),
                    "enable.auto.commit": False,
                    "log_level": 0,
                    **confluent_config(reader),
                }
            )
            # Release topics have one partition: read it from its start, in order.
            consumer.assign([TopicPartition(self.cfg.release_topic(statistic), 0, 0)])
            self._readers[statistic] = consumer
        return self._readers[statistic]

    def log_tail(self, lines: int = 40) -> str:
        """The end of the worker's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no worker log)"
        return "worker log:\n" + "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the worker (a crash); :meth:`restart` brings it back on the same config."""
        if self.running():
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> None:
        """Stop the worker cleanly and close the clients. Safe to call twice."""
        from dpstream.pipeline.worker.processes import stop_worker

        if self._proc is not None:
            stop_worker(self._proc)
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
