"""How the worker stops when it cannot go on safely: at once, with one exit status; and
how a stop it was asked for ends when it cannot finish in time.

Every stop after a failure (an exception in a stage agent, the worker's ingest process
gone, a stalled table recovery, a failed stage-1 changelog write) logs a CRITICAL line
saying what failed, then calls :func:`exit_now`. A stop asked for (SIGTERM, SIGINT) is
bounded by a :class:`StopDeadline`. This module imports nothing of the pipeline, so
``app.py``, ``changelog.py``, ``lifecycle.py`` and ``faust_compat`` can all use it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import NoReturn

log = logging.getLogger(__name__)

EXIT_INTERNAL_ERROR = os.EX_SOFTWARE
"""The worker's exit status when it stopped itself after a failure (70, sysexits'
"internal software error")."""


def exit_now() -> NoReturn:
    """End the worker at once, as a SIGKILL would, with :data:`EXIT_INTERNAL_ERROR`: no
    shutdown, so no offset is committed and no output or changelog write is flushed.

    Faust's own crash path (a ``CrashingSupervisor``, ``App.crash``) stops the worker
    gracefully, and that stop can wait forever: its last commit calls into the consumer
    thread, which the crash has already stopped (faust-streaming 0.15.3, mode 0.7.1;
    docs/reliability.md)."""
    logging.shutdown()  # the lines that say why are written first
    os._exit(EXIT_INTERNAL_ERROR)


EXIT_STOPPED_UNFLUSHED = os.EX_TEMPFAIL
"""The exit status of a worker or an ingest asked to stop that could not flush what it
had sent within its stop bound (75, sysexits' "temporary failure"): the broker did not
acknowledge it, typically because it is gone. Nothing is lost: no offset was committed
past what was acknowledged, and the next start reads those records again. A stop that
flushed everything exits 0."""


class StopDeadline:
    """A bound on a stop: once :meth:`arm` is called, the process ends after ``seconds``
    (logging why, exit status :data:`EXIT_STOPPED_UNFLUSHED`) unless it has ended first.

    Faust's stop waits without a time limit for its agents to finish their records and
    for its producer to flush; with the broker gone neither ever happens, and a worker
    asked to stop ignored SIGTERM for minutes. The timer runs in a thread of its own: the
    event loop may be the thing that waits."""

    def __init__(self, seconds: float, what: str = "the worker") -> None:
        self.seconds = seconds
        self._what = what
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        """Start the clock (once; later calls change nothing)."""
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self.expire)
            self._timer.daemon = True
            self._timer.start()

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def expire(self) -> NoReturn:
        log.error(
            "%s did not stop within %g s (is the broker reachable?): exiting without "
            "flushing; no offset was committed past what the broker acknowledged, and a "
            "restarted worker reads those records again",
            self._what,
            self.seconds,
        )
        logging.shutdown()
        os._exit(EXIT_STOPPED_UNFLUSHED)
