"""Every record replay emits (the same records the pipeline publishes: releases of every
kind, ledger entries of every type, dead letters) is valid under its published schema, and
each variant of each schema is met at least once, so a variant no record takes is noticed."""

from __future__ import annotations

import random

import orjson
import pytest

from dpstream.client import schemas
from dpstream.config.schema import parse_config
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.worker.keys import PipelineKey
from dpstream.pipeline.worker.ledger import History, plan, signed, statement_entry
from tests import record_kinds

KEY = PipelineKey.from_key(bytes(range(32)))
TICKS = 8


def replayed(public_counts: bool) -> tuple[list[dict], list[dict], list[dict]]:
    """The releases, signed ledger entries (a statement first) and dead letters of a
    replay over ``TICKS`` ticks of every kind's traffic, with bad records among them."""
    cfg = parse_config(record_kinds.config(public_counts, {"mode": "keyed"}))
    rng = random.Random(7)
    lines: list[bytes] = []
    for tick in range(1, TICKS + 1):
        events = record_kinds.round_of_events(rng, cfg.model_dump()["statistics"])
        lines += [orjson.dumps(e) for e in events] + record_kinds.BAD_RECORDS
        lines.append(orjson.dumps({"tick": tick}))
    ledger: list[dict] = []
    letters: list[bytes] = []
    releases = list(replay(cfg, lines, KEY.noise, ledger=ledger, dead_letters=letters))
    statement = statement_entry(cfg, plan(cfg, History(), KEY), KEY)
    entries = [statement, *(signed(entry, cfg, KEY) for entry in ledger)]
    dead = [orjson.loads(letter) for letter in letters]
    return releases, entries, dead


@pytest.fixture(scope="module", params=[False, True], ids=["whole-users", "public-counts"])
def records(request) -> tuple[list[dict], list[dict], list[dict]]:
    return replayed(request.param)


def test_every_release_is_valid_and_every_kind_is_released(records):
    releases, _, _ = records
    variants = {record_kinds.variant(schemas.RELEASE, r) for r in releases}
    kinds = {r["kind"] for r in releases}
    assert releases
    if releases[0].get("public_counts"):
        assert kinds == {"mean", "cell_mean"}
        assert variants == {"ContinualMean", "CellMean"}
    else:
        assert kinds == {"count", "sum", "histogram", "kselect", "distinct", "mean", "cell_mean"}
        assert variants == {
            "Counter", "UserLevel", "Histogram", "KSelect", "WholeUserMean", "CellMean",
            "Exhausted",
        }  # fmt: skip


def test_every_ledger_entry_is_valid_and_every_type_is_written(records):
    _, entries, _ = records
    variants = {record_kinds.variant(schemas.LEDGER, e) for e in entries}
    expected = {"StatementEntry", "StartEntry", "Cells"}
    if not entries[0]["public_counts"]:
        expected |= {"Budget", "ExhaustedEntry"}
    assert variants == expected


def test_every_dead_letter_is_valid(records):
    _, _, dead = records
    assert len(dead) >= TICKS * len(record_kinds.BAD_RECORDS)
    for letter in dead:
        assert record_kinds.variant(schemas.DEAD_LETTER, letter) == "DeadLetterRecord"
