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


def test_a_zcdp_pipeline_s_records_are_valid():
    # privacy.accounting: zcdp: releases with rho and delta, a statement and start entries
    # with the rho fields, each valid under the current schemas.
    cfg = parse_config(
        {
            "noise": {"mode": "keyed"},
            "privacy": {"accounting": "zcdp", "total_rho": 1.0, "delta": 1e-8},
            "statistics": [
                {"name": "views", "rho": 0.5, "tau": 3},
                {"name": "spend", "kind": "sum", "rho": 0.25, "tau": 4, "max_value": 9},
                {"name": "basket", "kind": "sum", "rho": 0.25, "tau": 2, "upper": 50.0,
                 "resolution": 100},
            ],
        }
    )  # fmt: skip
    lines = []
    for tick in range(1, TICKS + 1):
        lines += [orjson.dumps({"user_id": f"u{i % 5}", "value": i % 9 + 1}) for i in range(6)]
        lines.append(orjson.dumps({"tick": tick}))
    ledger: list[dict] = []
    releases = list(replay(cfg, lines, KEY.noise, ledger=ledger))
    assert len(releases) == 3 * TICKS
    for release in releases:
        assert record_kinds.variant(schemas.RELEASE, release) == "Counter"
        assert release["accounting"] == "zcdp" and release["delta"] == 1e-8
    statement = statement_entry(cfg, plan(cfg, History(), KEY), KEY)
    assert statement["accounting"] == "zcdp" and statement["rho_total"] == 1.0
    entries = [statement, *(signed(entry, cfg, KEY) for entry in ledger)]
    variants = [record_kinds.variant(schemas.LEDGER, e) for e in entries]
    assert variants == ["StatementEntry"] + ["StartEntry"] * 3
    assert {e["rho"] for e in entries[1:]} == {0.5, 0.25}
