"""The privacy statement at worker start: check it against the ledger, then write it.

The ledger topic keeps every statement a pipeline (app id) has run under. Before a worker
starts, this module reads them back and hands the accountant (``operators.accounting``)
what it needs: a statistic whose parameters changed under its old name is refused (its
state and its published noise belong to the old parameters), and statistics that ran
before and are no longer configured stay charged (``retired``). Glue only: the
accountant composes and decides.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from confluent_kafka import KafkaException

from dpstream.config.schema import ConfigError, PipelineConfig
from dpstream.operators import accounting

from .clients import make_producer, read_topic, tools_group
from .stages import SCHEMA_VERSION

log = logging.getLogger(__name__)


def past_statements(
    cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The statements this app id wrote to its ledger topic, oldest first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = read_topic(
                bootstrap, cfg.outputs.ledger_topic, 1, security=cfg.kafka, group=tools_group(cfg)
            )
            break
        except KafkaException:
            # A topic created a moment ago may have no leader yet (NOT_LEADER, UNKNOWN).
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    out = []
    for _, _, value, _ in records.get(0, []):
        try:
            entry = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            continue  # not ours
        if (
            isinstance(entry, dict)
            and entry.get("event") == "statement"
            and entry.get("app_id") == cfg.app_id
        ):
            out.append(entry)
    return out


def checked_statement(
    cfg: PipelineConfig, past: list[dict[str, Any]]
) -> accounting.PrivacyStatement:
    """The statement this worker runs under, given the app id's ``past`` statements.

    Raises:
        ConfigError: a statistic's parameters changed under its name (the message names
            the changed fields), or the retired statistics' spend takes the total above
            ``privacy.total_epsilon``.
    """
    last: dict[str, dict[str, Any]] = {}  # name -> its latest run: parameters and charge
    for entry in past:
        charges = {c["statistic"]: c for c in entry.get("statistics", [])}
        for name, run in entry.get("identities", {}).items():
            last[name] = {**run, "charge": charges.get(name)}
    current = {s.name: i for i, s in enumerate(cfg.statistics)}
    retired = []
    for name, run in sorted(last.items()):
        i = current.get(name)
        if i is None:
            if run["charge"] is not None:
                retired.append(accounting.Charge.from_json(run["charge"]))
            continue
        params = cfg.statistic_parameters(cfg.statistics[i])
        if accounting.fingerprint(params) != run["fingerprint"]:
            changed = accounting.changed_fields(run["parameters"], params)
            raise ConfigError(
                f"{_field(i, changed)}: statistic {name!r} ran under app_id "
                f"{cfg.app_id!r} with other parameters ({', '.join(changed)} changed). A "
                "changed statistic is a new statistic: give it a new name (what the old one "
                "spent stays charged)"
            )
    try:
        return cfg.privacy_statement(tuple(retired))
    except accounting.StatementError as exc:
        raise ConfigError(f"{exc} (including what ran before under this app_id)") from None


# Pipeline-wide parameters of a statistic's identity, by their config field.
_PIPELINE_FIELDS = {
    "app_id": "app_id",
    "neighbours": "privacy.neighbours",
    "public_counts": "privacy.public_counts",
    "partitions": "input.partitions",
    "interval_seconds": "ticks.interval_seconds",
}


def _field(index: int, changed: list[str]) -> str:
    """The config field of the first changed parameter of ``statistics[index]``."""
    first = changed[0] if changed else "statistic.name"
    if first.startswith("statistic."):
        return f"statistics[{index}].{first.removeprefix('statistic.')}"
    return _PIPELINE_FIELDS.get(first, first)


def statement_entry(cfg: PipelineConfig, statement: accounting.PrivacyStatement) -> dict:
    """The ledger record of a worker start: the statement and each statistic's identity."""
    identities = {}
    for stat in cfg.statistics:
        params = cfg.statistic_parameters(stat)
        identities[stat.name] = {
            "fingerprint": accounting.fingerprint(params),
            "parameters": params,
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "event": "statement",
        **statement.to_json(),
        "identities": identities,
    }


def record_statement(cfg: PipelineConfig, bootstrap: str) -> accounting.PrivacyStatement:
    """Check this config against the ledger and write its statement there (worker start)."""
    statement = checked_statement(cfg, past_statements(cfg, bootstrap))
    producer = make_producer(bootstrap, cfg.kafka)
    producer.produce(
        cfg.outputs.ledger_topic,
        key=cfg.app_id.encode(),
        value=orjson.dumps(statement_entry(cfg, statement)),
    )
    if producer.flush(30) != 0:
        raise ConfigError(
            f"outputs.ledger_topic: could not write the statement to {cfg.outputs.ledger_topic}"
        )
    for line in statement.describe():
        log.info("%s", line)
    return statement
