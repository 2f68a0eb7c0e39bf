"""dpstream's topics and consumer groups: their names, layout, replication and creation
(confluent-kafka admin).

Every topic and consumer group dpstream makes for itself is named ``<app_id>-...`` (the
events and stage-2 topics, Faust's changelogs and its leader topic, the worker's, the
ingest's and the tools' groups), so one prefixed ACL of each kind covers them
(docs/security.md, ``pipeline/acls.py``). The topics a user names (sources, releases, dead
letters, ledger) are granted by name.
"""

from __future__ import annotations

import logging

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from dpstream.config.schema import ConfigError, KafkaSecurityConfig, PipelineConfig
from dpstream.operators.errors import DpStreamError

from .kafka_security import confluent_config

log = logging.getLogger(__name__)


COMPACTED = {"cleanup.policy": "compact"}

# The Faust tables of pipeline/app.py; Faust names their changelogs <app_id>-<table>-changelog.
TABLES = ("stage1", "stage2")

PRODUCTION_REPLICAS = 3
"""Replicas of dpstream's topics where the cluster has the brokers (min.insync.replicas 2)."""


def changelog_topics(cfg: PipelineConfig) -> list[str]:
    return [f"{cfg.app_id}-{table}-changelog" for table in TABLES]


def leader_topic(cfg: PipelineConfig) -> str:
    """Faust's leader-election topic (one partition; its holder runs the public clock)."""
    return f"{cfg.app_id}-__assignor-__leader"


def group_id(app_id: str, role: str) -> str:
    """The consumer group of one of dpstream's consumers: ``<app_id>-<role>``.

    Roles: ``worker`` (Faust's stage agents), ``ingest`` (the source topics), ``tools``
    (export-log, the ledger and hole reads: assigned partitions, no commits) and
    ``tail-<statistic>`` (``dpstream tail``).
    """
    return f"{app_id}-{role}"


def former_worker_group(cfg: PipelineConfig) -> str:
    """The worker's group before it was ``<app_id>-worker``: Faust's default, the app id."""
    return cfg.app_id


def topic_plan(cfg: PipelineConfig) -> dict[str, int]:
    """Every topic dpstream writes, with its partitions (the source topics are read only)."""
    plan = {cfg.events_topic: cfg.input.partitions, cfg.stage2_topic: cfg.input.partitions}
    # Created here, not lazily by Faust: right after a lazy creation the worker's metadata
    # may still show 0 partitions, and Faust then crashes the agent (PartitionsMismatch).
    # Faust creates no topic that exists already, so it needs no Create right either.
    plan.update(dict.fromkeys(changelog_topics(cfg), cfg.input.partitions))
    plan[leader_topic(cfg)] = 1
    for stat in cfg.statistics:
        plan[cfg.release_topic(stat.name)] = 1  # one partition: releases stay in tick order
    plan[cfg.outputs.dead_letter_topic] = 1
    plan[cfg.outputs.ledger_topic] = 1
    return plan


def replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of dpstream's topics on a cluster of
    ``brokers`` brokers: 3 and 2 where it has three or more (a write is acknowledged by two
    replicas, and one broker may be lost without stopping writes), else one replica per
    broker and 1."""
    factor = max(1, min(PRODUCTION_REPLICAS, brokers))
    return factor, 2 if factor >= PRODUCTION_REPLICAS else 1


def admin(bootstrap: str, security: KafkaSecurityConfig | None = None) -> AdminClient:
    conf: dict[str, str | int] = {"bootstrap.servers": bootstrap, "log_level": 0}
    return AdminClient({**conf, **confluent_config(security or KafkaSecurityConfig())})


def ensure_topics(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> int:
    """Create dpstream's missing topics; stop with a ConfigError if one has the wrong shape.

    New topics get the replication the cluster allows (:func:`replication`), with a warning
    where that is below :data:`PRODUCTION_REPLICAS` and for existing topics of dpstream
    with fewer replicas than that. A source topic that does not exist yet is created with
    ``input.partitions`` partitions and the broker's defaults (a new pipeline's first run);
    one that exists is never touched, whatever its partitions and settings.

    Returns:
        The replication factor of new topics (for Faust's ``topic_replication_factor``).

    Raises:
        ConfigError: An events, stage-2 or changelog topic with other partitions.
        DpStreamError: The principal may not create a missing topic (naming it).
    """
    client = admin(bootstrap, cfg.kafka)
    metadata = client.list_topics(timeout=timeout)
    existing = metadata.topics
    factor, min_insync = replication(len(metadata.brokers))
    plan = topic_plan(cfg)
    for name in (cfg.events_topic, cfg.stage2_topic, *changelog_topics(cfg)):
        if name in existing and len(existing[name].partitions) != plan[name]:
            raise ConfigError(
                f"input.partitions: topic {name!r} has {len(existing[name].partitions)} "
                f"partitions, the config says {plan[name]}"
            )
    _warn_under_replicated(cfg, metadata, factor)
    configs: dict[str, dict[str, str]] = dict.fromkeys(changelog_topics(cfg), COMPACTED)
    # The broker stamps the events topic's records, so a tick marker's time cannot be
    # forged (records.check_marker_time).
    configs[cfg.events_topic] = {"message.timestamp.type": "LogAppendTime"}
    missing = [
        NewTopic(
            n, p, factor, config={**configs.get(n, {}), "min.insync.replicas": str(min_insync)}
        )
        for n, p in plan.items()
        if n not in existing
    ]
    missing += [_new_source(cfg, t, factor) for t in cfg.input.topics if t not in existing]
    _create(client, missing, timeout)
    return factor


def ensure_sources(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> None:
    """Create the source topics that do not exist yet (``dpstream produce`` on a new
    pipeline): a producer needs no right on dpstream's own topics."""
    client = admin(bootstrap, cfg.kafka)
    metadata = client.list_topics(timeout=timeout)
    factor, _ = replication(len(metadata.brokers))
    new = [_new_source(cfg, t, factor) for t in cfg.input.topics if t not in metadata.topics]
    _create(client, new, timeout)


def _new_source(cfg: PipelineConfig, topic: str, factor: int) -> NewTopic:
    return NewTopic(topic, cfg.input.partitions, factor)


def _create(client: AdminClient, topics: list[NewTopic], timeout: float) -> None:
    if not topics:
        return
    for name, future in client.create_topics(topics, operation_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent worker won
                continue
            if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise DpStreamError(
                    f"kafka: topic {name!r} does not exist and this principal may not create "
                    "it: create it, or grant Create on it (docs/security.md, `dpstream acls`)"
                ) from None
            raise
        log.info("created topic %s", name)


def _warn_under_replicated(cfg: PipelineConfig, metadata: object, factor: int) -> None:
    brokers = len(metadata.brokers)  # type: ignore[attr-defined]
    if factor < PRODUCTION_REPLICAS:
        log.warning(
            "the cluster has %d broker(s): dpstream's new topics get replication factor %d, "
            "and a broker's loss loses their data or stops the pipeline (production: %d "
            "brokers, replication factor %d, min.insync.replicas 2)",
            brokers,
            factor,
            PRODUCTION_REPLICAS,
            PRODUCTION_REPLICAS,
        )
    topics = metadata.topics  # type: ignore[attr-defined]
    for name in topic_plan(cfg):
        if name in topics and topics[name].partitions:
            replicas = min(len(p.replicas) for p in topics[name].partitions.values())
            if replicas < factor:
                log.warning(
                    "topic %s has %d replica(s) where the cluster allows %d: under-replicated "
                    "(add replicas with kafka-reassign-partitions)",
                    name,
                    replicas,
                    factor,
                )


def adopt_former_worker_offsets(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> None:
    """Copy the committed offsets of the worker's former group (the app id, Faust's
    default) to ``<app_id>-worker`` once, when only the former exists: a worker upgraded
    from a version before the rename goes on where the old one stopped instead of reading
    its topics again from their start. That re-read is what happens where the copy fails or
    the principal may not see the former group (grant it Describe and Read on the group
    ``<app_id>`` until the first start to keep them): harmless, since stage 1 and stage 2
    drop what they have seen, but long."""
    client = admin(bootstrap, cfg.kafka)
    new, old = group_id(cfg.app_id, "worker"), former_worker_group(cfg)
    try:
        # Listing the groups needs no group coordinator: a new cluster, whose coordinator
        # is not loaded yet, answers at once (a new pipeline's common case).
        listed = client.list_consumer_groups(request_timeout=timeout).result(timeout)
        names = {group.group_id for group in listed.valid}
        if old not in names or new in names:
            return
        request = [ConsumerGroupTopicPartitions(old)]
        future = client.list_consumer_group_offsets(request, request_timeout=timeout)[old]
        ours = {cfg.events_topic, cfg.stage2_topic}
        former = [
            tp
            for tp in future.result().topic_partitions or ()
            if tp.offset >= 0 and tp.topic in ours
        ]
        if not former:
            return
        request = [ConsumerGroupTopicPartitions(new, former)]
        client.alter_consumer_group_offsets(request, request_timeout=timeout)[new].result(timeout)
    except (KafkaException, TimeoutError) as exc:
        reason = exc.args[0].name() if isinstance(exc, KafkaException) else "no answer"
        log.warning(
            "the offsets of the worker's former group %s were not taken over (%s): the worker "
            "reads its topics again from their start (counting nothing twice)",
            old,
            reason,
        )
        return
    log.info("the worker's group is now %s; took over the offsets of %s", new, old)
