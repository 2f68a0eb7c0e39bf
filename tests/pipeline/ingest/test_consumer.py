"""The ingest's Kafka side (pipeline/ingest/consumer.py) without a broker: a stop ends in
bounded time when nothing acknowledges what it sent, and is clean when nothing was under
way."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter

import pytest

from dpstream.config.schema import parse_config
from dpstream.pipeline.ingest.consumer import Ingest, _Batch, all_dead_lettered, consumer_config
from tests.config_builders import minimal


@pytest.fixture
def nowhere() -> str:
    """A loopback address where nothing listens (a broker that is gone)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def ingest_with_a_batch_under_way(bootstrap: str) -> Ingest:
    ingest = Ingest(parse_config(minimal()), bootstrap)
    batch = _Batch({("source", 0): 10}, outstanding=1)
    ingest._send("events", b"{}", 0, None, batch)
    ingest._pending.append(batch)
    return ingest


def test_a_stop_with_the_broker_gone_gives_up_after_its_bound(nowhere, caplog):
    # Before, close() waited for this acknowledgement for ever (no message times out).
    ingest = ingest_with_a_batch_under_way(nowhere)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        clean = ingest.close(seconds=1.0)
    assert clean is False
    assert time.monotonic() - started < 30  # generous: the bound is 1 s
    assert "has not acknowledged within 1 s" in caplog.text


def test_a_wait_for_acknowledgements_ends_when_the_stop_is_set(nowhere):
    # step() waits for the batch before the last one: a stop must not wait behind it.
    ingest = ingest_with_a_batch_under_way(nowhere)
    ingest._stop = threading.Event()
    ingest._stop.set()
    try:
        assert ingest._settle(0) is False
        assert len(ingest._pending) == 1  # nothing committed
    finally:
        ingest.close(seconds=0.1)


def test_a_stop_with_nothing_under_way_is_clean(nowhere):
    assert Ingest(parse_config(minimal()), nowhere).close(seconds=5.0) is True


def test_an_interval_where_every_record_was_dead_lettered_warns_with_the_top_reasons():
    # Before, a mistyped input.user_id_field dead-lettered every event, and the only sign
    # was an INFO line every 10 s.
    rejected = Counter({"missing user id": 900, "not valid JSON": 7, "a": 2, "b": 1})
    assert all_dead_lettered(0, rejected) == (
        "ingest: every source record of the last 10 s was dead-lettered (910 records; the "
        "statistics receive none); top reasons: missing user id (900); not valid JSON (7); "
        "a (2)"
    )
    assert all_dead_lettered(1, rejected) is None  # one event got through
    assert all_dead_lettered(0, Counter()) is None  # nothing was read


@pytest.mark.parametrize("start", ["earliest", "latest"])
def test_input_start_is_the_ingest_groups_offset_reset(start):
    cfg = parse_config(minimal(input__start=start))
    assert consumer_config(cfg, "b:9092")["auto.offset.reset"] == start
