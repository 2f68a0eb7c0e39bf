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

from ..ingest.route import SourceRecord, route
from ..stages.drivers import (
    InputRecord,
    Stage1Driver,
    Stage1Outcome,
    Stage2Driver,
    Stage2Outcome,
)
from ..stages.stage1_state import UserEntry, new_partition_state
from ..stages.stage2_state import Stage2State, StatisticRun
from ..wire.records import BATCH, ENVELOPE, HEADER, RELEASE, TICK, limits_for, partition_for
from ..worker.keys import PipelineKey
from ..worker.ledger import LOG_HEADER
from .export import LOG_MAC


def replay(
    cfg: PipelineConfig,
    lines: Iterable[bytes],
    noise: NoiseSource,
    rejected: list | None = None,
    runs: Mapping[str, StatisticRun] | None = None,
    ledger: list[dict] | None = None,
    dead_letters: list[bytes] | None = None,
) -> Iterator[dict]:
    """Yield every release (in order) that the pipeline would publish for this log.

    The worker's code over the log: each line is a source record the ingest routes
    (``ingest.route``: its validation and dead letters, its envelopes by user), and the
    envelopes and tick markers are records of the events topic's partitions that the
    stage-1 driver handles, its reports and the release markers records of the stage-2
    topic's partitions that the stage-2 driver handles (``stages.drivers``: dedupe, dead
    letters and all). Every partition sees every marker; each marker's release marker
    follows its reports (when a tick is released changes when it is published, never what
    it holds). ``rejected`` gets (line, index, reason) of each dead letter,
    ``dead_letters`` the dead-letter records themselves, ``ledger`` the ledger entries
    stage 2 publishes (unsigned: the worker signs them). The statistics' runs are
    ``runs``, else the log header's (``export.py``), else ``OFFLINE_RUN``'s."""
    lines = iter(lines)
    first = next(lines, b"")
    header = _header(first)
    if header is None:
        lines = itertools.chain([first], lines)
    elif runs is None:
        runs = runs_of_header(header)
    topics = _Topics(cfg, noise, runs, ledger, dead_letters)
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
            yield from topics.marker(line, lineno, rejected)
        else:
            topics.source_record(line, isinstance(obj, list), lineno, rejected)


class _Topics:
    """Replay's events and stage-2 topics: each partition's offsets, stage 1's states per
    partition and stage 2's per statistic, and the drivers over them."""

    def __init__(
        self,
        cfg: PipelineConfig,
        noise: NoiseSource,
        runs: Mapping[str, StatisticRun] | None,
        ledger: list[dict] | None,
        dead_letters: list[bytes] | None,
    ) -> None:
        self.ledger = [] if ledger is None else ledger
        self.dead_letters = [] if dead_letters is None else dead_letters
        # The input's partitions, as in the worker: a continual mean splits its user cap
        # and packs its median arrays per partition (every other kind merely adds up).
        self.partitions = cfg.input.partitions
        # The log names users "user_id", whatever the config reads (export's form).
        self.limits = dataclasses.replace(limits_for(cfg), user_id_path=("user_id",))
        self.stage1 = Stage1Driver(cfg, self.limits)
        self.stage2 = Stage2Driver(cfg, noise, self.partitions, runs)
        self.users: dict[str, UserEntry] = {}
        self.pstates = [new_partition_state() for _ in range(self.partitions)]
        self.states: dict[str, Stage2State] = {}
        self.offsets = {"events": [0] * self.partitions, "stage2": [0] * self.partitions}

    def _next(self, topic: str, partition: int) -> int:
        offset = self.offsets[topic][partition]
        self.offsets[topic][partition] = offset + 1
        return offset

    def source_record(self, line: bytes, batch: bool, lineno: int, rejected: list | None) -> None:
        """One line as a source record: routed, its envelopes handled by stage 1."""
        record = SourceRecord("replay", 0, lineno, [(HEADER, BATCH)] if batch else None, line)
        routed = route([record], self.limits, self.partitions)
        self.dead_letters.extend(routed.dead_letters)
        if rejected is not None:
            for letter in routed.dead_letters:
                dead = orjson.loads(letter)
                rejected.append((lineno, dead["index"] or 0, dead["reason"]))
        for partition, value in routed.envelopes:
            self._stage1(partition, [(HEADER, ENVELOPE)], value)

    def marker(self, line: bytes, lineno: int, rejected: list | None) -> Iterator[dict]:
        """A tick marker in every events partition, its reports to stage 2, then its
        release marker in every stage-2 partition: the releases it publishes."""
        bad = False
        for partition in range(self.partitions):
            outcome = self._stage1(partition, [(HEADER, TICK)], line)
            bad = bad or bool(outcome.reasons)
            if partition == 0 and rejected is not None:
                rejected.extend((lineno, 0, reason) for reason in outcome.reasons)
            for report in outcome.reports:
                at = partition_for(report.statistic, self.partitions)
                self._stage2(at, None, orjson.dumps(report.to_json()))
        if bad:
            return
        for partition in range(self.partitions):
            published = self._stage2(partition, [(HEADER, RELEASE)], line)
            self.ledger.extend(entry for _, entry in published.ledger)
            yield from (release for _, release in published.releases)

    def _stage1(self, partition: int, headers: list, value: bytes) -> Stage1Outcome:
        pstate = self.pstates[partition]
        record = InputRecord(partition, self._next("events", partition), headers, value)
        outcome = self.stage1.handle(pstate, self.users, record)
        self.dead_letters.extend(outcome.dead_letters)
        self.stage1.done(pstate, record.offset)
        return outcome

    def _stage2(self, partition: int, headers: list | None, value: bytes) -> Stage2Outcome:
        record = InputRecord(partition, self._next("stage2", partition), headers, value)
        outcome = self.stage2.handle(record, self.states.get)
        self.dead_letters.extend(outcome.dead_letters)
        self.states.update(outcome.states)
        return outcome


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
