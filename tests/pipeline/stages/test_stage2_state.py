"""The typed states' JSON codecs give back what they were given, on the states a real
replay makes: the stored bytes (Faust changelogs, what inspection reads) stay as they were.

The keys named here only find a state in what a replay stored; the codecs alone build it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from dpstream.pipeline.stages.stage2_state import Stage2State
from dpstream.statistics.cell_mean import CellMarks, CellStage2State, CellUserState
from dpstream.statistics.continual_mean import MeanRedo
from dpstream.statistics.user_level import UserLevelState
from tests.pipeline.stages.replayed_states import config, replayed


def assert_round_trips(cls: Any, stored: Any) -> None:
    """``stored`` (as a table holds it) -> ``cls`` -> the same bytes, and back."""
    state = cls.from_json(stored)
    assert orjson.dumps(state.to_json()) == orjson.dumps(stored)
    assert cls.from_json(state.to_json()) == state


@pytest.mark.parametrize("public_counts", [False, True])
def test_stage2_state_codec_round_trips(public_counts, monkeypatch):
    states = replayed(public_counts, monkeypatch).stage2
    for state in states:
        stored = orjson.loads(orjson.dumps(state.to_json()))  # as the changelog holds it
        assert Stage2State.from_json(state.to_json()) == state
        recovered = Stage2State.from_json(stored)  # as a restarted worker has it
        assert orjson.dumps(recovered.to_json()) == orjson.dumps(state.to_json())
        assert orjson.dumps(recovered.to_json()) == orjson.dumps(stored)  # keys in order
    names = {s["name"] for s in config(public_counts)["statistics"]}
    assert len(states) > 10 * len(names)
    assert all(s.identity is not None for s in states[-len(names) :])
    if not public_counts:
        assert any(s.exhausted is not None for s in states)


@pytest.mark.parametrize("public_counts", [False, True])
def test_the_kinds_state_codecs_round_trip(public_counts, monkeypatch):
    """cell_mean's partition, user and stage-2 states, the continual mean's redo record,
    tau: auto's stage-2 state."""
    recorded = replayed(public_counts, monkeypatch)
    seen: Counter[str] = Counter()
    for pstate in recorded.partitions:
        if pstate.get("stats", {}).get("speed") is not None:  # None before the first marker
            assert_round_trips(CellMarks, pstate["stats"]["speed"])
            seen["marks"] += 1
    for entry in recorded.users:
        if "speed" in entry.get("state", {}):
            assert_round_trips(CellUserState, entry["state"]["speed"])
            seen["cell users"] += 1
            seen["both groups"] += "o" in entry["state"]["speed"]
        if entry.get("redo", {}).get("latency") is not None:
            assert_round_trips(MeanRedo, entry["redo"]["latency"])
            seen["mean redo"] += 1
    for state in recorded.stage2:
        stored = orjson.loads(orjson.dumps(state.to_json()))["statistic_state"]
        if stored is not None and "late_slots" in stored:
            assert_round_trips(CellStage2State, stored)
            seen["cells stage 2"] += 1
        if stored is not None and "spent" in stored:
            assert_round_trips(UserLevelState, stored)
            seen["tau auto"] += "min_band" in stored  # distinct's, once at least
    expected = {"marks", "cell users", "cells stage 2"}
    expected |= {"mean redo", "both groups"} if public_counts else {"tau auto"}
    assert {name for name, n in seen.items() if n} == expected


def test_a_version_1_state_is_read_and_stored_as_version_2():
    # Version 1 stored the kind's state as "tree", whatever the kind; version 2 says what it
    # is. A stage-2 changelog written by version 1 is still recovered.
    state = Stage2State(reported={0: 7}, first={0: 5}, last_closed=7, statistic_state={"t": 3})
    current = state.to_json()
    assert current["version"] == 2 and current["statistic_state"] == {"t": 3}
    old = {k: v for k, v in current.items() if k not in ("version", "statistic_state")}
    old["tree"] = {"t": 3}
    assert Stage2State.from_json(old) == state == Stage2State.from_json(current)
    with pytest.raises(ValueError, match="stage 2 state version 3"):
        Stage2State.from_json({**current, "version": 3})
