"""kind mean on the real broker, in both of its modes.

Public counts (George et al. Alg. 6): 300 users on 4 partitions send values in [0, 100]
tick after tick, heavy users more, so the private medians of levels 2 and 3 gather their
arrays mid-stream and the levels activate (buffers flushed, clipping on). The pipeline's
releases must equal ``dpstream replay`` of the exported log byte for byte, and the ledger
must state the epsilon split of the medians and binary mechanisms.

Default (the whole-user mean), beside a count with tau = m over the same events (issue
13's reproduction): releases equal the replay byte for byte, carry no exact count, and
the ledger states the two counters' split and sensitivities.
"""

from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from tests.integration.support import rounds_equal_to_replay

pytestmark = pytest.mark.integration

TICK = 0.5
USERS = 300
ROUNDS = 12
KEY_ENV = "DPSTREAM_TEST_KEY"


def mean_config() -> dict:
    return {
        "input": {"partitions": 4},
        "ticks": {"interval_seconds": TICK},
        "noise": {"mode": "keyed", "key_env": KEY_ENV},
        # A mean treats arrivals as public: a pipeline of its own (operators.accounting).
        "privacy": {"total_epsilon": 256.0, "public_counts": True},
        "statistics": [
            {
                "name": "latency",
                "kind": "mean",
                "key": "rtt",
                # Large so that K_2 and K_3 (the median arrays) are reached in seconds
                # even with delta = 1e-6: the clip intervals then miss with probability
                # below 1e-6 (Alg. 6's guarantee), so the accuracy check below cannot
                # flake (the noise differs every run: its scope has the start tick).
                "epsilon": 256.0,
                "mean": {
                    "lower": 0,
                    "upper": 100,
                    "max_users": 400,
                    "max_samples_per_user": 16,
                    "delta": 1e-6,
                },
            },
        ],
    }


def traffic(rng: random.Random) -> list[dict]:
    events = []
    for u in range(USERS):
        for _ in range(rng.randint(0, 3 if u % 3 else 1)):
            value = min(100.0, max(0.0, rng.gauss(40.0, 15.0)))
            events.append({"user_id": f"user-{u:05d}", "key": "rtt", "value": value})
    rng.shuffle(events)
    return events


def run(bootstrap, worker_factory, monkeypatch, data: dict, seed: int):
    """ROUNDS rounds of ``traffic`` through a worker under a key of ``seed``; the releases
    equal the replay. (releases per statistic, ledger entries)."""
    key = np.random.default_rng(seed).bytes(32).hex()
    worker = worker_factory(data, env={KEY_ENV: key})
    rng = random.Random(seed)
    rounds = [traffic(rng) for _ in range(ROUNDS)]
    return rounds_equal_to_replay(bootstrap, worker, rounds, "latency", KEY_ENV, key, monkeypatch)


def test_mean_pipeline_equals_replay_while_levels_activate(bootstrap, worker_factory, monkeypatch):
    pipeline, ledger = run(bootstrap, worker_factory, monkeypatch, mean_config(), seed=5)
    last = orjson.loads(pipeline["latency"][-1])
    assert last["active_levels"] >= 2, last  # a private median ran in the pipeline
    assert last["samples"] > 1000
    assert abs(last["value"] - 40.0) < 10.0, last  # the noise std here is about 1
    (start,) = [e for e in ledger if e.get("statistic") == "latency"]
    assert last["public_counts"] is True  # the pipeline's statement, on every release
    assert start["split"]["total"] <= 256.0
    assert start["neighbours"] == "user_values_same_arrivals"


def whole_user_config() -> dict:
    return {
        "input": {"partitions": 4},
        "ticks": {"interval_seconds": TICK},
        "noise": {"mode": "keyed", "key_env": KEY_ENV},
        "privacy": {"total_epsilon": 16.0},
        "statistics": [
            {"name": "events", "epsilon": 8.0, "tau": 16, "key": "rtt"},
            {
                "name": "latency",
                "kind": "mean",
                "key": "rtt",
                "epsilon": 8.0,
                "mean": {"lower": 0, "upper": 100, "max_samples_per_user": 16},
            },
        ],
    }


def test_whole_user_mean_pipeline_equals_replay_and_releases_no_exact_count(
    bootstrap, worker_factory, monkeypatch
):
    pipeline, ledger = run(bootstrap, worker_factory, monkeypatch, whole_user_config(), seed=6)
    means = [orjson.loads(r) for r in pipeline["latency"]]
    counts = {c["tick"]: c["value"] for c in map(orjson.loads, pipeline["events"])}
    last = means[-1]
    assert last["samples"] > 1000 and last["mechanism"] == "whole_user_mean"
    # Delta method: std about 0.2 here; 10 is dozens of stds.
    assert abs(last["value"] - 40.0) < 10.0 and last["std"] < 2.0, last
    for r in means:
        assert not {"users", "samples_covered", "active_levels", "public_counts"} & set(r)
    # Two independent noises: the mean's count is not the count's release.
    assert any(r["samples"] != counts.get(r["tick"]) for r in means)
    (start,) = [e for e in ledger if e.get("statistic") == "latency" and "fingerprint" in e]
    assert start["split"] == {"samples": 4.0, "units": 4.0}
    assert start["sensitivities"] == [16, 16 * 1024]
    assert start["neighbours"] == "whole_user"
