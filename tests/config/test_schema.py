"""The pipeline config (config/schema.py): errors name the field, the budget is checked
exactly, the shipped demo config is valid, a dumped config parses again."""

from __future__ import annotations

import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import load_config, parse_config
from tests.config_builders import MINIMAL, minimal


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"statistics__0__epsilon": -1},
            "statistics[0] (events).epsilon: Input should be greater than 0",
        ),
        (
            {"statistics__0__tau": 0},
            "statistics[0] (events).tau: must be 'auto' or an integer in [1, 1000000]",
        ),
        ({"statistics__0__kind": "median"}, "statistics[0] (events).kind: Input should be 'count'"),
        ({"statistics__0__name": "bad name!"}, "statistics[0].name: must match"),
        (
            {"statistics__0__bogus": 1},
            "statistics[0] (events).bogus: Extra inputs are not permitted",
        ),
        ({"input__partitions": 0}, "input.partitions: Input should be greater than or equal to 1"),
        ({"input__topics": ["a topic"]}, "input.topics: [0]: must be a Kafka topic name"),
        ({"input__topic": "events"}, "input.topic: now topics, a list of source topics"),
        (
            {"input__topics": ["dp.events"]},
            "input.topics[0]: the source topic 'dp.events' is also the release topic",
        ),
        ({"input__user_id_field": "actor."}, "input.user_id_field: must be a field name"),
        ({"ticks__interval_seconds": 0}, "ticks.interval_seconds: Input should be greater than 0"),
        (
            {"ticks__release_delay_seconds": 0.49},
            "ticks.release_delay_seconds: must be at least 0.5 (the clock's marker period "
            "min(interval_seconds / 4, 1) = 0.25 s plus 0.25 s for stage 1 and stage 2), got 0.49",
        ),
        (
            {"ticks__interval_seconds": 60, "ticks__release_delay_seconds": 1.2},
            "ticks.release_delay_seconds: must be at least 1.25 (the clock's marker period "
            "min(interval_seconds / 4, 1) = 1 s plus",
        ),
        ({"privacy__total_epsilon": 0.5}, "privacy.total_epsilon: statistics spend 1 in total"),
        ({"privacy__neighbours": "event"}, "privacy.neighbours: Input should be 'whole_user'"),
        ({"noise__mode": "gaussian"}, "noise.mode: Input should be 'keyed' or 'insecure_zero'"),
        (
            {"statistics__0__mechanism": "kary"},
            "statistics[0] (events).k: required for mechanism kary",
        ),
        (
            {"statistics__0__mechanism": "kary_subtract", "statistics__0__k": 2},
            "statistics[0] (events).k: must be >= 3 for kary_subtract, got 2",
        ),
        (
            {"statistics__0__k": 3},
            "statistics[0] (events).k: only applies to kary and kary_subtract",
        ),
        ({"statistics__0__mechanism": "expiring"}, "statistics[0] (events).lambda: required"),
        (
            {"statistics__0__mechanism": "expiring", "statistics__0__lambda": 2},
            "statistics[0] (events).horizon_ticks: required for mechanism expiring",
        ),
        (
            {"statistics__0__lambda": 2},
            "statistics[0] (events).lambda: lambda and delay only apply",
        ),
        ({"statistics__0__mechanism": "auto"}, "statistics[0] (events).horizon_ticks: required"),
        (
            {"statistics__0__mechanism": "fancy"},
            "statistics[0] (events).mechanism: Input should be",
        ),
        ({"statistics__0__kind": "sum"}, "statistics[0] (events).max_value: required for kind sum"),
        (
            {"statistics__0__bins": 8},
            "statistics[0] (events).bins: only applies to histogram and kselect",
        ),
        (
            {"statistics__0__kind": "sum", "statistics__0__lower": 1},
            "statistics[0] (events).upper: required with lower or resolution",
        ),
        (
            {"statistics__0__kind": "sum", "statistics__0__upper": 200},
            "statistics[0] (events).resolution: required with upper "
            "(grid units per (upper - lower)",
        ),
        (
            {
                "statistics__0__kind": "sum",
                "statistics__0__upper": 2,
                "statistics__0__max_value": 2,
            },
            "statistics[0] (events).upper: give either max_value or lower/upper/resolution",
        ),
        (
            {
                "statistics__0__kind": "sum",
                "statistics__0__lower": 5,
                "statistics__0__upper": 5,
                "statistics__0__resolution": 10,
            },
            "statistics[0] (events).upper: must be greater than lower (5)",
        ),
        (
            {
                "statistics__0__kind": "sum",
                "statistics__0__tau": "auto",
                "statistics__0__lower": -5,
                "statistics__0__upper": 5,
                "statistics__0__resolution": 10,
            },
            "statistics[0] (events).lower: tau: auto (Dong-Luo-Yi Alg. 5) ranks users by "
            "non-negative contributions; a negative lower needs a fixed tau",
        ),
        (
            {"statistics__0__upper": 5},
            "statistics[0] (events).upper: only applies to kind sum, not count",
        ),
        (
            {
                "statistics__0__kind": "histogram",
                "statistics__0__tau": "auto",
                "statistics__0__bins": 4,
                "statistics__0__resolution": 10,
            },
            "statistics[0] (events).resolution: only applies to kind sum, not histogram",
        ),
        (
            {"statistics__0__kind": "histogram", "statistics__0__bins": 8},
            "statistics[0] (events).tau: kind histogram needs tau: auto",
        ),
        (
            {
                "statistics__0__kind": "kselect",
                "statistics__0__bins": 8,
                "statistics__0__tau": "auto",
            },
            "statistics[0] (events).rank: required for kind kselect",
        ),
        (
            {"statistics__0__halve_margin": True},
            "statistics[0] (events).halve_margin: only applies to kind kselect, not count",
        ),
        (
            {
                "statistics__0__tau": "auto",
                "statistics__0__mechanism": "expiring",
                "statistics__0__lambda": 1,
                "statistics__0__horizon_ticks": 100,
            },
            "statistics[0] (events).mechanism: tau: auto runs kind count's instances on binary "
            "or kary or kary_subtract",
        ),
        (
            {
                "statistics__0__tau": "auto",
                "statistics__0__kind": "distinct",
                "statistics__0__deletions": True,
            },
            "statistics[0] (events).deletions: not supported for kind distinct",
        ),
        (
            {"statistics__0__deletions": True},
            "statistics[0] (events).deletions: only with tau: auto",
        ),
        (
            {"statistics__0__theta": 0},
            "statistics[0] (events).theta: Input should be greater than 0",
        ),
        (
            {"input__ingest_wait_ms": -1},
            "input.ingest_wait_ms: Input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_config_names_the_field(changes, message):
    with pytest.raises(ConfigError) as info:
        parse_config(minimal(**changes))
    assert message in str(info.value)


def test_missing_sections_and_duplicates_name_the_field():
    with pytest.raises(ConfigError, match=r"privacy: Field required"):
        parse_config({"statistics": MINIMAL["statistics"]})
    dup = minimal()
    dup["statistics"].append(dict(dup["statistics"][0]))
    with pytest.raises(ConfigError, match=r"statistics\[1\].name: duplicate statistic name"):
        parse_config(dup)


def test_budget_boundary_is_exact():
    data = minimal(privacy__total_epsilon=0.3)
    data["statistics"] = [
        {"name": "a", "epsilon": 0.1, "tau": 1},
        {"name": "b", "epsilon": 0.2, "tau": 1},
    ]
    parse_config(data)  # 0.1 + 0.2 is exactly the budget, whatever binary floats say
    data["privacy"]["total_epsilon"] = 0.3 - 1e-6
    with pytest.raises(ConfigError, match="privacy.total_epsilon"):
        parse_config(data)


def test_expiring_statistics_are_charged_their_loss_at_the_horizon():
    stat = {
        "name": "e",
        "epsilon": 0.5,
        "tau": 1,
        "mechanism": "expiring",
        "lambda": 1,
        "horizon_ticks": 8,
    }
    # lambda = 1: g(d) = 2 (floor(log2 d) + 1), so g(8) = 8 and the charge is 0.5 * 8 = 4.
    parse_config({"privacy": {"total_epsilon": 4}, "statistics": [stat]})
    with pytest.raises(ConfigError, match="privacy.total_epsilon: statistics spend 4 in total"):
        parse_config({"privacy": {"total_epsilon": 3.99}, "statistics": [stat]})


def test_shipped_demo_config_is_valid():
    from importlib.resources import files

    cfg = load_config(files("dpstream.config").joinpath("demo.yaml"))
    assert [s.name for s in cfg.statistics] == ["events", "clicks", "events_auto"]
    assert cfg.statistics[2].user_level and not cfg.statistics[0].user_level


def test_yaml_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("statistics: [\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(path)


def test_a_dumped_config_parses_again():
    # The demo (and users' tooling) writes a parsed config back out: defaults included.
    data = {
        "privacy": {"total_epsilon": 9.0},
        "statistics": [
            {"name": "c", "epsilon": 1.0, "tau": 4},
            {"name": "s", "kind": "sum", "max_value": 5, "epsilon": 1.0},
            {"name": "h", "kind": "histogram", "bins": 4, "epsilon": 1.0},
            {"name": "k", "kind": "kselect", "bins": 4, "rank": "max", "epsilon": 1.0},
            {"name": "d", "kind": "distinct", "epsilon": 1.0},
            {"name": "e", "epsilon": 1.0, "tau": 2, "mechanism": "expiring", "lambda": 1,
             "horizon_ticks": 2},
        ],
    }  # fmt: skip
    cfg = parse_config(data)
    assert parse_config(cfg.model_dump(mode="json", by_alias=True)) == cfg


@pytest.mark.parametrize(
    ("ticks", "delay"),
    [
        ({}, 1.25),  # 1 s ticks: the marker period 0.25 s plus 1 s
        ({"interval_seconds": 0.5}, 1.125),
        ({"interval_seconds": 3600}, 2.0),  # the clock looks every second at most
        ({"interval_seconds": 1, "release_delay_seconds": 0.5}, 0.5),  # the least allowed
    ],
)
def test_the_release_delay_defaults_to_the_marker_period_plus_a_second(ticks, delay):
    cfg = parse_config({**MINIMAL, "ticks": ticks})
    assert cfg.ticks.release_delay == delay
    assert cfg.ticks.marker_period_seconds == min(cfg.ticks.interval_seconds / 4, 1.0)


def test_an_error_about_a_statistic_names_it():
    # Before: "statistics[1].epsilon: ..." alone, which the user had to count to.
    data = minimal(statistics__0__name="views")
    data["statistics"].append({"name": "revenue", "epsilon": -1, "tau": 2})
    with pytest.raises(ConfigError) as raised:
        parse_config(data)
    assert str(raised.value).splitlines()[1:] == [
        "  statistics[1] (revenue).epsilon: Input should be greater than 0"
    ]
    data["statistics"][1] |= {"epsilon": 1, "name": "views"}  # a message naming it already
    with pytest.raises(ConfigError, match=r"duplicate statistic name 'views'$"):
        parse_config(data)


def _refusal(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


def test_a_release_topic_that_is_the_events_topic_is_refused():
    # Issue 27's reproduction: with the prefix "<app_id>-" a statistic named "events" was
    # released into the events topic; check-config said OK and the worker crashed at start
    # (aiokafka: "AssertionError: Unrecognized partition").
    data = minimal(outputs__release_topic_prefix="dpstream-")
    assert (
        "statistics[0].name: the release topic (outputs.release_topic_prefix 'dpstream-' + "
        "name) 'dpstream-events' is also dpstream's events topic (app_id)"
    ) in _refusal(data)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"statistics__0__name": "stage2", "outputs__release_topic_prefix": "dpstream-"},
            "statistics[0].name: the release topic (outputs.release_topic_prefix 'dpstream-' + "
            "name) 'dpstream-stage2' is also dpstream's stage-2 topic (app_id)",
        ),
        (
            {
                "statistics__0__name": "stage1-changelog",
                "outputs__release_topic_prefix": "dpstream-",
            },
            "'dpstream-stage1-changelog' is also dpstream's Faust changelog (app_id)",
        ),
        (
            {"statistics__0__name": "dead-letter", "outputs__release_topic_prefix": "dpstream."},
            "statistics[0].name: the release topic (outputs.release_topic_prefix 'dpstream.' + "
            "name) 'dpstream.dead-letter' is also the dead-letter topic "
            "(outputs.dead_letter_topic)",
        ),
        (
            {"outputs__ledger_topic": "dp.events"},
            "statistics[0].name: the release topic (outputs.release_topic_prefix 'dp.' + name) "
            "'dp.events' is also the ledger topic (outputs.ledger_topic)",
        ),
        (
            {"outputs__ledger_topic": "dpstream.dead-letter"},
            "outputs.ledger_topic: the ledger topic 'dpstream.dead-letter' is also the "
            "dead-letter topic (outputs.dead_letter_topic)",
        ),
        (
            {"outputs__dead_letter_topic": "dpstream-events"},
            "outputs.dead_letter_topic: the dead-letter topic 'dpstream-events' is also "
            "dpstream's events topic (app_id)",
        ),
        (
            {"app_id": "dp", "outputs__ledger_topic": "dp-stage1-changelog"},
            "outputs.ledger_topic: the ledger topic 'dp-stage1-changelog' is also dpstream's "
            "Faust changelog (app_id)",
        ),
        (
            {"input__topics": ["dpstream.ledger"]},
            "input.topics[0]: the source topic 'dpstream.ledger' is also the ledger topic "
            "(outputs.ledger_topic)",
        ),
        (
            {"input__topics": ["dpstream-stage2"]},
            "input.topics[0]: the source topic 'dpstream-stage2' is also dpstream's stage-2 "
            "topic (app_id)",
        ),
        (
            {"input__topics": ["dpstream-clicks"]},
            "input.topics[0]: the source topic 'dpstream-clicks' starts with 'dpstream-', the "
            "prefix of dpstream's own topics (app_id)",
        ),
        # Kafka compares names with '.' read as '_' and refuses to create the second.
        (
            {"outputs__release_topic_prefix": "dp_"},
            None,  # dp_events alone is fine
        ),
        (
            {"input__topics": ["dp_events"]},
            "input.topics[0]: the source topic 'dp_events' collides with the release topic "
            "(outputs.release_topic_prefix 'dp.' + name) 'dp.events' (statistics[0].name): "
            "Kafka takes '.' for '_'",
        ),
        (
            {"outputs__dead_letter_topic": "dpstream_ledger"},
            "outputs.ledger_topic: the ledger topic 'dpstream.ledger' collides with the "
            "dead-letter topic 'dpstream_ledger' (outputs.dead_letter_topic)",
        ),
        # Kafka's topic-name rules, for every topic the pipeline names.
        (
            {"outputs__release_topic_prefix": "dp/"},
            "outputs.release_topic_prefix: must be the start of a Kafka topic name",
        ),
        (
            {"outputs__release_topic_prefix": "x" * 150, "statistics__0__name": "y" * 100},
            f"statistics[0].name: the release topic (outputs.release_topic_prefix '{'x' * 150}' "
            f"+ name) '{'x' * 150}{'y' * 100}': must be a Kafka topic name",
        ),
        ({"input__topics": ["."]}, "input.topics: [0]: must be a Kafka topic name"),
        ({"outputs__ledger_topic": ".."}, "outputs.ledger_topic: must be a Kafka topic name"),
        ({"outputs__dead_letter_topic": "x" * 250}, "outputs.dead_letter_topic: must be a"),
    ],
)
def test_topic_collisions_and_illegal_names_are_refused_naming_the_field(changes, message):
    if message is None:
        parse_config(minimal(**changes))
        return
    assert message in _refusal(minimal(**changes))


def test_the_longest_release_topic_kafka_takes_is_accepted():
    prefix = "x" * 149  # + a name of 100: 249 characters, Kafka's limit
    cfg = parse_config(minimal(outputs__release_topic_prefix=prefix, statistics__0__name="y" * 100))
    assert len(cfg.release_topic("y" * 100)) == 249


def test_every_named_topic_is_listed_with_its_field():
    cfg = parse_config(minimal(app_id="prod", input__topics=["clicks", "views"]))
    fields = {topic: field for field, _, topic in cfg.named_topics()}
    assert fields == {
        "prod-events": "app_id",
        "prod-stage2": "app_id",
        "prod-stage1-changelog": "app_id",
        "prod-stage2-changelog": "app_id",
        "prod-__assignor-__leader": "app_id",
        "dpstream.dead-letter": "outputs.dead_letter_topic",
        "dpstream.ledger": "outputs.ledger_topic",
        "dp.events": "statistics[0].name",
        "clicks": "input.topics[0]",
        "views": "input.topics[1]",
    }


@pytest.mark.parametrize(
    ("noise", "message"),
    [
        # Found at the worker's start before (pipeline/worker/keys.py), now in the config.
        (
            {"mode": "keyed", "key_env": None},
            "noise.key_env: keyed mode needs noise.key_file or noise.key_env",
        ),
        ({"mode": "keyed", "key_env": "NOT A NAME"}, "noise.key_env: must be the name of an"),
    ],
)
def test_a_keyed_config_without_a_place_for_its_key_is_refused(noise, message):
    assert message in _refusal(minimal(noise=noise))
    parse_config(minimal(noise={"mode": "insecure_zero", "key_env": None}))
    parse_config(minimal(noise={"mode": "keyed", "key_file": "/k", "key_env": None}))
