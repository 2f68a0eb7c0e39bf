"""The ceiling: a plain consumer reading and parsing a pre-produced source topic.

Run by ``bench.throughput`` (its contenders) in a subprocess of its own, once per client:

    python -m bench.ceiling aiokafka|confluent|confluent-backoff --bootstrap B --topic T \
        --ends '{"0": n0, ...}'

It reads every partition from offset 0 up to the given end offsets (the topic's end right
after it was pre-produced), parses every record's JSON with orjson (a batch envelope is
one JSON array of events), counts events (and would skip tick markers, which a source
topic no longer holds). ``confluent-backoff`` is confluent-kafka with
``fetch.queue.backoff.ms=10``, as the ingest's consumer has it. No consumer group (partitions are
assigned), no commits. A pass is timed from the first fetch request (the client is
connected and knows the offsets) to the last record parsed; passes repeat, each from
offset 0, until ``--min-seconds`` have been timed, so that a small topic still gives a
stable rate. Prints one JSON line ``{"client", "events", "records", "passes", "seconds",
"cpu_seconds", "first_pass_end", "peak_rss"}`` with per-pass means; ``cpu_seconds`` is the
process's CPU time (all threads), ``first_pass_end`` the Unix time the first pass ended.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import orjson

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import proc_status  # noqa: E402
from dpstream.pipeline.wire.records import BATCH, ENVELOPE, TICK, header_kind

TIMEOUT = 600.0
# FETCH_WAIT: the clients' only non-default setting. At the end of a pass a fetch request
# sits on the broker for fetch.wait.max.ms (default 500 ms) waiting for data that never
# comes, and the next pass's first fetch queues behind it. 10 ms bounds that stall; while
# data is available the broker answers at once whatever this is.


class Tally:
    """Events, records and time over one or more passes over the topic."""

    def __init__(self) -> None:
        self.events = 0
        self.records = 0
        self.passes = 0
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self._t0 = self._c0 = 0.0
        self.first_pass_end = 0.0  # Unix time the first pass read its last record

    def start(self) -> None:
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.seconds += time.perf_counter() - self._t0
        self.cpu_seconds += time.process_time() - self._c0
        self.passes += 1
        self.first_pass_end = self.first_pass_end or time.time()

    def parse(self, value: bytes | None, headers) -> None:
        kind = header_kind(headers)
        if kind == TICK:
            return
        obj = orjson.loads(value)
        if kind == BATCH:
            self.events += len(obj)
        elif kind == ENVELOPE:  # dpstream's columnar envelope: one offset per event
            self.events += len(obj["o"])
        else:
            self.events += 1
        self.records += 1

    def result(self, client: str) -> dict:
        return {
            "client": client,
            "events": self.events // self.passes,
            "records": self.records // self.passes,
            "passes": self.passes,
            "seconds": self.seconds / self.passes,
            "cpu_seconds": self.cpu_seconds / self.passes,
            "first_pass_end": self.first_pass_end,
            "peak_rss": proc_status(os.getpid()).get("VmHWM"),
        }


async def read_aiokafka(bootstrap: str, topic: str, ends: dict[int, int], min_seconds: float):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=10,  # see FETCH_WAIT
    )
    await consumer.start()
    tally = Tally()
    try:
        tps = {p: TopicPartition(topic, p) for p, end in ends.items() if end > 0}
        consumer.assign(list(tps.values()))
        await consumer.position(next(iter(tps.values())))  # connected, offsets known
        while tally.seconds < min_seconds or tally.passes == 0:
            await consumer.seek_to_beginning(*tps.values())
            consumer.resume(*tps.values())
            tally.start()
            remaining = set(tps)
            deadline = time.monotonic() + TIMEOUT
            while remaining:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"aiokafka: partitions {sorted(remaining)} not read")
                batch = await consumer.getmany(timeout_ms=1000)
                for tp, messages in batch.items():
                    if tp.partition not in remaining:
                        continue
                    end = ends[tp.partition]
                    for msg in messages:
                        if msg.offset >= end:
                            break
                        tally.parse(msg.value, msg.headers)
                    if messages and messages[-1].offset >= end - 1:
                        remaining.discard(tp.partition)
                        consumer.pause(tp)
            tally.stop()
        return tally.result("aiokafka")
    finally:
        await consumer.stop()


def read_confluent(
    bootstrap: str, topic: str, ends: dict[int, int], min_seconds: float, backoff: bool = False
) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-ceiling-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 10,  # see FETCH_WAIT
            "log_level": 0,
            # librdkafka's default (1 s) idles the fetcher once its queue holds enough.
            **({"fetch.queue.backoff.ms": 10} if backoff else {}),
        }
    )
    tally = Tally()
    parts = [p for p, end in ends.items() if end > 0]
    try:
        consumer.list_topics(topic, timeout=30)  # connected
        while tally.seconds < min_seconds or tally.passes == 0:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
            tally.start()
            remaining = set(parts)
            deadline = time.monotonic() + TIMEOUT
            while remaining:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"confluent: partitions {sorted(remaining)} not read")
                # A short timeout: consume() waits that long for a full batch at the end.
                for msg in consumer.consume(num_messages=10_000, timeout=0.02):
                    if msg.error():
                        continue
                    p, offset = msg.partition(), msg.offset()
                    if p not in remaining or offset >= ends[p]:
                        continue
                    tally.parse(msg.value(), msg.headers())
                    if offset >= ends[p] - 1:
                        remaining.discard(p)
            tally.stop()
            consumer.unassign()
        return tally.result("confluent-backoff" if backoff else "confluent")
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("client", choices=["aiokafka", "confluent", "confluent-backoff"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--ends", required=True, help='JSON {"partition": end offset}')
    parser.add_argument(
        "--min-seconds", type=float, default=2.0, help="read the topic again until this long"
    )
    args = parser.parse_args(argv)
    ends = {int(p): int(e) for p, e in orjson.loads(args.ends).items()}
    if args.client == "aiokafka":
        result = asyncio.run(read_aiokafka(args.bootstrap, args.topic, ends, args.min_seconds))
    else:
        result = read_confluent(
            args.bootstrap, args.topic, ends, args.min_seconds, args.client == "confluent-backoff"
        )
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
