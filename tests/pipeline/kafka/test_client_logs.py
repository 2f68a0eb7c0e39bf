"""The Kafka clients' errors are rate-limited in the log (pipeline/kafka/client_logs.py):
one line per cause per interval, with the count held back, the same lines on every
handler; dpstream's own lines and CRITICAL ones always pass."""

from __future__ import annotations

import io
import logging

from confluent_kafka import KafkaError

from dpstream.pipeline.kafka.client_logs import (
    RateLimitedLogs,
    RateLimiter,
    error_callback,
    install,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_cause_per_interval_with_the_count_held_back():
    clock = Clock()
    limiter = RateLimiter(interval=10.0, clock=clock)
    assert limiter.admit("refused") == 0  # the first line of a cause passes
    assert [limiter.admit("refused") for _ in range(5)] == [None] * 5
    assert limiter.admit("timeout") == 0  # another cause is not held back by this one
    clock.now += 9.9
    assert limiter.admit("refused") is None
    clock.now += 0.1  # 10 s after the last line written
    assert limiter.admit("refused") == 6
    assert limiter.note(6) == " (and 6 more like it since the last such line)"
    assert limiter.note(0) == ""
    assert limiter.admit("refused") is None


def handler() -> tuple[logging.Handler, io.StringIO]:
    out = io.StringIO()
    h = logging.StreamHandler(out)
    h.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    return h, out


def test_the_transports_lines_are_limited_alike_on_every_handler_and_dpstreams_pass():
    clock = Clock()
    first, first_out = handler()
    second, second_out = handler()
    install([first, second], RateLimiter(interval=10.0, clock=clock))
    conn = logging.getLogger("aiokafka.client")  # aiokafka's, retrying a broker that is gone
    ours = logging.getLogger("dpstream.test")
    saved = [(lg, lg.propagate, lg.level) for lg in (conn, ours)]
    for lg in (conn, ours):
        lg.propagate = False
        lg.setLevel(logging.DEBUG)
        lg.addHandler(first)
        lg.addHandler(second)
    try:
        for node in range(1000):
            conn.error("Unable connect to node with id %s: %s", node % 3, "refused")
        conn.critical("not rate-limited: %s", "critical")
        conn.info("nor below warning")
        for _ in range(3):
            ours.warning("dpstream's own line")
        clock.now += 10.0
        conn.error("Unable connect to node with id %s: %s", 1, "100% refused")
    finally:
        for lg, propagate, level in saved:
            lg.removeHandler(first)
            lg.removeHandler(second)
            lg.propagate, lg.level = propagate, level
    lines = first_out.getvalue().splitlines()
    assert second_out.getvalue().splitlines() == lines  # each handler writes the same
    assert lines == [
        "aiokafka.client ERROR Unable connect to node with id 0: refused",
        "aiokafka.client CRITICAL not rate-limited: critical",
        "aiokafka.client INFO nor below warning",
        "dpstream.test WARNING dpstream's own line",
        "dpstream.test WARNING dpstream's own line",
        "dpstream.test WARNING dpstream's own line",
        # the % of the arguments is kept: the note is added after formatting
        "aiokafka.client ERROR Unable connect to node with id 1: 100% refused "
        "(and 999 more like it since the last such line)",
    ]


def test_the_listed_loggers_are_the_kafka_transports():
    log_filter = RateLimitedLogs(RateLimiter(clock=Clock()))

    def passes(name: str) -> list[bool]:
        record = logging.LogRecord(name, logging.ERROR, __file__, 1, "same %s", ("x",), None)
        again = logging.LogRecord(name, logging.ERROR, __file__, 1, "same %s", ("x",), None)
        return [log_filter.filter(record), log_filter.filter(again)]

    assert passes("aiokafka") == [True, False]
    assert passes("aiokafka.consumer.fetcher") == [True, False]
    assert passes("faust.transport.drivers.aiokafka") == [True, False]
    assert passes("aiokafkaesque") == [True, True]
    assert passes("dpstream.pipeline.worker.app") == [True, True]


def test_librdkafka_errors_are_logged_once_per_code_per_interval(caplog):
    clock = Clock()
    callback = error_callback("ingest", logging.getLogger("t"), RateLimiter(10.0, clock))
    refused = KafkaError(KafkaError._TRANSPORT, "127.0.0.1:9/1: Connection refused")
    with caplog.at_level(logging.DEBUG, logger="t"):
        for _ in range(200):
            callback(refused)
        callback(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        callback(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        clock.now += 10.0
        callback(refused)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "ingest: Kafka client: 127.0.0.1:9/1: Connection refused"),
        (logging.WARNING, "ingest: Kafka client: 1/1 brokers are down"),
        (logging.ERROR, "ingest: Kafka client: fenced"),
        (
            logging.WARNING,
            "ingest: Kafka client: 127.0.0.1:9/1: Connection refused "
            "(and 199 more like it since the last such line)",
        ),
    ]
