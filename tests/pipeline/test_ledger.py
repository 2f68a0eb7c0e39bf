"""The privacy statement at worker start (pipeline/ledger.py): a statistic changed in place
is refused naming the field, a renamed one stays charged, each entry carries the identities."""

from __future__ import annotations

import pytest

from dpstream.config.schema import ConfigError, parse_config
from dpstream.pipeline.ledger import checked_statement, statement_entry
from tests.config_builders import production


def test_the_ledger_check_refuses_epsilon_changed_in_place_and_names_the_field():
    old = parse_config(production())
    past = [statement_entry(old, old.privacy_statement())]
    assert checked_statement(old, past).per_user_total == 1  # a restart: the same statistic
    with pytest.raises(ConfigError) as info:
        checked_statement(parse_config(production(epsilon=0.5)), past)
    assert str(info.value).startswith("statistics[0].epsilon: statistic 'events' ran under")
    assert "statistic.epsilon changed" in str(info.value)
    with pytest.raises(ConfigError, match=r"^privacy\.neighbours: "):
        changed = production(privacy={"total_epsilon": 2.0, "neighbours": "any_subset"})
        checked_statement(parse_config(changed), past)


def test_a_renamed_statistic_is_new_and_the_old_one_stays_charged():
    old = parse_config(production())
    past = [statement_entry(old, old.privacy_statement())]
    statement = checked_statement(parse_config(production(name="events_v2")), past)
    assert statement.per_user_total == 2  # events (retired) 1 + events_v2 1
    assert [c.statistic for c in statement.retired] == ["events"]
    tight = production(name="events_v2", privacy={"total_epsilon": 1.5})
    with pytest.raises(ConfigError, match=r"^privacy\.total_epsilon: .*events 1"):
        checked_statement(parse_config(tight), past)


def test_the_statement_entry_carries_each_statistic_identity():
    cfg = parse_config(production())
    entry = statement_entry(cfg, cfg.privacy_statement())
    assert entry["event"] == "statement" and entry["app_id"] == "prod"
    assert entry["per_user_total"] == 1.0 and entry["relation"] == "whole_user"
    identity = entry["identities"]["events"]
    assert identity["parameters"]["statistic"]["epsilon"] == 1.0
    assert len(identity["fingerprint"]) == 32
