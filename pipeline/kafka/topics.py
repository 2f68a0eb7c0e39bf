"""Topic layout and creation (confluent-kafka admin)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from dpstream.config.schema import ConfigError, KafkaSecurityConfig, PipelineConfig

from .client_logs import error_callback
from .security import confluent_config

log = logging.getLogger(__name__)


COMPACTED = {"cleanup.policy": "compact"}
TIMESTAMP_TYPE = "message.timestamp.type"

# The Faust tables of pipeline/worker/app.py; Faust names their changelogs
# <app_id>-<table>-changelog.
TABLES = ("stage1", "stage2")


def changelog_topics(cfg: PipelineConfig) -> list[str]:
    return [f"{cfg.app_id}-{table}-changelog" for table in TABLES]


def topic_plan(cfg: PipelineConfig) -> dict[str, int]:
    """Every topic dpstream writes, with its partitions (the source topics are read only)."""
    plan = {cfg.events_topic: cfg.input.partitions, cfg.stage2_topic: cfg.input.partitions}
    # Created here, not lazily by Faust: right after a lazy creation the worker's metadata
    # may still show 0 partitions, and Faust then crashes the agent (PartitionsMismatch).
    plan.update(dict.fromkeys(changelog_topics(cfg), cfg.input.partitions))
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

    A source topic that does not exist yet is created with ``input.partitions`` partitions
    and the broker's defaults (a new pipeline's first run); one that exists is never
    touched, whatever its partitions and settings."""
    client = admin(bootstrap, cfg.kafka)
    existing = client.list_topics(timeout=timeout).topics
    plan = topic_plan(cfg)
    _check_partitions(existing, (cfg.events_topic, cfg.stage2_topic, *changelog_topics(cfg)), plan)
    if cfg.outputs.ledger_topic in existing:
        check_ledger_topic(client, cfg.outputs.ledger_topic, timeout)
    _check_timestamps(client, cfg, existing, timeout)
    plan.update({t: cfg.input.partitions for t in cfg.input.topics if t not in existing})
    if only is not None:
        plan = {name: n for name, n in plan.items() if name in set(only)}
    return _create_missing(client, cfg, existing, plan, timeout)


def ensure_ingest_topics(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> None:
    """What a stand-alone ``dpstream ingest`` checks at start: the events topic has
    ``input.partitions`` partitions (else a ConfigError naming the field: its envelopes
    would go to partitions whose stage 1 does not own their users). The topics it writes,
    the events and dead-letter topics, are created as the worker creates them when they
    do not exist yet; no other."""
    client = admin(bootstrap, cfg.kafka)
    existing = client.list_topics(timeout=timeout).topics
    plan = {cfg.events_topic: cfg.input.partitions, cfg.outputs.dead_letter_topic: 1}
    _check_partitions(existing, (cfg.events_topic,), plan)
    _create_missing(client, cfg, existing, plan, timeout)


def _check_partitions(existing: dict, names: Iterable[str], plan: dict[str, int]) -> None:
    for name in names:
        if name in existing and len(existing[name].partitions) != plan[name]:
            raise ConfigError(
                f"input.partitions: topic {name!r} has {len(existing[name].partitions)} "
                f"partitions, the config says {plan[name]}"
            )


def _create_missing(
    client: AdminClient, cfg: PipelineConfig, existing: dict, plan: dict[str, int], timeout: float
) -> list[str]:
    """Create the topics of ``plan`` that do not exist, each with its settings; returns
    their names."""
    configs: dict[str, dict[str, str]] = dict.fromkeys(changelog_topics(cfg), COMPACTED)
    for name, kind in timestamp_types(cfg).items():
        configs[name] = {TIMESTAMP_TYPE: kind}
    configs[cfg.outputs.ledger_topic] = {
        **configs.get(cfg.outputs.ledger_topic, {}),
        **LEDGER_CONFIG,
    }
    missing = [
        NewTopic(n, p, 1, config=configs.get(n, {})) for n, p in plan.items() if n not in existing
    ]
    if not missing:
        return []
    for name, future in client.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: a concurrent worker won
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
