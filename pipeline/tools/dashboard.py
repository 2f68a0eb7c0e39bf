"""``dpstream dashboard``: a live web page of a pipeline's releases, budget, dead letters
and lag, for someone who has never seen its config.

A process of its own beside the worker: it reads what the pipeline published through
``dpstream.client`` (each statistic's release topic, the ledger, the dead-letter topic:
threads that follow them) and the ingest's lag the way ``dpstream lag`` does
(``ingest.consumer.source_lag``, every ``LAG_SECONDS``), keeps the latest ``MAX_POINTS``
releases of each statistic, and serves one static page (``static/dashboard.html`` and
``.js``: plain SVG, no library, nothing fetched from the internet) and a JSON snapshot at
``/api/state`` that the page polls every second (aiohttp, which Faust already brings).

What it shows is what the pipeline published: DP releases, the public ledger, and of the
dead letters only their reasons, topics and times, never their payloads (user data). It
reads the dead-letter topic, so it runs with the operators' credentials, not a reader's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from aiohttp import web

from dpstream.client import DeadLetter, LedgerEntry, Release, dead_letters, ledger, releases
from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import StatisticConfig
from dpstream.statistics import registry

from ..ingest.consumer import source_lag

log = logging.getLogger(__name__)

MAX_POINTS = 720
"""Releases kept per statistic (and per cell): six minutes of 0.5 s ticks."""
LAG_SECONDS = 5.0
RETRY_SECONDS = 5.0
RECENT_DEAD_LETTERS = 10

# What each kind releases, in words, for the page's titles ({key}: the events it reads;
# {unit}: what one of them adds). A kind missing here is titled by its config line
# (``registry.describe``), so a new kind still shows, in the operators' words.
WHAT_IT_COUNTS = {
    "count": ("How many {key} events there have been so far", "events, running total"),
    "sum": ("The total of the values of {key} events so far", "sum of values, running total"),
    "distinct": ("How many distinct values {key} events have had so far", "distinct values"),
    "histogram": (
        "How often each value 1 to {bins} of {key} events has occurred so far",
        "events per value",
    ),  # fmt: skip
    "kselect": ("The {rank} value (1 to {bins}) of {key} events so far", "value"),
    "mean": ("The average value of {key} events", "mean of values in [{lower}, {upper}]"),
    "cell_mean": (
        "The average value of {key} events in each cell ({field}), per {slot_ticks}-tick slot",
        "mean per cell",
    ),  # fmt: skip
}

BAND = (
    "The shaded band is the 95% interval: the noise added for privacy moved the value "
    "shown by less than this, with probability 95% (it says nothing of sampling error)."
)


def plain_words(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, str]:
    """The page's title, unit and epsilon of ``stat`` in words."""
    words = {
        "key": f"'{stat.key}'" if stat.key else "all",
        "bins": str(stat.bins),
        "rank": "median" if stat.rank == "median" else "largest" if stat.rank == "max"
        else f"{stat.rank}-th largest",
    }  # fmt: skip
    for section in (stat.mean, stat.cells):
        if section is not None:
            words.update({k: str(v) for k, v in section.model_dump().items()})
    known = WHAT_IT_COUNTS.get(stat.kind)
    title, unit = known or (registry.describe(stat, cfg), "")
    title, unit = title.format_map(_Missing(words)), unit.format_map(_Missing(words))
    budget = (
        f"epsilon = {stat.epsilon:g}"
        if stat.rho is None
        else f"rho = {stat.rho:g} (zero-concentrated DP)"
    )
    tau = (
        "each user's contribution bound (tau) is tracked privately"
        if stat.tau == "auto"
        else f"each user counts at most {stat.tau} per tick (tau)"
    )
    return {
        "title": title,
        "unit": unit,
        "privacy": f"{budget} for this statistic (smaller is more private: "
        f"how much one user's data can change what is published); {tau}",
        "config": registry.describe(stat, cfg),
    }


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


@dataclass
class StatisticView:
    """What the page shows of one statistic."""

    name: str
    words: dict[str, str]
    epsilon: float
    points: dict[str, deque] = field(default_factory=dict)  # series ("" or a cell) -> points
    bins: dict[str, Any] | None = None  # a histogram's latest release, per value
    latest_tick: int | None = None
    releases: int = 0
    spent: float | None = None
    exhausted: bool = False

    def add(self, r: Release) -> None:
        series = str(r.fields.get("cell", ""))
        points = self.points.setdefault(series, deque(maxlen=MAX_POINTS))
        if points and points[-1]["tick"] >= r.tick:
            return  # read again after a reader's restart
        self.releases += 1
        self.latest_tick = max(self.latest_tick or r.tick, r.tick)
        self.exhausted = self.exhausted or r.exhausted
        low, high = r.interval or (None, None)
        points.append(
            {"tick": r.tick, "t": r.fields["tick_end_unix"], "value": r.value,
             "low": low, "high": high, "tau": r.tau}
        )  # fmt: skip
        if "values" in r.fields:  # per-value releases (a histogram)
            self.bins = {"tick": r.tick, "values": r.fields["values"],
                         "intervals": r.fields["intervals"]}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.words,
            "epsilon": self.epsilon,
            "series": {name: list(points) for name, points in self.points.items()},
            "bins": self.bins,
            "latest_tick": self.latest_tick,
            "releases": self.releases,
            "spent": self.spent,
            "exhausted": self.exhausted,
        }


class DashboardState:
    """Everything the readers have seen, behind one lock (readers write, the server
    reads a snapshot)."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.lock = threading.Lock()
        # Each statistic's epsilon as the statement charges it (under zCDP: the epsilon
        # its rho implies at the pipeline's delta).
        self.statement = cfg.privacy_statement()
        charged = {c.statistic: float(c.epsilon) for c in self.statement.charges}
        self.views = {
            s.name: StatisticView(s.name, plain_words(s, cfg), charged[s.name])
            for s in cfg.statistics
        }
        self.per_user_total: float | None = None
        self.dead_total = 0
        self.dead_by_reason: Counter[str] = Counter()
        self.dead_recent: deque[dict[str, Any]] = deque(maxlen=RECENT_DEAD_LETTERS)
        self.dead_seen: set[tuple[int, int]] = set()
        self.lag: dict[str, dict] = {}
        self.lag_at: float | None = None
        self.problems: dict[str, str] = {}

    def release(self, r: Release) -> None:
        with self.lock:
            self.views[r.statistic].add(r)

    def entry(self, e: LedgerEntry) -> None:
        if e.app_id != self.cfg.app_id:
            return  # another pipeline sharing the ledger topic
        with self.lock:
            if e.event == "statement":
                self.per_user_total = e.epsilon_spent
            elif e.statistic in self.views and e.epsilon_spent is not None:
                self.views[e.statistic].spent = e.epsilon_spent

    def dead_letter(self, d: DeadLetter) -> None:
        at = (d.position.partition, d.position.offset) if d.position else None
        with self.lock:
            if at is not None and at in self.dead_seen:
                return
            if at is not None:
                self.dead_seen.add(at)
            self.dead_total += 1
            self.dead_by_reason[d.reason] += 1
            stamp = d.position.timestamp_ms / 1000 if d.position else None
            self.dead_recent.appendleft({"reason": d.reason, "topic": d.topic, "t": stamp})

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "app_id": self.cfg.app_id,
                "total_epsilon": float(self.statement.total_epsilon),
                "per_user_total": self.per_user_total,
                "tick_seconds": self.cfg.ticks.interval_seconds,
                "band": BAND,
                "statistics": [v.to_json() for v in self.views.values()],
                "dead_letters": {
                    "total": self.dead_total,
                    "by_reason": dict(self.dead_by_reason.most_common()),
                    "recent": list(self.dead_recent),
                },
                "lag": self.lag,
                "lag_total": sum(row["lag"] for row in self.lag.values()),
                "lag_at": self.lag_at,
                "problems": dict(self.problems),
                "now": time.time(),
            }


def follow(
    what: str, read: Callable[[], Iterator[Any]], handle: Callable[[Any], None],
    state: DashboardState, stop: threading.Event,
) -> None:  # fmt: skip
    """Read ``read()`` into ``handle`` until ``stop``; a failed reader is noted on the page
    and started again from the beginning (what it saw already is skipped)."""
    while not stop.is_set():
        try:
            for record in read():
                handle(record)
                with state.lock:
                    state.problems.pop(what, None)
        except Exception as exc:  # noqa: BLE001 (shown on the page, then retried)
            log.warning("dashboard: reading %s: %s", what, exc)
            with state.lock:
                state.problems[what] = f"{type(exc).__name__}: {exc}"
        stop.wait(RETRY_SECONDS)


def poll_lag(state: DashboardState, bootstrap: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            lag = source_lag(state.cfg, bootstrap)
            with state.lock:
                state.lag, state.lag_at = lag, time.time()
                state.problems.pop("lag", None)
        except Exception as exc:  # noqa: BLE001 (shown on the page, then retried)
            with state.lock:
                state.problems["lag"] = f"{type(exc).__name__}: {exc}"
        stop.wait(LAG_SECONDS)


def start_readers(state: DashboardState, bootstrap: str, stop: threading.Event) -> None:
    """One thread per topic the page shows, and the lag's."""
    cfg = state.cfg
    jobs: list[tuple[str, Callable[[], Iterator[Any]], Callable[[Any], None]]] = [
        (
            f"releases of {s.name}",
            functools.partial(releases, s.name, bootstrap, cfg, follow=True, stop=stop),
            state.release,
        )
        for s in cfg.statistics
    ]
    ledger_entries = functools.partial(ledger, bootstrap, cfg, follow=True, stop=stop)
    letters = functools.partial(dead_letters, bootstrap, cfg, follow=True, stop=stop)
    jobs += [("the ledger", ledger_entries, state.entry),
             ("the dead letters", letters, state.dead_letter)]  # fmt: skip
    for what, read, handle in jobs:
        threading.Thread(
            target=follow, args=(what, read, handle, state, stop), name=what, daemon=True
        ).start()
    lag = threading.Thread(target=poll_lag, args=(state, bootstrap, stop), name="lag", daemon=True)
    lag.start()


def page(name: str) -> bytes:
    return resources.files("dpstream.pipeline.tools").joinpath("static", name).read_bytes()


def make_app(state: DashboardState) -> web.Application:
    async def index(_: web.Request) -> web.Response:
        return web.Response(body=page("dashboard.html"), content_type="text/html")

    async def script(_: web.Request) -> web.Response:
        return web.Response(body=page("dashboard.js"), content_type="text/javascript")

    async def snapshot(_: web.Request) -> web.Response:
        return web.json_response(state.snapshot(), headers={"Cache-Control": "no-store"})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/dashboard.js", script)
    app.router.add_get("/api/state", snapshot)
    return app


def serve(cfg: PipelineConfig, bootstrap: str, host: str, port: int) -> None:
    """Serve the dashboard until SIGINT or SIGTERM; prints its URL once it listens."""
    state = DashboardState(cfg)
    stop = threading.Event()
    start_readers(state, bootstrap, stop)
    try:
        asyncio.run(_serve(make_app(state), host, port))
    finally:
        stop.set()


async def _serve(app: web.Application, host: str, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        print(f"dashboard: http://{host}:{bound}/", flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
    finally:
        await runner.cleanup()
