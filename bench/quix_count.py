"""The Quix Streams peer of the benchmark (bench/throughput/peers.py): a running per-user count.

What a Quix Streams user would write for it: a stateful ``apply`` over a topic keyed by user
id (Quix scopes state to the message key), JSON values, Quix's defaults otherwise (RocksDB
state with changelog topics, commit every 5 s). Run in a fresh process by
``bench.throughput.peers.run_peer``::

    python bench/quix_count.py BOOTSTRAP TOPIC RECORDS at-least-once|exactly-once \
        --group G --state-dir DIR

It stops once RECORDS records have been counted and prints one JSON line: records,
first-to-last-record seconds, wall seconds from process start to the last record, CPU
seconds of the process at exit and its peak RSS (VmHWM). Needs quixstreams (the ``bench``
extra: quixstreams==3.28.0); dpstream itself is not imported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path


def process_start_epoch() -> float | None:
    """When this process started (Unix seconds, 1/CLK_TCK resolution), from /proc."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22: starttime
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    started = process_start_epoch() or time.time()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("records", type=int)
    p.add_argument("guarantee", choices=["at-least-once", "exactly-once"])
    p.add_argument("--group", required=True, help="consumer group (unique per run)")
    p.add_argument("--state-dir", required=True)
    p.add_argument(
        "--timeout", type=float, default=60.0, help="stop after this many s without a record"
    )
    a = p.parse_args(argv)

    from quixstreams import Application

    app = Application(
        broker_address=a.bootstrap,
        consumer_group=a.group,
        auto_offset_reset="earliest",
        processing_guarantee=a.guarantee,
        state_dir=a.state_dir,
        loglevel="WARNING",
    )
    topic = app.topic(a.topic, key_deserializer="str", value_deserializer="json")
    sdf = app.dataframe(topic)

    target = a.records
    seen = 0
    first = last = 0.0
    last_epoch = 0.0

    def count(value: dict, state) -> int:  # the user's code: one counter per user (key)
        nonlocal seen, first, last, last_epoch
        total = state.get("count", 0) + 1
        state.set("count", total)
        seen += 1  # the benchmark's clock, not part of the count
        if seen == 1:
            first = time.perf_counter()
        if seen == target:
            last = time.perf_counter()
            last_epoch = time.time()
        return total

    sdf = sdf.apply(count, stateful=True)
    # count=N: Quix stops after N outputs (one per record here) and commits on the way out.
    app.run(count=target, timeout=a.timeout, collect=False)

    complete = seen >= target
    if not complete:
        last, last_epoch = time.perf_counter(), time.time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {
        "peer": "quix",
        "guarantee": a.guarantee,
        "records": min(seen, target),
        "span_seconds": (last - first) if seen else None,
        "wall_seconds": round(last_epoch - started, 3),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss": peak_rss(),
    }
    print(json.dumps(line), flush=True)
    return 0 if complete else 2


if __name__ == "__main__":
    sys.exit(main())
