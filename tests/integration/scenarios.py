"""Scenarios that run against any broker, as tests of their own modules (test_pipeline.py,
test_plugin.py) on the jar broker and again in test_containers.py on a container broker:
pipeline == replay with the same key, and the README's plugin example.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import orjson
from confluent_kafka import Producer

from dpstream.pipeline.kafka.clients import make_producer, produce_events
from dpstream.pipeline.tools.synthetic import synthetic_events
from dpstream.testing import Pipeline
from tests.integration.support import (
    TICK,
    TopicReader,
    WorkerProcess,
    pipeline_config,
    readers,
    truncated_counts,
    wait_for_first_release,
    wait_for_tick,
)

USERS = 50
ROUNDS = 24  # one round per tick: 12 s of traffic

CONFIG = {
    "input": {"partitions": 2},
    "ticks": {"interval_seconds": 0.5},
    "noise": {"mode": "insecure_zero"},  # exact releases: for tests only
    "privacy": {"total_epsilon": 1.0},
    "statistics": [{"name": "clicks", "kind": "count", "epsilon": 1.0, "tau": 2, "key": "click"}],
}


def shop_events(seed: int, n: int, max_value: int) -> list[dict]:
    """``n`` events of 40 users, half views, half purchases of a whole value in
    [1, max_value], seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        user = f"user-{rng.randrange(40):02d}"
        if rng.random() < 0.5:
            out.append({"user_id": user, "key": "view"})
        else:
            out.append({"user_id": user, "key": "buy", "value": float(rng.randint(1, max_value))})
    return out


def drive(
    bootstrap: str, worker: WorkerProcess, rd: dict[str, TopicReader], bad: list | None = None
) -> int:
    """Produce 24 rounds of traffic, one per tick; return the last tick that carried events."""
    cfg = worker.cfg
    producer = make_producer(bootstrap)
    raw = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    # Every user at least once, then Zipf-like traffic where heavy users exceed tau.
    events = [{"user_id": f"user-{u:05d}", "key": "view"} for u in range(USERS)]
    events += synthetic_events(USERS, ROUNDS * 40 - USERS, seed=11)
    good = 1  # the one good event inside the half-bad envelope below
    bad = list(bad or [])
    for i in range(ROUNDS):
        chunk = events[i * 40 : (i + 1) * 40]
        # Alternate single-event records and batch envelopes.
        good += produce_events(producer, cfg, chunk, batch=1 if i % 2 else 8)
        if bad and i >= 2:
            value, kwargs, _ = bad.pop(0)
            raw.produce(cfg.input.topics[0], value=value, **kwargs)
        producer.flush(10)
        raw.flush(10)
        time.sleep(TICK)
    assert not bad
    last = math.floor(time.time() / TICK)
    wait_for_tick(worker, rd, last + 1)
    return good


def zcdp_config(noise: dict) -> dict:
    """The counts of ``pipeline_config`` under ``privacy.accounting: zcdp``: the square-root
    factorization counter with discrete Gaussian noise (the kinds zCDP runs)."""
    data = pipeline_config(noise)
    data["privacy"] = {"accounting": "zcdp", "total_rho": 2.0}
    data["statistics"] = [
        {"name": "views", "rho": 0.5, "tau": 5, "key": "view"},
        {"name": "clicks", "rho": 0.5, "tau": 2, "key": "click", "horizon_ticks": 4096},
    ]
    return data


def pipeline_equals_replay_with_the_same_key(
    bootstrap: str, worker_factory, tmp_path: Path, accounting: str = "pure"
) -> None:
    """Keyed noise: the releases equal ``dpstream replay`` of the exported log."""
    key = np.random.default_rng(5).bytes(32).hex()
    noise = {"mode": "keyed", "key_env": "DPSTREAM_TEST_KEY"}
    data = zcdp_config(noise) if accounting == "zcdp" else pipeline_config(noise)
    worker = worker_factory(data, env={"DPSTREAM_TEST_KEY": key})
    rd = readers(bootstrap, worker)
    try:
        wait_for_first_release(worker, rd["views"])
        drive(bootstrap, worker, rd)
        pipeline = {s.name: rd[s.name].records[:] for s in worker.cfg.statistics}
    finally:
        for r in rd.values():
            r.close()
    # The same commands a user runs: export the input topic, replay it offline.
    log_path = tmp_path / "events.jsonl"
    cli = [sys.executable, "-m", "dpstream.pipeline.tools.cli"]
    subprocess.run(
        [
            *cli,
            "export-log",
            "--config",
            str(worker.config_path),
            "--bootstrap",
            bootstrap,
            "--out",
            str(log_path),
        ],
        check=True,
        # With the key: the log ends with its MAC, which a keyed replay requires.
        env={**os.environ, "DPSTREAM_TEST_KEY": key},
    )
    out = subprocess.run(
        [*cli, "replay", "--config", str(worker.config_path), "--events", str(log_path)],
        check=True,
        capture_output=True,
        env={"DPSTREAM_TEST_KEY": key, "PATH": "/usr/bin:/bin"},
    )
    replayed: dict[str, list[bytes]] = defaultdict(list)
    for line in out.stdout.splitlines():
        replayed[orjson.loads(line)["statistic"]].append(line)
    for name, released in pipeline.items():
        assert len(released) >= 20
        assert replayed[name][: len(released)] == released, name  # byte for byte
        # Real noise: the keyed releases are not the exact counts.
        zero = truncated_counts(log_path.read_bytes().splitlines(), worker.cfg)[name]
        values = [orjson.loads(r) for r in released]
        assert sum(v["value"] != zero.get(v["tick"], 0) for v in values) > len(values) // 2
        if accounting == "zcdp":
            assert {(v["accounting"], v["noise"]) for v in values} == {
                ("zcdp", "discrete_gaussian")
            }
        assert all("insecure" not in v for v in values)


def zero_noise_count_of_clicks(dpstream_pipeline) -> None:
    """The README's example test: three users' clicks, exact releases."""
    pipeline: Pipeline = dpstream_pipeline(CONFIG)
    events = [{"user_id": f"u{i % 3}", "key": "click"} for i in range(9)]
    events += [{"user_id": "u9", "key": "view"}]
    pipeline.produce(events)
    # Three users, each counted at most tau = 2 times; the view is not a click.
    releases = pipeline.releases("clicks", until=lambda r: r[-1]["value"] == 6)
    ticks = [r["tick"] for r in releases]  # public time: one release per tick, none skipped
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))
    assert all(r["value"] in (0, 6) for r in releases)
