"""The dashboard's state and server (pipeline/tools/dashboard.py): releases kept per
series in tick order (a re-read skipped), the ledger's spend per statistic, dead letters
counted by reason without their payloads, titles in words from the config, and the page
and snapshot served."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import ClientSession, web

from dpstream.client import records
from dpstream.client.records import Position
from dpstream.config.schema import parse_config
from dpstream.pipeline.tools.dashboard import DashboardState, make_app, plain_words
from tests import record_kinds

CFG = parse_config(record_kinds.config(False, {"mode": "keyed"}))


def count_release(tick: int, value: int) -> records.Release:
    record = {
        "schema_version": 3, "statistic": "views", "kind": "count", "tick": tick,
        "tick_end": "2026-11-27T10:00:07+00:00", "tick_end_unix": 1795773600.0 + tick,
        "confidence": 0.95, "epsilon": 1.0, "neighbours": "whole_user",
        "mechanism": "binary_tree", "step": tick, "value": value, "std": 1.5,
        "interval": [value - 3, value + 3], "tau": 2,
    }  # fmt: skip
    return records.release(orjson.dumps(record))


def test_releases_are_kept_in_tick_order_and_a_re_read_is_skipped():
    state = DashboardState(CFG)
    for tick, value in [(1, 10), (2, 12), (2, 99), (1, 98), (3, 15)]:
        state.release(count_release(tick, value))
    views = next(s for s in state.snapshot()["statistics"] if s["name"] == "views")
    assert [(p["tick"], p["value"], p["low"], p["tau"]) for p in views["series"][""]] == [
        (1, 10, 7, 2), (2, 12, 9, 2), (3, 15, 12, 2),
    ]  # fmt: skip
    assert views["latest_tick"] == 3 and views["releases"] == 3


def test_the_ledger_gives_each_statistic_s_spend_and_the_per_user_total():
    state = DashboardState(CFG)
    common = {"schema_version": 4, "key_commitment": "c", "mac": "m"}
    budget = {**common, "app_id": CFG.app_id, "statistic": "views_auto", "tick": 4,
              "total_epsilon": 100.0, "event": "budget", "tracker_epsilon": 0.1,
              "instances_epsilon": 0.2, "epsilon_spent": 0.3, "epsilon": 1.0, "tau": 8,
              "svt_index": 1, "instance": 0}  # fmt: skip
    state.entry(records.ledger_entry(orjson.dumps(budget)))
    state.entry(
        records.ledger_entry(orjson.dumps({**budget, "app_id": "other", "epsilon_spent": 0.9}))
    )
    spent = {s["name"]: s["spent"] for s in state.snapshot()["statistics"]}
    assert spent["views_auto"] == 0.3 and spent["views"] is None


def test_dead_letters_are_counted_by_reason_without_their_payloads():
    state = DashboardState(CFG)
    letter = {"reason": "malformed JSON", "topic": "src", "partition": 0, "index": None,
              "payload": "user-77 secret", "payload_truncated": False}  # fmt: skip
    for offset in (5, 6, 5):  # offset 5 read twice
        value = orjson.dumps({**letter, "offset": offset})
        state.dead_letter(records.dead_letter(value, Position("dead", 0, offset, 1000)))
    dead = state.snapshot()["dead_letters"]
    assert dead["total"] == 2 and dead["by_reason"] == {"malformed JSON": 2}
    assert "user-77" not in orjson.dumps(state.snapshot()).decode()


def test_titles_say_what_each_statistic_counts_in_words():
    words = {s.name: plain_words(s, CFG) for s in CFG.statistics}
    assert words["views"]["title"] == "How many 'view' events there have been so far"
    assert "at most 2 per tick" in words["views"]["privacy"]
    assert "tracked privately" in words["views_auto"]["privacy"]
    assert words["median_rating"]["title"] == "The median value (1 to 5) of 'rate' events so far"
    assert words["temperature"]["unit"] == "mean of values in [0.0, 10.0]"
    assert "?" not in "".join(w["title"] + w["unit"] for w in words.values())


def test_the_server_serves_the_page_and_the_snapshot():
    state = DashboardState(CFG)
    state.release(count_release(1, 10))

    async def fetch() -> tuple[str, str, dict]:
        runner = web.AppRunner(make_app(state))
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
            async with ClientSession() as client:
                page = await (await client.get(url)).text()
                script = await (await client.get(url + "dashboard.js")).text()
                snapshot = await (await client.get(url + "api/state")).json()
        finally:
            await runner.cleanup()
        return page, script, snapshot

    page, script, snapshot = asyncio.run(fetch())
    assert '<script src="dashboard.js">' in page and "function render" in script
    assert snapshot["app_id"] == CFG.app_id and snapshot["total_epsilon"] == 100.0
    assert [s["latest_tick"] for s in snapshot["statistics"]][0] == 1
