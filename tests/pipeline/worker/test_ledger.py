"""The ledger at worker start (pipeline/worker/ledger.py): a statistic changed in place is refused
naming the field, a renamed or removed one stays charged (also when only the latest
statement is left), a run is stated once and adopted by concurrent starts, a run begun anew
is charged again, forged records and another key are refused, and pipelines over the same
source are composed."""

from __future__ import annotations

import hashlib

import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.pipeline.worker.keys import PipelineKey
from dpstream.pipeline.worker.ledger import (
    History,
    LedgerRefused,
    adopt,
    cross_pipeline,
    history_of,
    plan,
    ran_statistics,
    refuse_lost_state,
    runs_of,
    statement_entry,
)
from dpstream.statistics.registry import statistic_for, with_mechanisms
from tests.config_builders import production

KEY = PipelineKey.from_key(hashlib.sha256(b"the ledger tests' key").digest())
OTHER_KEY = PipelineKey.from_key(hashlib.sha256(b"another key").digest())


def started(data: dict, history: History | None = None, **kwargs) -> tuple[History, dict]:
    """A worker start of ``data`` after ``history``: (the history with its statement, the
    statement entry)."""
    history = history or History()
    cfg = parse_config(data)
    entry = statement_entry(cfg, plan(cfg, history, KEY, **kwargs), KEY)
    return History([*history.statements, entry], dict(history.starts)), entry


def test_a_statistic_changed_in_place_is_refused_naming_the_field():
    history, _ = started(production())
    assert plan(parse_config(production()), history, KEY).statement.per_user_total == 1
    with pytest.raises(ConfigError) as info:
        plan(parse_config(production(epsilon=0.5)), history, KEY)
    assert str(info.value).startswith("statistics[0].epsilon: statistic 'events' ran under")
    assert "statistic.epsilon changed" in str(info.value)
    with pytest.raises(ConfigError, match=r"^privacy\.neighbours: "):
        changed = production(privacy={"total_epsilon": 2.0, "neighbours": "any_subset"})
        plan(parse_config(changed), history, KEY)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input": {"partitions": 2, "user_id_field": "session.id"}}, "input.user_id_field"),
        ({"noise": {"mode": "insecure_zero"}}, "noise.mode"),
    ],
)
def test_the_privacy_unit_and_the_noise_mode_are_in_the_identity(change, field):
    # The review: user_id_field (user_id -> session.id) and noise.mode kept the
    # fingerprint, so every old user returned with a fresh tau inside the same tree.
    history, _ = started(production())
    with pytest.raises(ConfigError, match=rf"^{field}: statistic 'events' ran under"):
        plan(parse_config(production(**change)), history, KEY)


def test_the_identity_names_the_resolved_tree_and_the_algorithms_versions():
    auto = production()
    auto["statistics"][0].update(mechanism="auto", horizon_ticks=1_000_000)
    _, entry = started(auto)
    algorithm = entry["identities"]["events"]["parameters"]["algorithm"]
    assert algorithm["mechanism"].startswith("kary_tree") and algorithm["k"] >= 3
    assert algorithm["versions"] == {
        "truncation": 1,
        "tree_counter": 1,
        "kary_tree": 1,
        "expiring_tree": 1,
    }
    assert entry["identities"]["events"]["parameters"]["noise_sampler"] == 1


@pytest.mark.parametrize("tau", [8, "auto"])
def test_a_statistic_that_names_no_mechanism_keeps_the_tree_it_ran_a_new_one_gets_the_default(
    tau,
):
    # Before the default changed, a statistic that named no mechanism recorded "binary"
    # (the schema's default then): its parameters are those of mechanism: binary now.
    before = production(tau=tau)
    before["statistics"][0]["mechanism"] = "binary"
    history, entry = started(before)
    cfg = parse_config(production(tau=tau))
    assert cfg.statistics[0].mechanism is None and cfg.statistics[0].horizon_ticks is None
    # Taken as new it would run the new default tree: another statistic, refused by name.
    with pytest.raises(ConfigError, match=r"statistic\.mechanism"):
        plan(cfg, history, KEY)
    # Resolved against the ledger (as the worker does): the same fingerprint, the same run,
    # the binary tree it ran.
    kept = with_mechanisms(cfg, ran_statistics(history))
    assert (
        plan(kept, history, KEY).runs["events"].run_id == (entry["identities"]["events"]["run_id"])
    )
    assert statistic_for(kept.statistics[0], kept).tree == ("binary", 2)
    # A pipeline the ledger has never seen: the least-error tree for an unbounded stream,
    # recorded as resolved, so its later starts keep it.
    fresh = with_mechanisms(cfg, ran_statistics(History()))
    assert statistic_for(fresh.statistics[0], fresh).tree == ("kary_subtract", 13)
    history, entry = started(production(tau=tau))
    assert entry["identities"]["events"]["parameters"]["statistic"]["mechanism"] == (
        "kary_subtract"
    )
    again = with_mechanisms(cfg, ran_statistics(history))
    assert statistic_for(again.statistics[0], again).tree == ("kary_subtract", 13)
    assert (
        plan(again, history, KEY).runs["events"].run_id == (entry["identities"]["events"]["run_id"])
    )


def test_a_renamed_statistic_is_new_and_the_old_one_stays_charged():
    history, _ = started(production())
    statement = plan(parse_config(production(name="events_v2")), history, KEY).statement
    assert statement.per_user_total == 2  # events (retired) 1 + events_v2 1
    assert [c.statistic for c in statement.retired] == ["events"]
    tight = production(name="events_v2", privacy={"total_epsilon": 1.5})
    with pytest.raises(ConfigError, match=r"^privacy\.total_epsilon: .*events 1"):
        plan(parse_config(tight), history, KEY)


def test_the_latest_statement_alone_keeps_every_retired_charge():
    # The review: retired charges were rebuilt only from statements in which the statistic
    # was still configured; once those were gone, a pipeline that spent 3 was accepted at
    # 2 under total_epsilon 2.
    history, _ = started(production(privacy={"total_epsilon": 3.0}))
    history, _ = started(production(name="v2", privacy={"total_epsilon": 3.0}), history)
    history, latest = started(production(name="v3", privacy={"total_epsilon": 3.0}), history)
    assert sorted(c["statistic"] for c in latest["retired"]) == ["events", "v2"]
    only_latest = History([latest])
    with pytest.raises(ConfigError, match=r"^privacy\.total_epsilon: statistics spend 3"):
        plan(parse_config(production(name="v3")), only_latest, KEY)  # total_epsilon 2
    kept = plan(
        parse_config(production(name="v3", privacy={"total_epsilon": 3.0})), only_latest, KEY
    )
    assert kept.statement.per_user_total == 3


def test_a_removed_statistic_added_back_continues_its_run_charged_once():
    history, first = started(production())
    history, _ = started(production(name="other"), history)
    again = plan(parse_config(production(privacy={"total_epsilon": 3.0})), history, KEY)
    assert again.runs["events"].run_id == first["identities"]["events"]["run_id"]
    assert again.statement.per_user_total == 2  # events 1 (current) + other 1 (retired)


def test_concurrent_first_starts_adopt_the_first_statement_s_run():
    cfg = parse_config(production())
    mine = plan(cfg, History(), KEY)
    theirs = statement_entry(cfg, plan(cfg, History(), KEY), KEY)  # in the log first
    ours = statement_entry(cfg, mine, KEY)
    adopted = adopt(cfg, History([theirs, ours]), mine)
    assert adopted.runs["events"].run_id == theirs["identities"]["events"]["run_id"]
    assert adopted.runs["events"].run_id != mine.runs["events"].run_id
    # One run: the other proposal is not charged as a second run.
    runs, retired, _ = runs_of([theirs, ours])
    assert list(runs) == ["events"] and retired == {}
    # A concurrent start with other parameters stated first: refused.
    changed = parse_config(production(epsilon=0.5))
    first = statement_entry(changed, plan(changed, History(), KEY), KEY)
    with pytest.raises(LedgerRefused, match=r"started at the same time with other parameters"):
        adopt(cfg, History([first, ours]), mine)


def test_a_statistic_begun_anew_is_charged_again_and_replaces_its_old_run():
    tight = production(privacy={"total_epsilon": 1.5})
    history, first = started(tight)
    old_run = first["identities"]["events"]["run_id"]
    with pytest.raises(ConfigError, match=r"^privacy\.total_epsilon: statistics spend 2"):
        plan(parse_config(tight), history, KEY, charge_again=["events"])
    with pytest.raises(ConfigError, match=r"^--charge-again: not a statistic"):
        plan(parse_config(tight), history, KEY, charge_again=["nope"])
    history, renewed = started(production(), history, charge_again=["events"])
    assert renewed["new_runs"] == ["events"]
    new_run = renewed["identities"]["events"]["run_id"]
    assert new_run != old_run
    # A later start continues the new run, replacing the old run's state, both charged.
    later = plan(parse_config(production()), history, KEY)
    assert later.runs["events"].run_id == new_run
    assert later.runs["events"].replaces == frozenset({old_run})
    assert later.statement.per_user_total == 2
    assert [(c.statistic, c.run_id) for c in later.statement.retired] == [("events", old_run)]


def test_a_run_that_released_is_refused_when_its_state_topics_are_gone():
    history, entry = started(production())
    run_id = entry["identities"]["events"]["run_id"]
    cfg = parse_config(production())
    refuse_lost_state(cfg, plan(cfg, history, KEY), ["prod-stage2-changelog"])  # not released
    history.starts[("events", run_id)] = 1000
    chosen = plan(cfg, history, KEY)
    assert chosen.runs["events"].start_tick == 1000
    with pytest.raises(LedgerRefused, match=r"\['events'\] have released .* --charge-again events"):
        refuse_lost_state(cfg, chosen, ["prod-stage2-changelog"])


def records(*entries: dict) -> list[tuple[int, object]]:
    return list(enumerate(entries))


def test_forged_records_and_another_key_are_refused_other_apps_are_read():
    cfg = parse_config(production())
    entry = statement_entry(cfg, plan(cfg, History(), KEY), KEY)
    assert history_of(cfg, records(entry), KEY).statements == [entry]
    # A writer of the ledger topic without the key: an unsigned statement that forgets.
    forged = {**entry, "retired": [], "per_user_total": 0.0}
    with pytest.raises(LedgerRefused, match=r"ledger@1 names app_id 'prod' but its MAC does not"):
        history_of(cfg, records(entry, forged), KEY)
    unsigned = {k: v for k, v in entry.items() if k != "mac"}
    with pytest.raises(LedgerRefused, match="MAC does not verify"):
        history_of(cfg, records(unsigned), KEY)
    # The same app under another key: the key changed (every node would be re-drawn).
    with pytest.raises(LedgerRefused, match=r"^noise: .* written under another noise key"):
        history_of(cfg, records(entry), OTHER_KEY)
    # Other pipelines' statements are read as they are (another key, another app id).
    other = parse_config(production(app_id="staging"))
    theirs = statement_entry(other, plan(other, History(), OTHER_KEY), OTHER_KEY)
    assert history_of(cfg, records(theirs, entry), KEY).others == {"staging": theirs}


def pipeline(app_id: str, public_counts: bool = False, topics: list[str] | None = None) -> dict:
    data = production(app_id=app_id, input={"topics": topics or ["clicks"], "partitions": 2})
    if public_counts:
        data["privacy"] = {"total_epsilon": 2.0, "public_counts": True}
        data["statistics"] = [
            {
                "name": "latency",
                "kind": "mean",
                "epsilon": 1.0,
                "mean": {"max_users": 100, "max_samples_per_user": 4},
            }
        ]
    return data


def test_pipelines_over_one_source_are_composed():
    # The review: a public-counts pipeline and a whole-user one over the same topic both
    # passed; the public one's exact samples equalled the other's truncated count.
    ours = parse_config(pipeline("ours"))
    public = parse_config(pipeline("public", public_counts=True))
    other = parse_config(pipeline("other"))
    elsewhere = parse_config(pipeline("elsewhere", topics=["views"]))
    history = History(
        others={
            app.app_id: statement_entry(app, plan(app, History(), OTHER_KEY), OTHER_KEY)
            for app in (public, other, elsewhere)
        }
    )
    statement = plan(ours, History(), KEY).statement
    with pytest.raises(ConfigError, match=r"^privacy\.public_counts: pipeline 'public' reads"):
        cross_pipeline(ours, statement, history)
    del history.others["public"]
    lines = cross_pipeline(ours, statement, history)
    assert lines == [
        "pipeline 'other' reads clicks: 1",
        "pipelines over these sources together: one user can lose at most 2 (basic "
        "composition over pipelines)",
    ]
    limited = parse_config(
        {**pipeline("ours"), "privacy": {"total_epsilon": 2.0, "cross_pipeline_epsilon": 1.5}}
    )
    with pytest.raises(ConfigError, match=r"^privacy\.cross_pipeline_epsilon: .* spend 2 "):
        cross_pipeline(limited, statement, history)


def test_the_statement_entry_carries_runs_sources_and_its_mac():
    cfg = parse_config(production())
    chosen = plan(cfg, History(), KEY)
    entry = statement_entry(cfg, chosen, KEY)
    assert entry["event"] == "statement" and entry["app_id"] == "prod"
    assert entry["schema_version"] == 5 and entry["key_commitment"] == KEY.commitment
    assert entry["per_user_total"] == 1.0 and entry["relation"] == "whole_user"
    assert entry["sources"] == ["dpstream.events"] and entry["user_id_field"] == "user_id"
    identity = entry["identities"]["events"]
    assert identity["parameters"]["statistic"]["epsilon"] == 1.0
    assert identity["run_id"] == chosen.runs["events"].run_id and len(identity["run_id"]) == 32
    assert len(identity["fingerprint"]) == 32
    assert KEY.verify(entry) and not OTHER_KEY.verify(entry)
