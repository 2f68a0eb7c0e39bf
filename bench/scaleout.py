"""Scale-out: 1 worker vs 2 workers of one app on 4 partitions (issue 7, item 3).

    .venv/bin/python -m bench.scaleout [--events 200000] [--batch 100] [--runs 3]

Per run and worker count N: a fresh app and source topic; N ``dpstream worker`` processes
(each with its ingest, at the worker's default ``--ingest``) are started and left to settle
into their groups (every events partition assigned to one stage 1, none twice, read from
their logs; every source partition held by the ingest group); then the synthetic events
are produced into the source topic (dpstream's producer, ``clients.produce_events``).
Time = from the first produce call (the workers are idle until then) to the release of
the first tick whose markers, written by the workers' own clock into the events topic,
follow the last envelope in every events partition (a release CreateTime): so it
includes up to one tick of waiting for that tick to end (ticks of 0.25 s here).
Every run's releases must equal the offline replay of its input log (what
``dpstream export-log`` and ``dpstream replay`` compute), byte for byte, as with one
worker. Prints a Markdown table; ``--out`` appends it to a file. A benchmark: nothing in
the test suite asserts on its timings.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

from dpstream.config.schema import PipelineConfig

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine  # noqa: E402
from bench.throughput.datasets import synthetic  # noqa: E402
from bench.throughput.workers import (  # noqa: E402
    DEFAULT_LOGLEVEL,
    KEY_ENV,
    Watcher,
    base_config,
    ingest_assigned,
    run_config,
    stop,
    write_config,
)

# dpstream's producer with room for a whole pre-produced log in its queue.
PRODUCER_QUEUE = {
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_000_000,
}


def run(bootstrap: str, workers: int, args: argparse.Namespace, env: dict[str, str]) -> dict:
    from dpstream.pipeline.kafka.clients import make_producer, produce_events
    from dpstream.pipeline.kafka.topics import create_source_topics, ensure_topics
    from dpstream.pipeline.worker.processes import assigned_partitions, spawn_worker

    base = base_config(None)
    cfg, path = write_config(
        run_config(base, f"s{workers}", None, args.tick, args.partitions), args.workdir
    )
    create_source_topics(cfg, bootstrap)
    ensure_topics(cfg, bootstrap)
    logs = [args.workdir / f"{cfg.app_id}.{i}.log" for i in range(workers)]
    procs = [spawn_worker(path, bootstrap, log, env=env, loglevel=DEFAULT_LOGLEVEL) for log in logs]
    watcher = Watcher(bootstrap, cfg, events=args.events)
    try:
        deadline = time.time() + 120
        while True:
            parts = [
                assigned_partitions(log.read_text(errors="replace"), cfg.events_topic)
                if log.exists()
                else set()
                for log in logs
            ]
            union = set().union(*parts)
            if (
                all(parts)
                and union == set(range(args.partitions))
                and sum(map(len, parts)) == len(union)
            ):
                break
            if time.time() > deadline:
                raise TimeoutError(f"{workers} workers did not settle: {parts}")
            time.sleep(0.5)
        ingest_assigned(bootstrap, cfg)
        time.sleep(3)  # the recovery after the last assignment
        producer = make_producer(bootstrap, **PRODUCER_QUEUE)
        started = time.time()  # the workers are idle: they start on the first event
        sent = produce_events(
            producer, cfg, synthetic(args.users, args.events, args.seed), batch=args.batch
        )
        if producer.flush(300):
            raise RuntimeError("producing: messages still queued after 300 s")
        watcher.wait(lambda: watcher.closing() is not None, 1800, "every event", procs[0], logs[0])
        last = (watcher.closing() or (-1, 0.0))[0]
        watcher.wait(
            lambda: watcher.released(last), 1800, f"release of tick {last}", procs[0], logs[0]
        )
        end = max(watcher.releases[s][last][0] for s in watcher.stats)
    finally:
        for proc in procs:
            stop(proc)
        watcher.close()
    return {
        "workers": workers,
        "events": sent,
        "seconds": end - started,
        "equal_to_replay": equal_to_replay(bootstrap, cfg),
    }


def equal_to_replay(bootstrap: str, cfg: PipelineConfig) -> bool:
    """Every release of the run equals the offline replay of its input log, byte for byte
    (the releases are a prefix of the replay's: the replay closes every tick)."""
    from dpstream.pipeline.kafka.clients import read_topic
    from dpstream.pipeline.tools.export import export_log
    from dpstream.pipeline.tools.replay import replay
    from dpstream.pipeline.worker.keys import load_noise

    replayed: dict[str, list[bytes]] = {}
    for release in replay(cfg, export_log(cfg, bootstrap), load_noise(cfg)):
        replayed.setdefault(release["statistic"], []).append(orjson.dumps(release))
    for stat in cfg.statistics:
        topic = cfg.release_topic(stat.name)
        released = [value for _, _, value, _ in read_topic(bootstrap, topic, 1)[0]]
        if not released or released != replayed.get(stat.name, [])[: len(released)]:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=100, help="envelope size (1: single events)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--tick", type=float, default=0.25, help="short: the end is a tick's release")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help="append the table here")
    args = p.parse_args(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-scaleout-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    from dpstream.deploy.broker import kafka_broker

    env = {KEY_ENV: secrets.token_hex(32)}
    os.environ.update(env)  # the replay here uses the workers' key
    results: list[dict] = []
    with kafka_broker() as bootstrap:
        for i in range(args.runs):
            for workers in (1, 2):
                r = run(bootstrap, workers, args, env)
                results.append(r)
                print(
                    f"[scaleout] run {i + 1}/{args.runs}, {workers} worker(s): "
                    f"{r['events'] / r['seconds']:,.0f} events/s ({r['seconds']:.2f} s)",
                    flush=True,
                )
    same = all(r["equal_to_replay"] for r in results)
    rows = [
        "| workers | runs | events/s (median) | spread (min-max) | releases == replay of the log |",
        "|---:|---:|---:|---:|---|",
    ]
    for workers in (1, 2):
        rates = [r["events"] / r["seconds"] for r in results if r["workers"] == workers]
        equal = all(r["equal_to_replay"] for r in results if r["workers"] == workers)
        rows.append(
            f"| {workers} | {len(rates)} | {statistics.median(rates):,.0f} | "
            f"{min(rates):,.0f}-{max(rates):,.0f} | {'yes' if equal else 'NO'} |"
        )
    m = machine()
    info = f"{m['cores']} cores ({m['cpu']}), {m['ram']} RAM, broker and workers on the same cores"
    shape = "single-event records" if args.batch == 1 else f"envelopes of {args.batch}"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (
        f"\n## Scale-out: 1 vs 2 workers\n\n`python -m bench.scaleout --events {args.events} "
        f"--batch {args.batch} --runs {args.runs}`, {when}; {args.events:,} events ({shape}, "
        f"{args.users:,} users) over {args.partitions} partitions, workers of one app started "
        f"and settled before the events are written. Machine: {info}.\n\n" + "\n".join(rows) + "\n"
    )
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
