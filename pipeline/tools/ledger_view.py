"""What the ledger says, read without writing anything: ``dpstream ledger`` (the statement
history, what each statistic spent, what is left) and ``dpstream check-config --live``
(what a worker starting on this config now would refuse).

Both read the ledger with the checks the worker's start runs (``worker/ledger.py``:
``history_of`` authenticates every record of this app under the key, ``plan`` refuses a
statistic changed in place and a total above ``privacy.total_epsilon`` with the retired
charges, ``cross_pipeline`` the pipelines over the same sources, ``refuse_lost_state`` a
released statistic whose state topics are gone; ``kafka/topics.py``:
``check_source_topics`` and ``check_ledger_topic``), and neither writes a record, creates
a topic or commits an offset: the check of a config is no start.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dpstream.config.base import ConfigError
from dpstream.config.schema import PipelineConfig
from dpstream.operators.accounting import Charge
from dpstream.statistics.registry import with_mechanisms

from ..kafka.security import check_connection
from ..kafka.topics import admin, check_ledger_topic, check_source_topics
from ..worker.keys import PipelineKey, load_key
from ..worker.ledger import (
    History,
    cross_pipeline,
    history_of,
    plan,
    ran_statistics,
    read_records,
    read_timed_records,
    refuse_lost_state,
    runs_of,
)


def live_check(cfg: PipelineConfig, bootstrap: str, timeout: float = 30.0) -> list[str]:
    """What a worker starting on ``cfg`` now would see, in lines; raises what it would
    refuse with (the same messages).

    Raises:
        ConfigError: no usable key, a refused connection, a missing source topic (one the
            config does not wait for), a ledger topic that could forget, a ledger record of
            another key or forged (``LedgerRefused``), a statistic changed in place, a
            total above ``privacy.total_epsilon`` with the retired charges, a pipeline over
            the same sources of the other relation or above the cross-pipeline limit, a
            released statistic whose state topics are gone.
    """
    key = load_key(cfg)  # as the worker: no key, no start
    brokers = check_connection(cfg.kafka, bootstrap)
    lines = [f"live check on {bootstrap} ({brokers} broker(s)): noise key loaded"]
    client = admin(bootstrap, cfg.kafka)
    existing = client.list_topics(timeout=timeout).topics
    missing = [t for t in cfg.input.topics if t not in existing]
    if missing and not cfg.input.wait_for_topics_seconds:
        check_source_topics(cfg, bootstrap, timeout)  # raises the worker's refusal
    if missing:
        wait = cfg.input.wait_for_topics_seconds
        lines.append(f"source topics {missing} missing: the worker waits up to {wait:g} s")
    ledger = cfg.outputs.ledger_topic
    history = History()
    if ledger in existing:
        check_ledger_topic(client, ledger, timeout)
        history = history_of(cfg, read_records(cfg, bootstrap, timeout), key)
    # A statistic that names no mechanism: the tree it ran, or a new one's default.
    cfg = with_mechanisms(cfg, ran_statistics(history))
    chosen = plan(cfg, history, key)
    refuse_lost_state(cfg, chosen, [t for t in cfg.changelog_topics if t not in existing])
    known = f"{len(history.statements)} statement(s) of app_id {cfg.app_id!r}"
    lines.append(f"ledger {ledger}: " + (known if ledger in existing else "not created yet"))
    lines += cross_pipeline(cfg, chosen.statement, history)
    lines += chosen.statement.describe()
    return lines


def ledger_report(cfg: PipelineConfig, bootstrap: str, key: PipelineKey) -> list[str]:
    """``dpstream ledger``: every statement of this app (when, what each statistic was
    charged, the total), what each statistic spent over its runs, and what is left of
    ``privacy.total_epsilon``; then what this config would start under, or why a worker
    would refuse it (``cfg`` with its mechanisms resolved: ``ledger.resolved_config``).

    Raises:
        LedgerRefused: a record of this app under another key, or forged.
    """
    timed = read_timed_records(cfg, bootstrap)
    history = history_of(cfg, [(offset, entry) for offset, _, entry in timed], key)
    when = {id(entry): stamp for _, stamp, entry in timed}
    lines = [f"ledger {cfg.outputs.ledger_topic}, app_id {cfg.app_id}:"]
    if not history.statements:
        return [*lines, "  no statement yet: no worker of this app has started"]
    lines.append("statements (the start of a worker, oldest first):")
    lines += [f"  {_statement_line(e, when.get(id(e), -1))}" for e in history.statements]
    lines += _spent_lines(history)
    latest = history.statements[-1]
    total, spent = float(latest["total_epsilon"]), float(latest["per_user_total"])
    unit = " per accounting epoch" if latest.get("per_epoch") else ""
    if "total_rho" in latest:  # zCDP: the budget is rho; the epsilon is at its delta
        rho, spent_rho = float(latest["total_rho"]), float(latest["rho_total"])
        lines.append(
            f"left: rho {rho - spent_rho:g} of total_rho={rho:g} (spent rho {spent_rho:g}, "
            f"({spent:.4g}, {latest['delta']:g})-DP; retired runs included: what a "
            "statistic spent stays spent)"
        )
    else:
        lines.append(
            f"left: {total - spent:g}{unit} of total_epsilon={total:g} (spent {spent:g}, "
            "retired runs included: what a statistic spent stays spent)"
        )
    try:
        chosen = plan(cfg, history, key)
    except ConfigError as exc:
        return [*lines, f"this config: a worker would refuse it: {exc}"]
    return [*lines, "this config:", *(f"  {line}" for line in chosen.statement.describe())]


def _statement_line(entry: Mapping[str, Any], stamp_ms: int) -> str:
    when = "time unknown" if stamp_ms < 0 else _utc(stamp_ms)
    charges = ", ".join(f"{c['statistic']} {_amount(c)}" for c in entry["statistics"])
    retired = sum(float(c["epsilon"]) for c in entry.get("retired", []))
    extra = f", retired runs {retired:g}" if retired else ""
    anew = f"; begun anew: {', '.join(entry['new_runs'])}" if entry.get("new_runs") else ""
    return (
        f"{when}: {charges}{extra}{anew} -> one user can lose at most "
        f"{float(entry['per_user_total']):g} of total_epsilon={float(entry['total_epsilon']):g}"
    )


def _amount(charge: Mapping[str, Any]) -> str:
    """A statement's charge: its epsilon, or under zCDP its rho."""
    if charge.get("rho") is not None:
        return f"rho {float(charge['rho']):g}"
    return f"{float(charge['epsilon']):g}"


def _spent_lines(history: History) -> list[str]:
    runs, retired, _ = runs_of(history.statements)
    zcdp = "total_rho" in history.statements[-1]
    lines = ["spent, by statistic (each run charged once" + (", in rho):" if zcdp else "):")]

    def spent(charge: Charge) -> float:  # zCDP adds rhos (a pure run as epsilon^2 / 2)
        return float(charge.as_rho if zcdp else charge.epsilon)

    for name, run in sorted(runs.items()):
        current = 0.0 if run.charge is None else spent(run.charge)
        earlier = {rid: spent(c) for (n, rid), c in retired.items() if n == name}
        start = history.starts.get((name, run.run_id))
        since = "not released yet" if start is None else f"released from tick {start}"
        listed = ", ".join(f"{rid} {eps:g}" for rid, eps in sorted(earlier.items()))
        more = f"; earlier runs: {listed}" if earlier else ""
        lines.append(
            f"  {name}: {current + sum(earlier.values()):g} (run {run.run_id}: "
            f"{current:g}, {since}{more})"
        )
    for (name, run_id), charge in sorted(retired.items()):
        if name not in runs:
            lines.append(f"  {name} (retired, run {run_id}): {spent(charge):g}")
    return lines


def _utc(stamp_ms: int) -> str:
    return datetime.fromtimestamp(stamp_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
