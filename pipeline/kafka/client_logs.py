"""The Kafka clients' errors in dpstream's logs, rate-limited: one line per cause per
interval, with a count of the lines held back.

With the broker gone, aiokafka (Faust's transport, the worker's stages) logs every
failed connection, metadata request, fetch, produce and coordinator request as it retries:
a worker whose broker was stopped wrote 3,840 such lines in 35 s (14 KB/s), and the line
that said why it stopped was lost among them (docs/reliability.md, "A broker that goes
away"). librdkafka (the ingest and the tools, confluent-kafka) reports the same errors to
an ``error_cb``, which dpstream never set (and ``log_level: 0`` keeps librdkafka's own log
quiet), so they said nothing at all.

:class:`RateLimitedLogs` filters the handlers of the worker's log (``aiokafka`` and
``faust`` records at WARNING and ERROR); :func:`error_callback` is the ``error_cb`` of
every confluent-kafka client dpstream makes. Both let the first line of a cause through,
hold back the ones that follow within :data:`INTERVAL_SECONDS`, and add the count held
back to the next line of that cause that passes. A cause is the logger and the message's
template (``Unable connect to node with id %s: %s``), or librdkafka's error code: which
node or which address does not split it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable

from confluent_kafka import KafkaError

INTERVAL_SECONDS = 10.0
"""At most one line per cause per this many seconds."""

RATE_LIMITED_LOGGERS = ("aiokafka", "faust")
"""The loggers (and their children) whose warnings and errors :class:`RateLimitedLogs`
limits: the Kafka transport's. dpstream's own lines are never held back."""


class RateLimiter:
    """Which lines of each cause to write: the first, then one per ``interval`` seconds.

    Thread-safe: librdkafka calls ``error_cb`` from the thread that polls, Faust logs from
    its event loop and aiokafka from its consumer thread.
    """

    def __init__(
        self, interval: float = INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._held: Counter[Hashable] = Counter()
        self._lock = threading.Lock()

    def admit(self, cause: Hashable) -> int | None:
        """None: hold this line back (one of ``cause`` was written less than ``interval``
        ago); else write it, noting how many of ``cause`` were held back since the last."""
        now = self._clock()
        with self._lock:
            last = self._last.get(cause)
            if last is not None and now - last < self.interval:
                self._held[cause] += 1
                return None
            self._last[cause] = now
            return self._held.pop(cause, 0)

    def note(self, held: int) -> str:
        """What a line adds when ``held`` lines of its cause were held back before it."""
        return f" (and {held} more like it since the last such line)" if held else ""


class RateLimitedLogs(logging.Filter):
    """A handler filter: the WARNING and ERROR records of ``loggers`` pass once per cause
    per interval (CRITICAL always passes, as does every other logger's record).

    Installed on every handler of the root logger; a record goes through each handler's
    filter, and the first decision is kept on the record, so each handler writes or drops
    the same lines and a record counts once.
    """

    _DECIDED = "dpstream_rate_limited"

    def __init__(
        self, limiter: RateLimiter | None = None, loggers: tuple[str, ...] = RATE_LIMITED_LOGGERS
    ) -> None:
        super().__init__()
        self.limiter = limiter or RateLimiter()
        self._loggers = frozenset(loggers)
        self._children = tuple(f"{name}." for name in loggers)

    def filter(self, record: logging.LogRecord) -> bool:
        if not logging.WARNING <= record.levelno < logging.CRITICAL:
            return True
        if record.name not in self._loggers and not record.name.startswith(self._children):
            return True
        decided = getattr(record, self._DECIDED, None)
        if decided is None:
            held = self.limiter.admit((record.name, str(record.msg)))
            decided = held is not None
            if held:
                # The note goes after the formatted message: the template may hold %.
                record.msg, record.args = "%s" + self.limiter.note(held), (record.getMessage(),)
            setattr(record, self._DECIDED, decided)
        return decided


def install(handlers: list[logging.Handler], limiter: RateLimiter | None = None) -> None:
    """Rate-limit the Kafka transport's lines on ``handlers`` (one shared limiter)."""
    log_filter = RateLimitedLogs(limiter)
    for handler in handlers:
        handler.addFilter(log_filter)


def error_callback(
    what: str, logger: logging.Logger, limiter: RateLimiter | None = None
) -> Callable[[KafkaError], None]:
    """A confluent-kafka ``error_cb`` that logs the client's errors (``what``: whose
    client, e.g. ``ingest``) once per error code per interval: a fatal one as ERROR, the
    others, which librdkafka retries on its own (a broker that went away), as WARNING."""
    limiter = limiter or RateLimiter()

    def on_error(error: KafkaError) -> None:
        held = limiter.admit(error.code())
        if held is None:
            return
        level = logging.ERROR if error.fatal() else logging.WARNING
        logger.log(level, "%s: Kafka client: %s%s", what, error.str(), limiter.note(held))

    return on_error
