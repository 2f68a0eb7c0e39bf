"""Input validation and config errors: each names what is wrong."""

from __future__ import annotations

import copy

import orjson
import pytest

from dpstream.config.schema import ConfigError, load_config, parse_config
from dpstream.pipeline.records import (
    BATCH,
    TICK,
    BadRecord,
    Limits,
    check_marker_time,
    decode_events,
    decode_tick,
    event_json,
    header_kind,
    parse_event,
    partition_for,
)
from dpstream.pipeline.worker_support import limits_for, load_noise

LIMITS = Limits(max_record_bytes=2048, max_user_id_length=64, known_keys=frozenset({"click"}))
ANY_KEY = Limits(max_record_bytes=2048, max_user_id_length=64, known_keys=None)

BASE = {
    "privacy": {"total_epsilon": 2.0},
    "statistics": [{"name": "events", "epsilon": 1.0, "tau": 4}],
}


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "malformed JSON"),
        (b'{"value": 1}', "missing user_id"),
        (b'{"user_id": 42}', "user_id is not a string"),
        (b'{"user_id": "  "}', "empty user_id"),
        (b'{"user_id": "' + b"u" * 65 + b'"}', "user_id too long"),
        (b'{"user_id": "u", "value": "3"}', "value is not a number"),
        (b'{"user_id": "u", "value": true}', "value is not a number"),
        (b'{"user_id": "u", "value": NaN}', "non-finite number (NaN or infinity)"),
        (b'{"user_id": "u", "value": 1e999}', "non-finite number (NaN or infinity)"),
        (b'{"user_id": "u", "key": 7}', "key is not a string"),
        (b'{"user_id": "u", "key": "nope"}', "unknown statistic key"),
        (b'{"user_id": "u", "ts": [1]}', "ts is not a number or string"),
        (b'{"user_id": "u"}', "missing key"),
        (b"[1, 2]", "event is not a JSON object"),
        (b'{"user_id": "u", "pad": "' + b"x" * 3000 + b'"}', "oversized record"),
    ],
)
def test_bad_events_are_rejected_with_their_reason(payload, reason):
    limits = LIMITS if "key" in reason else ANY_KEY
    with pytest.raises(BadRecord) as info:
        decode_events(payload, None, limits)
    assert info.value.reason == reason
    assert "u" * 10 not in info.value.reason  # reasons never echo payloads


def test_a_statistic_without_key_filter_accepts_every_key():
    from dpstream.pipeline.worker_support import limits_for

    cfg = parse_config(
        {
            **BASE,
            "statistics": [
                *BASE["statistics"],
                {"name": "c", "epsilon": 1, "tau": 1, "key": "click"},
            ],
            "privacy": {"total_epsilon": 2},
        }
    )
    limits = limits_for(cfg)
    assert limits.known_keys is None
    for payload in (b'{"user_id": "u", "key": "view"}', b'{"user_id": "u"}'):
        assert len(decode_events(payload, None, limits)[0]) == 1


def _valued_limits():
    cfg = parse_config(
        {
            "privacy": {"total_epsilon": 4},
            "statistics": [
                {"name": "n", "epsilon": 1, "tau": 3},
                {"name": "spend", "epsilon": 1, "kind": "sum", "max_value": 10, "key": "buy"},
                {"name": "seen", "epsilon": 1, "kind": "distinct", "key": "page"},
                {"name": "cart", "epsilon": 1, "key": "cart", "deletions": True},
            ],
        }
    )
    return limits_for(cfg)


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"key": "buy"}, "value is not an integer (statistic spend)"),
        ({"key": "buy", "value": 2.5}, "value is not an integer (statistic spend)"),
        ({"key": "buy", "value": 11}, "value outside [1, 10] (statistic spend)"),
        ({"key": "buy", "value": 0}, "value outside [1, 10] (statistic spend)"),
        ({"key": "page"}, "missing value (statistic seen)"),
        (
            {"key": "page", "op": "delete", "value": 1},
            "op delete: no statistic with deletions counts this event",
        ),
        ({"key": "cart", "op": "remove"}, "op is not insert or delete"),
        ({"key": "cart", "op": None}, "op is not insert or delete"),
        ({"key": "cart", "op": ["delete"]}, "op is not insert or delete"),
        ({"key": "buy", "value": True}, "value is not a number"),
        ({"key": "buy", "value": 3, "ts": False}, "ts is not a number or string"),
        ({"key": "buy", "value": 3, "ts": None, "op": "insert"}, None),
    ],
)
def test_statistics_reject_events_they_cannot_use(event, reason):
    if reason is None:  # null where null means absent: accepted
        assert parse_event({"user_id": "u", **event}, _valued_limits()).value == 3.0
        return
    with pytest.raises(BadRecord) as info:
        parse_event({"user_id": "u", **event}, _valued_limits())
    assert str(info.value) == reason


def test_good_valued_and_delete_events():
    limits = _valued_limits()
    buy = parse_event({"user_id": "u", "key": "buy", "value": 10}, limits)
    assert (buy.value, buy.delete) == (10.0, False)
    gone = parse_event({"user_id": "u", "key": "cart", "op": "delete"}, limits)
    assert gone.delete and event_json(gone) == {"user_id": "u", "key": "cart", "op": "delete"}
    assert parse_event({"user_id": "u", "key": "page", "value": -3.5}, limits).value == -3.5


def test_envelope_keeps_good_events_and_reports_bad_ones_by_index():
    payload = orjson.dumps(
        [{"user_id": "a", "key": "click"}, {"user_id": ""}, {"user_id": "b", "key": "click"}]
    )
    good, bad = decode_events(payload, BATCH, LIMITS)
    assert [e.user_id for e in good] == ["a", "b"]
    assert bad == [(1, "empty user_id")]
    with pytest.raises(BadRecord, match="not a JSON array"):
        decode_events(b'{"user_id": "a"}', BATCH, LIMITS)


def test_tick_markers_and_headers():
    assert decode_tick(b'{"tick": 12}') == 12
    for bad in (b'{"tick": -1}', b'{"tick": "3"}', b"[]", b"x"):
        with pytest.raises(BadRecord, match="malformed tick marker"):
            decode_tick(bad)
    assert header_kind([("dpstream", b"tick")]) == TICK
    assert header_kind({"dpstream": b"batch"}) == BATCH
    assert header_kind(None) is None


@pytest.mark.parametrize(
    ("key", "java_murmur2"),
    # Kafka's UtilsTest.testMurmur2 vectors (signed 32-bit results of Utils.murmur2).
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_partition_for_matches_the_java_default_partitioner(key, java_murmur2):
    for n in (1, 3, 4, 7, 64):
        # DefaultPartitioner: Utils.toPositive(murmur2(key)) % n, toPositive = x & 0x7fffffff
        assert partition_for(key, n) == (java_murmur2 & 0x7FFFFFFF) % n


def _cfg(**changes):
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        target = data
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        target[last] = value
    return data


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"statistics__0__epsilon": -1}, "statistics[0].epsilon: Input should be greater than 0"),
        (
            {"statistics__0__tau": 0},
            "statistics[0].tau: must be 'auto' or an integer in [1, 1000000]",
        ),
        ({"statistics__0__kind": "median"}, "statistics[0].kind: Input should be 'count'"),
        ({"statistics__0__name": "bad name!"}, "statistics[0].name: must match"),
        ({"statistics__0__bogus": 1}, "statistics[0].bogus: Extra inputs are not permitted"),
        ({"input__partitions": 0}, "input.partitions: Input should be greater than or equal to 1"),
        ({"input__topics": ["a topic"]}, "input.topics: [0]: must be a Kafka topic name"),
        ({"input__topic": "events"}, "input.topic: now topics, a list of source topics"),
        ({"input__topics": ["dp.events"]}, "input.topics[0]: 'dp.events' is a topic dpstream"),
        ({"input__user_id_field": "actor."}, "input.user_id_field: must be a field name"),
        ({"ticks__interval_seconds": 0}, "ticks.interval_seconds: Input should be greater than 0"),
        ({"privacy__total_epsilon": 0.5}, "privacy.total_epsilon: statistics spend 1 in total"),
        ({"privacy__neighbours": "event"}, "privacy.neighbours: Input should be 'whole_user'"),
        ({"noise__mode": "gaussian"}, "noise.mode: Input should be 'keyed' or 'insecure_zero'"),
        ({"statistics__0__mechanism": "kary"}, "statistics[0].k: required for mechanism kary"),
        (
            {"statistics__0__mechanism": "kary_subtract", "statistics__0__k": 2},
            "statistics[0].k: must be >= 3 for kary_subtract, got 2",
        ),
        ({"statistics__0__k": 3}, "statistics[0].k: only applies to kary and kary_subtract"),
        ({"statistics__0__mechanism": "expiring"}, "statistics[0].lambda: required"),
        (
            {"statistics__0__mechanism": "expiring", "statistics__0__lambda": 2},
            "statistics[0].horizon_ticks: required for mechanism expiring",
        ),
        ({"statistics__0__lambda": 2}, "statistics[0].lambda: lambda and delay only apply"),
        ({"statistics__0__mechanism": "auto"}, "statistics[0].horizon_ticks: required"),
        ({"statistics__0__mechanism": "fancy"}, "statistics[0].mechanism: Input should be"),
        ({"statistics__0__kind": "sum"}, "statistics[0].max_value: required for kind sum"),
        ({"statistics__0__bins": 8}, "statistics[0].bins: only applies to histogram and kselect"),
        (
            {"statistics__0__kind": "histogram", "statistics__0__bins": 8},
            "statistics[0].tau: kind histogram needs tau: auto",
        ),
        (
            {
                "statistics__0__kind": "kselect",
                "statistics__0__bins": 8,
                "statistics__0__tau": "auto",
            },
            "statistics[0].rank: required for kind kselect",
        ),
        (
            {"statistics__0__halve_margin": True},
            "statistics[0].halve_margin: only applies to kind kselect, not count",
        ),
        (
            {
                "statistics__0__tau": "auto",
                "statistics__0__mechanism": "kary",
                "statistics__0__k": 4,
            },
            "statistics[0].mechanism: tau: auto runs Dong-Luo-Yi's binary tree",
        ),
        (
            {
                "statistics__0__tau": "auto",
                "statistics__0__kind": "distinct",
                "statistics__0__deletions": True,
            },
            "statistics[0].deletions: not supported for kind distinct",
        ),
        ({"statistics__0__deletions": True}, "statistics[0].deletions: only with tau: auto"),
        ({"statistics__0__theta": 0}, "statistics[0].theta: Input should be greater than 0"),
    ],
)
def test_bad_config_names_the_field(changes, message):
    with pytest.raises(ConfigError) as info:
        parse_config(_cfg(**changes))
    assert message in str(info.value)


def test_missing_sections_and_duplicates_name_the_field():
    with pytest.raises(ConfigError, match=r"privacy: Field required"):
        parse_config({"statistics": BASE["statistics"]})
    dup = _cfg()
    dup["statistics"].append(dict(dup["statistics"][0]))
    with pytest.raises(ConfigError, match=r"statistics\[1\].name: duplicate statistic name"):
        parse_config(dup)


def test_budget_boundary_is_exact():
    data = _cfg(privacy__total_epsilon=0.3)
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


def test_noise_key_is_required_and_never_echoed(monkeypatch, tmp_path):
    cfg = parse_config(_cfg(noise__key_env="DPSTREAM_TEST_KEY"))
    monkeypatch.delenv("DPSTREAM_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="noise.key_env: environment variable DPSTREAM_TEST_KEY"):
        load_noise(cfg)
    monkeypatch.setenv("DPSTREAM_TEST_KEY", "short")
    with pytest.raises(ConfigError, match="noise.key_env: the noise key must be at least 256"):
        load_noise(cfg)
    secret = "8f1c2a7e55d04b9e3a61c0ffee12ab34cd56ef7890a1b2c3d4e5f60718293a4b"
    monkeypatch.setenv("DPSTREAM_TEST_KEY", secret)
    assert secret not in repr(load_noise(cfg))
    key_file = tmp_path / "key"
    key_file.write_text(secret + "\n")
    from_file = load_noise(parse_config(_cfg(noise__key_file=str(key_file))))
    assert from_file.discrete_laplace(("n", 1), 10) == load_noise(cfg).discrete_laplace(
        ("n", 1), 10
    )
    with pytest.raises(ConfigError, match="noise.key_file: cannot read key file"):
        load_noise(parse_config(_cfg(noise__key_file=str(tmp_path / "missing"))))


@pytest.mark.parametrize(
    ("tick", "appended", "reason"),
    [
        (9, 10.0, None),  # tick 9 of 1 s ends at 10.0: written right then
        (9, 8.5, None),  # within the 2 s clock skew
        (9, 7.9, "tick marker from the future"),
        (9, 310.0, None),  # 300 s late: a stalled leader, still accepted
        (9, 310.5, "tick marker too old"),
    ],
)
def test_tick_markers_are_checked_against_their_broker_timestamp(tick, appended, reason):
    if reason is None:
        check_marker_time(tick, 1.0, int(appended * 1000))
    else:
        with pytest.raises(BadRecord, match=reason):
            check_marker_time(tick, 1.0, int(appended * 1000))
    check_marker_time(tick, 1.0, None)  # no timestamp (e.g. a replay log): nothing to check


def test_a_dpstream_header_without_a_value_is_an_unknown_kind():
    assert header_kind([("dpstream", None)]) == b""
    with pytest.raises(BadRecord, match="unknown dpstream header"):
        decode_events(b'{"user_id": "u"}', b"", ANY_KEY)


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
