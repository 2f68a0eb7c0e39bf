"""``python -m bench.throughput``: parse the flags, run the contenders, write the document."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from bench.common import fmt_bytes, fmt_rate, loadavg, machine
from bench.throughput import micro, peers
from bench.throughput.contenders import (
    AVRO_READERS,
    CONTENDERS,
    EXPERIMENTS,
    INGEST,
    INGEST_MODES,
    PIPELINE,
    SINGLE_ONLY,
    run_contender,
    run_latency,
    run_memory,
    run_naive,
    run_pipeline,
)
from bench.throughput.datasets import (
    AVRO,
    ENVELOPES,
    SINGLE,
    Dataset,
    Message,
    avro_messages,
    batch_name,
    envelope_messages,
    messages,
    preproduce,
    routed_envelopes,
    shape_name,
    synthetic,
)
from bench.throughput.report import (
    Results,
    document,
    latency_table,
    results_from_json,
    results_json,
    targets_section,
    throughput_table,
)
from bench.throughput.workers import (
    DEFAULT_LOGLEVEL,
    KEY_ENV,
    ROOT,
    Harness,
    base_config,
    log,
    py_spy,
    run_config,
)
from dpstream.config.schema import parse_config

# Kafka Streams' full-mode span. Measured on the 2-core machine (loaded), the same topic:
# at_least_once 77k records/s over the first 1,000,000 records and 132k over 5,000,000,
# CPU 9.2 and 4.0 µs/record (exactly_once_v2: 83k and 115k, 12.3 and 5.4 µs): over a
# million records the JVM's start-up and JIT warm-up still dominate.
KSTREAMS = "kafka-streams"
KSTREAMS_SPAN = 5_000_000


def parse_args(argv: list[str]) -> argparse.Namespace:
    from bench import throughput

    p = argparse.ArgumentParser(
        description=(throughput.__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small sizes, 1 run (~3 minutes)")
    p.add_argument("--runs", type=int, help="throughput runs (default 3; quick 1)")
    p.add_argument("--users", type=int, default=10_000, help="distinct users in the events")
    p.add_argument(
        "--singles", type=int, help="single-event records (default 1,000,000; quick 50,000)"
    )
    p.add_argument(
        "--envelope-events",
        type=int,
        help="events in our envelopes (default 1,000,000; quick 50,000; 0: skip)",
    )
    p.add_argument(
        "--span",
        action="append",
        default=[],
        metavar="CONTENDER=RECORDS",
        help="a longer span of single-event records for a contender or a family of them "
        "(e.g. quix=2000000: both Quix Streams guarantees); repeatable; full mode with the default "
        f"--singles gives {KSTREAMS} {KSTREAMS_SPAN:,}",
    )
    p.add_argument("--batch", default="100", help="source batch sizes for latency and memory runs")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--tick", type=float, default=1.0, help="tick interval in seconds")
    p.add_argument(
        "--ingest-mode",
        default="default",
        help="the pipeline's `dpstream worker --ingest`: process, thread, or default (the "
        "worker's); comma-separated to compare them in the same run (the first is used for "
        "latency, memory and profiles)",
    )
    p.add_argument(
        "--contenders",
        help=f"comma-separated, from {','.join(CONTENDERS)} (default all but the naive "
        f"agent's diagnostic variants {', '.join(EXPERIMENTS)})",
    )
    p.add_argument(
        "--latency-rate",
        help="events/s, comma-separated (default 50000: the target of issue 16; quick 20000)",
    )
    p.add_argument("--latency-seconds", type=float, help="default 20; quick 10")
    p.add_argument("--latency-wait", type=float, help="max wait for the last release")
    p.add_argument(
        "--latency-batch",
        help="input shapes for latency (1 = single events; default 1, full 1,100)",
    )
    p.add_argument("--memory-users", help="user counts for the RSS runs, comma-separated")
    p.add_argument("--memory-events", type=int, help="events in each RSS run (default 100000)")
    p.add_argument("--memory-per-user", type=int, default=2, help="for the in-process constant")
    p.add_argument("--state-users", type=int, help="users for the in-process per-user bytes")
    p.add_argument("--state-ticks", help="ticks for the per-statistic state, comma-separated")
    p.add_argument("--profile", action="store_true", help="py-spy the worker (extra runs)")
    p.add_argument("--profile-label", default="before")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples/s")
    p.add_argument("--profile-tools", default="pyspy,cprofile", help="pyspy and/or cprofile")
    p.add_argument("--config", type=Path, help="pipeline YAML (default config/demo.yaml)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--json", type=Path, help="also write every number as JSON here")
    p.add_argument("--workdir", type=Path, help="configs, logs, profiles (default: temp)")
    p.add_argument("--under-load", action="store_true", help="say so in the document")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--worker-loglevel", default=DEFAULT_LOGLEVEL, help="for the Faust processes")
    args = p.parse_args(argv)
    args.argv = argv
    q = args.quick
    sizes_given = args.singles is not None
    args.runs = args.runs or (1 if q else 3)
    args.singles = args.singles if args.singles is not None else (50_000 if q else 1_000_000)
    if args.envelope_events is None:
        args.envelope_events = 50_000 if q else 1_000_000
    args.latency_seconds = args.latency_seconds or (10.0 if q else 20.0)
    if args.latency_batch is None:
        args.latency_batch = "1" if q else "1,100"
    if args.memory_users is None:
        args.memory_users = "" if q else "1000,10000,50000"
    args.memory_events = args.memory_events or 100_000
    args.state_users = args.state_users or (20_000 if q else 100_000)
    args.state_ticks = [
        int(t) for t in (args.state_ticks or ("1000" if q else "1000,10000")).split(",")
    ]
    args.batches = [int(b) for b in args.batch.split(",") if b.strip()]
    args.latency_batches = [int(b) for b in args.latency_batch.split(",") if b.strip()]
    if args.latency_rate is None:
        args.latency_rate = "20000" if q else "50000"
    args.latency_rates = [float(r) for r in args.latency_rate.split(",") if r.strip()]
    args.memory_list = [int(u) for u in args.memory_users.split(",") if u.strip()]
    if args.contenders is None:
        args.contenders = ",".join(c for c in CONTENDERS if c not in EXPERIMENTS)
    args.contenders = [c for c in args.contenders.split(",") if c]
    args.profile_tools = [t for t in args.profile_tools.split(",") if t]
    args.ingest_modes = [m for m in args.ingest_mode.split(",") if m]
    if not args.ingest_modes or set(args.ingest_modes) - {"default", *INGEST_MODES}:
        p.error("--ingest-mode: default, process and/or thread")
    if set(args.profile_tools) - {"pyspy", "cprofile"}:
        p.error("--profile-tools: pyspy and/or cprofile")
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    if "aiokafka" not in args.contenders:
        p.error("aiokafka (the ceiling every ratio refers to) must be among the contenders")
    # Kafka Streams' longer span goes with the full mode's default sizes only.
    told = sizes_given or any(s.startswith(f"{KSTREAMS}=") for s in args.span)
    if not q and not told and any(c.startswith(f"{KSTREAMS}:") for c in args.contenders):
        args.span.append(f"{KSTREAMS}={KSTREAMS_SPAN}")
    args.spans = parse_spans(p, args.span, args.contenders)
    return args


def parse_spans(
    p: argparse.ArgumentParser, given: list[str], contenders: list[str]
) -> dict[str, int]:
    """``NAME=RECORDS`` flags as contender -> records; NAME is a contender or the part of
    a peer's name before its guarantee (``kafka-streams``, ``quix``)."""
    out: dict[str, int] = {}
    for item in given:
        name, _, records = item.partition("=")
        chosen = [c for c in contenders if c == name or c.partition(":")[0] == name]
        if not chosen or not records.strip().isdigit():
            p.error(f"--span {item!r}: CONTENDER=RECORDS with a contender of this run")
        out.update(dict.fromkeys(chosen, int(records)))
    return out


def render(path: Path, out: Path | None) -> int:
    """Write the document again from a run's ``--json`` file (after a template change)."""
    data = orjson.loads(path.read_bytes())
    args = parse_args(data["argv"] + ([f"--out={out}"] if out else []))
    args.argv = data["argv"]
    args.out.write_text(document(results_from_json(data, args)))
    log(f"wrote {args.out} from {path}")
    return 0


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - read-only
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "pipeline", "operators", "config"],  # noqa: S607
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def base_name(row: str) -> str:
    """The contender of a table row (``dpstream-process`` is the pipeline)."""
    return PIPELINE if row.startswith(PIPELINE) else row


class Run:
    """One invocation: the flags, the broker, the results so far. Sections that may fail
    without spoiling the rest go through ``attempt``."""

    def __init__(self, args: argparse.Namespace, harness: Harness, res: Results) -> None:
        self.args = args
        self.harness = harness
        self.res = res
        self.payloads: dict[str, list[Message]] = {}
        mode = args.ingest_modes[0]
        self.ingest = None if mode == "default" else mode

    def attempt(self, what: str, fn: Callable[[], None]) -> bool:
        """Optional sections: a failure is reported in the document, not fatal."""
        try:
            fn()
        except Exception as exc:
            log(f"{what} failed: {exc}")
            self.res.errors.append(f"{what}: {type(exc).__name__}: {str(exc)[:2000]}")
            return False
        return True

    def prepare_peers(self) -> None:
        """Build Kafka Streams and install Quix Streams before anything is timed; a peer
        that cannot be had here is left out (and the document says why)."""
        wanted = [c for c in self.args.contenders if c in peers.PEERS]
        setups = (("kafka-streams", peers.build_kafka_streams), ("quix", peers.quix_python))
        for family, setup in setups:
            members = [c for c in wanted if c.partition(":")[0] == family]
            if members and not self.attempt(f"{family} (set-up)", setup):
                self.args.contenders = [c for c in self.args.contenders if c not in members]

    def datasets(self) -> None:
        args, bootstrap = self.args, self.harness.bootstrap
        spans = sorted(set(args.spans.values()) - {args.singles})
        for n in [args.singles, *spans] if args.singles > 0 else []:
            msgs, n = messages(synthetic(args.users, n, args.seed), 1)
            name = SINGLE if n == args.singles else f"{SINGLE}-{n}"
            ds = preproduce(bootstrap, name, SINGLE, args.partitions, msgs, n)
            # Only the pipeline writes the records again (its own copy of the topic).
            self.add(ds, msgs if n == args.spans.get(PIPELINE, args.singles) else [])
        if INGEST in args.contenders and args.singles > 0:
            # The same events as the single-event records, as Avro.
            events = list(synthetic(args.users, args.singles, args.seed))
            msgs = avro_messages(events, str(self.harness.registry))
            self.add(preproduce(bootstrap, AVRO, AVRO, args.partitions, msgs, len(events)), [])
        if args.envelope_events > 0:
            cfg = parse_config(
                run_config(self.harness.base, "e", None, args.tick, args.partitions),
                "benchmark config",
            )
            single, n = messages(synthetic(args.users, args.envelope_events, args.seed), 1)
            msgs = envelope_messages(routed_envelopes(cfg, single))
            self.add(preproduce(bootstrap, ENVELOPES, ENVELOPES, args.partitions, msgs, n), msgs)

    def add(self, ds: Dataset, msgs: list[Message]) -> None:
        self.res.datasets[ds.name], self.payloads[ds.name] = ds, msgs
        log(f"{ds.name}: {ds.events:,} events in {ds.records:,} records ({ds.topic})")

    def dataset_for(self, contender: str, shape: str) -> Dataset | None:
        """The dataset ``contender`` reads for ``shape``: its own span's, if it has one."""
        if shape == AVRO:
            return self.res.datasets[shape] if contender in AVRO_READERS else None
        if shape != SINGLE:
            return None if contender in SINGLE_ONLY else self.res.datasets[shape]
        n = self.args.spans.get(contender, self.args.singles)
        return self.res.datasets[SINGLE if n == self.args.singles else f"{SINGLE}-{n}"]

    def throughput(self) -> None:
        """Every contender on every shape, the runs interleaved."""
        args, res = self.args, self.res
        for run in range(args.runs):
            for shape in res.shapes():
                names = res.contenders()
                if shape == ENVELOPES:  # the ingest is off: one pipeline row
                    names = [n for n in names if not n.startswith(PIPELINE)] + [
                        n for n in names if n.startswith(PIPELINE)
                    ][:1]
                for contender in names:
                    ds = self.dataset_for(base_name(contender), shape)
                    if ds is not None:
                        self.one(run, contender, ds)

    def one(self, run: int, contender: str, ds: Dataset) -> None:
        args, res = self.args, self.res
        name = base_name(contender)
        mode = contender.removeprefix(PIPELINE).lstrip("-") or args.ingest_modes[0]
        ingest = None if mode == "default" else mode

        def measure() -> None:
            r = run_contender(name, ds, self.harness, self.payloads[ds.name], ingest)
            r.update(run=run, dataset=ds.name, shape=ds.shape, contender=contender)
            r["rate"] = r["events"] / r["seconds"]
            res.runs.append(r)
            log(
                f"run {run + 1}/{args.runs} {shape_name(ds.shape)} {contender}: "
                f"{fmt_rate(r['rate'])} events/s ({r['seconds']:.2f} s, "
                f"wall {r['wall_seconds']:.1f} s)"
            )

        if contender in peers.PEERS:  # a peer that fails leaves a note, not a dead run
            self.attempt(f"{contender}, run {run + 1}", measure)
        else:
            measure()

    def latency(self) -> None:
        args = self.args
        for batch in args.latency_batches:
            for rate in args.latency_rates:

                def latency(batch: int = batch, rate: float = rate) -> None:
                    r = run_latency(
                        self.harness,
                        batch=batch,
                        rate=rate,
                        seconds=args.latency_seconds,
                        users=args.users,
                        partitions=args.partitions,
                        seed=args.seed + 1,
                        wait=args.latency_wait or max(15.0, args.latency_seconds),
                        ingest=self.ingest,
                    )
                    self.res.latency.append(r)
                    log(
                        f"latency {batch_name(batch)} at {fmt_rate(rate)}/s: p50 "
                        f"{r['p50']:.3f} s, p99 {r['p99']:.3f} s, kept up: {r['kept_up']}"
                    )

                self.attempt(f"latency, {batch_name(batch)} at {rate:g}/s", latency)

    def memory(self) -> None:
        args = self.args
        for users in args.memory_list:

            def memory(users: int = users) -> None:
                r = run_memory(
                    self.harness,
                    users=users,
                    events=args.memory_events,
                    batch=max(args.batches or [100]),
                    partitions=args.partitions,
                    ingest=self.ingest,
                )
                self.res.memory.append(r)
                log(f"memory {users:,} users: RSS {fmt_bytes(r['rss'])}")

            self.attempt(f"memory, {users} users", memory)

    def profiles(self) -> None:
        args = self.args
        for shape in self.res.shapes():
            ds = self.res.datasets[shape]
            for tool in args.profile_tools:

                def profile(ds: Dataset = ds, tool: str = tool) -> None:
                    if tool == "pyspy" and py_spy() is None:
                        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
                    suffix = "txt" if tool == "pyspy" else "pstats"
                    path = args.workdir / f"profile-{tool}-{ds.name}.{suffix}"
                    r = run_pipeline(
                        self.harness,
                        ds,
                        self.payloads[ds.name],
                        ingest=self.ingest,
                        profile=(tool, path),
                        profile_rate=args.profile_rate,
                    )
                    naive = None
                    if tool == "cprofile":  # the same for the naive agent, to diff
                        naive = args.workdir / f"profile-cprofile-naive-{ds.name}.pstats"
                        run_naive(ds, self.harness, cprofile=naive)
                    self.res.profiles.append(
                        {
                            "tool": tool,
                            "shape": ds.shape,
                            "path": str(path),
                            "naive_path": str(naive) if naive else None,
                            "events": ds.events,
                            "records": ds.records,
                            "rate": ds.events / r["seconds"],
                            "cpu_us": 1e6 * r["cpu_seconds"] / ds.events,
                        }
                    )
                    log(f"profiled ({tool}) {shape_name(ds.shape)}: {path}")

                self.attempt(f"profile ({tool}), {shape_name(ds.shape)}", profile)

    def in_process(self) -> None:
        args, res, base = self.args, self.res, self.harness.base

        def constants() -> None:
            log("state constants (in process)")
            res.constants = micro.state_constants(
                base, args.state_users, args.memory_per_user, args.state_ticks
            )

        self.attempt("state constants", constants)

        def micros() -> None:
            log("ingest and stage-1 micro-benchmarks (in process)")
            n = max(args.singles, args.envelope_events)
            res.ingest_micro = micro.ingest_micro(
                base, args.users, n, [1, *args.batches], args.seed
            )
            res.micro = micro.stage1_micro(base, args.users, n, 1, args.seed)

        self.attempt("ingest and stage-1 micro-benchmarks", micros)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--render"]:
        return render(Path(argv[1]), Path(argv[2]) if len(argv) > 2 else None)
    args = parse_args(argv)
    from dpstream.deploy.broker import BOOTSTRAP_ENV, KAFKA_VERSION, kafka_broker
    from dpstream.deploy.registry import schema_registry

    if args.workdir is None:
        args.workdir = Path(tempfile.mkdtemp(prefix="dpstream-bench-"))
    args.workdir.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    external = os.environ.get(BOOTSTRAP_ENV, "").strip()
    kafka = (
        f"external broker at {external} (version not checked)"
        if external
        else f"Apache Kafka {KAFKA_VERSION} (KRaft, single node, from Kafka's jars)"
    )
    res = Results(args=args, info=machine(), kafka=kafka, load_start=loadavg())
    res.commit, res.date = git_commit(), time.strftime("%Y-%m-%d %H:%M %Z")
    log(f"workdir {args.workdir}")
    # A Schema Registry for the Avro dataset, which only the ingest contender reads.
    registry = schema_registry() if INGEST in args.contenders else contextlib.nullcontext()
    with kafka_broker() as bootstrap, registry as registry_url:
        log(f"broker {bootstrap}")
        harness = Harness(
            bootstrap=bootstrap,
            base=base_config(args.config),
            workdir=args.workdir,
            env={KEY_ENV: secrets.token_hex(32)},
            tick=args.tick,
            loglevel=args.worker_loglevel,
            registry=registry_url,
        )
        run = Run(args, harness, res)
        run.prepare_peers()
        run.datasets()
        run.throughput()
        run.latency()
        run.memory()
        if args.profile:
            run.profiles()
    run.in_process()
    res.load_end = loadavg()
    res.wall = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(document(res))
    print(throughput_table(res))
    print()
    print(targets_section(res))
    if res.latency:
        print()
        print(latency_table(res))
    log(f"wrote {args.out}")
    if args.json:
        args.json.write_bytes(results_json(res))
    for err in res.errors:
        log(f"ERROR {err.splitlines()[0]}")
    return 1 if res.errors else 0
