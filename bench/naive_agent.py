"""The naive peer: a plain Faust agent that only parses and counts.

Run by ``bench.throughput`` (its contenders) in a subprocess of its own:

    python -m bench.naive_agent --bootstrap B --topic T --partitions P --expect N --result F

Same Faust version, transport (aiokafka), app settings and raw serializers as dpstream's
worker (``pipeline/worker/app.py``), one agent on the input topic: per record it reads the
``dpstream`` header, skips tick markers, ``orjson.loads`` the value and counts its events (a
batch's array length, a columnar envelope's user column). No tables, no outputs. With
``--tables`` it also does stage 1's state writes without any DP logic: per record, one write
to a Faust table (memory store, changelogged) per distinct user (``u:<user>`` -> a small
dict with a count) and one per partition (``p:<partition>``), the write pattern of
``pipeline/worker/app.py``'s stage 1, to separate what the state writes cost from what the DP work
costs. ``--tables batched`` makes the same writes into the table's local store directly and
sends their changelog entries (same topic, partition, keys, values and order) as ONE
aiokafka record batch per input record, instead of one Faust ``send_soon`` per write: the
experiment behind the worker's ``pipeline/worker/changelog.py``, which batches across records as
well. ``--tables direct`` sends each entry with the aiokafka producer's own ``send`` instead
(no Faust ``send_soon``/``ProducerBuffer``; aiokafka still batches across records).

When ``N`` events have been counted it writes ``{"events", "records", "seconds",
"cpu_seconds", "last_epoch"}`` to ``F`` (``seconds`` from the first record the agent saw to the N-th
event; ``cpu_seconds`` the process's CPU time, all threads, over the same span) and keeps
running until the harness stops it.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpstream.pipeline.wire.records import BATCH, ENVELOPE, TICK, header_kind


def build_app(
    bootstrap: str, topic_name: str, partitions: int, expect: int, result: Path, tables: str
):
    import faust

    from dpstream.pipeline.worker.app import broker_urls

    app = faust.App(
        f"bench-naive-{time.time_ns()}",
        broker=broker_urls(bootstrap),
        store="memory://",
        datadir=tempfile.mkdtemp(prefix="bench-naive-"),
        web_enabled=False,
        topic_partitions=partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        producer_linger_ms=5,
        worker_redirect_stdouts=False,
    )
    topic = app.topic(
        topic_name, partitions=partitions, key_serializer="raw", value_serializer="raw"
    )
    state = {"events": 0, "records": 0, "first": None, "cpu0": 0.0, "done": False}
    table = app.Table("state", partitions=partitions, key_type=str) if tables != "none" else None

    async def write_batched(writes: list[tuple[str, dict]], partition: int) -> None:
        producer = app.producer._ensure_producer()  # the aiokafka producer Faust runs
        topic = table.changelog_topic.get_topic_name()
        batch = producer.create_batch()
        for key, value in writes:
            table.data[key] = value  # the memory store; no Faust changelog send
            k, v = orjson.dumps(key), orjson.dumps(value)
            if batch.append(key=k, value=v, timestamp=None) is None:
                batch.close()
                await producer.send_batch(batch, topic, partition=partition)
                batch = producer.create_batch()
                batch.append(key=k, value=v, timestamp=None)
        batch.close()
        await producer.send_batch(batch, topic, partition=partition)

    async def write_direct(writes: list[tuple[str, dict]], partition: int) -> None:
        producer = app.producer._ensure_producer()
        topic = table.changelog_topic.get_topic_name()
        for key, value in writes:
            table.data[key] = value
            # Enqueued in aiokafka's accumulator; delivery is not awaited (Faust's commit
            # flushes this producer before it commits offsets, as for its own sends).
            await producer.send(
                topic, key=orjson.dumps(key), value=orjson.dumps(value), partition=partition
            )

    profile_to = os.environ.get("NAIVE_CPROFILE")  # a stats file: cProfile the main thread
    prof = cProfile.Profile() if profile_to else None

    @app.agent(topic, name="naive")
    async def count(stream):
        async for event in stream.events():
            if state["first"] is None:
                state["first"] = time.perf_counter()
                state["cpu0"] = time.process_time()
                if prof is not None:
                    prof.enable()
            kind = header_kind(event.message.headers)
            if kind == TICK:
                continue
            obj = orjson.loads(event.value)
            users = (
                [e["user_id"] for e in obj]
                if kind == BATCH
                else [obj["U"][x] for x in obj["x"]]  # dpstream's columnar envelope
                if kind == ENVELOPE
                else [obj["user_id"]]
            )
            state["events"] += len(users)
            state["records"] += 1
            if table is not None:
                msg = event.message
                writes = []
                for user in set(users):
                    key = f"u:{user}"
                    entry = table.get(key) or {"n": 0, "offset": -1}
                    writes.append((key, {"n": entry["n"] + 1, "offset": msg.offset}))
                writes.append((f"p:{msg.partition}", {"last_offset": msg.offset}))
                if tables == "batched":
                    await write_batched(writes, msg.partition)
                elif tables == "direct":
                    await write_direct(writes, msg.partition)
                else:
                    for key, value in writes:
                        table[key] = value
            if state["events"] >= expect and not state["done"]:
                state["done"] = True
                if prof is not None:
                    prof.disable()
                    prof.dump_stats(profile_to)
                out = {
                    "events": state["events"],
                    "records": state["records"],
                    "seconds": time.perf_counter() - state["first"],
                    "cpu_seconds": time.process_time() - state["cpu0"],
                    "last_epoch": time.time(),
                }
                tmp = result.with_suffix(".tmp")
                tmp.write_bytes(orjson.dumps(out))
                tmp.rename(result)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--expect", type=int, required=True, help="events to count")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--loglevel", default="info")
    parser.add_argument(
        "--tables", choices=["none", "faust", "batched", "direct"], default="none", help="above"
    )
    args = parser.parse_args(argv)
    import faust

    app = build_app(
        args.bootstrap, args.topic, args.partitions, args.expect, args.result, args.tables
    )
    worker = faust.Worker(app, loglevel=args.loglevel, quiet=True, override_logging=True)
    worker.execute_from_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
