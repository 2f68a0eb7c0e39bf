"""Topic layout and creation (confluent-kafka admin)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from dpstream.config.schema import ConfigError, KafkaSecurityConfig, PipelineConfig

from .kafka_security import confluent_config

log = logging.getLogger(__name__)


COMPACTED = {"cleanup.policy": "compact"}

# The Faust tables of pipeline/app.py; Faust names their changelogs <app_id>-<table>-changelog.
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


def admin(bootstrap: str, security: KafkaSecurityConfig | None = None) -> AdminClient:
    conf: dict[str, str | int] = {"bootstrap.servers": bootstrap, "log_level": 0}
    return AdminClient({**conf, **confluent_config(security or KafkaSecurityConfig())})


def ensure_topics(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> None:
    """Create dpstream's missing topics; stop with a ConfigError if one has the wrong shape.

    A source topic that does not exist yet is created with ``input.partitions`` partitions
    and the broker's defaults (a new pipeline's first run); one that exists is never
    touched, whatever its partitions and settings."""
    client = admin(bootstrap, cfg.kafka)
    existing = client.list_topics(timeout=timeout).topics
    plan = topic_plan(cfg)
    _check_partitions(existing, (cfg.events_topic, cfg.stage2_topic, *changelog_topics(cfg)), plan)
    plan.update({t: cfg.input.partitions for t in cfg.input.topics if t not in existing})
    _create_missing(client, cfg, existing, plan, timeout)


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
) -> None:
    configs: dict[str, dict[str, str]] = dict.fromkeys(changelog_topics(cfg), COMPACTED)
    # The broker stamps the events topic's records, so a tick marker's time cannot be
    # forged (records.check_marker_time).
    configs[cfg.events_topic] = {"message.timestamp.type": "LogAppendTime"}
    missing = [
        NewTopic(n, p, 1, config=configs.get(n, {})) for n, p in plan.items() if n not in existing
    ]
    if not missing:
        return
    for name, future in client.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: a concurrent worker won
                raise
        log.info("created topic %s", name)
