"""The Faust worker that runs dpstream's app: a stop that ends in bounded time, the ingest
stopped first, and a log that stays readable in a file.

* Any stop (SIGTERM, SIGINT) arms a :class:`~.exits.StopDeadline` of
  :data:`STOP_SECONDS`: Faust's own stop waits for its agents and its producer without a
  time limit, and with the broker gone it never finished (a worker ignored SIGTERM for
  75 s and hung on SIGINT at "Flush producer buffer...": docs/reliability.md, "A broker
  that goes away"). A stop that flushed everything exits 0; one the deadline ends exits
  :data:`~.exits.EXIT_STOPPED_UNFLUSHED`.
* The worker's ingest is asked to stop at the same moment, upstream first: it finishes
  what it sent (``ingest.consumer.CLOSE_SECONDS``, within the bound) while the stages
  stop; ``cli.run_worker`` waits for it.
* The Kafka transport's warnings and errors pass once per cause per interval
  (``kafka.client_logs``): aiokafka retries a lost broker many times a second and logs
  each try.
* Faust's progress spinner writes terminal codes (cursor hide and show, backspaces) to
  stdout, a terminal or not: it is left out unless stdout is a terminal.

Only Faust's and mode's public hooks are used: a worker's ``spinner`` attribute,
``on_setup_root_logger`` (called once the root logger is configured) and ``on_stop``
(called first when the worker stops, before its app).
"""

from __future__ import annotations

import logging
from typing import Any

import faust

from ..ingest.consumer import IngestHandle
from ..kafka import client_logs
from .exits import StopDeadline

STOP_SECONDS = 10.0
"""How long a worker asked to stop may take: Faust's clean stop takes about 2 s with the
broker up (docs/reliability.md), and the ingest's close up to its ``CLOSE_SECONDS``."""


class Worker(faust.Worker):
    """``faust.Worker`` with a bounded stop, its ingest stopped first, rate-limited
    Kafka client errors and no spinner off a terminal.

    Args:
        app: The app (``app.create_app``).
        ingest: The worker's own ingest, if it runs one.
        stop_seconds: The bound on a stop.
        **kwargs: ``faust.Worker``'s.
    """

    def __init__(
        self,
        app: faust.App,
        *,
        ingest: IngestHandle | None = None,
        stop_seconds: float = STOP_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self.ingest = ingest
        self.deadline = StopDeadline(stop_seconds)
        isatty = getattr(self.stdout, "isatty", None)
        if not (isatty is not None and isatty()):
            self.spinner = None

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        client_logs.install(logger.handlers)

    async def on_stop(self) -> None:
        self.deadline.arm()
        if self.ingest is not None:
            self.ingest.request_stop()
        await super().on_stop()
