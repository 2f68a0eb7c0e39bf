"""The typed states' JSON codecs give back what they were given, on the states a real
replay makes: the stored bytes (Faust changelogs, what inspection reads) stay as they were.

The keys named here only find a state in what a replay stored; the codecs alone build it.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from typing import Any

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise
from dpstream.pipeline.cells import CellMarks, CellStage2State, CellUserState
from dpstream.pipeline.counters import UserLevelState
from dpstream.pipeline.drivers import Stage1Driver, Stage2Driver
from dpstream.pipeline.means import MeanRedo
from dpstream.pipeline.replay import replay
from dpstream.pipeline.stage2_state import Stage2State


def config(public_counts: bool) -> dict:
    mean: dict[str, Any] = {"lower": 0, "upper": 100, "max_samples_per_user": 3}
    cells: dict[str, Any] = {
        "field": "cell",
        "slot_ticks": 2,
        "lower": 0,
        "upper": 100,
        "step": 1,
        "counts_public": public_counts,
        "epoch_slots": 4,
        "epoch_cap": 10,
    }
    statistics: list[dict[str, Any]] = []
    if public_counts:  # George et al.'s mean, cells with public counts
        mean["max_users"] = 50
        cells["mechanism"] = "array_averaging"
    else:
        cells.update(mechanism="noisy_ratio", keys=["A", "B", "C"], contribution_cap=3)
        statistics = [
            {"name": "events", "kind": "count", "epsilon": 1.0, "tau": 4},
            {"name": "auto", "kind": "count", "epsilon": 1.0, "tau": "auto", "practical": False},
            {"name": "values", "kind": "distinct", "epsilon": 1.0, "tau": "auto"},
            {  # its lifetime budget runs out: an exhausted state
                "name": "recent",
                "kind": "count",
                "epsilon": 1.0,
                "tau": 2,
                "mechanism": "expiring",
                "lambda": 0.5,
                "horizon_ticks": 6,
            },
        ]
    statistics += [
        {"name": "latency", "kind": "mean", "epsilon": 1.0, "key": "latency", "mean": mean},
        {"name": "speed", "kind": "cell_mean", "epsilon": 1.0, "key": "speed", "cells": cells},
    ]
    return {
        "app_id": "states",
        "input": {"partitions": 2},
        "privacy": {"total_epsilon": 100.0, "public_counts": public_counts},
        "statistics": statistics,
    }


def event_log(public_counts: bool, ticks: int = 13) -> list[bytes]:
    rng = random.Random(7)
    keys = ["latency", "speed"] + ([] if public_counts else [None])
    lines = []
    for tick in range(1, ticks + 1):
        for _ in range(rng.randrange(12)):
            event = {
                "user_id": f"u{rng.randrange(6)}",
                "key": rng.choice(keys),
                "value": float(rng.randrange(101)),
                "cell": rng.choice("ABC"),
            }
            lines.append(orjson.dumps({k: v for k, v in event.items() if v is not None}))
        lines.append(orjson.dumps({"tick": tick}))
    return lines


class Recorded:
    """What a replay's stages held: every stage-2 state after each report, and stage 1's
    partition states and user entries, as stored (JSON), at each marker."""

    def __init__(self) -> None:
        self.stage2: list[Stage2State] = []
        self.partitions: list[dict] = []
        self.users: list[dict] = []


def replayed(public_counts: bool, monkeypatch: pytest.MonkeyPatch) -> Recorded:
    recorded = Recorded()
    on_report, on_marker = Stage2Driver.on_report, Stage1Driver.on_marker

    def report_recorded(self: Stage2Driver, state: Stage2State, report: Any, offset: int) -> Any:
        out = on_report(self, state, report, offset)
        recorded.stage2.append(copy.deepcopy(state))
        return out

    def marker_recorded(self: Stage1Driver, pstate: dict, users: dict, *args: Any) -> Any:
        recorded.partitions.append(orjson.loads(orjson.dumps(pstate)))
        recorded.users.extend(orjson.loads(orjson.dumps(list(users.values()))))
        return on_marker(self, pstate, users, *args)

    monkeypatch.setattr(Stage2Driver, "on_report", report_recorded)
    monkeypatch.setattr(Stage1Driver, "on_marker", marker_recorded)
    cfg = parse_config(config(public_counts))
    assert list(replay(cfg, event_log(public_counts), KeyedNoise(bytes(32))))
    return recorded


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
        stored = orjson.loads(orjson.dumps(state.to_json()))["tree"]
        if stored is not None and "late_slots" in stored:
            assert_round_trips(CellStage2State, stored)
            seen["cells stage 2"] += 1
        if stored is not None and "spent" in stored:
            assert_round_trips(UserLevelState, stored)
            seen["tau auto"] += "min_band" in stored  # distinct's, once at least
    expected = {"marks", "cell users", "cells stage 2"}
    expected |= {"mean redo", "both groups"} if public_counts else {"tau auto"}
    assert {name for name, n in seen.items() if n} == expected
