"""``dpstream worker`` under cProfile with a CPU-time clock, switched on and off by signals.

    python -m bench.cprofile_worker STATS_FILE worker --config C --bootstrap B ...

The arguments after STATS_FILE are ``dpstream``'s own. Signal ``SIGRTMIN+1`` starts
profiling the main thread (the event loop: agents, Faust, aiokafka's producer);
``SIGRTMIN+2`` stops and writes the stats (``pstats`` format) to STATS_FILE.

What it is for: exact call counts per event (table writes, messages produced, murmur2
hashes, ...). Its times are cProfile's default wall clock and its per-call overhead
roughly doubles the worker's CPU per event, so read its shares as rough. (A CPU-time
clock, ``time.thread_time``, costs a system call per function call and slowed the worker
ten-fold, which changes the producer's batching; not used.) mode's Worker owns
SIGUSR1/SIGUSR2, hence the real-time signals.
"""

from __future__ import annotations

import cProfile
import signal
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

START = signal.SIGRTMIN + 1
STOP = signal.SIGRTMIN + 2


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]), argv[1:]
    prof = cProfile.Profile()

    def start(*_: object) -> None:
        prof.enable()

    def stop(*_: object) -> None:
        prof.disable()
        tmp = out.with_suffix(".tmp")
        prof.dump_stats(tmp)
        tmp.rename(out)

    signal.signal(START, start)
    signal.signal(STOP, stop)
    from dpstream.pipeline.tools.cli import main as cli

    return cli(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
