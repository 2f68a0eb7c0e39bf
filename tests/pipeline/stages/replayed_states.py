"""A replay of every kind with per-user state over a random log, recording what its stages
held: for the tests of the stored states (``test_stage1_state``, ``test_stage2_state``)."""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise
from dpstream.pipeline.stages.drivers import Stage1Driver, Stage2Driver
from dpstream.pipeline.stages.stage1_state import PartitionEntry, UserEntry
from dpstream.pipeline.stages.stage2_state import Stage2State
from dpstream.pipeline.tools.replay import replay


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
        self.partitions: list[PartitionEntry] = []
        self.users: list[UserEntry] = []


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
