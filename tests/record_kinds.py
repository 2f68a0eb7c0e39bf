"""Pipelines that write every kind of record there is, and traffic for them: the schema
tests run them through replay (tests/client/test_schemas_records.py) and through a real
worker (tests/integration/test_client.py), and check every record against its published
schema. Two pipelines, because public counts and whole-user statistics never share one."""

from __future__ import annotations

import random
from typing import Any

from jsonschema import Draft202012Validator

from dpstream.client import schemas

CELLS = ["8a2a1072b59ffff", "8a2a1072b5b7fff"]
COMMON_CELLS = {"field": "h3", "slot_ticks": 2, "lower": 0, "upper": 10, "step": 0.5}
MEAN = {"lower": 0, "upper": 10, "max_samples_per_user": 4}

WHOLE_USER_STATISTICS: list[dict[str, Any]] = [
    {"name": "views", "kind": "count", "epsilon": 1.0, "tau": 2, "key": "view"},
    {"name": "views_k", "kind": "count", "epsilon": 1.0, "tau": 2, "key": "view",
     "mechanism": "kary_subtract", "k": 3},
    # Its lifetime budget is spent after 3 ticks: the exhausted release and ledger entry.
    {"name": "views_short", "kind": "count", "epsilon": 0.1, "tau": 2, "key": "view",
     "mechanism": "expiring", "lambda": 1, "horizon_ticks": 3},
    {"name": "views_auto", "kind": "count", "epsilon": 1.0, "tau": "auto", "key": "view"},
    {"name": "views_del", "kind": "count", "epsilon": 1.0, "tau": "auto", "key": "view",
     "deletions": True},
    {"name": "revenue", "kind": "sum", "epsilon": 1.0, "tau": 3, "key": "buy", "max_value": 10},
    {"name": "revenue_auto", "kind": "sum", "epsilon": 1.0, "tau": "auto", "key": "buy",
     "max_value": 10},
    {"name": "ratings", "kind": "histogram", "epsilon": 1.0, "key": "rate", "bins": 5},
    {"name": "median_rating", "kind": "kselect", "epsilon": 1.0, "key": "rate", "bins": 5,
     "rank": "median"},
    {"name": "tags", "kind": "distinct", "epsilon": 1.0, "key": "tag"},
    {"name": "temperature", "kind": "mean", "epsilon": 1.0, "key": "temp", "mean": MEAN},
    {"name": "speed_strict", "kind": "cell_mean", "epsilon": 1.0, "key": "cell",
     "cells": {**COMMON_CELLS, "mechanism": "noisy_ratio", "contribution_cap": 2,
               "keys": CELLS, "epoch_slots": 4, "epoch_cap": 2.0}},
]  # fmt: skip

PUBLIC_COUNTS_STATISTICS: list[dict[str, Any]] = [
    {"name": "temperature", "kind": "mean", "epsilon": 1.0, "key": "temp",
     "mean": {**MEAN, "max_users": 100}},
    {"name": "speed", "kind": "cell_mean", "epsilon": 1.0, "key": "cell",
     "cells": {**COMMON_CELLS, "mechanism": "levy", "counts_public": True, "clip_user": True,
               "epoch_slots": 4, "epoch_cap": 3.0}},
]  # fmt: skip


def config(public_counts: bool, noise: dict[str, Any], tick: float = 0.5) -> dict[str, Any]:
    """The pipeline of one relation (``noise``: the config's noise section)."""
    return {
        "input": {"partitions": 2},
        "ticks": {"interval_seconds": tick},
        "noise": noise,
        "privacy": {"total_epsilon": 100.0, "public_counts": public_counts},
        "statistics": PUBLIC_COUNTS_STATISTICS if public_counts else WHOLE_USER_STATISTICS,
    }


def round_of_events(
    rng: random.Random, statistics: list[dict[str, Any]], users: int = 12
) -> list[dict[str, Any]]:
    """One tick's events of the keys ``statistics`` count: every user views, buys, rates,
    tags, measures and moves."""
    keys = {s["key"] for s in statistics}
    events: list[dict[str, Any]] = []
    for u in range(users):
        user = f"user-{u:03d}"
        events += [
            {"user_id": user, "key": "view"},
            {"user_id": user, "key": "buy", "value": rng.randint(1, 10)},
            {"user_id": user, "key": "rate", "value": rng.randint(1, 5)},
            {"user_id": user, "key": "tag", "value": rng.randint(1, 30)},
            {"user_id": user, "key": "temp", "value": round(rng.uniform(0, 10), 2)},
            {"user_id": user, "key": "cell", "h3": CELLS[u % 2], "value": rng.uniform(0, 10)},
        ]
        if u % 4 == 0:
            events.append({"user_id": user, "key": "view", "op": "delete"})
    return [e for e in events if e["key"] in keys]


BAD_RECORDS = [b"{not json", b'{"key": "view"}', b'{"user_id": "u", "key": "buy"}']
"""Source records that are dead-lettered: malformed, without a user id, a buy without the
value both sums need (an out-of-range value is clipped, not dead-lettered)."""


def variant(family: str, record: dict[str, Any]) -> str:
    """The title of the one variant of its family's current schema that ``record`` is (the
    schema's ``oneOf`` makes it one); raises when it is none."""
    schema = schemas.validator(family, schemas.CURRENT[family]).schema
    Draft202012Validator(schema).validate(record)
    options = schema.get("oneOf", [schema])
    (title,) = [o["title"] for o in options if Draft202012Validator(o).is_valid(record)]
    return str(title)
