"""``dpstream export-log``: dpstream's events topic as a replay log (``replay.py``).

The log is what stage 1 counted, tick by tick, headed by the statistics' runs as the
ledger states them (so replay draws the pipeline's noise) and, when exported with the
pipeline's key, ended by the log's MAC: a keyed replay of anything else is refused
(``replay.replay_file``), because replaying other data under the production key gives
exact differences from the published values (docs/security.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import orjson

from dpstream.config.schema import PipelineConfig
from dpstream.statistics.registry import TUNING_FIELDS

from ..kafka.clients import read_topic, tools_group
from ..stages.drivers import Stage1Driver
from ..stages.stage1_state import new_partition_state
from ..wire.records import (
    ENVELOPE,
    TICK,
    BadRecord,
    check_marker_time,
    decode_envelope,
    decode_tick,
    event_json,
    header_kind,
)
from ..worker.keys import PipelineKey
from ..worker.ledger import LOG_HEADER, history_of, read_records, runs_of

LOG_MAC = "dpstream_log_mac"
"""The last line of a log exported with the key: ``{"dpstream_log_mac": <hex>}``."""


def export_log(
    cfg: PipelineConfig, bootstrap: str, key: PipelineKey | None = None
) -> Iterator[bytes]:
    """dpstream's events topic as a replay log (see ``replay.py``): a header with the
    statistics' runs as the ledger states them, the events stage 1 counts (each source
    event once, and only those its own rules admit: ``Stage1Driver.admitted``), grouped
    into the ticks that closed in every partition, each tick ended by a marker, and,
    with the pipeline's ``key``, a trailer with the log's MAC (``dpstream replay``
    refuses a keyed replay of a log without one: docs/security.md)."""
    mac = key.log_mac() if key is not None else None
    for line in _export_lines(cfg, bootstrap, log_header(cfg, bootstrap, key)):
        if mac is not None:
            mac.update(line)
        yield line
    if mac is not None:
        yield orjson.dumps({LOG_MAC: mac.hexdigest()})


def _export_lines(cfg: PipelineConfig, bootstrap: str, header: dict) -> Iterator[bytes]:
    yield orjson.dumps(header)
    partitions = cfg.input.partitions
    driver = Stage1Driver(cfg)
    per_partition = read_topic(
        bootstrap, cfg.events_topic, partitions, security=cfg.kafka, group=tools_group(cfg)
    )
    ticks: list[dict[int, list[dict]]] = []  # per partition: tick -> counted events
    firsts: list[int] = []
    lasts: list[int] = []
    for p in range(partitions):
        by_tick: dict[int, list[dict]] = defaultdict(list)
        buffered: list[dict] = []
        positions = new_partition_state()  # only its sources: what unseen has counted
        first = last = None
        for _, headers, value, timestamp in per_partition[p]:
            kind = header_kind(headers)
            try:
                if kind == TICK:
                    tick = decode_tick(value or b"")
                    check_marker_time(tick, cfg.ticks.interval_seconds, timestamp)
                    if last is not None and tick <= last:
                        continue
                    by_tick[tick] = buffered
                    buffered = []
                    first = tick if first is None else first
                    last = tick
                elif kind == ENVELOPE:
                    events, _ = driver.admitted(positions, decode_envelope(value), p)
                    buffered += [event_json(e) for e in events]
            except BadRecord:
                continue
        if first is None or last is None:  # both set at a partition's first closed tick
            return  # a partition without a closed tick: nothing has been released yet
        ticks.append(by_tick)
        firsts.append(first)
        lasts.append(last)
    for tick in range(min(firsts), min(lasts) + 1):
        for p in range(partitions):
            for event in ticks[p].get(tick, ()):
                yield orjson.dumps(event)
        yield orjson.dumps({"tick": tick})


def ran_as(recorded: dict) -> dict:
    """What replay needs of a statistic's recorded definition (its ledger identity's
    ``statistic``) to run it as the pipeline did: its tree and, for a tau: auto count, sum
    or histogram, the tracker tuning it recorded (absent: Alg. 5's, ``registry.resolved``)."""
    tuning = {f: recorded[f] for f in TUNING_FIELDS if f in recorded}
    return {"mechanism": recorded.get("mechanism"), "k": recorded.get("k"), **tuning}


def log_header(cfg: PipelineConfig, bootstrap: str, key: PipelineKey | None) -> dict:
    """An exported log's first line: each configured statistic's run as the ledger states
    it (replay draws the pipeline's noise under it)."""
    history = history_of(cfg, read_records(cfg, bootstrap), key)
    runs, _, _ = runs_of(history.statements)
    commitment = history.statements[-1].get("key_commitment") if history.statements else None
    stated, ran = {}, {}
    for stat in cfg.statistics:
        run = runs.get(stat.name)
        if run is not None:
            stated[stat.name] = {
                "run_id": run.run_id,
                "key_commitment": commitment,
                "start_tick": history.starts.get((stat.name, run.run_id)),
            }
            recorded = run.parameters.get("statistic", {})
            ran[stat.name] = ran_as(recorded)
    # "mechanisms": the tree each ran (and a tau: auto count's tracker tuning, recorded
    # where it is not Alg. 5's), so replay runs a statistic that names none as the
    # pipeline did (registry.with_mechanisms).
    return {LOG_HEADER: 1, "app_id": cfg.app_id, "runs": stated, "mechanisms": ran}
