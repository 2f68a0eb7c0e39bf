"""The ingest alone: dpstream's ``Ingest`` (what ``dpstream ingest`` runs) over a
pre-produced source topic, in a process of its own.

Run by ``bench.throughput`` (its ``ingest`` contender), once per run and input format:

    python -m bench.ingest_only --bootstrap B --config C --expect N

The config names the source topic and its ``input.format`` (JSON, or Avro through
``input.schema_registry``). The ingest joins its consumer group, reads every record,
decodes and validates each event, routes it and writes the envelopes to the pipeline's
events topic, until it has sent ``N`` events (or dead-lettered them) and the broker has
acknowledged them all. Timed from the end of its first batch (the group joined, the
first schema fetched) to the last acknowledgement; the first batch's events are left
out of the count. Prints one JSON line ``{"events", "records", "seconds", "cpu_seconds",
"first_batch_end", "peak_rss", "dead_letters"}``: ``cpu_seconds`` is the process's CPU
time (all threads: librdkafka's too) over the same span.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import orjson

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import proc_status  # noqa: E402
from dpstream.config.schema import load_config  # noqa: E402
from dpstream.pipeline.ingest.consumer import Ingest  # noqa: E402
from dpstream.pipeline.kafka.topics import ensure_topics  # noqa: E402

TIMEOUT = 1800.0


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--expect", type=int, required=True, help="events in the source topic")
    args = p.parse_args()
    cfg = load_config(args.config)
    ensure_topics(cfg, args.bootstrap)
    ingest = Ingest(cfg, args.bootstrap)
    consumer = ingest._consumer
    consumer.subscribe(cfg.input.topics, on_assign=ingest._on_assign)
    deadline = time.monotonic() + TIMEOUT
    first_events = records = 0
    t0 = c0 = first_end = 0.0
    done = 0
    while done < args.expect:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ingest sent {done} of {args.expect} events")
        read = ingest.step(timeout=0.5)
        records += read
        done = ingest.events + sum(ingest.rejected.values())
        if read and not t0:
            t0, c0, first_end = time.perf_counter(), time.process_time(), time.time()
            first_events = done
    ingest._settle(0)  # every envelope acknowledged
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        orjson.dumps(
            {
                "events": done - first_events,
                "records": records,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "first_batch_end": first_end,
                "peak_rss": proc_status(os.getpid()).get("VmHWM"),
                "dead_letters": sum(ingest.rejected.values()),
            }
        ).decode()
    )
    ingest.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
