"""The worker's Prometheus metrics: one registry holding every metric docs/operations.md
lists, and the calls that record into it.

The agents record once per record they handle (a stage-1 envelope holds up to 2,000
events; a counter's increment costs about 0.3-1 µs), the stage-1 changelog once per
window, the event loop's heartbeat once per ingest report and table recovery; nothing is
recorded per event. The operations endpoint (``operations.py``) reads the registry in a
thread of its own. A scrape and a record never interleave: both hold ``lock``, so a scrape
sees the metrics between two records, never half of one (a release counted whose tick is
not yet marked released).

Labels carry configuration only: statistic names, stages, topics, partitions, tables and
dead-letter reasons, whose texts name the rule broken, the statistic and config values
(``records.parse_event``, ``route``, the drivers). The one reason that quotes what an input
record carries, stage 1's envelope made under other rules (its rules fingerprint, which
whoever writes the events topic chooses), is labelled without it (``reason_label``), and a
stage keeps at most ``MAX_REASONS`` reasons apart.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dpstream.config.schema import PipelineConfig
from dpstream.operators.accounting import PrivacyStatement

from ..ingest.consumer import IngestReport
from ..stages.drivers import FOREIGN_RULES, Stage1Outcome, Stage2Outcome, statistics_by_partition
from ..wire.records import CLIPPED
from .clock import last_due_tick, last_ended_tick

MAX_REASONS = 100
"""Dead-letter reasons a stage labels apart; further ones are counted as ``OTHER_REASONS``."""
OTHER_REASONS = "other reasons"

RECOVERY_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def reason_label(reason: str) -> str:
    """A dead letter's reason as a label: the reason, but a foreign rules fingerprint
    (chosen by whoever wrote the envelope) left out."""
    return FOREIGN_RULES if reason.startswith(FOREIGN_RULES) else reason


def latency_buckets(cfg: PipelineConfig) -> tuple[float, ...]:
    """Release latency buckets: from the release delay d (no release leaves earlier) by
    fractions of the clock's marker period p (a healthy release is within d + p) to many
    ticks late."""
    d, p = cfg.ticks.release_delay, cfg.ticks.marker_period_seconds
    interval = cfg.ticks.interval_seconds
    late = (d + k * interval for k in (1, 2, 5, 10, 30, 100))
    return tuple(sorted({d, d + p / 2, d + p, d + 2 * p, *late}))


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name ``registry`` can expose (a counter's ``_total``, a histogram's
    ``_bucket``, ``_sum`` and ``_count``...), whether or not it has samples yet."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    return {
        metric.name + suffix
        for metric in registry.collect()
        for suffix in suffixes.get(metric.type, ("",))
    }


class WorkerMetrics:
    """The metrics of one worker of ``cfg``, under ``statement`` (the ledger's at start;
    None: the config's own, without retired runs)."""

    def __init__(self, cfg: PipelineConfig, statement: PrivacyStatement | None = None) -> None:
        self._cfg = cfg
        self.lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        self._define_flow()
        self._define_ticks()
        self._define_budget(statement or cfg.privacy_statement())
        self._define_health()
        self._by_partition = statistics_by_partition(cfg, cfg.input.partitions)
        self._stage2_partitions: frozenset[int] = frozenset()
        # Scrape-time gauges come from these, so a rebalance can drop what is not held.
        self.stage1_closed: dict[int, int] = {}
        self.closed: dict[str, int] = {}
        self.released: dict[str, int] = {}
        self._spent: dict[str, float] = {}
        self._lag: dict[tuple[str, int], int] = {}
        self._ingest = IngestReport()  # the latest report's totals, counted already
        self._reasons: dict[str, set[str]] = {}

    def _counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), registry=self.registry)

    def _define_flow(self) -> None:
        info = self._gauge(
            "dpstream_info", "The pipeline and dpstream's version.", ["app_id", "version"]
        )
        info.labels(self._cfg.app_id, version("dpstream")).set(1)
        self.records_in = self._counter(
            "dpstream_records_in_total", "Kafka records a stage read from its input.", ["stage"]
        )
        self.events_in = self._counter(
            "dpstream_events_in_total",
            "Events taken in: sent to the events topic (ingest), counted once (stage1).",
            ["stage"],
        )
        self.dead_letters = self._counter(
            "dpstream_dead_letters_total",
            "Records and events sent to the dead-letter topic, by stage and reason.",
            ["stage", "reason"],
        )
        self.values_clipped = self._counter(
            "dpstream_values_clipped_total",
            "Values the ingest clipped into a statistic's bounds.",
            ["statistic"],
        )
        self.rule_failures = self._counter(
            "dpstream_rule_failures_total",
            "Events a statistic could not use (its reason) that another statistic counted.",
            ["statistic", "reason"],
        )
        self.ingest_lag = self._gauge(
            "dpstream_ingest_lag_records",
            "Records between the ingest's position and the end of a source partition.",
            ["topic", "partition"],
        )
        self.rebalances = self._counter(
            "dpstream_rebalances_total", "Partition assignments received.", ["consumer"]
        )
        self.assigned_partitions = self._gauge(
            "dpstream_assigned_partitions", "Partitions of a topic this worker holds.", ["topic"]
        )
        self.changelog_writes = self._counter(
            "dpstream_changelog_writes_total",
            "Records written to a table's changelog topic.",
            ["table"],
        )
        self.table_recovery = Histogram(
            "dpstream_table_recovery_seconds",
            "Duration of each table recovery from the changelogs.",
            buckets=RECOVERY_BUCKETS,
            registry=self.registry,
        )
        self._stage1_records = self.records_in.labels("stage1")
        self._stage1_events = self.events_in.labels("stage1")
        self._stage2_records = self.records_in.labels("stage2")
        self._stage2_writes = self.changelog_writes.labels("stage2")

    def _define_ticks(self) -> None:
        ticks = self._cfg.ticks
        self.clock_tick = self._gauge("dpstream_clock_tick", "The latest tick that has ended.")
        self.stage1_closed_tick = self._gauge(
            "dpstream_stage1_closed_tick",
            "The latest tick stage 1 closed on an events partition.",
            ["partition"],
        )
        self.closed_tick = self._gauge(
            "dpstream_closed_tick", "The latest tick stage 2 closed.", ["statistic"]
        )
        self.closed_tick_lag = self._gauge(
            "dpstream_closed_tick_lag_seconds",
            "Seconds from the end of the latest closed tick to now.",
            ["statistic"],
        )
        self.released_tick = self._gauge(
            "dpstream_released_tick", "Every tick up to this one is published.", ["statistic"]
        )
        self.release_lag = self._gauge(
            "dpstream_release_lag_ticks",
            "Ticks whose release deadline has passed and that are not published.",
            ["statistic"],
        )
        self.release_latency = Histogram(
            "dpstream_release_latency_seconds",
            "From a tick's end to the acknowledgement of its releases.",
            ["statistic"],
            buckets=latency_buckets(self._cfg),
            registry=self.registry,
        )
        self.releases = self._counter(
            "dpstream_releases_total", "Release records published.", ["statistic"]
        )
        self._gauge("dpstream_tick_interval_seconds", "ticks.interval_seconds").set(
            ticks.interval_seconds
        )
        self._gauge("dpstream_release_delay_seconds", "From a tick's end to its deadline.").set(
            ticks.release_delay
        )

    def _define_budget(self, statement: PrivacyStatement) -> None:
        self._charges = {c.statistic: float(c.epsilon) for c in statement.charges}
        self.epsilon_spent = self._gauge(
            "dpstream_epsilon_spent", "What a statistic has spent so far.", ["statistic"]
        )
        charged = self._gauge(
            "dpstream_epsilon_charged",
            "What the privacy statement charges a statistic.",
            ["statistic"],
        )
        for name, epsilon in self._charges.items():
            charged.labels(name).set(epsilon)
        self._gauge("dpstream_epsilon_retired", "What retired runs spent.").set(
            float(sum(c.epsilon for c in statement.retired))
        )
        self._gauge("dpstream_epsilon_per_user_bound", "What one user can lose at most.").set(
            float(statement.per_user_total)
        )
        self._gauge("dpstream_total_epsilon", "privacy.total_epsilon").set(
            float(statement.total_epsilon)
        )

    def _define_health(self) -> None:
        self.heartbeat_age = self._gauge(
            "dpstream_event_loop_heartbeat_age_seconds",
            "Seconds since the event loop last ran its heartbeat.",
        )
        self.ready = self._gauge("dpstream_ready", "1 when the worker is ready, else 0.")
        self.ready_condition = self._gauge(
            "dpstream_ready_condition", "1 when a readiness condition holds.", ["condition"]
        )

    def _dead_letters(self, stage: str, counts: Mapping[str, int]) -> None:
        """Count ``counts`` (reason -> dead letters) for ``stage``."""
        seen = self._reasons.setdefault(stage, set())
        for reason, n in counts.items():
            label = reason_label(reason)
            if label not in seen and len(seen) >= MAX_REASONS:
                label = OTHER_REASONS
            seen.add(label)
            self.dead_letters.labels(stage, label).inc(n)

    def stage1_record(self, partition: int, outcome: Stage1Outcome, closed: int | None) -> None:
        """Stage 1 handled a record of events partition ``partition``: ``outcome``, and the
        latest tick the partition has closed (``closed``) after a tick marker."""
        with self.lock:
            self._stage1_records.inc()
            if outcome.counted:
                self._stage1_events.inc(outcome.counted)
            if outcome.reasons:
                self._dead_letters("stage1", Tally(outcome.reasons))
            if closed is not None:
                self.stage1_closed[partition] = closed

    def stage2_record(self, outcome: Stage2Outcome, acknowledged_at: float) -> None:
        """Stage 2 handled a record (``outcome``), whose releases the broker acknowledged at
        ``acknowledged_at`` (Unix time)."""
        with self.lock:
            self._stage2_records.inc()
            if outcome.reasons:
                self._dead_letters("stage2", Tally(outcome.reasons))
            self._stage2_writes.inc(len(outcome.states))
            for name, state in outcome.states.items():
                if state.last_closed is not None:
                    self.closed[name] = state.last_closed
            self._releases(outcome.releases, acknowledged_at)
            self.released.update(outcome.published)

    def _releases(self, releases: list[tuple[str, dict]], acknowledged_at: float) -> None:
        """Count releases, their latency once per (statistic, tick), and what each
        statistic has spent: a ``tau: auto`` release's ``epsilon_spent``, else its charge."""
        counts = Tally(name for name, _ in releases)
        for name, n in counts.items():
            self.releases.labels(name).inc(n)
        ends = {(name, r["tick"]): r["tick_end_unix"] for name, r in releases}
        for (name, _), end in ends.items():
            self.release_latency.labels(name).observe(acknowledged_at - end)
        for name, release in releases:
            self._spent[name] = release.get("epsilon_spent", self._charges.get(name, 0.0))

    def changelog_written(self, table: str, records: int) -> None:
        """``records`` were written to ``table``'s changelog."""
        with self.lock:
            self.changelog_writes.labels(table).inc(records)

    def ingest_report(self, report: IngestReport) -> None:
        """The ingest's latest totals: count what grew since the last report (a total
        that shrank is a new ingest's: counted whole)."""
        with self.lock:
            last = self._ingest
            self.records_in.labels("ingest").inc(_grown(report.records, last.records))
            self.events_in.labels("ingest").inc(_grown(report.events, last.events))
            self.rebalances.labels("ingest").inc(_grown(report.rebalances, last.rebalances))
            grown = {
                reason: _grown(total, last.dead_letters.get(reason, 0))
                for reason, total in report.dead_letters.items()
            }
            self._dead_letters("ingest", {r: n for r, n in grown.items() if n})
            self._by_statistic(report, last)
            self._lag = dict(report.lag)
            self._ingest = report

    def _by_statistic(self, report: IngestReport, last: IngestReport) -> None:
        """The per-statistic clip and rule-failure counts that grew since ``last``."""
        for (statistic, what), total in report.by_statistic.items():
            n = _grown(total, last.by_statistic.get((statistic, what), 0))
            if not n:
                continue
            if what == CLIPPED:
                self.values_clipped.labels(statistic).inc(n)
            else:  # reasons are fixed texts naming config fields, never payloads
                self.rule_failures.labels(statistic, reason_label(what)).inc(n)

    def assigned(self, events: frozenset[int], stage2: frozenset[int]) -> None:
        """A rebalance assigned these partitions of the events and stage-2 topics: what
        this worker no longer holds leaves its gauges."""
        with self.lock:
            self.rebalances.labels("worker").inc()
            self.assigned_partitions.labels(self._cfg.events_topic).set(len(events))
            self.assigned_partitions.labels(self._cfg.stage2_topic).set(len(stage2))
            self._stage2_partitions = stage2
            held = self.owned_statistics()
            for ticks in (self.closed, self.released, self._spent):
                for name in set(ticks) - held:
                    del ticks[name]
            for partition in set(self.stage1_closed) - events:
                del self.stage1_closed[partition]

    def owned_statistics(self) -> frozenset[str]:
        """The statistics of the stage-2 partitions this worker holds."""
        return frozenset(
            name for p in self._stage2_partitions for name in self._by_partition.get(p, ())
        )

    def recovered(self, seconds: float) -> None:
        """A table recovery took ``seconds``."""
        with self.lock:
            self.table_recovery.observe(seconds)

    def refresh(self, now: float, heartbeat_age: float, conditions: Mapping[str, bool]) -> None:
        """Set the gauges that depend on the time of the scrape (call it holding ``lock``):
        the clock, how far behind it each statistic is, the health."""
        ticks = self._cfg.ticks
        self.clock_tick.set(last_ended_tick(now, ticks.interval_seconds))
        due = last_due_tick(now, ticks.interval_seconds, ticks.release_delay)
        _set_all(self.stage1_closed_tick, {(str(p),): t for p, t in self.stage1_closed.items()})
        _set_all(self.closed_tick, {(name,): t for name, t in self.closed.items()})
        lags: dict[tuple[str, ...], float] = {
            (name,): now - (t + 1) * ticks.interval_seconds for name, t in self.closed.items()
        }
        _set_all(self.closed_tick_lag, lags)
        _set_all(self.released_tick, {(name,): t for name, t in self.released.items()})
        _set_all(self.release_lag, {(name,): max(due - t, 0) for name, t in self.released.items()})
        _set_all(self.epsilon_spent, {(name,): v for name, v in self._spent.items()})
        _set_all(self.ingest_lag, {(t, str(p)): n for (t, p), n in self._lag.items()})
        self.heartbeat_age.set(heartbeat_age)
        self.ready.set(all(conditions.values()))
        for condition, holds in conditions.items():
            self.ready_condition.labels(condition).set(holds)


def _grown(total: int, last: int) -> int:
    return total - last if total >= last else total


def _set_all(gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
    """The labelled ``gauge`` holds exactly ``values``."""
    gauge.clear()
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
