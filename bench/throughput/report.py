"""The document a throughput run writes (docs/benchmarks.md): its tables and sections,
rendered from a run's ``Results`` (measured now, or read back from its ``--json``)."""

from __future__ import annotations

import argparse
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.common import fmt_bytes, fmt_rate, linear_fit, median, spread
from bench.throughput.contenders import INGEST, LABELS, PIPELINE
from bench.throughput.datasets import (
    AVRO,
    ENVELOPES,
    SHAPES,
    SINGLE,
    Dataset,
    batch_name,
    shape_name,
)
from bench.throughput.workers import base_config


@dataclass
class Results:
    args: argparse.Namespace
    info: dict
    kafka: str
    load_start: str
    load_end: str = ""
    datasets: dict[str, Dataset] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)  # {run, dataset, shape, contender, ...}
    latency: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    constants: dict | None = None
    micro: dict | None = None
    ingest_micro: dict | None = None
    profiles: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    commit: str = ""
    date: str = ""

    def shapes(self) -> list[str]:
        """The input shapes of this run's datasets, in the document's order."""
        present = {d.shape for d in self.datasets.values()}
        return [s for s in SHAPES if s in present]

    def rows(self, shape: str, contender: str) -> list[dict]:
        return [r for r in self.runs if r["shape"] == shape and r["contender"] == contender]

    def ratio(self, shape: str, contender: str, reference: str = "aiokafka") -> list[float]:
        """Per run: contender events/s over reference events/s in the same run, on the same
        input shape (the reference's default span)."""
        ref = {r["run"]: r["rate"] for r in self.rows(shape, reference)}
        return [r["rate"] / ref[r["run"]] for r in self.rows(shape, contender) if r["run"] in ref]

    def contenders(self) -> list[str]:
        """Row names: the contenders, the pipeline once per ingest mode when several."""
        out = []
        for c in self.args.contenders:
            out += pipeline_names(self.args) if c == PIPELINE else [c]
        return out


def pipeline_names(args: argparse.Namespace) -> list[str]:
    modes = args.ingest_modes
    return [PIPELINE] if len(modes) == 1 else [f"{PIPELINE}-{m}" for m in modes]


def label(name: str, args: argparse.Namespace, shape: str = SINGLE) -> str:
    if not name.startswith(PIPELINE):
        return LABELS[name]
    if shape == ENVELOPES:
        return "dpstream pipeline (stage 1 + 2 + releases), ingest off: envelopes pre-made"
    mode = name.partition("-")[2] or args.ingest_modes[0]
    where = "worker's default" if mode == "default" else mode
    return f"{LABELS[PIPELINE]}, ingest: {where}"


def throughput_table(res: Results) -> str:
    lines = [
        "| input | contender | span (events) | runs | events/s first→last (median) "
        "| spread (min-max) | wall s from process start (median, min-max) "
        "| ratio to aiokafka (median) | ratio to confluent-kafka (median) | CPU µs/event "
        "| peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape in res.shapes():
        for contender in res.contenders():
            rows = res.rows(shape, contender)
            if not rows:
                continue
            rates = [r["rate"] for r in rows]
            lo, hi = spread(rates)
            walls = [r.get("wall_seconds", math.nan) for r in rows]
            wlo, whi = spread(walls)
            ratio = median(res.ratio(shape, contender))
            ratio_c = median(res.ratio(shape, contender, "confluent"))
            cpu = median(1e6 * r["cpu_seconds"] / r["events"] for r in rows)
            rss = median(r.get("peak_rss") or math.nan for r in rows)
            lines.append(
                f"| {shape_name(shape)} | {label(contender, res.args, shape)} "
                f"| {rows[0]['events']:,} | {len(rows)} | {fmt_rate(median(rates))} "
                f"| {fmt_rate(lo)}-{fmt_rate(hi)} "
                f"| {median(walls):.1f} ({wlo:.1f}-{whi:.1f}) "
                f"| {ratio:.3f} | {ratio_c:.3f} | {cpu:.1f} | {fmt_bytes(rss)} |"
            )
    return "\n".join(lines)


def formats_section(res: Results) -> str:
    """The ingest alone on Avro beside JSON: the same events, the same run."""
    json_rows, avro_rows = res.rows(SINGLE, INGEST), res.rows(AVRO, INGEST)
    if not json_rows or not avro_rows:
        return ""
    lines = [
        "### The ingest on Avro beside JSON",
        "",
        "The ingest alone (`bench/ingest_only.py`: decode, validate, route, envelopes "
        "acknowledged by the broker; timed from the end of its first batch), on the same "
        "events as single-event JSON records and as single-event Avro records through the "
        "Schema Registry (`input.format: avro`, confluent-kafka's AvroDeserializer), in the "
        "same runs.",
        "",
        "| input | events/s (median) | spread (min-max) | CPU µs/event (median) "
        "| Avro / JSON events/s (median of per-run ratios) |",
        "|---|---:|---:|---:|---:|",
    ]
    json_rate = {r["run"]: r["rate"] for r in json_rows}
    ratios = [r["rate"] / json_rate[r["run"]] for r in avro_rows if r["run"] in json_rate]
    for shape, rows in ((SINGLE, json_rows), (AVRO, avro_rows)):
        rates = [r["rate"] for r in rows]
        lo, hi = spread(rates)
        cpu = median(1e6 * r["cpu_seconds"] / r["events"] for r in rows)
        ratio = f"{median(ratios):.2f}" if shape == AVRO else "1"
        lines.append(
            f"| {shape_name(shape)} | {fmt_rate(median(rates))} | {fmt_rate(lo)}-{fmt_rate(hi)} "
            f"| {cpu:.1f} | {ratio} |"
        )
    return "\n".join(lines)


def latency_table(res: Results) -> str:
    if not res.latency:
        return "(not measured in this run)"
    lines = [
        "| input | target rate | achieved | ticks | samples | p50 s | p99 s | max s "
        "| p99 / tick | growth s | kept up | worker CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    tick = res.args.tick
    for r in res.latency:
        kept = "yes" if r["kept_up"] else "NO"
        if r["censored_ticks"]:
            kept += f" ({r['censored_ticks']} ticks unreleased: lower bounds)"
        lines.append(
            f"| {batch_name(r['batch'])} | {fmt_rate(r['rate'])}/s "
            f"| {fmt_rate(r['achieved_rate'])}/s | {r['ticks']} | {r['samples']} "
            f"| {r['p50']:.3f} | {r['p99']:.3f} | {r['max']:.3f} | {r['p99'] / tick:.2f} "
            f"| {r['growth']:+.2f} | {kept} | {100 * r['cpu_share']:.0f}% |"
        )
    return "\n".join(lines)


def memory_section(res: Results) -> str:
    out = []
    if res.memory:
        out.append(
            f"Each run: a fresh worker over a log of {res.args.memory_events:,} events (source "
            "batches of up to the largest `--batch`) from N users taking turns; VmRSS and VmHWM "
            "read from /proc once T1 is released. Every run has the same log length and, "
            "with N at least partitions x batch size, the same number of table writes (every "
            "envelope holds distinct users), so the slope over N is the memory per user and "
            "the intercept is the worker's baseline plus the high-water of its transient "
            "allocations. The latter is large for a pre-produced log: the changelog writes "
            "the worker makes while racing through a backlog wait in Faust's and aiokafka's "
            "producer buffers (several KB each, with their futures) until sent, and the "
            "allocator keeps the arenas afterwards. Not a leak: checked by hand once (commit "
            "cd41d99), a worker that had processed a 10,000-event log (170 MiB) stayed at "
            "167 MiB while fed four more logs of the same size."
        )
        lines = [
            "| users | events | worker VmRSS after the log | peak RSS (VmHWM) |",
            "|---:|---:|---:|---:|",
        ]
        for m in res.memory:
            lines.append(
                f"| {m['users']:,} | {m['events']:,} | {fmt_bytes(m['rss'])} "
                f"| {fmt_bytes(m['peak_rss'])} |"
            )
        out.append("\n".join(lines))
        if len(res.memory) >= 2:
            xs = [m["users"] for m in res.memory]
            for key, name in (("rss", "VmRSS"), ("peak_rss", "peak RSS")):
                slope, icpt = linear_fit(xs, [m[key] for m in res.memory])
                out.append(
                    f"Least-squares fit, {name} = {fmt_bytes(icpt)} + {slope:,.0f} B x users."
                )
    c = res.constants
    if c:
        out.append(
            f"In-process, per user (stage 1, {c['users']:,} users x {c['per_user']} events, "
            f"tracemalloc of the `users` table as the memory store holds it): "
            f"**{c['python_bytes_per_user']:,.0f} B per user** in Python objects; "
            f"changelog record (orjson key + value) {c['changelog_bytes_per_user']:,.0f} B. "
            f"An entry: `{c['example_entry']}`."
        )
        lines = [
            "| statistic | mechanism | ticks | state JSON B | state Python B | kind state JSON B |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for t in c["trees"]:
            lines.append(
                f"| {t['statistic']} | {t['mechanism']} | {t['ticks']:,} | {t['json_bytes']:,} "
                f"| {t['python_bytes']:,} | {t['state_json_bytes']:,} |"
            )
        title = "Per statistic (stage 2 state, keyed noise, one event per tick):"
        out.append(title + "\n\n" + "\n".join(lines))
        out.append(
            "Keyed-noise cache (`CachedNoise`, one per worker, shared by all statistics): "
            + "; ".join(
                f"after {n['ticks']:,} ticks {n['entries']:,} entries, {fmt_bytes(n['bytes'])}"
                f" ({n['bytes'] / max(1, n['entries']):,.0f} B/entry; bound {n['max']:,} "
                f"entries = {fmt_bytes(n['max'] * n['bytes'] / max(1, n['entries']))})"
                for n in c["noise_cache"]
            )
            + "."
        )
    return "\n\n".join(out) if out else "(not measured in this run)"


def micro_section(res: Results) -> str:
    m, im = res.micro, res.ingest_micro
    if not m and not im:
        return "(not measured in this run)"
    parts = []
    if im:
        rows = "\n".join(
            f"| {batch_name(int(b))} | {x['route_us']:.2f} | {x['envelopes']:,} "
            f"| {x['events_per_envelope']:,.0f} |"
            for b, x in im["shapes"].items()
        )
        parts.append(
            f"""`ingest_micro` in `bench/throughput/micro.py`: `pipeline.ingest.route` (decode and
validate every source record with `records.decode_events`, murmur2 per user, columnar
envelopes with `records.encode_envelope`) over {im["events"]:,} events as the ingest's
consumer hands them over, in chunks of `input.ingest_batch` = {im["ingest_batch"]:,} records;
no Kafka (the consume, produce, flush and commit around it are not in it).

| source records | route µs/event | envelopes written | events per envelope |
|---|---:|---:|---:|
{rows}"""
        )
    if m:
        total = m["decode_us"] + m["unseen_us"] + m["add_us"]
        parts.append(
            f"""`stage1_micro`: what stage 1's `handle_input` does with an envelope of the events
topic, in this process, over the {m["envelopes"]:,} columnar envelopes `ingest.route` writes for
the same events in {batch_name(m["batch"])} ({m["events"]:,} events), with a plain dict as the
table. Per event:

| step | µs/event |
|---|---:|
| `orjson.loads` of the envelope alone (for scale) | {m["orjson_us"]:.2f} |
| `records.decode_envelope` (columns to numpy arrays, shape checks) | {m["decode_us"]:.2f} |
| `Stage1Driver.unseen` (drop what was counted before, by source position) | {m["unseen_us"]:.2f} |
| `Stage1.add_events` (numpy per envelope, one entry per user) \
| {m["add_us"]:.2f} |
| **total** (bounds stage 1 at {1e6 / total:,.0f} events/s on one core) | **{total:.2f}** |

The worker adds to this Faust's per-record cost (now per envelope) and the state writes:
{m["writes_per_event"]:.2f} table writes per event (distinct users per envelope / events)."""
        )
    return "\n\n".join(parts)


def decomposition_table(res: Results) -> str:
    """Time per event (1 / events/s, medians over runs) of the Faust contenders."""
    names = ["faust-naive", "faust-tables", "dpstream", "faust-batched", "faust-direct"]
    if not any(res.rows(b, c) for b in res.shapes() for c in names[1:2]):
        return ""

    pipeline = pipeline_names(res.args)[0]

    def us(b: str, c: str) -> float:
        return median(1e6 / r["rate"] for r in res.rows(b, pipeline if c == "dpstream" else c))

    lines = [
        "| input | naive agent | + stage 1's table writes | pipeline | writes add | DP logic "
        "adds | writes as 1 batch/record | writes by aiokafka send() |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in res.shapes():
        t = {c: us(b, c) for c in names}
        lines.append(
            f"| {shape_name(b)} | {t['faust-naive']:.1f} µs | {t['faust-tables']:.1f} µs "
            f"| {t['dpstream']:.1f} µs | +{t['faust-tables'] - t['faust-naive']:.1f} µs "
            f"| {t['dpstream'] - t['faust-tables']:+.1f} µs | {t['faust-batched']:.1f} µs "
            f"| {t['faust-direct']:.1f} µs |"
        )
    return (
        "Where the pipeline's time per event goes (wall time per event = 1 / events/s, "
        'medians over runs; the agent variants are described under "How it is '
        'measured"):\n\n' + "\n".join(lines) + '\n\n"writes add" = stage 1\'s table '
        'writes on top of the naive agent, "DP logic adds" = the pipeline on top of '
        "those writes (validation, routing check, truncation, stage 2, releases). The last "
        "two columns are the same writes sent two cheaper ways. The pipeline itself "
        "sends its stage-1 changelog in batches that span records (pipeline/worker/changelog.py), "
        "so it can beat the Faust-table-writes variant (DP logic adds < 0); what it costs "
        "over Faust is then the pipeline column against the naive agent's. Since the ingest "
        "(issue 14), the agents read the source topic record by record while the pipeline's "
        "stage 1 reads the ingest's envelopes (hundreds of events each, whatever the source "
        "records' shape), so on single-event records the pipeline no longer pays Faust's "
        "per-record cost and is faster than the naive agent itself."
    )


def unquantized(r: dict) -> float:
    """A pipeline run's seconds without the wait for the closing tick's marker."""
    return r["seconds"] - r["marker_wait_seconds"]


def spans_table(res: Results) -> str:
    """Where a pipeline run's time goes, from the commit that makes the backlog visible:
    medians over runs, per input shape and ingest mode."""
    lines = [
        "| input | ingest | first envelope | last envelope (ingest done) | ingest events/s "
        "| marker wait | last release | end to end events/s | without the marker wait "
        "| CPU µs/event | of which the ingest process |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape in res.shapes():
        for name in pipeline_names(res.args):
            rows = res.rows(shape, name)
            if not rows:
                continue

            def med(key: str, rows: list[dict] = rows) -> float:
                return median(r[key] for r in rows)

            n = rows[0]["events"]
            lines.append(
                f"| {shape_name(shape)} | {rows[0]['ingest']} "
                f"| +{med('first_envelope_seconds'):.2f} s | +{med('ingest_seconds'):.2f} s "
                f"| {fmt_rate(median(n / r['ingest_seconds'] for r in rows))} "
                f"| {med('marker_wait_seconds'):.2f} s | +{med('seconds'):.2f} s "
                f"| {fmt_rate(median(r['rate'] for r in rows))} "
                f"| {fmt_rate(median(n / unquantized(r) for r in rows))} "
                f"| {median(1e6 * r['cpu_seconds'] / n for r in rows):.1f} "
                f"| {median(1e6 * r.get('ingest_cpu_seconds', math.nan) / n for r in rows):.1f} |"
            )
    if len(lines) == 2:
        return ""
    return (
        "Where the pipeline's time goes (medians over runs; times from the commit that makes "
        "the backlog visible): the first and the last envelope the ingest appends to the "
        "events topic (broker time), the wait from the last envelope to the clock's marker "
        "that closes its tick (the tick must end first: up to one tick plus the clock's "
        "period when stage 1 has caught up with the ingest), the release of that tick. "
        '"Without the marker wait" = events / (last release - marker wait), the rate the '
        "tick's quantization hides. CPU = the worker and its ingest process, per event; of "
        "which the ingest process's own (stage 0; 0 when the ingest is a thread of the "
        "worker or off); the rest is the worker: stage 1, stage 2, the releases and Faust. "
        'On our envelopes the ingest is off and the "envelopes" are the ones this process '
        "writes into the events topic.\n\n" + "\n".join(lines)
    )


def dominates_section(res: Results) -> str:
    """What bounds the end-to-end row on single-event records, from this run's numbers:
    the spans of the pipeline runs, the py-spy profile, the in-process micro-benchmarks."""
    from bench import pyspy_summary

    if SINGLE not in res.shapes():
        return "(no single-event records in this run)"
    out = []
    for name in pipeline_names(res.args):
        rows = res.rows(SINGLE, name)
        if not rows:
            continue
        total = median(r["seconds"] for r in rows)
        ingest = median(r["ingest_seconds"] for r in rows)
        wait = median(r["marker_wait_seconds"] for r in rows)
        out.append(
            f"* **{label(name, res.args)}**: the ingest appended its last envelope at "
            f"+{ingest:.2f} s of the {total:.2f} s end to end ({100 * ingest / total:.0f}%, "
            f"medians; {fmt_rate(rows[0]['events'] / ingest)} events/s through the ingest); "
            f"the rest is the wait for the marker that closes the last event's tick "
            f"({wait:.2f} s) and stage 1 reaching it, stage 2 and the release."
        )
    for p in res.profiles:
        if p["tool"] != "pyspy" or p["shape"] != SINGLE:
            continue
        prof = pyspy_summary.parse(Path(p["path"]).read_text())
        idle = 100 * (prof.main_total - prof.main_busy) / max(1, prof.main_total)
        out.append(
            f"* Under py-spy ({fmt_rate(p['rate'])} events/s), the worker's main thread "
            f"(stage 1, stage 2, Faust) was idle {idle:.0f}% of the span"
            + (": it waits for the ingest's envelopes." if idle >= 25 else ".")
        )
        ingest = Path(p["path"]).with_suffix(".ingest.txt")
        iprof = pyspy_summary.parse(ingest.read_text()) if ingest.exists() else None
        if iprof is None and prof.threads.get("ingest"):
            iprof = pyspy_summary.parse(Path(p["path"]).read_text(), "ingest")
        if iprof is not None and iprof.main_total:
            top = ", ".join(
                f"`{fn.split(' (')[0]}` {100 * n / iprof.main_total:.0f}%"
                for fn, n in iprof.self_time.most_common(6)
            )
            out.append(
                "* The ingest's own thread, self time in % of its samples: "
                f"{top}. `Ingest._read`'s self time is its `poll()`/`consume()` calls into "
                "librdkafka (copying records into Python, waiting for fetched data or for a "
                "core); a batch's acknowledgements arrive while the next is read and routed, "
                "and its offsets are committed asynchronously once it is acknowledged whole."
            )
    im, m = res.ingest_micro, res.micro
    if im and m and "1" in im["shapes"]:
        route = im["shapes"]["1"]["route_us"]
        stage1 = m["decode_us"] + m["unseen_us"] + m["add_us"]
        name = pipeline_names(res.args)[0]
        e2e = median(1e6 / r["rate"] for r in res.rows(SINGLE, name))
        against = "" if math.isnan(e2e) else f", against {e2e:.1f} µs per event end to end ({name})"
        out.append(
            f"* In Python alone (below): the ingest's `route` takes {route:.2f} µs per "
            f"single event ({fmt_rate(1e6 / route)} events/s on one core, validation "
            f"included) and stage 1 {stage1:.2f} µs per event on its envelopes{against}."
        )
    return "\n".join(out)


def ratio_target(
    res: Results, name: str, reference: str, shape: str = SINGLE, percent: bool = False
) -> str:
    """The median (and min-max) over runs of ``name``'s events/s over ``reference``'s in
    the same run, as "2.00x (1.50-2.50)" or "12.5% (10.0-15.0%)", or why there is none."""
    ratios = res.ratio(shape, name, reference)
    if not ratios:
        return "not measured in this run"
    lo, hi = spread(ratios)
    if percent:
        return f"{100 * median(ratios):.1f}% ({100 * lo:.1f}-{100 * hi:.1f}%)"
    return f"{median(ratios):.2f}x ({lo:.2f}-{hi:.2f})"


def targets_section(res: Results) -> str:
    """Issue 16's targets as ratios to the peers and ceilings of the same run, then the
    earlier issues' targets."""
    args = res.args
    rows = ["| target | measured (median of per-run ratios, min-max) | met |", "|---|---|---|"]
    names = pipeline_names(args)
    for name in names if SINGLE in res.shapes() else []:
        for peer in ("quix:exactly-once", "kafka-streams:exactly_once_v2"):
            ratios = res.ratio(SINGLE, name, peer)
            met = "n/a" if not ratios else "yes" if median(ratios) >= 1 else "no"
            rows.append(
                f"| end to end on single-event records >= {LABELS[peer]} (same run, same "
                f"topic; {label(name, args)}) | {ratio_target(res, name, peer)} | {met} |"
            )
    if ENVELOPES in res.shapes():
        ratios = res.ratio(ENVELOPES, names[0])
        met = "n/a" if not ratios else "yes" if median(ratios) >= 0.25 else "no"
        same = ratio_target(res, names[0], "aiokafka", ENVELOPES, percent=True)
        aio = median(r["rate"] for r in res.rows(SINGLE, "aiokafka"))
        pipe = median(r["rate"] for r in res.rows(ENVELOPES, names[0]))
        scale = 100 * pipe / aio
        also = "" if math.isnan(scale) else f"; for scale: {scale:.1f}% of it on single events"
        rows.append(
            "| on our envelopes >= 25% of the aiokafka ceiling (the same envelopes, same run) "
            f"| {same}{also} | {met} |"
        )
    for r in res.latency:
        ok = r["kept_up"] and r["p99"] < 2 * args.tick
        rows.append(
            f"| p99 release latency < 2 ticks ({2 * args.tick:g} s) at {fmt_rate(r['rate'])} "
            f"events/s, {batch_name(r['batch'])} | {r['p99']:.3f} s = "
            f"{r['p99'] / args.tick:.2f} ticks{'' if r['kept_up'] else ' (did not keep up)'} "
            f"| {'yes' if ok else 'no'} |"
        )
    for name in names if SINGLE in res.shapes() else []:
        r = median(res.ratio(SINGLE, name, "confluent"))
        if not math.isnan(r):
            rows.append(
                "| (issue 14) end to end on single-event records >= 13% of the plain "
                f"confluent-kafka consume of the same source topic (same run; "
                f"{label(name, args)}) | {100 * r:.1f}% | {'yes' if r >= 0.13 else 'no'} |"
            )
    ratios = res.ratio(SINGLE, names[0], "faust-naive")
    if ratios:
        extra = 1 / median(ratios) - 1  # time per event, pipeline over naive, minus 1
        rows.append(
            "| (issue 7) single-event records: the pipeline adds <= 20% over the naive "
            f"Faust agent (time per event) | {100 * extra:+.0f}% "
            f"| {'yes' if extra <= 0.2 else 'no'} |"
        )
    if res.constants:
        c = res.constants
        slope = math.nan
        if len(res.memory) >= 2:
            slope, _ = linear_fit([m["users"] for m in res.memory], [m["rss"] for m in res.memory])
        rows.append(
            "| worker memory O(users), constant documented | "
            f"{c['python_bytes_per_user']:,.0f} B/user in state objects; worker RSS slope "
            f"{'n/a' if math.isnan(slope) else f'{slope:,.0f} B/user'} | see Memory |"
        )
    return "\n".join(rows)


def ceiling_budget(res: Results) -> str:
    """What 13% of the confluent-kafka ceiling leaves per single event, against what the
    ingest and stage 1 take in Python alone."""
    m, im = res.micro, res.ingest_micro
    if SINGLE not in res.shapes() or not m or not im or "1" not in im["shapes"]:
        return ""
    ceiling = median(1e6 / r["rate"] for r in res.rows(SINGLE, "confluent"))
    if math.isnan(ceiling):
        return ""
    pipes = "; ".join(
        f"{label(n, res.args)}: {median(1e6 / r['rate'] for r in res.rows(SINGLE, n)):.2f} µs"
        for n in pipeline_names(res.args)
        if res.rows(SINGLE, n)
    )
    route = im["shapes"]["1"]["route_us"]
    stage1 = m["decode_us"] + m["unseen_us"] + m["add_us"]
    return (
        "What the 13% target leaves per single event (time per event = 1 / events/s, "
        f"medians): the confluent-kafka ceiling takes {ceiling:.2f} µs, so the budget is "
        f"{ceiling / 0.13:.2f} µs. Measured end to end: {pipes}. In Python alone, without "
        f"Kafka or Faust: the ingest's `route` {route:.2f} µs (in its own process when the "
        f"ingest is one) and stage 1 on the envelopes {stage1:.2f} µs (below)."
    )


def runs_table(res: Results) -> str:
    lines = [
        "| run | input | contender | events | events/s | seconds | wall s | CPU s | CPU share "
        "| extra |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in res.runs:
        extra = ""
        if r["contender"].startswith("dpstream"):
            extra = (
                f"ingest {r['ingest']}; first envelope +{r['first_envelope_seconds']:.2f} s, "
                f"last +{r['ingest_seconds']:.2f} s, marker wait "
                f"{r['marker_wait_seconds']:.2f} s; startup {r['startup_seconds']:.1f} s, "
                f"dead letters {r['dead_letters']}, RSS {fmt_bytes(r['rss'])}"
            )
        share = r.get("cpu_wall_seconds") or r["seconds"]
        lines.append(
            f"| {r['run'] + 1} | {shape_name(r['shape'])} | {r['contender']} | {r['events']:,} "
            f"| {fmt_rate(r['rate'])} | {r['seconds']:.2f} "
            f"| {r.get('wall_seconds', math.nan):.1f} | {r['cpu_seconds']:.2f} "
            f"| {100 * r['cpu_seconds'] / share:.0f}% | {extra} |"
        )
    return "\n".join(lines)


def profile_section(res: Results) -> str:
    from bench import pyspy_summary

    label = res.args.profile_label
    parts = [
        f"## Profile: {label}\n",
        f"Commit `{res.commit}`, {res.date}, load average at the start of the run "
        f"{res.load_start}. One extra pipeline run per input shape and "
        "tool (not counted in the tables above), of the end-to-end row (ingest in "
        f"{res.args.ingest_modes[0]} mode), profiled from the moment the source records "
        "become visible to the release of the tick holding the last event, so start-up is "
        "not in it. Raw profiles: "
        f"`{res.args.workdir}`.\n",
        f"* **py-spy** ({res.args.profile_rate} Hz, `record --threads --idle -f raw`, wall "
        "clock): self = innermost Python frame, inclusive = anywhere on the stack, in % of "
        "the main thread's busy samples (idle = innermost frame is a select/poll/sleep/lock "
        "wait). Wall clock: on a loaded machine a syscall that wakes another process (a "
        "socket write to the broker) also collects the time the worker waits for a core.",
        "* **cProfile** (`bench/cprofile_worker.py`, main thread): exact call counts per "
        "event. Its per-call overhead slows the worker (see its events/s), which also "
        "changes how the producer batches: counts of produce requests, waits and tasks are "
        "of that slower run; counts of table writes, hashes and messages are not.\n",
    ]
    for p in sorted(res.profiles, key=lambda p: (p["shape"], p["tool"] != "pyspy")):
        head = (
            f"### {shape_name(p['shape'])}, {p['tool']} ({p['events']:,} events; "
            f"{fmt_rate(p['rate'])} events/s and {p['cpu_us']:.0f} µs worker CPU per event "
            "under the profiler"
        )
        if p["tool"] == "pyspy":
            text = Path(p["path"]).read_text()
            prof = pyspy_summary.parse(text)
            idle = 100 * (prof.main_total - prof.main_busy) / max(1, prof.main_total)
            parts.append(f"{head}; main thread idle {idle:.0f}%)\n")
            parts.append(pyspy_summary.thread_lines(prof) + "\n")
            parts.append(pyspy_summary.bucket_lines(text) + "\n")
            parts.append(pyspy_summary.table(prof, "self", 15) + "\n")
            if prof.threads.get("ingest"):
                parts.append("The worker's ingest thread, self time:\n")
                parts.append(pyspy_summary.table(pyspy_summary.parse(text, "ingest"), "self", 12))
                parts.append("")
            ingest = Path(p["path"]).with_suffix(".ingest.txt")
            if ingest.exists():
                iprof = pyspy_summary.parse(ingest.read_text())
                iidle = 100 * (iprof.main_total - iprof.main_busy) / max(1, iprof.main_total)
                parts.append(
                    f"The worker's ingest process (main thread idle {iidle:.0f}%; "
                    "librdkafka's own threads are native, not sampled by py-spy):\n"
                )
                parts.append(pyspy_summary.thread_lines(iprof) + "\n")
                parts.append(pyspy_summary.table(iprof, "self", 12) + "\n")
        else:
            parts.append(f"{head})\n")
            parts.append(pyspy_summary.cprofile_tables(p["path"], p["events"], p["records"]) + "\n")
            if p.get("naive_path") and Path(p["naive_path"]).exists():
                parts.append(
                    "What the pipeline's main thread spends per input record beyond the naive "
                    "Faust agent's (the agent under cProfile too, over the same topic): the "
                    "functions whose self time differs most, and the total.\n"
                )
                parts.append(
                    pyspy_summary.cprofile_diff(p["path"], p["naive_path"], p["records"]) + "\n"
                )
    return "\n".join(parts)


def errors_section(res: Results) -> str:
    if not res.errors:
        return ""
    items = "\n".join(f"* {e.splitlines()[0]}" for e in res.errors)
    return f"\n## Sections that failed in this run\n\n{items}\n"


def kept_section(path: Path, label: str) -> str:
    kept = kept_profiles(path, label)
    if not kept:
        return ""
    return (
        "Profile sections with other labels are kept from earlier runs; their commits say "
        "which layout they measured (before the ingest of issue 14, stage 1 read the users' "
        "topic itself, record by record).\n\n" + kept
    )


def kept_profiles(path: Path, label: str) -> str:
    """Profile sections of an existing document whose label differs from ``label``."""
    try:
        text = path.read_text()
    except OSError:
        return ""
    keep = []
    for m in re.finditer(r"^## Profile: (.+?)$(.*?)(?=^## |\Z)", text, re.M | re.S):
        if m.group(1).strip() != label:
            keep.append(m.group(0).rstrip() + "\n")
    return "\n".join(keep)


def pipeline_description(args: argparse.Namespace) -> str:
    base = base_config(args.config)
    stats = ", ".join(
        f"{st.get('name')} ({st.get('kind', 'count')}, tau {st.get('tau', 'auto')}"
        f"{', key ' + st['key'] if st.get('key') else ''})"
        for st in base.get("statistics", [])
    )
    source = f"`{args.config}`" if args.config else "`config/demo.yaml`"
    return f"{source}: {stats}"


def command_line(args: argparse.Namespace) -> str:
    """The run's command, less where it wrote (``--out``, ``--json``, ``--workdir``)."""
    local = ("--out", "--json", "--workdir")
    kept, skip = [], False
    for arg in args.argv:
        if skip:
            skip = False
        elif arg in local:
            skip = True  # "--json PATH": its value too
        elif arg.partition("=")[0] not in local:
            kept.append(arg)
    return shlex.join([".venv/bin/python", "-m", "bench.throughput", *kept])


def busy(load: str, info: dict) -> bool:
    """Whether the 1-minute load average at the start exceeded the machine's cores (other
    work was running), whatever ``--under-load`` said."""
    try:
        return float(load.split()[0]) > float(info["cores"])
    except (ValueError, IndexError, KeyError):
        return False


def document(res: Results) -> str:
    a, info = res.args, res.info
    spans: dict[str, list[str]] = {}  # a longer span's dataset -> the contenders reading it
    for name, n in a.spans.items():
        spans.setdefault(f"{SINGLE}-{n}", []).append(name)
    ds_lines = "\n".join(
        f"* {shape_name(d.shape)}: {d.events:,} events in {d.records:,} records over "
        f"{d.partitions} partitions, pre-produced in {d.produce_seconds:.1f} s "
        f"({fmt_rate(d.events / max(d.produce_seconds, 1e-9))} events/s)"
        + (f"; read by {', '.join(spans[d.name])} only" if d.name in spans else "")
        for d in res.datasets.values()
    )
    mode = (
        "**Quick mode** (`--quick`: small sizes, one run)."
        if a.quick
        else f"Full mode ({a.runs} runs, {a.singles:,} single events, {a.envelope_events:,} "
        "events in envelopes)."
    )
    span_note = "".join(
        f"; {LABELS[name]}: {n:,} records, a longer span so that its start-up does not dominate"
        for name, n in a.spans.items()
        if n != a.singles
    )
    loaded = (
        "**Measured while other work shared the machine: not final numbers.**"
        if a.under_load or busy(res.load_start, info)
        else "Measured with the machine otherwise quiet."
    )
    return f"""# dpstream throughput, latency and memory against a real Kafka broker

Generated by `bench/throughput/` (issues 7, 14 and 16). Regenerate with

    {command_line(a)}

{mode} {loaded} Load average (1/5/15 min) at the start {res.load_start}, at the end
{res.load_end}. Wall time {res.wall / 60:.1f} min. Commit `{res.commit}`, run started {res.date}.

Machine: {info["cores"]} cores ({info["cpu"]}), {info["ram"]} RAM, {info["platform"]};
{info["python"]}; {info["libs"]}; Kafka: {res.kafka}. The broker, the contender and (for
latency) the producer share the same cores.

## Throughput

Each run, every contender in a fresh process on the same pre-produced topic, the same events
({a.users:,} users, Zipf-like activity, `pipeline/tools/synthetic.py`; pipeline =
{pipeline_description(a)}, keyed noise):

{ds_lines}

{throughput_table(res)}

{decomposition_table(res)}

{spans_table(res)}

{formats_section(res)}

Span = the records (events) each contender read and was timed over: every record of its
topic{span_note}. events/s first→last = span / the time from the first record to the last
(for the pipeline: from the backlog becoming visible to the release of the tick holding the
last event). Wall s from process start = the same end, from the contender's process start:
start-up, connecting, JVM warm-up and (for the peers and the naive agent) the group join
included; for the pipeline its start-up (until its first release) plus the span, for the
ceilings to the end of their first pass. Ratio = the contender's events/s over the aiokafka
(or confluent-kafka) ceiling's **in the same run on the same input** (median over runs of
that per-run ratio). CPU µs/event = the process's CPU time (all threads) per event: over
the timed span for the ceilings, the naive agent and the pipeline (the worker and its ingest
process); over the whole process, start-up, JIT and shutdown included, for Kafka Streams and
Quix Streams (their own report at exit). Peak RSS = VmHWM of the contender's process (the
worker's, not its ingest process's). Per-run numbers are at the end.

## Targets

{targets_section(res)}

Why the unmet targets are unmet, by how much, and what it would take: `docs/throughput-gaps.md`
(written from a full run; re-read it against a new one).

{ceiling_budget(res)}

## What dominates end to end (single-event records)

{dominates_section(res)}

## Release latency

A fresh worker (tick {a.tick:g} s, ingest {a.ingest_modes[0]}); once it has released its first
tick and its ingest holds every source partition, this process produces into the source topic
at the target rate for {a.latency_seconds:g} s with a plain confluent-kafka Producer (lz4,
otherwise defaults; every 50 ms what is due: single-event records keyed by user, or source
batches, JSON arrays of up to the batch size). Latency of a release = its Kafka timestamp
minus its `tick_end_unix`, for every statistic and every tick lying wholly inside the
production window; the timestamp is the tick's release deadline (tick end + the release
delay) or, for a tick whose reports missed it, the deadline of the release marker that
published it, k ticks later (docs/design.md section 1).
Percentiles are nearest-rank (with fewer than 100 samples, p99 is the maximum). After
production this process waits at most {a.latency_wait or max(15.0, a.latency_seconds):g} s for
the last of those ticks; a tick still unreleased then counts with the lower bound (give-up time
minus tick end). Growth = median latency of the last third of the released ticks minus that of
the first third (per tick, its slowest statistic): a worker slower than the input piles up a
backlog and its latency grows by about (1 - its rate / input rate) s per second. Kept up =
every tick released and growth under one tick.

{latency_table(res)}

This latency is the release delay (`ticks.release_delay_seconds`, by default the clock's
marker period min(I/4, 1 s) plus 1 s) while the worker keeps up, and that plus k ticks for a
tick that missed its deadline: in between, the leader writes tick t's markers into the
events topic on its next timer firing after the tick ends, stage 1 must reach them behind
the ingest's envelopes and report through the stage-2 topic. An event's tick is the one in
which the ingest's envelope holding it reached the events topic.

## Memory

{memory_section(res)}

Worker memory = a start-up baseline (Python, Faust, aiokafka; the intercept above)
+ the per-user constant x users (stage-1 `users` table, Faust memory store: the Python
objects above plus the dict slot) + per statistic its stage-2 state (O(log t) integers)
+ the keyed-noise cache, bounded by its `maxsize` entries whatever the traffic.

## The ingest's and stage 1's own cost, without Kafka

{micro_section(res)}

## How it is measured

* **One broker, one run, same events.** Each input shape gets one topic ({a.partitions}
  partitions, broker defaults), pre-produced once with a plain confluent-kafka `Producer`
  (lz4, otherwise its defaults): **single-event records**, JSON keyed by user id
  (librdkafka's default partitioner, CRC32, not Kafka's murmur2), in a source topic as
  users have it; **our envelopes**, dpstream's columnar envelopes (`records.encode_envelope`:
  what the ingest's `route` writes for the same events, a few hundred to 2,000 events each,
  header `dpstream: envelope`) in the partition of their users, as in dpstream's events
  topic. The ceilings, the naive agent and the peers read that topic from offset 0, one
  after the other, each in a fresh process with a consumer group / application id of its
  own, and each reads all of it. Each pipeline run reads its own copy of it (below). The
  runs are interleaved (run 1 of every contender, then run 2, ...), so drift in the
  machine's load hits all.
* **Ceiling** (`bench/ceiling.py`): aiokafka `getmany` / confluent-kafka `consume(10000)`
  with assigned partitions (no group), `orjson.loads` of every record, events counted.
  A pass is timed from the first fetch request (connected, offsets known) to the last
  record parsed; passes repeat from offset 0 until 2 s have been timed (mean per pass).
  Only non-default client setting: fetch max wait 10 ms (else every pass after the first
  starts with a 500 ms long-poll left over from the previous one); the third ceiling also
  sets `fetch.queue.backoff.ms=10` (as the ingest's consumer does: librdkafka's default,
  1 s, idles the fetcher whenever a partition's queue holds `queued.min.messages`, 100,000
  records). So the plain confluent-kafka ceiling, and the 13% target's ratio with it,
  depend on the topic's size: a topic whose partitions hold fewer than 100,000 records each
  is prefetched whole at full speed, a larger one is read at a fraction of it (then
  compare the third ceiling).
* **Naive peer** (`bench/naive_agent.py`): a Faust app with the worker's settings and one
  agent (`stream.events()`, raw serializers) that reads the header, skips tick markers,
  `orjson.loads` the value and counts. Time = first record the agent sees to the last event
  counted. Three diagnostic variants of it (only when named in `--contenders`): **+ stage
  1's table writes** (one Faust table write per distinct user per record plus one per
  partition, i.e. the pipeline's state writes without any DP logic), **changelog as 1 batch
  per record** (the same writes put into the memory store directly, their changelog entries
  sent as one aiokafka record batch per input record instead of one Faust `send_soon` each),
  and **changelog by aiokafka's send()** (each entry sent with the underlying aiokafka
  producer's `send`, which still batches across records). They split the pipeline's cost
  into "Faust", "state writes" and "DP logic", and measure two ways to make the writes
  cheap.
* **Kafka Streams** (`bench/kstreams/`, Kafka Streams 4.1.1 built by Maven from the
  project's own pom): `builder.stream(topic).groupByKey().count()` with the default cached
  RocksDB store, `at_least_once` and `exactly_once_v2`, everything else at Kafka Streams'
  defaults; a fresh JVM per run. **Quix Streams** (`bench/quix_count.py`, quixstreams 3.28
  in a venv of its own): a stateful `apply` counting per key, `at-least-once` and
  `exactly-once`, Quix's defaults otherwise (RocksDB with changelog topics). Each stops
  itself after the span's last record and reports the first-to-last-record seconds, the
  wall seconds from its process start, its CPU seconds at exit and its peak RSS. Their
  internal topics and groups are deleted after each run.
* **Pipeline**: a real `dpstream worker` (`--ingest` as given, log level
  `{a.worker_loglevel}`) with a source topic of its own, written with the same records and
  producer settings plus a `transactional.id`, the transaction left open: the worker's
  ingest (read_committed, librdkafka's default) sees nothing yet. Once the worker has
  released a first tick and its ingest group holds every source partition, the bench
  commits the transaction: the whole backlog becomes visible at once. Time = from that
  commit to stage 2 holding every report (their broker append time, every statistic and
  partition) of the tick holding the last event: in each events partition, the first clock
  marker after the last envelope, the latest of those; its releases then wait for their
  deadline, a fixed delay that is not the pipeline's work. So it includes the ingest
  (consume, validate, route, send, acknowledge, commit), stage 1, and the wait for that
  tick to end if stage 1 had caught up with the ingest (per run: "marker wait"). events/s
  = events / that time. Start-up is excluded and shown per run; every run checks that the
  dead-letter topic stayed empty.
  On **our envelopes** the worker runs with `--ingest off`: once it has released a first
  tick, this process writes the envelopes into its events topic (Faust reads uncommitted
  records, so a held transaction would not hide them; the writing is inside the span) and
  the time runs from the first one sent: stage 1, stage 2, the releases, no ingest.
* The events/s column therefore excludes connection set-up and includes everything from
  the first record to the last; the wall column includes start-up; the events are
  identical across contenders.
* Several runs (`--runs`), medians, the spread is min-max over runs.

## Per-run numbers

{runs_table(res)}
{errors_section(res)}
{profile_section(res) if res.profiles else ""}
{kept_section(a.out, a.profile_label)}"""


def results_json(res: Results) -> bytes:
    """Every number of a run, for ``--json`` and for ``--render`` to read back."""
    return orjson.dumps(
        {
            "argv": res.args.argv,
            "commit": res.commit,
            "date": res.date,
            "kafka": res.kafka,
            "load_start": res.load_start,
            "load_end": res.load_end,
            "wall": res.wall,
            "machine": res.info,
            "runs": res.runs,
            "latency": res.latency,
            "memory": res.memory,
            "constants": res.constants,
            "stage1_micro": res.micro,
            "ingest_micro": res.ingest_micro,
            "profiles": res.profiles,
            "errors": res.errors,
            "datasets": {name: vars(d) for name, d in res.datasets.items()},
        },
        option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
        default=str,
    )


def results_from_json(data: dict, args: argparse.Namespace) -> Results:
    """A run's ``Results`` from its ``--json`` file, with ``args`` parsed from its argv."""
    res = Results(
        args=args,
        info=data["machine"],
        kafka=data["kafka"],
        load_start=data["load_start"],
        load_end=data["load_end"],
        runs=data["runs"],
        latency=data["latency"],
        memory=data["memory"],
        constants=data["constants"],
        micro=data["stage1_micro"],
        ingest_micro=data.get("ingest_micro"),
        profiles=data["profiles"],
        errors=data["errors"],
        wall=data["wall"],
        commit=data.get("commit", "unknown"),
        date=data.get("date", "unknown"),
    )
    for name, d in data["datasets"].items():
        res.datasets[name] = Dataset(**{**d, "ends": {int(p): e for p, e in d["ends"].items()}})
    return res
