"""Input validation (pipeline/wire/records.py): events, envelopes, tick markers and headers are
decoded, or rejected with a reason that names what is wrong."""

from __future__ import annotations

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.pipeline.wire.records import (
    BATCH,
    TICK,
    BadRecord,
    Limits,
    check_marker_time,
    decode_events,
    decode_tick,
    event_json,
    header_kind,
    limits_for,
    parse_event,
    partition_for,
    release_deadline_ms,
)
from tests.config_builders import MINIMAL

LIMITS = Limits(max_record_bytes=2048, max_user_id_length=64, known_keys=frozenset({"click"}))
ANY_KEY = Limits(max_record_bytes=2048, max_user_id_length=64, known_keys=None)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "malformed JSON"),
        (b'{"value": 1}', "missing user_id"),
        (b'{"user_id": 42}', "user_id is not a string"),
        (b'{"user_id": "  "}', "empty user_id"),
        (b'{"user_id": "' + b"u" * 65 + b'"}', "user_id too long"),
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


def test_a_value_no_statistic_reads_does_not_matter():
    # No statistic needs a value: a count counts the event whatever its "value" holds.
    for payload in (b'{"user_id": "u", "value": "3"}', b'{"user_id": "u", "value": true}'):
        assert decode_events(payload, None, ANY_KEY)[0][0].value is None


def test_a_statistic_without_key_filter_accepts_every_key():
    from dpstream.pipeline.wire.records import limits_for

    cfg = parse_config(
        {
            **MINIMAL,
            "statistics": [
                *MINIMAL["statistics"],
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
        (
            {"key": "page", "op": "delete", "value": 1},
            "op delete: no statistic with deletions counts this event",
        ),
        ({"key": "cart", "op": "remove"}, "op is not insert or delete"),
        ({"key": "cart", "op": None}, "op is not insert or delete"),
        ({"key": "cart", "op": ["delete"]}, "op is not insert or delete"),
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


@pytest.mark.parametrize(
    ("event", "value", "tally"),
    [
        # The count "n" counts every event: a value another statistic cannot use does not
        # lose the event, and the failure is counted for that statistic.
        ({"key": "buy"}, None, {("spend", "missing value"): 1}),
        ({"key": "buy", "value": True}, None, {("spend", "value is not a number"): 1}),
        ({"key": "buy", "value": "12"}, None, {("spend", "value is not a number"): 1}),
        ({"key": "page"}, None, {("seen", "missing value"): 1}),
        # Real values are the sum's; outside [0, max_value] they are clipped, and counted.
        ({"key": "buy", "value": 2.5}, 2.5, {}),
        ({"key": "buy", "value": 11}, 11.0, {("spend", "clipped"): 1}),
        ({"key": "buy", "value": -1}, -1.0, {("spend", "clipped"): 1}),
        ({"key": "buy", "value": 0}, 0.0, {}),
    ],
)
def test_an_event_one_statistic_cannot_use_is_counted_by_the_others(event, value, tally):
    counted: dict[tuple[str, str], int] = {}
    assert parse_event({"user_id": "u", **event}, _valued_limits(), counted).value == value
    assert counted == tally


def _no_count_limits():
    cfg = parse_config(
        {
            "privacy": {"total_epsilon": 4},
            "statistics": [
                {"name": "spend", "epsilon": 1, "kind": "sum", "max_value": 10, "key": "buy"},
                {"name": "sold", "epsilon": 1, "kind": "histogram", "bins": 4, "key": "buy"},
                {"name": "seen", "epsilon": 1, "kind": "distinct", "key": "page"},
            ],
        }
    )
    return limits_for(cfg)


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"key": "buy"}, "missing value (statistics spend, sold)"),
        ({"key": "buy", "value": "3"}, "value is not a number (statistics spend, sold)"),
        ({"key": "page", "value": None}, "missing value (statistic seen)"),
    ],
)
def test_an_event_no_statistic_can_use_is_dead_lettered_naming_them(event, reason):
    counted: dict[str, int] = {}
    with pytest.raises(BadRecord) as info:
        parse_event({"user_id": "u", **event}, _no_count_limits(), counted)
    assert str(info.value) == reason
    assert counted == {}  # a dead letter is counted as one, not per statistic


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


@pytest.mark.parametrize(
    ("appended", "reason"),
    [
        (11.25, None),  # tick 9 of 1 s, delay 1.25 s: its deadline is 11.25, written then
        (9.25, None),  # within the 2 s clock skew
        (9.2, "release marker from the future"),  # after the tick's end, before its deadline
        (311.25, None),
        (311.3, "release marker too old"),
    ],
)
def test_release_markers_are_checked_against_their_deadline(appended, reason):
    if reason is None:
        check_marker_time(9, 1.0, round(appended * 1000), 1.25, "release marker")
    else:
        with pytest.raises(BadRecord, match=reason):
            check_marker_time(9, 1.0, round(appended * 1000), 1.25, "release marker")


def test_release_deadlines_are_whole_milliseconds_of_tick_end_plus_delay():
    assert release_deadline_ms(9, 1.0, 1.25) == 11_250
    # A deadline binary floats cannot hold exactly still gives the exact millisecond
    # (32.3 s is 32299.999999999996 ms in floats, truncated 32299).
    assert release_deadline_ms(309, 0.1, 1.3) == 32_300
    assert int(((309 + 1) * 0.1 + 1.3) * 1000) == 32_299


def test_a_dpstream_header_without_a_value_is_an_unknown_kind():
    assert header_kind([("dpstream", None)]) == b""
    with pytest.raises(BadRecord, match="unknown dpstream header"):
        decode_events(b'{"user_id": "u"}', b"", ANY_KEY)


def _shop(**input_fields):
    """The purchases of a shop whose events name their type and amount: a count of page
    views, a count of purchases, a revenue sum and a basket mean of the same field."""
    return parse_config(
        {
            "input": input_fields,
            "privacy": {"total_epsilon": 4},
            "statistics": [
                {"name": "views", "epsilon": 1, "tau": 4, "where": {"event_type": "page_view"}},
                {
                    "name": "buys",
                    "epsilon": 1,
                    "tau": 4,
                    "where": {"event_type": ["purchase", "refund"], "shop.region": "eu"},
                },
                {
                    "name": "revenue",
                    "epsilon": 1,
                    "kind": "sum",
                    "tau": 3,
                    "upper": 200,
                    "resolution": 20000,
                    "value_field": "order.total",
                    "where": {"event_type": "purchase"},
                },
                {
                    "name": "basket",
                    "epsilon": 1,
                    "kind": "mean",
                    "value_field": "order.total",
                    "where": {"event_type": "purchase"},
                    "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4},
                },
            ],
        }
    )


@pytest.mark.parametrize(
    ("event", "outcome"),
    [
        ({"event_type": "page_view"}, {}),
        # Membership, a nested field ANDed: a refund outside the eu is nobody's.
        ({"event_type": "refund", "shop": {"region": "eu"}}, {}),
        ({"event_type": "refund", "shop": {"region": "us"}}, "no statistic's where matches"),
        ({"event_type": "signup"}, "no statistic's where matches"),
        ({"event_type": 1}, "no statistic's where matches"),  # a number is not "1"
        # A purchase with a bad amount still counts as a purchase (eu): the sum and the
        # mean fail, and say so; without the eu region nobody can use it.
        (
            {"event_type": "purchase", "shop": {"region": "eu"}, "order": {"total": "9,99"}},
            {
                ("revenue", "order.total is not a number"): 1,
                ("basket", "order.total is not a number"): 1,
            },
        ),
        (
            {"event_type": "purchase", "order": {}},
            "missing order.total (statistics revenue, basket)",
        ),
        (
            {"event_type": "purchase", "order": {"total": 250}},
            {("revenue", "clipped"): 1, ("basket", "clipped"): 1},
        ),
    ],
)
def test_where_filters_select_events_by_equality_membership_and_nested_fields(event, outcome):
    limits = limits_for(_shop())
    counted: dict[str, int] = {}
    if isinstance(outcome, str):
        with pytest.raises(BadRecord) as info:
            parse_event({"user_id": "u", **event}, limits, counted)
        assert info.value.reason == outcome
        return
    parse_event({"user_id": "u", **event}, limits, counted)
    assert counted == outcome


def test_the_fields_read_by_path_go_through_the_envelope_and_the_log_form():
    from dpstream.pipeline.wire.records import decode_envelope, encode_envelope

    limits = limits_for(_shop(user_id_field="actor.id"))
    raw = {
        "actor": {"id": "u"},
        "event_type": "purchase",
        "shop": {"region": "eu", "name": "not read"},
        "order": {"total": 12.5, "items": [1, 2]},
    }
    event = parse_event(raw, limits)
    assert event.attrs == (("event_type", "purchase"), ("order.total", 12.5), ("shop.region", "eu"))
    assert event_json(event) == {
        "user_id": "u",
        "event_type": "purchase",
        "order": {"total": 12.5},
        "shop": {"region": "eu"},
    }
    envelope = decode_envelope(encode_envelope("s/0", [0], [0], [event], rules="r"))
    assert envelope.events == [event]


def test_the_rules_fingerprint_keeps_the_old_form_and_covers_fields_and_filters():
    from dpstream.pipeline.wire.records import rules_fingerprint

    legacy = parse_config(
        {
            "privacy": {"total_epsilon": 4},
            "statistics": [
                {"name": "views", "epsilon": 1, "tau": 4, "key": "view"},
                {
                    "name": "revenue",
                    "epsilon": 1,
                    "kind": "sum",
                    "tau": 10,
                    "max_value": 200,
                    "key": "buy",
                },
                {"name": "sizes", "epsilon": 1, "kind": "histogram", "bins": 8, "key": "buy"},
                {
                    "name": "basket",
                    "epsilon": 1,
                    "kind": "mean",
                    "key": "buy",
                    "mean": {"lower": 0, "upper": 200, "max_samples_per_user": 4},
                },
            ],
        }
    )
    assert rules_fingerprint(limits_for(legacy), 3) == "f232e788ce524ae1"  # as before
    shop = _shop()
    seen = {rules_fingerprint(limits_for(shop), 3)}
    for n, change in enumerate(
        [
            {"value_field": "order.net"},
            {"where": {"event_type": "sale"}},
            {"where": {"event_type": ["purchase", "sale"]}},
        ]
    ):
        stats = [s.model_dump(by_alias=True, exclude_unset=True) for s in shop.statistics]
        stats[2] = {**stats[2], **change}
        other = parse_config({"privacy": {"total_epsilon": 4}, "statistics": stats})
        seen.add(rules_fingerprint(limits_for(other), 3))
        assert len(seen) == n + 2
