"""dpstream's topics and consumer groups: their names, layout, replication and creation
(confluent-kafka admin).

Every topic and consumer group dpstream makes for itself is named ``<app_id>-...`` (the
events and stage-2 topics, Faust's changelogs and its leader topic, the worker's, the
ingest's and the tools' groups), so one prefixed ACL of each kind covers them
(docs/security.md, ``pipeline/acls.py``). The topics a user names (sources, releases, dead
letters, ledger) are granted by name. The topics' names are the config's
(``PipelineConfig.named_topics``), whose validation refuses any two that collide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from dpstream.config.base import ConfigError
from dpstream.config.kafka import KafkaSecurityConfig
from dpstream.config.schema import PipelineConfig
from dpstream.operators.errors import DpStreamError

from .client_logs import error_callback
from .security import confluent_config

log = logging.getLogger(__name__)


# A changelog is compacted, but Kafka compacts only closed segments, and a segment closes at
# 1 GiB or after 7 days by default: until then a restore after a restart reads every write
# since the topic began (the soak's catch-up grew from 20 to 53 s in half an hour). A
# segment closed every 10 minutes keeps a restore to about the live entries and the last
# minutes' writes.
CHANGELOG_CONFIG = {"cleanup.policy": "compact", "segment.ms": str(10 * 60 * 1000)}
TIMESTAMP_TYPE = "message.timestamp.type"

PRODUCTION_REPLICAS = 3
"""Replicas of dpstream's topics where the cluster has the brokers (min.insync.replicas 2)."""


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
    plan.update(dict.fromkeys(cfg.changelog_topics, cfg.input.partitions))
    plan[cfg.leader_topic] = 1
    for stat in cfg.statistics:
        plan[cfg.release_topic(stat.name)] = 1  # one partition: releases stay in tick order
    plan[cfg.outputs.dead_letter_topic] = 1
    plan[cfg.outputs.ledger_topic] = 1
    return plan


def timestamp_types(cfg: PipelineConfig) -> dict[str, str]:
    """The timestamps dpstream's topics must keep. The broker stamps the events and
    stage-2 topics (LogAppendTime), so a tick or release marker cannot claim another time
    (records.check_marker_time); the release and ledger topics keep the one dpstream sets
    (CreateTime): the release deadline, which a broker's append time would replace with
    one that depends on when stage 2 got there."""
    out = dict.fromkeys((cfg.events_topic, cfg.stage2_topic), "LogAppendTime")
    for stat in cfg.statistics:
        out[cfg.release_topic(stat.name)] = "CreateTime"
    out[cfg.outputs.ledger_topic] = "CreateTime"
    return out


def replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of dpstream's topics on a cluster of
    ``brokers`` brokers: 3 and 2 where it has three or more (a write is acknowledged by two
    replicas, and one broker may be lost without stopping writes), else one replica per
    broker and 1."""
    factor = max(1, min(PRODUCTION_REPLICAS, brokers))
    return factor, 2 if factor >= PRODUCTION_REPLICAS else 1


def admin(bootstrap: str, security: KafkaSecurityConfig | None = None) -> AdminClient:
    conf: dict[str, str | int] = {"bootstrap.servers": bootstrap, "log_level": 0}
    return AdminClient(
        {**conf, **confluent_config(security or KafkaSecurityConfig())},
        error_cb=error_callback("admin", log),  # a callable: outside the stub's conf type
    )


# The ledger is what users have lost, for good: it never expires, and compaction (which
# keeps one record per key) would erase every statement but the last.
LEDGER_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


def missing_topics(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> list[str]:
    """dpstream's topics (``topic_plan``) that do not exist."""
    existing = admin(bootstrap, cfg.kafka).list_topics(timeout=timeout).topics
    return [name for name in topic_plan(cfg) if name not in existing]


def ensure_topics(
    cfg: PipelineConfig,
    bootstrap: str,
    timeout: float = 30.0,
    only: Iterable[str] | None = None,
) -> list[str]:
    """Create dpstream's missing topics (``only`` these, if given); stop with a
    ConfigError if one has the wrong shape or an existing ledger topic could forget.
    Returns the topics it created.

    New topics get the replication the cluster allows (:func:`replication`); when it checks
    them all (no ``only``), it warns where that is below :data:`PRODUCTION_REPLICAS` and
    for existing topics of dpstream with fewer replicas than the cluster allows. The source
    topics are the users': never created nor touched here (:func:`check_source_topics`).

    Raises:
        ConfigError: An events, stage-2 or changelog topic with other partitions, a ledger
            that could forget, other timestamps than dpstream needs.
        DpStreamError: The principal may not create a missing topic (naming it).
    """
    client = admin(bootstrap, cfg.kafka)
    metadata = client.list_topics(timeout=timeout)
    existing = metadata.topics
    plan = topic_plan(cfg)
    _check_partitions(existing, (cfg.events_topic, cfg.stage2_topic, *cfg.changelog_topics), plan)
    if cfg.outputs.ledger_topic in existing:
        check_ledger_topic(client, cfg.outputs.ledger_topic, timeout)
    _check_timestamps(client, cfg, existing, timeout)
    if only is None:
        _warn_under_replicated(cfg, metadata)
    if only is not None:
        plan = {name: n for name, n in plan.items() if name in set(only)}
    return _create_missing(client, cfg, metadata, plan, timeout)


def check_source_topics(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> None:
    """Stop unless every source topic (``input.topics``) exists, after waiting up to
    ``input.wait_for_topics_seconds`` for the missing ones. dpstream never creates them: a
    typo would otherwise make an empty topic, and the worker would release pure noise.

    Raises:
        ConfigError: A source topic is missing (naming ``input.topics`` and the topic).
    """
    client = admin(bootstrap, cfg.kafka)
    wait = cfg.input.wait_for_topics_seconds
    deadline = time.monotonic() + wait
    warned = False
    while True:
        existing = client.list_topics(timeout=timeout).topics
        missing = [t for t in cfg.input.topics if t not in existing]
        if not missing:
            return
        if time.monotonic() >= deadline:
            break
        if not warned:
            log.warning("input.topics: waiting up to %g s for %s", wait, ", ".join(missing))
            warned = True
        time.sleep(min(SOURCE_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
    after = f" after waiting {wait:g} s" if wait else ""
    raise ConfigError(
        f"input.topics: source topic {missing[0]!r} does not exist{after} "
        f"({len(missing)} of {len(cfg.input.topics)} missing: {', '.join(missing)}); "
        "dpstream never creates source topics: check the name, create the topic, or set "
        "input.wait_for_topics_seconds to wait for it"
    )


SOURCE_POLL_SECONDS = 2.0
"""How often :func:`check_source_topics` looks again for a source topic it waits for."""


def create_source_topics(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> list[str]:
    """Create the missing source topics with ``input.partitions`` partitions and the
    broker's defaults, as a user's producer setup would: for the tools that write events
    (``dpstream produce``, the demo, the test kit), never for the worker or the ingest.
    Returns the topics it created."""
    client = admin(bootstrap, cfg.kafka)
    metadata = client.list_topics(timeout=timeout)
    plan = {t: cfg.input.partitions for t in cfg.input.topics}
    return _create_missing(client, cfg, metadata, plan, timeout)


def ensure_ingest_topics(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> None:
    """What a stand-alone ``dpstream ingest`` checks at start: the events topic has
    ``input.partitions`` partitions (else a ConfigError naming the field: its envelopes
    would go to partitions whose stage 1 does not own their users). The topics it writes,
    the events and dead-letter topics, are created as the worker creates them when they
    do not exist yet; no other."""
    client = admin(bootstrap, cfg.kafka)
    metadata = client.list_topics(timeout=timeout)
    plan = {cfg.events_topic: cfg.input.partitions, cfg.outputs.dead_letter_topic: 1}
    _check_partitions(metadata.topics, (cfg.events_topic,), plan)
    _create_missing(client, cfg, metadata, plan, timeout)


def _check_partitions(existing: dict, names: Iterable[str], plan: dict[str, int]) -> None:
    for name in names:
        if name in existing and len(existing[name].partitions) != plan[name]:
            raise ConfigError(
                f"input.partitions: topic {name!r} has {len(existing[name].partitions)} "
                f"partitions, the config says {plan[name]}"
            )


def _create_missing(
    client: AdminClient, cfg: PipelineConfig, metadata: Any, plan: dict[str, int], timeout: float
) -> list[str]:
    """Create the topics of ``plan`` that do not exist, each with its settings and the
    replication the cluster allows; returns their names."""
    factor, min_insync = replication(len(metadata.brokers))
    ours = topic_plan(cfg)
    configs: dict[str, dict[str, str]] = dict.fromkeys(cfg.changelog_topics, CHANGELOG_CONFIG)
    for name, kind in timestamp_types(cfg).items():
        configs[name] = {TIMESTAMP_TYPE: kind}
    configs[cfg.outputs.ledger_topic] = {
        **configs.get(cfg.outputs.ledger_topic, {}),
        **LEDGER_CONFIG,
    }
    for name in ours:  # the sources are the users': the broker's defaults
        configs[name] = {**configs.get(name, {}), "min.insync.replicas": str(min_insync)}
    missing = [
        NewTopic(n, p, factor, config=configs.get(n, {}))
        for n, p in plan.items()
        if n not in metadata.topics
    ]
    if not missing:
        return []
    for name, future in client.create_topics(missing, operation_timeout=timeout).items():
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
    return [topic.topic for topic in missing]


def check_ledger_topic(client: AdminClient, topic: str, timeout: float = 30.0) -> None:
    """Refuse a ledger topic that could lose records: finite retention (time or size) or
    compaction; the message names the topic setting to change."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    (future,) = client.describe_configs([resource], request_timeout=timeout).values()
    settings = {name: entry.value for name, entry in future.result().items()}
    policy = settings.get("cleanup.policy") or "delete"
    if "compact" in policy.split(","):
        raise ConfigError(
            f"outputs.ledger_topic: topic {topic!r} has cleanup.policy={policy}: compaction "
            "keeps one record per key and would erase the ledger's history; set "
            "cleanup.policy=delete with retention.ms=-1 (kafka-configs --alter --entity-type "
            f"topics --entity-name {topic} --add-config cleanup.policy=delete,retention.ms=-1)"
        )
    for name in ("retention.ms", "retention.bytes"):
        value = settings.get(name)
        if value is not None and int(value) >= 0:
            raise ConfigError(
                f"outputs.ledger_topic: topic {topic!r} has {name}={value}: the ledger would "
                f"forget what users have lost; set {name}=-1 (kafka-configs --alter "
                f"--entity-type topics --entity-name {topic} --add-config {name}=-1)"
            )


def _check_timestamps(
    client: AdminClient, cfg: PipelineConfig, existing: dict, timeout: float
) -> None:
    """Stop with a ConfigError naming the topic and the setting when one of dpstream's
    existing topics keeps other timestamps than ``timestamp_types`` says (one created by
    an older dpstream, or by hand): changing it is the operator's call."""
    wanted = {name: kind for name, kind in timestamp_types(cfg).items() if name in existing}
    if not wanted:
        return
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in wanted]
    for resource, future in client.describe_configs(resources, request_timeout=timeout).items():
        have = future.result()[TIMESTAMP_TYPE].value
        need = wanted[resource.name]
        if have != need:
            raise ConfigError(
                f"topic {resource.name!r} has {TIMESTAMP_TYPE}={have}; dpstream needs {need} "
                "there (docs/design.md section 1): set it with kafka-configs.sh --alter "
                f"--entity-type topics --entity-name {resource.name} --add-config "
                f"{TIMESTAMP_TYPE}={need}"
            )


def _warn_under_replicated(cfg: PipelineConfig, metadata: Any) -> None:
    brokers = len(metadata.brokers)
    factor, _ = replication(brokers)
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
    topics = metadata.topics
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
