"""Stage 1 trusts no envelope it did not make under its own configuration
(``Stage1Driver.admitted``): an ingest whose configuration drifted, or an old one during a
rolling change, is refused by the rules fingerprint; an envelope that carries the right
fingerprint is still checked event by event, against the same rules and routing the
ingest applies. What it refuses is dead-lettered at its source position, once."""

from __future__ import annotations

import orjson
import pytest

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.pipeline.ingest.route import SourceRecord, route
from dpstream.pipeline.stages.drivers import Refused, Stage1Driver
from dpstream.pipeline.stages.stage1_state import UserEntry, new_partition_state
from dpstream.pipeline.wire.records import (
    decode_envelope,
    encode_envelope,
    limits_for,
    partition_for,
)
from dpstream.statistics.events import Event

COUNT = {"name": "n", "epsilon": 1.0, "tau": 8}
REVENUE = {"name": "revenue", "kind": "sum", "max_value": 10, "epsilon": 1.0, "tau": 10}


def pipeline(*statistics: dict, partitions: int = 1) -> PipelineConfig:
    return parse_config(
        {
            "input": {"partitions": partitions},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": float(len(statistics))},
            "statistics": list(statistics),
        }
    )


def ingested(cfg: PipelineConfig, events: list[dict], first: int = 0) -> list[tuple[int, bytes]]:
    """What an ingest under ``cfg`` writes for ``events``, one source record each at
    offsets ``first``, ``first`` + 1, ... of source partition src/0: (events partition,
    envelope)."""
    records = [
        SourceRecord("src", 0, first + i, None, orjson.dumps(e)) for i, e in enumerate(events)
    ]
    routed = route(records, limits_for(cfg), cfg.input.partitions)
    assert routed.dead_letters == []  # the ingest's own rules accept them all
    return routed.envelopes


def forged(cfg: PipelineConfig, events: list[Event], first: int = 0) -> bytes:
    """An envelope of ``events`` that carries ``cfg``'s rules fingerprint but was not made
    by its ingest (a buggy or hostile writer of the events topic)."""
    offsets = list(range(first, first + len(events)))
    rules = Stage1Driver(cfg).rules
    return encode_envelope("src/0", offsets, [0] * len(events), events, rules=rules)


def fed(
    driver: Stage1Driver, envelopes: list[tuple[int, bytes]]
) -> tuple[dict[int, dict], dict[int, dict[str, UserEntry]], list[Refused]]:
    """Each envelope to its partition's stage 1 (each partition with its own state and
    user entries, as a worker's table has them): (partition states, users by partition,
    refused)."""
    pstates: dict[int, dict] = {}
    users: dict[int, dict[str, UserEntry]] = {}
    refused: list[Refused] = []
    for offset, (partition, value) in enumerate(envelopes):
        pstate = pstates.setdefault(partition, new_partition_state())
        mine = users.setdefault(partition, {})
        rejected, out = driver.on_envelope(pstate, mine, partition, offset, value)
        assert rejected == []
        refused += out
        driver.done(pstate, offset)
    return pstates, users, refused


def test_an_old_ingest_without_the_sum_feeds_a_stage_1_with_it_nothing_out_of_bounds():
    """A rolling change adds a sum (R = 10): the old ingest's rules let ``value: 1e6``
    through (a count ignores values). It reached the sum as 1e6 units (1e20 as -2^63, the
    user's ``used`` at -9.2e18, so the next 500 units of the user were all kept under tau
    10). Now the old ingest's envelopes are refused whole, by their fingerprint."""
    old, new = pipeline(COUNT), pipeline(COUNT, REVENUE)
    driver = Stage1Driver(new)
    events = [{"user_id": "u", "value": v} for v in (1e6, 1e20, 5.0)]
    pstates, users, refused = fed(driver, ingested(old, events))
    assert users == {0: {}} and pstates[0]["pending"] == {}
    reason = f"stage 1: envelope made under other rules ({Stage1Driver(old).rules}, "
    reason += f"this stage 1's: {driver.rules})"
    assert [(r.reason, r.offset, r.event.value) for r in refused] == [
        (reason, 0, 1e6),
        (reason, 1, 1e20),
        (reason, 2, 5.0),
    ]
    # Its position advanced: the same events sent again are not dead-lettered twice.
    assert pstates[0]["sources"] == {"src/0": [2, 0]}


def test_out_of_range_sum_values_under_the_right_fingerprint_are_clipped_where_used():
    """A forged envelope's values reach the sum clipped into [0, R] and rounded: never
    more than R units per event (1e20 once became -2^63 units)."""
    new = pipeline(COUNT, {**REVENUE, "tau": 1000})
    driver = Stage1Driver(new)
    events = [Event("u", None, v) for v in (1e6, 1e20, 5.0, 0.0, 2.5, -3.0)]
    pstates, users, refused = fed(driver, [(0, forged(new, events))])
    assert refused == []
    assert users[0]["u"]["used"] == {"n": 6, "revenue": 10 + 10 + 5 + 0 + 3 + 0}
    assert pstates[0]["pending"] == {"n": {"w": 6}, "revenue": {"w": 28}}


def test_an_ingest_configured_for_4_partitions_cannot_double_a_user_of_an_8_partition_stage_1():
    """``user4`` is on partition 1 of 4 and 5 of 8: an ingest configured with 4 partitions
    sent its events to partition 1 of the 8-partition topic, whose stage 1 counted them
    beside partition 5's: 16 from one user with tau 8."""
    assert (partition_for("user4", 4), partition_for("user4", 8)) == (1, 5)
    four, eight = pipeline(COUNT, partitions=4), pipeline(COUNT, partitions=8)
    driver = Stage1Driver(eight)
    events = [{"user_id": "user4"}] * 8
    drifted, right = ingested(four, events), ingested(eight, events, first=8)
    assert [p for p, _ in drifted] == [1] and [p for p, _ in right] == [5]
    pstates, users, refused = fed(driver, drifted + right)
    kept = sum(p["pending"].get("n", {}).get("w", 0) for p in pstates.values())
    assert kept == 8
    assert {r.reason.split(" (")[0] for r in refused} == {
        "stage 1: envelope made under other rules"
    }
    # The same misrouting with this configuration's fingerprint: the routing check.
    _, _, refused = fed(Stage1Driver(eight), [(1, forged(eight, [Event("user4", None, None)]))])
    assert [r.reason for r in refused] == ["stage 1: user belongs to partition 5 of 8, not 1"]


HISTOGRAM = {"name": "h", "kind": "histogram", "bins": 4, "epsilon": 1.0, "tau": "auto"}
KSELECT = {"name": "k", "kind": "kselect", "bins": 4, "rank": "max", "epsilon": 1.0, "tau": "auto"}
MEAN = {
    "name": "m",
    "kind": "mean",
    "epsilon": 1.0,
    "mean": {"lower": 0, "upper": 10, "max_samples_per_user": 2},
}


@pytest.mark.parametrize("statistic", [HISTOGRAM, KSELECT, MEAN])
def test_an_event_without_a_value_counts_for_the_count_and_not_for_the_value_kind(statistic):
    """A histogram, k-selection or mean once raised TypeError on an event without a value
    in stage 1 (a crash loop), then dead-lettered it for the count too; now the count
    counts it and the value kind skips it, and only the value event reaches the kind."""
    new = pipeline(COUNT, statistic)
    driver = Stage1Driver(new)
    events = [Event("u", None, None), Event("u", None, 2.0)]
    pstates, users, refused = fed(driver, [(0, forged(new, events))])
    assert refused == []
    assert users[0]["u"]["used"] == {"n": 2, statistic["name"]: 1}
    old_ingest = ingested(pipeline(COUNT), [{"user_id": "u"}])
    _, _, refused = fed(driver, old_ingest)
    assert [r.reason.split(" (")[0] for r in refused] == [
        "stage 1: envelope made under other rules"
    ]


@pytest.mark.parametrize("statistic", [HISTOGRAM, KSELECT, MEAN])
def test_an_event_no_statistic_can_use_is_refused_naming_the_statistic(statistic):
    new = pipeline(statistic)
    events = [Event("u", None, None), Event("u", None, 2.0)]
    _, users, refused = fed(Stage1Driver(new), [(0, forged(new, events))])
    name = statistic["name"]
    assert [(r.reason, r.offset) for r in refused] == [
        (f"stage 1: missing value (statistic {name})", 0)
    ]
    assert users[0]["u"]["used"] == {name: 1}


def test_a_histogram_value_of_0_is_clipped_into_bin_1_not_the_band_below():
    """Value 0 became column -1 of the histogram's weights (the previous rank band); it
    is clipped into [1, R] now, like every value outside its bins."""
    new = pipeline(COUNT, HISTOGRAM)
    driver = Stage1Driver(new)
    pstates, _, refused = fed(
        driver, [(0, forged(new, [Event("u", None, 0.0), Event("v", None, 4.0)]))]
    )
    assert refused == []
    weights = pstates[0]["pending"]["h"]
    assert not any(key.endswith("/-1") for key in weights)
    bins = sorted(key.rsplit("/", 1)[1] for key in weights if key.startswith("+b"))
    assert bins == ["0", "3"]  # u's 0.0 in bin 1, v's 4.0 in bin 4


def test_the_dead_letter_names_the_source_position_and_carries_the_event():
    cfg = pipeline(REVENUE)
    driver = Stage1Driver(cfg)
    value = encode_envelope(
        "users.clicks/3",
        [40, 41, 41],
        [0, 0, 2],
        [Event("a", None, 1.0), Event("b", None, None), Event("c", None, 2.0)],
        rules=driver.rules,
    )
    pstate = new_partition_state()
    rejected, refused = driver.on_envelope(pstate, {}, 0, 7, value)
    assert rejected == []
    (dead,) = [orjson.loads(r.dead_letter()) for r in refused]
    assert dead == {
        "reason": "stage 1: missing value (statistic revenue)",
        "topic": "users.clicks",
        "partition": 3,
        "offset": 41,
        "index": 0,
        "payload": '{"user_id":"b"}',
        "payload_truncated": False,
    }
    # A re-delivered record (the worker crashed before its offset was stored) and the
    # ingest's re-send of the same events: not dead-lettered again.
    assert driver.on_envelope(pstate, {}, 0, 7, value) == ([], [])
    driver.done(pstate, 7)
    assert driver.on_envelope(pstate, {}, 0, 8, value) == ([], [])


@pytest.mark.parametrize("rules", ["0123456789abcdef", None])
def test_an_envelope_under_other_rules_or_none_is_dead_lettered_whole(rules, caplog):
    cfg = pipeline(COUNT)
    driver = Stage1Driver(cfg)
    events = [Event("a", None, None), Event("b", None, None)]
    raw = orjson.loads(encode_envelope("src/2", [5, 9], [1, 0], events, rules=rules or "x"))
    if rules is None:
        del raw["r"]
    value = orjson.dumps(raw)
    assert decode_envelope(value).rules == rules
    pstate, users = new_partition_state(), {}
    for offset in (0, 1):  # a second envelope under the same rules: logged once
        rejected, refused = driver.on_envelope(pstate, users, 0, offset, value)
        driver.done(pstate, offset)
    reason = (
        "stage 1: envelope without a rules fingerprint"
        if rules is None
        else f"stage 1: envelope made under other rules ({rules}, this stage 1's: {driver.rules})"
    )
    assert users == {} and pstate["pending"] == {}
    assert pstate["sources"] == {"src/2": [9, 0]}  # handled: dead-lettered, once
    first = driver.on_envelope(new_partition_state(), {}, 0, 0, value)[1]
    assert [(r.reason, r.source, r.offset, r.index, r.event) for r in first] == [
        (reason, "src/2", 5, 1, events[0]),
        (reason, "src/2", 9, 0, events[1]),
    ]
    assert refused == []  # the second envelope's events were the first's: seen
    assert (
        sum("dead-lettering envelopes made under rules" in r.message for r in caplog.records) == 1
    )


def test_a_malformed_fingerprint_is_a_malformed_envelope():
    driver = Stage1Driver(pipeline(COUNT))
    raw = orjson.loads(forged(pipeline(COUNT), [Event("a", None, None)]))
    value = orjson.dumps({**raw, "r": 7})
    assert driver.on_envelope(new_partition_state(), {}, 0, 0, value) == (
        [(None, "malformed envelope")],
        [],
    )


def test_the_ingest_writes_its_fingerprint_into_every_envelope():
    cfg = pipeline(COUNT, REVENUE, partitions=3)
    envelopes = ingested(cfg, [{"user_id": f"u{i}", "value": 1} for i in range(30)])
    assert len(envelopes) == 3
    assert {decode_envelope(v).rules for _, v in envelopes} == {Stage1Driver(cfg).rules}
