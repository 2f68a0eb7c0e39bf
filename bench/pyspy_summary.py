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


def share(prof: Profile, pattern: str) -> float:
    """Inclusive share (% of busy main-thread samples) of functions matching ``pattern``
    (a regex on ``function (file)``), counted once per sample at most only when the
    matches never nest; use for leaf-ish functions."""
    rx = re.compile(pattern)
    busy = max(1, prof.main_busy)
    return 100 * max((n for fn, n in prof.inclusive.items() if rx.search(fn)), default=0) / busy


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
        print(table(prof, "self", 25), "\n")
        print(table(prof, "inclusive", 40), "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
