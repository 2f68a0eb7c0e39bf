"""In-process measurements, no Kafka: the bytes of state per user and per statistic, and
the ingest's and stage 1's own Python cost per event."""

from __future__ import annotations

import sys
import time
import tracemalloc

import orjson

from bench.throughput.datasets import (
    messages,
    round_robin,
    routed_envelopes,
    source_records,
    synthetic,
)
from bench.throughput.workers import run_config
from dpstream.config.schema import parse_config


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(deep_size(getattr(obj, a), seen) for a in obj.__slots__ if hasattr(obj, a))
    elif hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    return size


def state_constants(base: dict, users: int, per_user: int, tree_ticks: list[int]) -> dict:
    """Bytes of state per user (stage 1) and per statistic (stage 2), in process.

    Drives ``Stage1`` / ``Stage2`` the way ``pipeline/tools/replay.py`` does (envelopes decoded by
    ``records.decode_events``, reports from ``Stage1.close_tick``), with plain dicts where
    the worker has Faust tables (the memory store keeps table values as these same Python
    objects). Per user: tracemalloc growth of the ``users`` mapping after
    ``users * per_user`` events, and the mean changelog record (orjson key + value). Per
    statistic: its stage-2 state after t ticks (one event per tick), as orjson (the
    changelog record) and as Python objects, plus the keyed-noise cache.
    """
    from dpstream.operators.noise import KeyedNoise
    from dpstream.pipeline.stages.stage1 import Stage1
    from dpstream.pipeline.stages.stage1_state import new_partition_state
    from dpstream.pipeline.stages.stage2 import Stage2
    from dpstream.pipeline.wire.records import BATCH, decode_events, limits_for

    cfg = parse_config(run_config(base, "s", None, 1.0, 4), "benchmark config")
    limits = limits_for(cfg)
    stage1 = Stage1(cfg)
    pstate = new_partition_state()
    table: dict[str, dict] = {}

    def feed(envelope: list[dict], offset: int) -> None:
        events, bad = decode_events(orjson.dumps(envelope), BATCH, limits)
        assert not bad, bad
        stage1.add_events(pstate, table, events, offset)
        pstate["last_offset"] = offset

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    offset, chunk = 0, []
    for e in round_robin(users, per_user):
        chunk.append(e)
        if len(chunk) == 100:
            feed(chunk, offset)
            chunk, offset = [], offset + 1
    if chunk:
        feed(chunk, offset)
    chunk = []
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    changelog = sum(len(orjson.dumps(k)) + len(orjson.dumps(v)) for k, v in table.items())
    example = next(iter(table.items()))
    del table

    trees, caches = [], []
    for t_max in tree_ticks:
        stage1, table = Stage1(cfg), {}
        pstate = new_partition_state()
        stage2 = Stage2(cfg, KeyedNoise(bytes(32)), partitions=1)
        sstates = {s.name: Stage2.new_state() for s in cfg.statistics}
        for t in range(1, t_max + 1):
            feed([{"user_id": f"user-{t % 1000}", "key": "click"}], t)
            for report in stage1.close_tick(pstate, 0, t):
                stage2.on_report(sstates[report.statistic], report)
        cache = getattr(stage2._noise, "_cache", {})  # measuring it, not using it
        caches.append(
            {
                "ticks": t_max,
                "entries": len(cache),
                "bytes": deep_size(cache),
                "max": getattr(stage2._noise, "maxsize", 0),
            }
        )
        for stat in cfg.statistics:
            sstate = sstates[stat.name]
            trees.append(
                {
                    "statistic": stat.name,
                    "mechanism": stat.mechanism,
                    "ticks": t_max,
                    "json_bytes": len(orjson.dumps(sstate.to_json())),
                    "python_bytes": deep_size(sstate.to_json()),  # what the table holds
                    "state_json_bytes": len(orjson.dumps(sstate.statistic_state)),
                }
            )
    return {
        "users": users,
        "per_user": per_user,
        "python_bytes_per_user": grown / users,
        "changelog_bytes_per_user": changelog / users,
        "example_entry": orjson.dumps({example[0]: example[1]}).decode(),
        "trees": trees,
        "noise_cache": caches,
    }


def ingest_micro(base: dict, users: int, events: int, batches: list[int], seed: int) -> dict:
    """The ingest's own Python cost per event, no Kafka: ``ingest.route`` (decode and
    validate each source record, murmur2 per user, columnar envelopes) over records as the
    consumer returns them, in the worker's ``input.ingest_batch`` chunks. Per shape
    (1 = single-event records): µs per event, and the envelopes it writes."""
    from dpstream.pipeline.ingest.route import route
    from dpstream.pipeline.wire.records import limits_for

    cfg = parse_config(run_config(base, "s", None, 1.0, 4), "benchmark config")
    limits, partitions, chunk = limits_for(cfg), cfg.input.partitions, cfg.input.ingest_batch
    out = {"events": events, "ingest_batch": chunk, "shapes": {}}
    for batch in batches:
        msgs, n = messages(synthetic(users, events, seed), batch)
        records = source_records(msgs, partitions)
        t = time.perf_counter()
        envelopes = routed = 0
        for start in range(0, len(records), chunk):
            r = route(records[start : start + chunk], limits, partitions)
            envelopes += len(r.envelopes)
            routed += r.events
        seconds = time.perf_counter() - t
        assert routed == n, (routed, n)
        out["shapes"][str(batch)] = {
            "route_us": 1e6 * seconds / n,
            "envelopes": envelopes,
            "events_per_envelope": n / max(1, envelopes),
        }
    return out


def stage1_micro(base: dict, users: int, events: int, batch: int, seed: int) -> dict:
    """Stage 1's own Python cost per event, no Kafka and no Faust: what ``handle_input``
    does with an envelope of the events topic (``records.decode_envelope``,
    ``Stage1Driver.unseen``, ``Stage1.add_events``, with a
    dict as the table), over the columnar envelopes the ingest writes (``ingest.route`` of
    the same synthetic events, in source records of ``batch`` events, 1 = single-event
    records)."""
    from dpstream.pipeline.stages.drivers import Stage1Driver
    from dpstream.pipeline.stages.stage1_state import new_partition_state
    from dpstream.pipeline.wire.records import decode_envelope

    cfg = parse_config(run_config(base, "s", None, 1.0, 4), "benchmark config")
    partitions = cfg.input.partitions
    msgs, _ = messages(synthetic(users, events, seed), batch)
    envelopes = routed_envelopes(cfg, msgs)
    t = time.perf_counter()
    for _, raw in envelopes:
        orjson.loads(raw)
    t_json = time.perf_counter() - t
    t = time.perf_counter()
    decoded = [decode_envelope(raw) for _, raw in envelopes]
    t_decode = time.perf_counter() - t
    n = sum(len(e.events) for e in decoded)
    driver = Stage1Driver(cfg)
    pstates = {p: new_partition_state() for p in range(partitions)}
    t = time.perf_counter()
    fresh = [
        Stage1Driver.unseen(pstates[p], env) for (p, _), env in zip(envelopes, decoded, strict=True)
    ]
    t_unseen = time.perf_counter() - t
    table: dict = {}
    t = time.perf_counter()
    for offset, ((p, _), evs) in enumerate(zip(envelopes, fresh, strict=True)):
        driver.stage1.add_events(pstates[p], table, evs, offset, p)
        Stage1Driver.done(pstates[p], offset)
    t_add = time.perf_counter() - t
    return {
        "events": n,
        "batch": batch,
        "envelopes": len(envelopes),
        "orjson_us": 1e6 * t_json / n,
        "decode_us": 1e6 * t_decode / n,
        "unseen_us": 1e6 * t_unseen / n,
        "add_us": 1e6 * t_add / n,
        "writes_per_event": sum(len({e.user_id for e in env.events}) for env in decoded) / n,
    }
