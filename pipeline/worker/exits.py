"""How the worker stops when it cannot go on safely: at once, with one exit status.

Every such stop (an exception in a stage agent, the worker's ingest process gone, a
stalled table recovery, a failed stage-1 changelog write) logs a CRITICAL line saying
what failed, then calls :func:`exit_now`. This module imports nothing of the pipeline,
so ``app.py``, ``changelog.py`` and ``faust_compat`` can all use it.
"""

from __future__ import annotations

import logging
import os
from typing import NoReturn

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
