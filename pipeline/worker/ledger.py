"""The ledger at worker start: read it back, check this config against it, state the runs.

The ledger topic (``outputs.ledger_topic``) keeps every record a pipeline writes: at each
worker start a *statement* (the privacy statement, each statistic's identity and run, the
source topics, the key commitment), then from stage 2 each statistic's *start* (its run's
first released tick) and its expenditures. It never expires and is never compacted
(``topics.check_ledger_topic``): it is what one user has lost, for good.

Every record carries the app id, the key commitment and a MAC under the pipeline's key
(``pipeline.keys``): a record that names this app but is not authenticated by its key was
not written by it (forged, or another key's: refused at start). Records of other app ids
are other pipelines' statements (``cross_pipeline``).

Runs. A statistic's *run* is the life of its stage-2 state under one identity: a random
run id, stated in the first statement that lists the statistic, continued by later starts
with the same fingerprint, and begun anew only when the ledger says so (``charge_again``:
the old run stays charged, the new one is charged too). Noise is scoped by the run id, so
two deployments of one app (a second cluster, a recovery site) draw independent noise,
and stage 2 refuses a state of another run, another key, or one that is gone after its
run released (``stages.Stage2``). Concurrent first starts each propose a run id; the
first statement in the log wins, and each worker re-reads the ledger after writing its
own to adopt it.

Glue only: the accountant (``operators.accounting``) composes and decides.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import orjson
from confluent_kafka import KafkaException

from dpstream.config.base import ConfigError
from dpstream.config.schema import PipelineConfig
from dpstream.operators import accounting
from dpstream.statistics import releases
from dpstream.statistics.identity import identity_parameters
from dpstream.statistics.registry import with_mechanisms
from dpstream.statistics.releases import RunIdentity

from ..kafka.clients import make_producer, read_topic, tools_group
from ..stages.stage2_state import StatisticRun
from .keys import PipelineKey

log = logging.getLogger(__name__)

LOG_HEADER = "dpstream_log"
"""The first line of an exported log (``export.py``): the runs replay draws under."""


class LedgerRefused(ConfigError):
    """The ledger holds what this worker must not start under (another key, a forged
    record, a concurrent start with other parameters); the message says what to do."""


@dataclass(frozen=True)
class Run:
    """One run of a statistic as the ledger states it."""

    name: str
    fingerprint: str
    parameters: dict[str, Any]
    run_id: str
    charge: accounting.Charge | None


@dataclass
class History:
    """What the ledger says of this app and of the pipelines beside it.

    Attributes:
        statements: this app's statements, authenticated, in log order.
        starts: (statistic, run id) -> the tick of the run's first release.
        others: app id -> the latest statement of another pipeline in this ledger topic.
    """

    statements: list[dict[str, Any]] = field(default_factory=list)
    starts: dict[tuple[str, str], int] = field(default_factory=dict)
    others: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_records(
    cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0
) -> list[tuple[int, Any]]:
    """The ledger topic's records as (offset, decoded JSON or None), oldest first."""
    return [(offset, entry) for offset, _, entry in read_timed_records(cfg, bootstrap, timeout)]


def read_timed_records(
    cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0
) -> list[tuple[int, int, Any]]:
    """The ledger topic's records as (offset, timestamp in ms, decoded JSON or None),
    oldest first: the timestamp is the one the writer set (CreateTime)."""
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
    out: list[tuple[int, int, Any]] = []
    for offset, _, value, timestamp in records.get(0, []):
        try:
            out.append((offset, timestamp, orjson.loads(value or b"")))
        except orjson.JSONDecodeError:
            out.append((offset, timestamp, None))  # not ours
    return out


def history_of(
    cfg: PipelineConfig, records: Iterable[tuple[int, Any]], key: PipelineKey | None
) -> History:
    """This app's authenticated history and the other pipelines' statements.

    Args:
        cfg: the pipeline.
        records: the ledger topic's records (``read_records``).
        key: the pipeline's key; None reads without authenticating (``export-log``
            without a key: what it copies is then checked where the log is replayed).

    Raises:
        LedgerRefused: a record names this app but another key's commitment (the key
            changed), or its MAC does not verify (not written by this pipeline).
    """
    out = History()
    topic = cfg.outputs.ledger_topic
    for offset, entry in records:
        if not isinstance(entry, dict):
            continue
        app = entry.get("app_id")
        if app != cfg.app_id:
            if entry.get("event") == "statement" and isinstance(app, str):
                out.others[app] = entry
            continue
        if key is not None:
            _authenticate(entry, key, f"{topic}@{offset}", cfg.app_id)
        event = entry.get("event")
        if event == "statement":
            out.statements.append(entry)
        elif event == "start":
            out.starts.setdefault((entry["statistic"], entry["run_id"]), entry["start_tick"])
    return out


def _authenticate(entry: Mapping[str, Any], key: PipelineKey, where: str, app: str) -> None:
    commitment = entry.get("key_commitment")
    if commitment != key.commitment:
        raise LedgerRefused(
            f"noise: the ledger record {where} of app_id {app!r} was written under another "
            f"noise key (commitment {commitment!r}, this key's {key.commitment!r}). A changed "
            "key re-draws the noise of every released node, so the worker does not start: "
            "restore the key, or run the pipeline under a new app_id (what the old one spent "
            "stays spent)"
        )
    if not key.verify(entry):
        raise LedgerRefused(
            f"outputs.ledger_topic: the ledger record {where} names app_id {app!r} but its "
            "MAC does not verify under this pipeline's key: this pipeline did not write it "
            "(forged, or corrupt). Find out who can write the ledger topic "
            "(docs/security.md); the worker does not start on a ledger it cannot trust"
        )


def runs_of(
    statements: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, Run], dict[tuple[str, str], accounting.Charge], dict[str, set[str]]]:
    """Replay the statements: (each statistic's current run, the charges of runs no longer
    current by (statistic, run id), the earlier run ids of each statistic begun anew).

    A statistic's first statement begins its run; a later one with the same fingerprint
    continues it (another run id there is a concurrent start's proposal: the first
    wins); one that lists it in ``new_runs`` begins a new run and retires the old; one
    with another fingerprint is a start that was refused (it never ran). Every
    statement's ``retired`` list counts too, so the latest statement alone still holds
    every charge."""
    runs: dict[str, Run] = {}
    retired: dict[tuple[str, str], accounting.Charge] = {}
    replaced: dict[str, set[str]] = {}
    for entry in statements:
        charges = {c["statistic"]: c for c in entry.get("statistics", [])}
        renewed = set(entry.get("new_runs", []))
        for name, identity in entry.get("identities", {}).items():
            charge = charges.get(name)
            run = Run(
                name,
                identity["fingerprint"],
                identity["parameters"],
                identity["run_id"],
                None if charge is None else _charge(charge, identity["run_id"]),
            )
            old = runs.get(name)
            if old is None:
                runs[name] = run
            elif name in renewed and old.run_id != run.run_id:
                if old.charge is not None:
                    retired[(name, old.run_id)] = old.charge
                replaced.setdefault(name, set()).add(old.run_id)
                runs[name] = run
        for charge_json in entry.get("retired", []):
            charge = accounting.Charge.from_json(charge_json)
            assert charge.run_id is not None  # every retired charge names its run
            current = runs.get(charge.statistic)
            if current is None or current.run_id != charge.run_id:
                retired[(charge.statistic, charge.run_id)] = charge
    return runs, retired, replaced


def ran_statistics(history: History) -> dict[str, dict[str, Any]]:
    """Each statistic's parameters as the ledger recorded them for its current run (its
    ``identity_parameters``'s ``statistic``): what ``registry.with_mechanisms`` keeps a
    statistic that names no mechanism running on (the tree it ran, not a new default)."""
    runs, _, _ = runs_of(history.statements)
    return {name: run.parameters.get("statistic", {}) for name, run in runs.items()}


def _charge(obj: Mapping[str, Any], run_id: str) -> accounting.Charge:
    return accounting.Charge.from_json({**obj, "run_id": run_id})


@dataclass(frozen=True)
class Plan:
    """What a worker starts under: the statement and each configured statistic's run."""

    statement: accounting.PrivacyStatement
    runs: dict[str, StatisticRun]
    new_runs: tuple[str, ...] = ()


def plan(
    cfg: PipelineConfig,
    history: History,
    key: PipelineKey,
    charge_again: Iterable[str] = (),
) -> Plan:
    """This config's runs and statement under ``history``.

    Args:
        cfg: the pipeline.
        history: the ledger's (``history_of``).
        key: the pipeline's key (its commitment goes into each run).
        charge_again: statistics to begin anew: their old runs stay charged, the new
            ones are charged too (``dpstream ledger --charge-again``).

    Raises:
        ConfigError: a statistic changed under its name (naming the changed field), or
            the total with what ran before is above ``privacy.total_epsilon``.
    """
    runs, retired, replaced = runs_of(history.statements)
    again = set(charge_again)
    unknown = again - {s.name for s in cfg.statistics}
    if unknown:
        raise ConfigError(f"--charge-again: not a statistic of this config: {sorted(unknown)}")
    current: dict[str, StatisticRun] = {}
    for i, stat in enumerate(cfg.statistics):
        params = identity_parameters(stat, cfg)
        old = runs.get(stat.name)
        if old is not None and old.fingerprint != accounting.fingerprint(params):
            changed = accounting.changed_fields(old.parameters, params)
            raise ConfigError(
                f"{_field(i, changed)}: statistic {stat.name!r} ran under app_id "
                f"{cfg.app_id!r} with other parameters ({', '.join(changed)} changed). A "
                "changed statistic is a new statistic: give it a new name (what the old one "
                "spent stays charged)"
            )
        earlier = frozenset(replaced.get(stat.name, set()))
        if old is None or stat.name in again:
            if old is not None and old.charge is not None:
                retired[(stat.name, old.run_id)] = old.charge
                earlier |= {old.run_id}
            current[stat.name] = StatisticRun(new_run_id(), key.commitment, None, earlier)
        else:
            start = history.starts.get((stat.name, old.run_id))
            current[stat.name] = StatisticRun(old.run_id, key.commitment, start, earlier)
    for name, run in runs.items():
        if name not in current and run.charge is not None:
            retired[(name, run.run_id)] = run.charge
    charged = [
        charge
        for (name, run_id), charge in sorted(retired.items())
        if _not_current(name, run_id, current)
    ]
    try:
        statement = cfg.privacy_statement(tuple(charged))
    except accounting.StatementError as exc:
        raise ConfigError(f"{exc} (including what ran before under this app_id)") from None
    return Plan(statement, current, tuple(sorted(again)))


def _not_current(name: str, run_id: str, current: Mapping[str, StatisticRun]) -> bool:
    run = current.get(name)
    return run is None or run.run_id != run_id


def new_run_id() -> str:
    """A run id: 128 random bits, hex."""
    return secrets.token_hex(16)


# Pipeline-wide parameters of a statistic's identity, by their config field.
_PIPELINE_FIELDS = {
    "app_id": "app_id",
    "neighbours": "privacy.neighbours",
    "public_counts": "privacy.public_counts",
    "partitions": "input.partitions",
    "interval_seconds": "ticks.interval_seconds",
    "user_id_field": "input.user_id_field",
    "noise_mode": "noise.mode",
}


def _field(index: int, changed: list[str]) -> str:
    """The config field of the first changed parameter of ``statistics[index]``."""
    first = changed[0] if changed else "statistic.name"
    if first.startswith("statistic."):
        return f"statistics[{index}].{first.removeprefix('statistic.')}"
    if first.startswith("algorithm") or first == "noise_sampler":
        return f"statistics[{index}] (its algorithm's version: {first})"
    return _PIPELINE_FIELDS.get(first, first)


def statement_entry(cfg: PipelineConfig, plan: Plan, key: PipelineKey) -> dict[str, Any]:
    """The ledger record of a worker start, signed: the statement, each statistic's
    identity and run, the runs begun anew, the sources and the privacy unit."""
    identities: dict[str, RunIdentity] = {}
    for stat in cfg.statistics:
        params = identity_parameters(stat, cfg)
        identities[stat.name] = {
            "fingerprint": accounting.fingerprint(params),
            "parameters": params,
            "run_id": plan.runs[stat.name].run_id,
        }
    entry = releases.statement_entry(cfg, plan.statement, identities, plan.new_runs)
    return signed(entry, cfg, key)


def signed(entry: Mapping[str, Any], cfg: PipelineConfig, key: PipelineKey) -> dict[str, Any]:
    """A ledger record as the pipeline writes it: its app id, the key commitment, its MAC."""
    return key.sign({**entry, "app_id": cfg.app_id, "key_commitment": key.commitment})


def cross_pipeline(
    cfg: PipelineConfig, statement: accounting.PrivacyStatement, history: History
) -> list[str]:
    """The pipelines of this ledger topic that read a source topic of ``cfg``: refuse the
    mix of public counts and whole users, and the sum of their totals above
    ``privacy.cross_pipeline_epsilon``; return lines describing the composition.

    Raises:
        ConfigError: a pipeline over a shared source of the other relation, or a sum above
            the declared cross-pipeline limit.
    """
    sources = set(cfg.input.topics)
    total = statement.per_user_total
    lines, per_epoch = [], statement.per_epoch
    for app, other in sorted(history.others.items()):
        shared = sources & set(other.get("sources", []))
        if not shared:
            continue
        listed = ", ".join(sorted(shared))
        if bool(other.get("public_counts")) != cfg.privacy.public_counts:
            raise ConfigError(
                f"privacy.public_counts: pipeline {app!r} reads {listed} too, with "
                f"public_counts: {str(bool(other.get('public_counts'))).lower()}; a "
                "public-counts pipeline publishes exactly what a whole-user pipeline "
                "protects, so the two cannot read one source (docs/security.md)"
            )
        spent = Fraction(repr(float(other.get("per_user_total", 0.0))))
        total += spent
        per_epoch = per_epoch or bool(other.get("per_epoch"))
        unit = other.get("user_id_field")
        note = "" if unit == cfg.input.user_id_field else f" (privacy unit {unit!r}: another)"
        lines.append(f"pipeline {app!r} reads {listed}: {float(spent):g}{note}")
    if not lines:
        return []
    unit = " per accounting epoch (some are per epoch)" if per_epoch else ""
    lines.append(
        f"pipelines over these sources together: one user can lose at most {float(total):g}"
        f"{unit} (basic composition over pipelines)"
    )
    limit = cfg.privacy.cross_pipeline_epsilon
    if limit is not None and total > Fraction(repr(limit)):
        raise ConfigError(
            f"privacy.cross_pipeline_epsilon: the pipelines reading {', '.join(sorted(sources))} "
            f"spend {float(total):g} together, more than {limit:g}: " + "; ".join(lines[:-1])
        )
    return lines


def record_statement(
    cfg: PipelineConfig,
    bootstrap: str,
    key: PipelineKey,
    charge_again: Iterable[str] = (),
    lost_state: Iterable[str] = (),
) -> Plan:
    """Check this config against the ledger, write its statement, and adopt the runs the
    ledger settles on (a concurrent start may have stated a run first).

    ``lost_state``: the stage tables whose changelog topics did not exist before this
    start: a statistic whose run has released is then refused (its state is gone).
    """
    history = history_of(cfg, read_records(cfg, bootstrap), key)
    chosen = plan(cfg, history, key, charge_again)
    refuse_lost_state(cfg, chosen, lost_state)
    # Without a declared limit, the sum over pipelines is a warning (docs/security.md).
    level = logging.INFO if cfg.privacy.cross_pipeline_epsilon is not None else logging.WARNING
    for line in cross_pipeline(cfg, chosen.statement, history):
        log.log(level, "%s", line)
    producer = make_producer(bootstrap, cfg.kafka)
    producer.produce(
        cfg.outputs.ledger_topic,
        key=cfg.app_id.encode(),
        value=orjson.dumps(statement_entry(cfg, chosen, key)),
    )
    if producer.flush(30) != 0:
        raise ConfigError(
            f"outputs.ledger_topic: could not write the statement to {cfg.outputs.ledger_topic}"
        )
    adopted = adopt(cfg, history_of(cfg, read_records(cfg, bootstrap), key), chosen)
    for line in adopted.statement.describe():
        log.info("%s", line)
    return adopted


def adopt(cfg: PipelineConfig, history: History, chosen: Plan) -> Plan:
    """The runs the ledger settled on, now that this start's statement is in it: the
    first statement of a run wins over a concurrent start's proposal.

    Raises:
        LedgerRefused: a concurrent start stated a statistic with other parameters first.
    """
    runs, _, _ = runs_of(history.statements)
    out = {}
    for stat in cfg.statistics:
        mine, settled = chosen.runs[stat.name], runs[stat.name]
        if settled.fingerprint != accounting.fingerprint(identity_parameters(stat, cfg)):
            raise LedgerRefused(
                f"statistics ({stat.name}): another worker of app_id {cfg.app_id!r} started "
                "at the same time with other parameters for it, and stated them first; "
                "a changed statistic is a new statistic: give it a new name"
            )
        start = history.starts.get((stat.name, settled.run_id), mine.start_tick)
        out[stat.name] = StatisticRun(settled.run_id, mine.key_commitment, start, mine.replaces)
    return Plan(chosen.statement, out, chosen.new_runs)


def resolved_config(cfg: PipelineConfig, bootstrap: str, key: PipelineKey) -> PipelineConfig:
    """``cfg`` with each unnamed mechanism resolved against the ledger: the tree a
    statistic ran, or a new statistic's default (``registry.with_mechanisms``)."""
    return with_mechanisms(cfg, ran_statistics(history_of(cfg, read_records(cfg, bootstrap), key)))


def refuse_lost_state(cfg: PipelineConfig, chosen: Plan, lost: Iterable[str]) -> None:
    released = sorted(name for name, run in chosen.runs.items() if run.start_tick is not None)
    lost = sorted(lost)
    if released and lost:
        raise LedgerRefused(
            f"statistics {released} have released under their current runs, but the "
            f"topics {lost} that hold their state do not exist (deleted?): starting them "
            "again would release the same data under fresh noise. Restore the topics, or "
            "begin them anew, charged again: dpstream ledger --config ... --charge-again "
            + " ".join(released)
        )
