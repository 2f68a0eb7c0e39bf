"""The worker's metrics registry (pipeline/worker/metrics.py): its names against
docs/operations.md, and what each recording call does to the samples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dpstream.config.schema import parse_config
from dpstream.pipeline.ingest.consumer import IngestReport
from dpstream.pipeline.stages.drivers import (
    FOREIGN_RULES,
    Stage1Outcome,
    Stage2Outcome,
    statistics_by_partition,
)
from dpstream.pipeline.worker.metrics import (
    MAX_REASONS,
    OTHER_REASONS,
    WorkerMetrics,
    exposed_names,
    latency_buckets,
    reason_label,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
CFG = parse_config(
    {
        "app_id": "ops",
        "input": {"partitions": 2},
        "ticks": {"interval_seconds": 10},
        "noise": {"mode": "insecure_zero"},
        "privacy": {"total_epsilon": 2.0},
        "statistics": [
            {"name": "count", "epsilon": 0.5, "tau": 2},
            {"name": "other", "epsilon": 0.25, "tau": 2},
        ],
    }
)


def samples(metrics: WorkerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the registry exposes now: (name, sorted labels) -> value."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: WorkerMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


def test_every_metric_is_documented_and_every_documented_one_exists():
    documented = set(re.findall(r"^\| `(dpstream_\w+)` \|", DOCS.read_text(), re.MULTILINE))
    families = {m.name for m in WorkerMetrics(CFG).registry.collect()}
    counters = {m.name for m in WorkerMetrics(CFG).registry.collect() if m.type == "counter"}
    # prometheus_client names a counter's family without its ``_total``.
    exposed = {f"{name}_total" if name in counters else name for name in families}
    assert documented == exposed


def test_names_follow_prometheus_conventions():
    for metric in WorkerMetrics(CFG).registry.collect():
        assert metric.name.startswith("dpstream_")
        if metric.type == "histogram":
            assert metric.name.endswith("_seconds")
        if metric.type == "gauge":
            assert not metric.name.endswith("_total")
    names = exposed_names(WorkerMetrics(CFG).registry)
    assert {"dpstream_releases_total", "dpstream_release_latency_seconds_bucket"} <= names


def test_ingest_reports_are_totals_counted_once_each():
    metrics = WorkerMetrics(CFG)
    first = IngestReport(10, 8, {"input: not JSON": 2}, 1, {("src", 0): 5})
    metrics.ingest_report(first)
    metrics.ingest_report(first)  # the same totals again: nothing grew
    metrics.ingest_report(
        IngestReport(15, 12, {"input: not JSON": 2, "input: no user id": 1}, 1, {("src", 0): 0})
    )
    metrics.refresh(0.0, 0.1, {"event_loop": True})
    assert value(metrics, "dpstream_records_in_total", stage="ingest") == 15
    assert value(metrics, "dpstream_events_in_total", stage="ingest") == 12
    assert value(metrics, "dpstream_rebalances_total", consumer="ingest") == 1
    dead = {"stage": "ingest", "reason": "input: not JSON"}
    assert value(metrics, "dpstream_dead_letters_total", **dead) == 2
    dead["reason"] = "input: no user id"
    assert value(metrics, "dpstream_dead_letters_total", **dead) == 1
    assert value(metrics, "dpstream_ingest_lag_records", topic="src", partition="0") == 0
    # A total below the last one is a new ingest's, from zero: counted whole.
    metrics.ingest_report(IngestReport(3, 3, {}, 2, {}))
    assert value(metrics, "dpstream_events_in_total", stage="ingest") == 15
    assert value(metrics, "dpstream_rebalances_total", consumer="ingest") == 2


def test_values_clipped_and_rule_failures_are_counted_per_statistic_once_each():
    metrics = WorkerMetrics(CFG)
    tally = {("revenue", "clipped"): 3, ("revenue", "missing amount"): 2}
    report = IngestReport(10, 10, {}, 1, {}, tally)
    metrics.ingest_report(report)
    metrics.ingest_report(report)  # the same totals again: nothing grew
    metrics.ingest_report(IngestReport(12, 12, {}, 1, {}, {**tally, ("revenue", "clipped"): 4}))
    assert value(metrics, "dpstream_values_clipped_total", statistic="revenue") == 4
    failed = {"statistic": "revenue", "reason": "missing amount"}
    assert value(metrics, "dpstream_rule_failures_total", **failed) == 2


def test_reasons_are_labelled_without_foreign_fingerprints_and_bounded():
    foreign = f"{FOREIGN_RULES} (abc123, this stage 1's: def456)"
    assert reason_label(foreign) == FOREIGN_RULES
    assert reason_label("input: not JSON") == "input: not JSON"
    metrics = WorkerMetrics(CFG)
    metrics.stage1_record(0, Stage1Outcome(reasons=[foreign, foreign], counted=3), None)
    many = {f"reason {i}": 1 for i in range(MAX_REASONS + 5)}
    metrics.ingest_report(IngestReport(0, 0, many, 0, {}))
    got = samples(metrics)
    assert (
        got[("dpstream_dead_letters_total", (("reason", FOREIGN_RULES), ("stage", "stage1")))] == 2
    )
    assert value(metrics, "dpstream_events_in_total", stage="stage1") == 3
    ingest = [
        k for k in got if k[0] == "dpstream_dead_letters_total" and ("stage", "ingest") in k[1]
    ]
    assert len(ingest) == MAX_REASONS + 1
    other = ("dpstream_dead_letters_total", (("reason", OTHER_REASONS), ("stage", "ingest")))
    assert got[other] == 5


def release(tick: int, **extra: float) -> dict:
    return {"tick": tick, "tick_end_unix": (tick + 1) * 10.0, **extra}


def test_releases_latency_spent_and_ticks_of_the_statistics_held():
    metrics = WorkerMetrics(CFG)
    held = statistics_by_partition(CFG, 2)
    (p_count,) = [p for p, names in held.items() if "count" in names]
    metrics.assigned(frozenset({0, 1}), frozenset({p_count}))
    outcome = Stage2Outcome(
        releases=[
            ("count", release(4)),
            ("count", release(5, epsilon_spent=0.125)),
        ],  # 11.5 s, 1.5 s
        published={"count": 5},
    )
    metrics.stage2_record(outcome, acknowledged_at=61.5)  # ticks 4, 5 ended at 50, 60
    metrics.stage1_record(0, Stage1Outcome(), closed=6)
    metrics.refresh(now=75.0, heartbeat_age=0.2, conditions={"event_loop": True, "x": False})
    assert value(metrics, "dpstream_releases_total", statistic="count") == 2
    assert value(metrics, "dpstream_release_latency_seconds_count", statistic="count") == 2
    assert value(metrics, "dpstream_release_latency_seconds_sum", statistic="count") == 13.0
    assert value(metrics, "dpstream_epsilon_spent", statistic="count") == 0.125
    assert value(metrics, "dpstream_epsilon_charged", statistic="count") == 0.5
    assert value(metrics, "dpstream_total_epsilon") == 2.0
    assert value(metrics, "dpstream_released_tick", statistic="count") == 5
    assert value(metrics, "dpstream_clock_tick") == 6  # floor(75 / 10) - 1
    assert value(metrics, "dpstream_stage1_closed_tick", partition="0") == 6
    assert value(metrics, "dpstream_ready") == 0
    assert value(metrics, "dpstream_ready_condition", condition="event_loop") == 1
    assert value(metrics, "dpstream_assigned_partitions", topic=CFG.events_topic) == 2
    # A rebalance that takes the stage-2 partition and events partition 0 away drops
    # their gauges (another worker exposes them now), not the counters.
    metrics.assigned(frozenset({1}), frozenset())
    metrics.refresh(now=75.0, heartbeat_age=0.2, conditions={})
    assert value(metrics, "dpstream_released_tick", statistic="count") is None
    assert value(metrics, "dpstream_stage1_closed_tick", partition="0") is None
    assert value(metrics, "dpstream_releases_total", statistic="count") == 2
    assert value(metrics, "dpstream_rebalances_total", consumer="worker") == 2


def test_a_charge_is_spent_once_released_and_release_lag_counts_due_ticks():
    metrics = WorkerMetrics(CFG)
    (p_other,) = [p for p, n in statistics_by_partition(CFG, 2).items() if "other" in n]
    metrics.assigned(frozenset(), frozenset({p_other}))
    metrics.stage2_record(
        Stage2Outcome(releases=[("other", release(3))], published={"other": 3}), 45.0
    )
    metrics.refresh(now=75.0, heartbeat_age=0.0, conditions={})
    assert value(metrics, "dpstream_epsilon_spent", statistic="other") == 0.25
    due = (75.0 - CFG.ticks.release_delay) // 10 - 1
    assert value(metrics, "dpstream_release_lag_ticks", statistic="other") == due - 3


def test_latency_buckets_start_at_the_release_delay():
    buckets = latency_buckets(CFG)
    assert buckets[0] == CFG.ticks.release_delay and list(buckets) == sorted(set(buckets))


def test_changelog_writes_and_recoveries():
    metrics = WorkerMetrics(CFG)
    metrics.changelog_written("stage1", 7)
    metrics.changelog_written("stage1", 2)
    metrics.recovered(3.0)
    assert value(metrics, "dpstream_changelog_writes_total", table="stage1") == 9
    assert value(metrics, "dpstream_table_recovery_seconds_count") == 1
    assert value(metrics, "dpstream_table_recovery_seconds_sum") == pytest.approx(3.0)
