"""Stage 1 stores exactly the keys ``PartitionEntry`` and ``UserEntry`` declare: every key
it writes is declared, every required one is there, every declared one is written by some
pipeline, in the declared order where the order is fixed (the stored bytes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from dpstream.config.schema import parse_config
from dpstream.pipeline.stages.drivers import Stage1Driver
from dpstream.pipeline.stages.stage1_state import (
    PartitionEntry,
    UserEntry,
    new_partition_state,
)
from dpstream.pipeline.wire.records import encode_envelope
from dpstream.statistics.events import Event
from tests.config_builders import minimal
from tests.pipeline.stages.replayed_states import replayed


def assert_declared(stored: Mapping[str, object], declared: Any) -> None:
    keys = list(stored)
    assert set(keys) <= set(declared.__annotations__), keys
    assert declared.__required_keys__ <= set(keys), keys
    in_order = [k for k in declared.__annotations__ if k in stored]
    required = [k for k in in_order if k in declared.__required_keys__]
    assert keys[: len(required)] == required  # the required keys first, in order


def test_a_new_partition_state_has_the_required_keys_in_order():
    state = new_partition_state()
    assert list(state) == ["last_offset", "last_tick", "pending"]
    assert list(state) == [k for k in PartitionEntry.__annotations__ if k in state]
    assert PartitionEntry.__required_keys__ == set(state)


@pytest.mark.parametrize("public_counts", [False, True])
def test_what_stage1_stores_is_declared(public_counts, monkeypatch):
    recorded = replayed(public_counts, monkeypatch)
    for pstate in recorded.partitions:
        assert_declared(pstate, PartitionEntry)
    for entry in recorded.users:
        assert_declared(entry, UserEntry)
        # kept (a record's weights) comes before state and redo, set together.
        assert [k for k in entry if k not in ("used", "offset")] in (
            [],
            ["kept"],
            ["state", "redo"],
            ["kept", "state", "redo"],
        )
    # Each optional key somewhere; no kind counted per user (distinct) with public counts.
    written = {k for e in recorded.users for k in e}
    assert written == set(UserEntry.__annotations__) - ({"kept"} if public_counts else set())
    assert {k for p in recorded.partitions for k in p} == set(PartitionEntry.__annotations__)


def test_an_envelope_adds_its_source_position():
    driver, pstate = Stage1Driver(parse_config(minimal())), new_partition_state()
    users: dict[str, UserEntry] = {}
    events = [Event("a", None, None)] * 2
    envelope = encode_envelope("src/0", [5, 5], [0, 1], events, rules=driver.rules)
    driver.on_envelope(pstate, users, 0, 0, envelope)
    assert_declared(pstate, PartitionEntry)
    assert pstate["sources"] == {"src/0": [5, 1]}
    assert users == {"a": {"used": {"events": 2}, "offset": 0}}
