"""``dpstream replay``: the pipeline's stages run offline over a JSONL event log.

Log format, one JSON value per line:
  * an event object ``{"user_id": ..., "key"?: ..., "value"?: ...}``,
  * a JSON array of events (a batch envelope),
  * a tick marker ``{"tick": n}``: the events above it (since the previous marker) belong
    to tick n.
Events after the last marker belong to no closed tick and release nothing, as in the
pipeline. ``dpstream export-log`` writes this format from the input topic, so the same
key gives the pipeline's releases exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import orjson

from dpstream.config.schema import PipelineConfig
from dpstream.operators.noise import NoiseSource

from .records import BATCH, BadRecord, Event, decode_events, decode_tick, partition_for
from .stages import Stage1, Stage2, users_of_partition
from .worker_support import limits_for


def replay(
    cfg: PipelineConfig, lines: Iterable[bytes], noise: NoiseSource, rejected: list | None = None
) -> Iterator[dict]:
    """Yield every release (in order) that the pipeline would publish for this log."""
    limits = limits_for(cfg)
    # The input's partitions, as in the worker: a continual mean splits its user cap
    # and packs its median arrays per partition (every other kind merely adds up).
    partitions = cfg.input.partitions
    stage1, stage2 = Stage1(cfg), Stage2(cfg, noise, partitions)
    users: dict[str, dict] = {}
    pstates = [Stage1.new_partition_state() for _ in range(partitions)]
    sstates = {s.name: Stage2.new_state() for s in cfg.statistics}
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = orjson.loads(line)
            if isinstance(obj, dict) and "tick" in obj and "user_id" not in obj:
                tick = decode_tick(line)
                for p, pstate in enumerate(pstates):
                    entries = users_of_partition(users, p, partitions)
                    for report in stage1.close_tick(pstate, p, tick, entries):
                        releases, _ = stage2.on_report(sstates[report.statistic], report)
                        yield from releases
                continue
            kind = BATCH if isinstance(obj, list) else None
            events, bad = decode_events(line, kind, limits)
        except orjson.JSONDecodeError:
            bad = [(0, "malformed JSON")]
            events = []
        except BadRecord as exc:
            bad = [(0, exc.reason)]
            events = []
        if rejected is not None:
            rejected.extend((lineno, index, reason) for index, reason in bad)
        by_partition: dict[int, list[Event]] = {}
        for event in events:
            by_partition.setdefault(partition_for(event.user_id, partitions), []).append(event)
        for p, pstate in enumerate(pstates):
            stage1.add_events(pstate, users, by_partition.get(p, []), lineno, p)
            pstate["last_offset"] = lineno


def replay_file(cfg: PipelineConfig, path: str, noise: NoiseSource) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        for release in replay(cfg, fh, noise):
            yield orjson.dumps(release)
