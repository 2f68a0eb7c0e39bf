"""``dpstream.client`` against a running worker: every record on the release, ledger and
dead-letter topics is valid under its published schema (each kind's releases, every type
of ledger entry, dead letters), read as typed records; the iterator stops at the end of
the topic or follows it; ``dpstream tail`` prints what the client reads."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import numpy as np
import orjson
import pytest

from dpstream.client import dead_letters, ledger, releases, schemas
from dpstream.pipeline.kafka.clients import make_producer, produce_events
from tests import record_kinds
from tests.integration.support import wait_until

pytestmark = pytest.mark.integration

KEY_ENV = "DPSTREAM_TEST_KEY"
ROUNDS = 8
TICK = 0.5


def produce_traffic(bootstrap: str, cfg) -> None:
    """``ROUNDS`` rounds of every kind's events a tick apart, with bad records among them."""
    producer = make_producer(bootstrap)
    rng = random.Random(5)
    statistics = cfg.model_dump()["statistics"]
    for _ in range(ROUNDS):
        produce_events(producer, cfg, record_kinds.round_of_events(rng, statistics))
        for bad in record_kinds.BAD_RECORDS:
            producer.produce(cfg.input.topics[0], value=bad)
        assert producer.flush(10) == 0
        time.sleep(TICK)


def released_ticks(bootstrap: str, cfg, name: str) -> list[int]:
    return [r.tick for r in releases(name, bootstrap, cfg)]


@pytest.mark.parametrize("public_counts", [False, True], ids=["whole-users", "public-counts"])
def test_every_record_the_pipeline_writes_is_valid_under_its_schema(
    bootstrap, worker_factory, public_counts
):
    key = np.random.default_rng(3).bytes(32).hex()
    noise = {"mode": "keyed", "key_env": KEY_ENV}
    worker = worker_factory(record_kinds.config(public_counts, noise, TICK), env={KEY_ENV: key})
    cfg = worker.cfg
    clock = "temperature"  # a mean releases every tick
    wait_until(lambda: released_ticks(bootstrap, cfg, clock) != [], 90, "a release", worker)
    produce_traffic(bootstrap, cfg)
    after = max(released_ticks(bootstrap, cfg, clock)) + 4  # cell slots of 2 ticks closed
    wait_until(
        lambda: max(released_ticks(bootstrap, cfg, clock)) >= after, 60, "more ticks", worker
    )

    variants: set[str] = set()
    kinds = set()
    for stat in cfg.statistics:
        read = list(releases(stat.name, bootstrap, cfg))  # validated, or it raises
        assert read and all(r.statistic == stat.name for r in read), stat.name
        assert [r.tick for r in read] == sorted(r.tick for r in read)
        variants |= {record_kinds.variant(schemas.RELEASE, dict(r.fields)) for r in read}
        kinds.add(stat.kind)
    entries = [e for e in ledger(bootstrap, cfg) if e.app_id == cfg.app_id]
    kinds_of_entries = {record_kinds.variant(schemas.LEDGER, dict(e.fields)) for e in entries}
    letters = list(dead_letters(bootstrap, cfg))

    if public_counts:
        assert variants == {"ContinualMean", "CellMean"}
        assert kinds_of_entries == {"StatementEntry", "StartEntry", "Cells"}
    else:
        assert variants == {
            "Counter", "UserLevel", "Histogram", "KSelect", "WholeUserMean", "CellMean",
            "Exhausted",
        }  # fmt: skip
        assert kinds_of_entries == {
            "StatementEntry", "StartEntry", "Cells", "Budget", "ExhaustedEntry",
        }  # fmt: skip
    assert len(letters) >= ROUNDS * len(record_kinds.BAD_RECORDS)
    assert {d.topic for d in letters} == {cfg.input.topics[0]}
    spent = [e for e in entries if e.event == "start"]
    assert {e.statistic for e in spent} == {s.name for s in cfg.statistics}
    assert all(e.epsilon_spent is not None and e.total_epsilon == 100.0 for e in spent)


def test_the_iterator_follows_the_topic_and_tail_prints_what_it_reads(bootstrap, worker_factory):
    key = np.random.default_rng(4).bytes(32).hex()
    noise = {"mode": "keyed", "key_env": KEY_ENV}
    data = record_kinds.config(True, noise, TICK)
    data["statistics"] = data["statistics"][:1]  # the mean: a release every tick
    worker = worker_factory(data, env={KEY_ENV: key})
    cfg = worker.cfg
    name = cfg.statistics[0].name
    wait_until(lambda: len(released_ticks(bootstrap, cfg, name)) >= 3, 90, "releases", worker)

    # From the end, following: only releases published after the start.
    last = max(released_ticks(bootstrap, cfg, name))
    stop = threading.Event()
    timer = threading.Timer(60, stop.set)
    timer.start()
    following = releases(name, bootstrap, cfg, from_beginning=False, follow=True, stop=stop)
    try:
        newer = [next(following).tick for _ in range(2)]
    finally:
        following.close()
        timer.cancel()
    assert last < newer[0] < newer[1]
    # From the end, stopping there: no release published before the call (one a tick
    # publishes while the reader starts may come).
    before = max(released_ticks(bootstrap, cfg, name))
    assert all(r.tick > before for r in releases(name, bootstrap, cfg, from_beginning=False))

    first = [dict(r.fields) for r in releases(name, bootstrap, cfg)][:3]
    tail = subprocess.run(
        [sys.executable, "-m", "dpstream.pipeline.tools.cli", "tail", name,
         "--config", str(worker.config_path), "--bootstrap", bootstrap,
         "--from-beginning", "--max", "3", "--timeout", "60"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert [orjson.loads(line) for line in tail.stdout.splitlines()] == first
