"""The typed states' JSON codecs give back what they were given, on the states a real
replay makes: the stored bytes (Faust changelogs, what inspection reads) stay as they were.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise
from dpstream.pipeline.drivers import Stage2Driver
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
                "user_id": f"u{rng.randrange(12)}",
                "key": rng.choice(keys),
                "value": float(rng.randrange(101)),
                "cell": rng.choice("ABC"),
            }
            lines.append(orjson.dumps({k: v for k, v in event.items() if v is not None}))
        lines.append(orjson.dumps({"tick": tick}))
    return lines


def stage2_states(public_counts: bool, monkeypatch: pytest.MonkeyPatch) -> list[Stage2State]:
    """Every stage-2 state of a replay, as it stood after each report."""
    seen: list[Stage2State] = []
    on_report = Stage2Driver.on_report

    def recording(self: Stage2Driver, state: Stage2State, report: Any, offset: int) -> Any:
        out = on_report(self, state, report, offset)
        seen.append(copy.deepcopy(state))
        return out

    monkeypatch.setattr(Stage2Driver, "on_report", recording)
    cfg = parse_config(config(public_counts))
    assert list(replay(cfg, event_log(public_counts), KeyedNoise(bytes(32))))
    return seen


@pytest.mark.parametrize("public_counts", [False, True])
def test_stage2_state_codec_round_trips(public_counts, monkeypatch):
    states = stage2_states(public_counts, monkeypatch)
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
