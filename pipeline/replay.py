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
from collections.abc import Iterable, Iterator

import orjson

from dpstream.config.schema import PipelineConfig
from dpstream.operators.noise import NoiseSource

from .drivers import Rejected, Stage1Driver, Stage2Driver
from .records import BATCH, BadRecord, Event, decode_events, partition_for
from .stage1_state import UserEntry, new_partition_state
from .stages import Stage2
from .worker_support import limits_for


def replay(
    cfg: PipelineConfig, lines: Iterable[bytes], noise: NoiseSource, rejected: list | None = None
) -> Iterator[dict]:
    """Yield every release (in order) that the pipeline would publish for this log.

    The worker's drivers (``drivers.py``) over the log: line numbers are the offsets,
    every partition sees every marker, and each line's events go to their users'
    partitions, as the ingest routes them. Each marker's release marker follows its
    reports: when a tick is released changes when it is published, never what it holds.
    """
    # The input's partitions, as in the worker: a continual mean splits its user cap
    # and packs its median arrays per partition (every other kind merely adds up).
    partitions = cfg.input.partitions
    driver1, driver2 = Stage1Driver(cfg), Stage2Driver(cfg, noise, partitions)
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


def replay_file(cfg: PipelineConfig, path: str, noise: NoiseSource) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        for release in replay(cfg, fh, noise):
            yield orjson.dumps(release)
