"""Stage 1's own checks of an envelope (pipeline/wire/records.py): the rules fingerprint an
ingest writes into it, and ``refused_rows``, the ingest's checks over the columns, which
must refuse exactly what the ingest's ``parse_event`` and routing would not have sent to
the partition, with the same reasons."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.config.schema import PipelineConfig, parse_config
from dpstream.pipeline.wire.records import (
    BadRecord,
    decode_envelope,
    encode_envelope,
    event_json,
    limits_for,
    parse_event,
    partition_for,
    refused_rows,
    rules_fingerprint,
)
from dpstream.statistics.events import Event

MEAN = {"lower": 0, "upper": 10, "max_samples_per_user": 2}
CELLS = {
    "field": "h3",
    "keys": ["a", "b"],
    "slot_ticks": 2,
    "lower": 0,
    "upper": 10,
    "step": 1,
    "mechanism": "noisy_ratio",
    "contribution_cap": 2,
    "epoch_slots": 4,
    "epoch_cap": 1,
}
# Every kind of value rule: keys (so unknown and missing keys), integer ranges, any finite
# value, deletions for some keys only, a cell attribute with a public domain.
KEYED = [
    {"name": "n", "epsilon": 1, "tau": 3, "key": "view"},
    {"name": "spend", "epsilon": 1, "kind": "sum", "max_value": 10, "tau": 5, "key": "buy"},
    {"name": "sizes", "epsilon": 1, "kind": "histogram", "bins": 4, "tau": "auto", "key": "buy"},
    {"name": "cart", "epsilon": 1, "tau": "auto", "key": "cart", "deletions": True},
    {"name": "seen", "epsilon": 1, "kind": "distinct", "tau": "auto", "key": "page"},
    {"name": "avg", "epsilon": 1, "kind": "mean", "mean": MEAN, "key": "rate"},
]
CELL = [
    {"name": "n", "epsilon": 1, "tau": 3},
    {"name": "speed", "epsilon": 1, "kind": "cell_mean", "cells": CELLS, "key": "gps"},
]


def pipeline(statistics: list[dict], partitions: int = 3, **inputs: object) -> PipelineConfig:
    stats = [{**s, "practical": False} if s.get("tau") == "auto" else s for s in statistics]
    return parse_config(
        {
            "input": {"partitions": partitions, "max_user_id_length": 6, **inputs},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": len(stats)},
            "statistics": stats,
        }
    )


def fingerprint(cfg: PipelineConfig) -> str:
    return rules_fingerprint(limits_for(cfg), cfg.input.partitions)


def test_the_fingerprint_changes_with_every_rule_and_only_with_rules():
    base = fingerprint(pipeline(KEYED))
    assert len(base) == 16 and int(base, 16) >= 0
    assert fingerprint(pipeline(KEYED)) == base  # a pure function of the config
    changed = [
        pipeline(KEYED, partitions=4),
        pipeline(KEYED, max_user_id_length=7),
        pipeline(KEYED, user_id_field="actor.id"),
        pipeline([*KEYED, {"name": "m", "epsilon": 1, "tau": 2, "key": "more"}]),  # a key
        pipeline([*KEYED, {"name": "m", "epsilon": 1, "tau": 2}]),  # every key
        pipeline([{**KEYED[1], "max_value": 11}, *KEYED[2:], KEYED[0]]),  # R
        pipeline([*KEYED[:3], {**KEYED[3], "deletions": False}, *KEYED[4:]]),  # deletions
        pipeline(CELL),
        pipeline([CELL[0], {**CELL[1], "cells": {**CELLS, "keys": ["a"]}}]),  # cell domain
        pipeline([CELL[0], {**CELL[1], "cells": {**CELLS, "field": "h4"}}]),  # cell field
        pipeline(CELL, max_cell_key_length=9),
    ]
    prints = [fingerprint(cfg) for cfg in changed]
    assert len({base, *prints}) == 1 + len(changed)
    # Names only label the reasons and order only picks among them: not a change of rules.
    renamed = [{**s, "name": f"x{i}"} for i, s in enumerate(reversed(KEYED))]
    assert fingerprint(pipeline(renamed)) == base
    # A bigger record limit changes nothing stage 1 sees.
    assert fingerprint(pipeline(KEYED, max_record_bytes=1 << 20)) == base


users_st = st.sampled_from(["a", "b", "c", "d", "e", "f", "", "  ", "sixsix", "seven77"])
keys_st = st.sampled_from([None, "view", "buy", "cart", "page", "rate", "gps", "other"])
values_st = st.sampled_from([None, 0.0, 1.0, 2.0, 2.5, 4.0, 5.0, 10.0, 11.0, -1.0, 1e6, 1e20])
cells_st = st.sampled_from([(), (("h3", "a"),), (("h3", "b"),), (("h3", "zz"),), (("h3", " "),)])
long_cell = (("h3", "x" * 200),)
events_st = st.lists(
    st.builds(
        Event,
        users_st,
        keys_st,
        values_st,
        st.booleans(),
        st.one_of(cells_st, st.just(long_cell)),
        st.just(()),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    events=events_st,
    statistics=st.sampled_from([KEYED, CELL, [*KEYED, CELL[1]]]),
    partition=st.integers(0, 2),
    cut=st.integers(0, 5),
)
def test_refused_are_exactly_what_the_ingest_would_not_have_sent_here(
    events, statistics, partition, cut
):
    cfg = pipeline(statistics)
    limits = limits_for(cfg)
    # The events as an envelope carries them (a columnar round trip) and, past ``cut``, as
    # ``unseen`` leaves them: the tail of a re-sent envelope.
    offsets = list(range(len(events)))
    raw = encode_envelope("src/0", offsets, [0] * len(events), events, rules="r")
    batch = decode_envelope(raw).batch
    start = min(cut, len(events) - 1)
    batch, events = batch.tail(start), events[start:]
    expected = []
    for row, event in enumerate(events):
        try:
            parse_event(orjson.loads(orjson.dumps(event_json(event))), limits)
        except BadRecord as exc:
            expected.append((row, exc.reason))
            continue
        home = partition_for(event.user_id, cfg.input.partitions)
        if home != partition:
            expected.append((row, f"user belongs to partition {home} of 3, not {partition}"))
    assert refused_rows(batch, limits, partition, cfg.input.partitions) == expected


def test_every_reason_of_the_ingest_is_given_by_the_columns():
    """The hypothesis test's draws cover these; here each once, by name."""
    cfg = pipeline([*KEYED, CELL[1]], partitions=1)
    limits = dataclasses.replace(limits_for(cfg), max_user_id_length=6)
    events = [
        Event("  ", "view", None),
        Event("seven77", "view", None),
        Event("a", None, None),
        Event("a", "other", None),
        Event("a", "buy", None),
        Event("a", "buy", 2.5),
        Event("a", "buy", 11.0),
        Event("a", "buy", 5.0),  # the sum's R is 10, the histogram's bins 4: clipped
        Event("a", "page", None),
        Event("a", "rate", None),
        Event("a", "view", None, True),
        Event("a", "gps", 3.0),
        Event("a", "gps", 3.0, False, (("h3", "zz"),)),
        Event("a", "gps", 3.0, False, (("h3", " "),)),
        Event("a", "gps", 3.0, False, (("h3", "x" * 200),)),
        Event("a", "cart", None, True),  # fine: the cart count has deletions
        Event("a", "buy", 4.0),  # fine
    ]
    raw = encode_envelope("src/0", list(range(len(events))), [0] * len(events), events, rules="r")
    assert refused_rows(decode_envelope(raw).batch, limits, 0, 1) == [
        (0, "empty user_id"),
        (1, "user_id too long"),
        (2, "missing key"),
        (3, "unknown statistic key"),
        (4, "missing value (statistics spend, sizes)"),  # 2.5, 11.0, 5.0: clipped, used
        (8, "missing value (statistic seen)"),
        (9, "missing value (statistic avg)"),
        (10, "op delete: no statistic with deletions counts this event"),
        (11, "missing h3 (statistic speed)"),
        (12, "h3 not in cells.keys (statistic speed)"),
        (13, "empty h3"),
        (14, "h3 too long"),
    ]


@pytest.mark.parametrize("partitions", [1, 4])
def test_nothing_is_refused_in_what_an_ingest_under_the_same_rules_sends(partitions):
    cfg = pipeline(KEYED, partitions=partitions)
    limits = limits_for(cfg)
    users = [f"u{i}" for i in range(40)]
    for partition in range(partitions):
        mine = [u for u in users if partition_for(u, partitions) == partition]
        events = [Event(u, "buy", float(1 + i % 4)) for i, u in enumerate(mine)]
        raw = encode_envelope("s/0", list(range(len(mine))), [0] * len(mine), events, rules="r")
        assert refused_rows(decode_envelope(raw).batch, limits, partition, partitions) == []


FIELDS = [
    {"name": "views", "epsilon": 1.0, "tau": 4, "where": {"event_type": "page_view"}},
    {
        "name": "revenue",
        "epsilon": 1.0,
        "kind": "sum",
        "tau": 3,
        "upper": 200,
        "resolution": 20000,
        "value_field": "order.total",
        "where": {"event_type": ["purchase", "refund"], "shop.region": "eu"},
    },
    {
        "name": "sizes",
        "epsilon": 1.0,
        "kind": "histogram",
        "bins": 4,
        "value_field": "order.items",
        "where": {"event_type": "purchase"},
    },
]
types_st = st.sampled_from([None, "page_view", "purchase", "refund", "signup", 1, True])
regions_st = st.sampled_from([None, "eu", "us"])
totals_st = st.sampled_from([None, 0, 12.5, 250, -1.0, "9,99", False])
attrs_st = st.builds(
    lambda t, r, total, items: tuple(
        (p, x)
        for p, x in (
            ("event_type", t),
            ("order.items", items),
            ("order.total", total),
            ("shop.region", r),
        )
        if x is not None
    ),
    types_st,
    regions_st,
    totals_st,
    totals_st,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    events=st.lists(
        st.builds(
            Event, users_st, st.just(None), st.just(None), st.just(False), st.just(()), attrs_st
        ),
        min_size=1,
        max_size=30,
    )
)
def test_refused_rows_with_value_fields_and_filters_are_the_ingests(events):
    cfg = pipeline(FIELDS, partitions=1)
    limits = limits_for(cfg)
    raw = encode_envelope("src/0", list(range(len(events))), [0] * len(events), events, rules="r")
    expected = []
    for row, event in enumerate(events):
        try:
            parse_event(orjson.loads(orjson.dumps(event_json(event))), limits)
        except BadRecord as exc:
            expected.append((row, exc.reason))
    assert refused_rows(decode_envelope(raw).batch, limits, 0, 1) == expected
