"""``dpstream replay``: the pipeline's stages run offline over a JSONL event log.

Log format, one JSON value per line:
  * an event object ``{"user_id": ..., "key"?: ..., "value"?: ...}``,
  * a JSON array of events (a batch envelope),
  * a tick marker ``{"tick": n}``: the events above it (since the previous marker) belong
    to tick n.
Events after the last marker belong to no closed tick and release nothing, as in the
pipeline. Events name their user ``user_id`` whatever ``input.user_id_field`` says (the
ingest's output form). ``dpstream export-log`` writes this format from dpstream's events
topic, so the same key gives the pipeline's releases exactly.
"""

from __future__ import annotations

import dataclasses
import hmac
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson

from dpstream.config.schema import PipelineConfig
from dpstream.operators.errors import DpStreamError
from dpstream.operators.noise import NoiseSource
from dpstream.statistics.events import Event

from ..stages.drivers import Rejected, Stage1Driver, Stage2Driver
from ..stages.stage1_state import UserEntry, new_partition_state
from ..stages.stage2 import Stage2
from ..stages.stage2_state import StatisticRun
from ..wire.records import BATCH, BadRecord, decode_events, limits_for, partition_for
from ..worker.keys import PipelineKey
from ..worker.ledger import LOG_HEADER
from .export import LOG_MAC


def replay(
    cfg: PipelineConfig,
    lines: Iterable[bytes],
    noise: NoiseSource,
    rejected: list | None = None,
    runs: Mapping[str, StatisticRun] | None = None,
) -> Iterator[dict]:
    """Yield every release (in order) that the pipeline would publish for this log.

    The worker's drivers (``drivers.py``) over the log: line numbers are the offsets,
    every partition sees every marker, and each line's events go to their users'
    partitions, as the ingest routes them. Each marker's release marker follows its
    reports: when a tick is released changes when it is published, never what it holds.
    The statistics' runs are ``runs``, else the log header's (``export.py``), else
    ``OFFLINE_RUN``'s."""
    lines = iter(lines)
    first = next(lines, b"")
    header = _header(first)
    if header is None:
        lines = itertools.chain([first], lines)
    elif runs is None:
        runs = runs_of_header(header)
    # The input's partitions, as in the worker: a continual mean splits its user cap
    # and packs its median arrays per partition (every other kind merely adds up).
    partitions = cfg.input.partitions
    driver1, driver2 = Stage1Driver(cfg), Stage2Driver(cfg, noise, partitions, runs)
    limits = dataclasses.replace(limits_for(cfg), user_id_path=("user_id",))
    users: dict[str, UserEntry] = {}
    pstates = [new_partition_state() for _ in range(partitions)]
    sstates = {s.name: Stage2.new_state() for s in cfg.statistics}
    sent = 0  # the stage-2 topic's offsets: one report after another, no holes
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and LOG_MAC in obj:
            continue  # the trailer (``replay_file`` checks it)
        if isinstance(obj, dict) and "tick" in obj and "user_id" not in obj:
            for p, pstate in enumerate(pstates):
                reports, bad = driver1.on_marker(pstate, users, p, line, None)
                driver1.done(pstate, lineno)
                if p == 0 and rejected is not None:
                    rejected.extend((lineno, index or 0, reason) for index, reason in bad)
                for report in reports:
                    driver2.on_report(sstates[report.statistic], report, sent)
                    sent += 1
            if not bad:  # the marker's release marker: what it closed, at its deadline
                tick = obj["tick"]
                for sstate in sstates.values():
                    yield from driver2.on_release(sstate, tick)[0]
            continue
        dead: list[Rejected]
        try:
            events, found = decode_events(line, BATCH if isinstance(obj, list) else None, limits)
            dead = list(found)
        except BadRecord as exc:
            events, dead = [], [(None, exc.reason)]
        by_partition: dict[int, list[Event]] = {}
        for event in events:
            by_partition.setdefault(partition_for(event.user_id, partitions), []).append(event)
        for p, pstate in enumerate(pstates):
            out = driver1.on_events(pstate, users, p, lineno, by_partition.get(p, []), dead)
            if p == 0 and rejected is not None:  # the line's dead letters, once
                rejected.extend((lineno, index or 0, reason) for index, reason in out)
            driver1.done(pstate, lineno)


def _header(line: bytes) -> dict | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and LOG_HEADER in obj else None


def runs_of_header(header: Mapping[str, Any]) -> dict[str, StatisticRun]:
    """The statistics' runs an exported log's header states."""
    return {
        name: StatisticRun(run["run_id"], run.get("key_commitment"), run.get("start_tick"))
        for name, run in header.get("runs", {}).items()
    }


class LogNotVerified(DpStreamError):
    """A keyed replay of a log that is not one this pipeline exported with its key."""


def verify_log(path: str, key: PipelineKey) -> None:
    """Check ``path`` is a log exported with ``key`` (``export.export_log``): its last
    line the MAC of the others.

    Raises:
        LogNotVerified: no trailer, or a MAC that does not verify.
    """
    mac = key.log_mac()
    trailer = None
    with open(path, "rb") as fh:
        for raw in fh:
            line = raw.rstrip(b"\n")
            if trailer is not None:
                mac.update(trailer)  # a trailer-like line that was not the last
            trailer = line
    found = None
    if trailer is not None:
        try:
            obj = orjson.loads(trailer)
            found = obj.get(LOG_MAC) if isinstance(obj, dict) else None
        except orjson.JSONDecodeError:
            found = None
    if not isinstance(found, str) or not hmac.compare_digest(found, mac.hexdigest()):
        raise LogNotVerified(
            f"{path} is not a log this pipeline exported with its key (no valid "
            f"{LOG_MAC} trailer). Replaying any other log under the production key gives "
            "releases whose differences from the published ones are exact data differences: "
            "its output is as sensitive as the key itself (docs/security.md). Export the "
            "log with `dpstream export-log` and the pipeline's key, or pass --unverified "
            "where the output is kept as secret as the key"
        )


def replay_file(
    cfg: PipelineConfig, path: str, key: PipelineKey, unverified: bool = False
) -> Iterator[bytes]:
    """``replay`` of a log file; with a secret key, only of a log this pipeline exported
    (``verify_log``) unless ``unverified``."""
    if key.secure and not unverified:
        verify_log(path, key)
    with open(path, "rb") as fh:
        for release in replay(cfg, fh, key.noise):
            yield orjson.dumps(release)
