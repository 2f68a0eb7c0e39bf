"""The worker's operations endpoint (docs/operations.md): Prometheus metrics on
``/metrics``, the probes ``/livez`` and ``/readyz``, from one small HTTP server in a
thread of its own, off the event loop.

The event loop keeps the server informed with a heartbeat, a callback it runs every
``HEARTBEAT_SECONDS``: it notes the time (``/livez`` fails when that stops), where Faust's
rebalance and table recovery stand (``faust_compat.table_status``; a recovery's duration
goes to the metrics once it ends) and whether the ingest runs, and hands the ingest's
latest report to the metrics. Faust tells each new assignment (``faust_compat.
on_assignment``). The server thread judges the health from those (``health.py``) and the
clock, holding the metrics' lock, so it never reads a record half counted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import faust
import orjson
from prometheus_client.exposition import choose_encoder

from dpstream.config.base import ConfigError
from dpstream.config.schema import PipelineConfig

from ..ingest.consumer import IngestHandle
from . import faust_compat
from .clock import last_due_tick, last_ended_tick
from .health import HealthState, conditions, live
from .metrics import WorkerMetrics

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 0.5
METRICS_PATH, LIVEZ_PATH, READYZ_PATH = "/metrics", "/livez", "/readyz"


@dataclass(frozen=True)
class LoopSample:
    """What the event loop's latest heartbeat saw."""

    at: float  # time.monotonic()
    tables_recovered: bool = False
    ingest_running: bool = True


def bind(host: str, port: int) -> ThreadingHTTPServer:
    """The endpoint's server, bound to ``host``:``port`` (0: any free port), not serving
    yet: a worker binds it first, so a port already taken stops it before it does anything.

    Raises:
        ConfigError: the port cannot be had (naming ``metrics.port``).
    """
    try:
        server = ThreadingHTTPServer((host, port), _Handler)
    except OSError as exc:
        raise ConfigError(
            f"metrics.port: cannot serve the metrics and probes on {host}:{port}: "
            f"{exc.strerror} (another worker on this host? dpstream worker --metrics-port)"
        ) from None
    server.daemon_threads = True
    return server


class Operations:
    """The operations endpoint of one worker: its app, metrics and ingest (None: none)."""

    def __init__(
        self,
        cfg: PipelineConfig,
        app: faust.App,
        metrics: WorkerMetrics,
        ingest: IngestHandle | None,
        clock: Any = time,
    ) -> None:
        self._cfg = cfg
        self._app = app
        self._metrics = metrics
        self._ingest = ingest
        self._clock = clock  # time() and monotonic(): tests pass their own
        self._sample = LoopSample(clock.monotonic())  # the loop has until then + the stall
        self._events: frozenset[int] = frozenset()
        self._stage2: frozenset[int] = frozenset()
        self._assigned_once = False  # before its first assignment, no table holds anything
        self._recovery_seen: float | None = None  # the start of the latest recovery timed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: ThreadingHTTPServer | None = None
        faust_compat.on_assignment(app, self._assigned)

    def start(self, loop: asyncio.AbstractEventLoop, server: ThreadingHTTPServer) -> None:
        """Serve on ``server`` (``bind``) in a thread of its own and start the heartbeat on
        ``loop``, the worker's event loop (it runs once the loop does)."""
        server.operations = self  # type: ignore[attr-defined]
        self._server = server
        threading.Thread(
            target=server.serve_forever, name="dpstream-operations", daemon=True
        ).start()
        self._loop = loop
        loop.call_soon_threadsafe(self._beat)
        host, port = server.server_address[:2]
        log.info("metrics and health probes on http://%s:%s/ (metrics, livez, readyz)", host, port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _assigned(self, tps: frozenset[tuple[str, int]]) -> None:
        self._assigned_once = True
        self._events = frozenset(p for t, p in tps if t == self._cfg.events_topic)
        self._stage2 = frozenset(p for t, p in tps if t == self._cfg.stage2_topic)
        self._metrics.assigned(self._events, self._stage2)

    def _beat(self) -> None:
        """In the event loop: note the time and what Faust and the ingest are doing, then
        run again in ``HEARTBEAT_SECONDS``."""
        try:
            self.observe()
        finally:
            assert self._loop is not None
            self._loop.call_later(HEARTBEAT_SECONDS, self._beat)

    def observe(self) -> None:
        """One heartbeat's work (in the event loop)."""
        status = faust_compat.table_status(self._app)
        started, ended = status.recovery_started, status.recovery_ended
        if (
            not status.in_recovery
            and started is not None
            and ended is not None
            and ended >= started
            and started != self._recovery_seen
        ):
            self._recovery_seen = started
            self._metrics.recovered(ended - started)
        running = True
        if self._ingest is not None:
            running = self._ingest.is_alive()
            report = self._ingest.latest_report()
            if report is not None:
                self._metrics.ingest_report(report)
        recovered = status.recovered and self._assigned_once
        self._sample = LoopSample(self._clock.monotonic(), recovered, running)

    def health(self, now: float) -> HealthState:
        """The worker's health at Unix time ``now`` (hold the metrics' lock)."""
        sample, ticks = self._sample, self._cfg.ticks
        return HealthState(
            heartbeat_age=max(self._clock.monotonic() - sample.at, 0.0),
            events_partitions=self._events,
            stage2_partitions=self._stage2,
            tables_recovered=sample.tables_recovered,
            ingest_running=sample.ingest_running,
            stage1_closed=dict(self._metrics.stage1_closed),
            owned_statistics=self._metrics.owned_statistics(),
            released=dict(self._metrics.released),
            ended_tick=last_ended_tick(now, ticks.interval_seconds),
            due_tick=last_due_tick(now, ticks.interval_seconds, ticks.release_delay),
        )

    def scrape(self, accept: str) -> tuple[bytes, str]:
        """The metrics as the scraper asked for them (its Accept header): (body, type)."""
        now = self._clock.time()
        with self._metrics.lock:
            state = self.health(now)
            self._metrics.refresh(now, state.heartbeat_age, conditions(state))
            encode, content_type = choose_encoder(accept)
            return encode(self._metrics.registry), content_type

    def livez(self) -> tuple[int, dict[str, Any]]:
        with self._metrics.lock:
            state = self.health(self._clock.time())
        body = {"live": live(state), "event_loop_heartbeat_age_seconds": state.heartbeat_age}
        return (200 if body["live"] else 503), body

    def readyz(self) -> tuple[int, dict[str, Any]]:
        with self._metrics.lock:
            state = self.health(self._clock.time())
        held = conditions(state)
        body = {
            "ready": all(held.values()),
            "conditions": held,
            "ended_tick": state.ended_tick,
            "due_tick": state.due_tick,
            "stage1_closed": {str(p): t for p, t in sorted(state.stage1_closed.items())},
            "released": dict(sorted(state.released.items())),
        }
        return (200 if body["ready"] else 503), body


class _Handler(BaseHTTPRequestHandler):
    """GET /metrics, /livez, /readyz."""

    server: Any  # a ThreadingHTTPServer with ``operations``

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        operations: Operations = self.server.operations
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            body, content_type = operations.scrape(self.headers.get("Accept", ""))
            self._answer(200, body, content_type)
        elif path in (LIVEZ_PATH, READYZ_PATH):
            status, answer = operations.livez() if path == LIVEZ_PATH else operations.readyz()
            self._answer(status, orjson.dumps(answer) + b"\n", "application/json")
        else:
            self._answer(404, b"not found: /metrics, /livez, /readyz\n", "text/plain")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's
        """No line per request: probes come every few seconds."""
