"""pipeline/tools/ledger_view.py without a broker: ``dpstream ledger``'s report of a
ledger (statements with their times, what each statistic spent, what is left, what this
config would start under) and ``check-config --live``'s key check, which refuses before
Kafka is asked."""

from __future__ import annotations

import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.pipeline.tools import ledger_view
from dpstream.pipeline.worker.keys import PipelineKey
from dpstream.pipeline.worker.ledger import History, plan, statement_entry

DATA = {
    "app_id": "shop",
    "noise": {"mode": "insecure_zero"},
    "privacy": {"total_epsilon": 3.0},
    "statistics": [
        {"name": "views", "epsilon": 1.0, "tau": 4},
        {"name": "clicks", "epsilon": 0.5, "tau": 2, "key": "click"},
    ],
}
KEY = PipelineKey.insecure_zero()
NOON = 1_795_003_200_000  # 2026-11-18 12:00:00 UTC, in ms


def test_the_report_gives_each_statement_its_time_each_statistics_spend_and_what_is_left(
    monkeypatch,
):
    cfg = parse_config(DATA)
    entry = statement_entry(cfg, plan(cfg, History(), KEY), KEY)
    records = [(0, NOON, entry), (1, NOON + 5, {"app_id": "another", "event": "statement"})]
    monkeypatch.setattr(ledger_view, "read_timed_records", lambda *a: records)
    lines = ledger_view.ledger_report(cfg, "b:9092", KEY)
    runs = {name: entry["identities"][name]["run_id"] for name in ("views", "clicks")}
    assert lines[:7] == [
        "ledger dpstream.ledger, app_id shop:",
        "statements (the start of a worker, oldest first):",
        "  2026-11-18 12:00:00 UTC: views 1, clicks 0.5 -> one user can lose at most 1.5 of "
        "total_epsilon=3",
        "spent, by statistic (each run charged once):",
        f"  clicks: 0.5 (run {runs['clicks']}: 0.5, not released yet)",
        f"  views: 1 (run {runs['views']}: 1, not released yet)",
        "left: 1.5 of total_epsilon=3 (spent 1.5, retired runs included: what a statistic "
        "spent stays spent)",
    ]
    assert lines[7] == "this config:"
    # The config changed in place: the report still shows the ledger, then the refusal.
    changed = parse_config({**DATA, "statistics": [{**DATA["statistics"][0], "tau": 5}]})
    refused = ledger_view.ledger_report(changed, "b:9092", KEY)
    assert refused[:7] == lines[:7]
    assert refused[7].startswith(
        "this config: a worker would refuse it: statistics[0].tau: statistic 'views' ran"
    )


def test_a_ledger_without_this_app_says_no_worker_started(monkeypatch):
    monkeypatch.setattr(ledger_view, "read_timed_records", lambda *a: [])
    assert ledger_view.ledger_report(parse_config(DATA), "b:9092", KEY) == [
        "ledger dpstream.ledger, app_id shop:",
        "  no statement yet: no worker of this app has started",
    ]


def test_the_live_check_refuses_a_missing_key_before_asking_kafka(monkeypatch):
    keyed = parse_config({**DATA, "noise": {"mode": "keyed", "key_env": "DPSTREAM_NO_SUCH_KEY"}})
    monkeypatch.delenv("DPSTREAM_NO_SUCH_KEY", raising=False)
    monkeypatch.setattr(ledger_view, "check_connection", pytest.fail)
    with pytest.raises(ConfigError, match="noise.key_env: environment variable DPSTREAM_NO_SUCH"):
        ledger_view.live_check(keyed, "b:9092")


def test_a_zcdp_ledger_reports_rho_spent_and_left(monkeypatch):
    data = {
        **DATA,
        "privacy": {"accounting": "zcdp", "total_rho": 0.5},
        "statistics": [
            {"name": "views", "rho": 0.25, "tau": 4},
            {"name": "clicks", "rho": 0.125, "tau": 2, "key": "click"},
        ],
    }
    cfg = parse_config(data)
    entry = statement_entry(cfg, plan(cfg, History(), KEY), KEY)
    monkeypatch.setattr(ledger_view, "read_timed_records", lambda *a: [(0, NOON, entry)])
    lines = ledger_view.ledger_report(cfg, "b:9092", KEY)
    runs = {name: entry["identities"][name]["run_id"] for name in ("views", "clicks")}
    spent = entry["per_user_total"]  # the epsilon rho = 0.375 implies at delta 10^-6
    assert lines[2].startswith("  2026-11-18 12:00:00 UTC: views rho 0.25, clicks rho 0.125 ->")
    assert lines[3:7] == [
        "spent, by statistic (each run charged once, in rho):",
        f"  clicks: 0.125 (run {runs['clicks']}: 0.125, not released yet)",
        f"  views: 0.25 (run {runs['views']}: 0.25, not released yet)",
        f"left: rho 0.125 of total_rho=0.5 (spent rho 0.375, ({spent:.4g}, 1e-06)-DP; retired "
        "runs included: what a statistic spent stays spent)",
    ]
    assert "one user can lose at most rho=0.375" in "\n".join(lines[8:])
