"""Summaries of a py-spy ``record --threads --idle -f raw`` profile (collapsed stacks).

Each line of the raw format is ``thread (tid): Name;frame;frame;... count``; a frame is
``function (file:line)``. We aggregate by ``function (file)`` (line numbers dropped):

* per thread: samples, and the share where the thread was idle (its innermost frame is a
  wait: ``select``, ``poll``, ``sleep``, a lock or queue wait);
* self time: the innermost frame of each busy main-thread sample;
* inclusive time: every function on a busy main-thread stack (counted once per sample).

Run directly to print a summary: ``python -m bench.pyspy_summary profile.txt``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")
_IDLE_LEAVES = {
    "select",
    "poll",
    "epoll",
    "sleep",
    "wait",
    "acquire",
    "_wait_for_tstate_lock",
    "get",
    "recv_into",
}


def frame_name(frame: str) -> str:
    """``function (file)``, with the file shortened to its package path."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker.startswith("/lib/"):
                path = path.split("/", 1)[-1]
            break
    for prefix in ("/work/main/",):
        if path.startswith(prefix):
            path = path[len(prefix) :]
    return f"{m.group('func')} ({path})"


@dataclass
class Profile:
    threads: Counter = field(default_factory=Counter)  # thread name -> samples
    idle: Counter = field(default_factory=Counter)  # thread name -> idle samples
    self_time: Counter = field(default_factory=Counter)  # main thread, busy samples
    inclusive: Counter = field(default_factory=Counter)  # main thread, busy samples
    main_busy: int = 0
    main_total: int = 0


def is_idle(leaf: str) -> bool:
    func = leaf.split(" (", 1)[0]
    return func in _IDLE_LEAVES or func.endswith("select")


def parse(text: str, main_thread: str = "MainThread") -> Profile:
    prof = Profile()
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        stack, _, count_s = line.rpartition(" ")
        try:
            count = int(count_s)
        except ValueError:
            continue
        head, _, frames_s = stack.partition(": ")
        frames = frames_s.split(";")
        name, frames = (frames[0], frames[1:]) if head.startswith("thread") else ("?", frames)
        prof.threads[name] += count
        if not frames:
            continue
        leaf = frame_name(frames[-1])
        idle = is_idle(leaf)
        if idle:
            prof.idle[name] += count
        if name != main_thread:
            continue
        prof.main_total += count
        if idle:
            continue
        prof.main_busy += count
        prof.self_time[leaf] += count
        for fn in {frame_name(f) for f in frames}:
            prof.inclusive[fn] += count
    return prof


def table(prof: Profile, which: str, top: int = 15) -> str:
    counts = prof.self_time if which == "self" else prof.inclusive
    busy = max(1, prof.main_busy)
    lines = [f"| {which} % of busy main-thread samples | function (file) |", "|---:|---|"]
    for fn, n in counts.most_common(top):
        lines.append(f"| {100 * n / busy:.1f} | `{fn}` |")
    return "\n".join(lines)


# Where a dpstream worker's main thread goes, as (label, regex on "function (file)").
# A sample counts for a bucket when any frame of its stack matches; buckets overlap
# where the stacks nest (e.g. table writes are inside Stage1.add_events).
BUCKETS = [
    ("stage-1 agent, all of it (`stage1_agent`)", r"stage1_agent "),
    ("  envelope decode (`records.decode_envelope`)", r"^decode_envelope "),
    ("  dedupe by source position (`Stage1Driver.unseen`)", r"^Stage1Driver\.unseen "),
    ("  murmur2 (`records.partition_for`, e.g. at tick close)", r"^partition_for "),
    ("  `Stage1.add_events` (incl. its table reads and writes)", r"^Stage1\.add_events "),
    (
        "  table reads (`Table.__getitem__` / `.get`)",
        r"^(Table|Collection|ManagedUserDict)\."
        r"(__getitem__|get|on_key_get)",
    ),
    ("  table writes (`Table.on_key_set` -> changelog `send_soon`)", r"^Table\.on_key_set "),
    ("stage-2 agent (`stage2_agent`)", r"stage2_agent "),
    (
        "producing: buffered sends (`ProducerBuffer._send_pending`, `flush_atmost`)",
        r"^ProducerBuffer\.(_send_pending|flush_atmost|_handle_pending) ",
    ),
    (
        "aiokafka producer send path (`AIOKafkaProducer.send`, `Sender`)",
        r"^(AIOKafkaProducer\.send|Sender\.|SendProduceReqHandler\.)",
    ),
    ("offset commits (`Consumer.commit`)", r"^Consumer\.(commit|force_commit) "),
    (
        "Faust delivery (`Consumer._drain_messages`, conductor, stream iteration)",
        r"^(Consumer\._drain_messages|Stream\._c_aiter|Conductor\.)",
    ),
    ("logging (`Logger.*`: records built for DEBUG)", r"^Logger\."),
    ("event loop only (`_run_once` self time)", None),
]


def buckets(text: str, main_thread: str = "MainThread") -> list[tuple[str, float]]:
    """Share (% of busy main-thread samples) of each of ``BUCKETS``."""
    compiled = [(label, re.compile(rx) if rx else None) for label, rx in BUCKETS]
    hits = [0] * len(compiled)
    busy = 0
    for line in text.splitlines():
        stack, _, count_s = line.rstrip().rpartition(" ")
        if not count_s.isdigit():
            continue
        head, _, frames_s = stack.partition(": ")
        frames = frames_s.split(";")
        if not head.startswith("thread") or frames[0] != main_thread or len(frames) < 2:
            continue
        names = [frame_name(f) for f in frames[1:]]
        if is_idle(names[-1]):
            continue
        count = int(count_s)
        busy += count
        for i, (_, rx) in enumerate(compiled):
            if rx is None:
                hit = names[-1].startswith("BaseEventLoop._run_once")
            else:
                hit = any(rx.search(n) for n in names)
            if hit:
                hits[i] += count
    return [(label, 100 * h / max(1, busy)) for (label, _), h in zip(compiled, hits, strict=True)]


def bucket_lines(text: str) -> str:
    lines = ["| where (inclusive) | % of busy main-thread samples |", "|---|---:|"]
    for label, pct in buckets(text):
        lines.append(f"| {label.replace('  ', '&nbsp;&nbsp;')} | {pct:.1f} |")
    return "\n".join(lines)


def thread_lines(prof: Profile) -> str:
    lines = ["| thread | samples | idle % |", "|---|---:|---:|"]
    for name, n in prof.threads.most_common():
        lines.append(f"| {name} | {n} | {100 * prof.idle[name] / max(1, n):.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    for path in argv:
        with open(path) as fh:
            prof = parse(fh.read())
        print(f"# {path}\n")
        print(thread_lines(prof), "\n")
        with open(path) as fh:
            print(bucket_lines(fh.read()), "\n")
        print(table(prof, "self", 25), "\n")
        print(table(prof, "inclusive", 40), "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --------------------------------------------------------------------------- cProfile

# Calls per event worth watching: (label, function name, file suffix).
# (cProfile counts a coroutine once per resume, so only plain functions are listed.)
WATCHED_CALLS = [
    ("`Stage1.add_events`", "add_events", "pipeline/stages/stage1.py"),
    ("events validated (`records.parse_event`)", "parse_event", "pipeline/wire/records.py"),
    ("murmur2 hashes (`aiokafka.partitioner.murmur2`)", "murmur2", "aiokafka/partitioner.py"),
    ("table writes (`Table.on_key_set`)", "on_key_set", "faust/tables/table.py"),
    ("table reads (`Table.on_key_get`)", "on_key_get", "faust/tables/table.py"),
    # Not FutureMessage.__init__: tuples.py's ConsumerMessage.__init__ (one per record
    # consumed) has the same name; a version before this counted both.
    ("Faust messages produced (`as_future_message`)", "as_future_message", "faust/channels.py"),
    ("messages handed to aiokafka (`AIOKafkaProducer.send`)", "send", "producer/producer.py"),
    ("produce requests (`Sender._send_produce_req`)", "_send_produce_req", "sender.py"),
    ("tasks created (`create_task`)", "create_task", "asyncio/base_events.py"),
    ("callbacks scheduled (`call_soon`)", "call_soon", "asyncio/base_events.py"),
    ("event-loop iterations (`_run_once`)", "_run_once", "asyncio/base_events.py"),
    ("log records built (`Logger._log`)", "_log", "logging/__init__.py"),
]


def _short(path: str) -> str:
    return frame_name(f"f ({path})")[3:-1]


def cprofile_tables(path: str, events: int, records: int, top: int = 15) -> str:
    """Self time per event of the top functions, and calls per event of
    ``WATCHED_CALLS``, from a ``bench/cprofile_worker.py`` stats file."""
    import pstats

    raw = pstats.Stats(path).stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
    total = sum(v[2] for v in raw.values())
    lines = [
        f"Main-thread time inside profiled calls: {total:.2f} s = {1e6 * total / events:.1f} µs"
        f" per event ({1e6 * total / max(1, records):.1f} µs per input record), cProfile's "
        "overhead included.\n",
        "| self % | µs/event | calls/event | function (file:line) |",
        "|---:|---:|---:|---|",
    ]
    for (file, line, func), (_, nc, tt, _, _) in sorted(
        raw.items(), key=lambda kv: kv[1][2], reverse=True
    )[:top]:
        lines.append(
            f"| {100 * tt / total:.1f} | {1e6 * tt / events:.2f} | {nc / events:.3f} "
            f"| `{func} ({_short(file)}:{line})` |"
        )
    lines += ["", "| calls | per event | per input record |", "|---|---:|---:|"]
    for label, func, suffix in WATCHED_CALLS:
        n = sum(v[1] for (f, _, fn), v in raw.items() if fn == func and f.endswith(suffix))
        lines.append(f"| {label} | {n / events:.3f} | {n / max(1, records):.2f} |")
    return "\n".join(lines)


def _self_per_record(path: str, records: int) -> dict[str, tuple[float, float]]:
    """function label -> (self µs per record, calls per record)."""
    import pstats

    out: dict[str, tuple[float, float]] = {}
    for (file, line, func), (_, nc, tt, _, _) in pstats.Stats(path).stats.items():
        key = f"`{func} ({_short(file)}:{line})`"
        tt0, nc0 = out.get(key, (0.0, 0.0))
        out[key] = (tt0 + 1e6 * tt / records, nc0 + nc / records)
    return out


def cprofile_diff(pipeline: str, naive: str, records: int, top: int = 15) -> str:
    """Per input record, the self time of the pipeline's functions against the naive
    agent's (both cProfiled over the same records), largest differences first."""
    a, b = _self_per_record(pipeline, records), _self_per_record(naive, records)
    diff = {k: a.get(k, (0.0, 0.0))[0] - b.get(k, (0.0, 0.0))[0] for k in set(a) | set(b)}
    ours = sum(d for k, d in diff.items() if "pipeline/" in k or "operators/" in k)
    lines = [
        f"Per record, under cProfile: pipeline {sum(v[0] for v in a.values()):.1f} µs, naive "
        f"agent {sum(v[0] for v in b.values()):.1f} µs, difference {sum(diff.values()):+.1f} "
        f"µs, of which {ours:+.1f} µs in dpstream's own functions (pipeline/, operators/).\n",
        "| µs/record pipeline | µs/record naive | difference | calls/record pipeline | "
        "calls/record naive | function |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for key in sorted(diff, key=lambda k: -diff[k])[:top]:
        (ta, na), (tb, nb) = a.get(key, (0.0, 0.0)), b.get(key, (0.0, 0.0))
        lines.append(f"| {ta:.2f} | {tb:.2f} | {ta - tb:+.2f} | {na:.3f} | {nb:.3f} | {key} |")
    return "\n".join(lines)
