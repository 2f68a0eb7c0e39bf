"""kind cell_mean (Rameshwar et al.) through stage 1, stage 2 and replay, with exact values.

Zero noise (``insecure_zero``) releases the mechanism's statistic rounded to its release
lattice Delta / 1024 (operators/cells/cell_mean.py), which ``lattice`` recomputes exactly.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import random
from fractions import Fraction

import orjson
import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.operators.cells import cell_mean as cm
from dpstream.operators.noise import KeyedNoise, RecordingNoise, ZeroNoise
from dpstream.pipeline.stages.stage1 import Stage1
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.stages.stage2 import Stage2
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.wire.records import (
    BadRecord,
    decode_events,
    event_json,
    limits_for,
    partition_for,
)
from dpstream.statistics.events import Event

U = 100


def lattice(f: Fraction, delta: Fraction) -> float:
    """What zero noise releases: f rounded to the lattice Delta / 1024."""
    rho = delta / 1024
    return float(math.floor(f / rho + Fraction(1, 2)) * rho)


def cell_config(partitions: int = 1, total: float = 50.0, name: str = "speed", **cells) -> dict:
    base = {
        "field": "cell",
        "slot_ticks": 2,
        "lower": 0,
        "upper": U,
        "step": 1,
        "mechanism": "baseline",
        "counts_public": True,
        "epoch_slots": 4,
        "epoch_cap": 10,
    }
    cells = {**base, **cells}
    return {
        "input": {"partitions": partitions},
        "noise": {"mode": "insecure_zero"},
        # Public counts are a pipeline-wide statement (operators.accounting).
        "privacy": {"total_epsilon": total, "public_counts": cells["counts_public"]},
        "statistics": [{"name": name, "kind": "cell_mean", "epsilon": 1.0, "cells": cells}],
    }


def ev(user: str, value: float, cell: str = "A") -> bytes:
    return orjson.dumps({"user_id": user, "value": value, "cell": cell})


def tick(n: int) -> bytes:
    return orjson.dumps({"tick": n})


def run(cfg_data: dict, lines: list[bytes]) -> tuple[list[dict], list[dict], list]:
    """replay.py's loop, keeping the ledger too: (releases, ledger entries, rejected)."""
    cfg = parse_config(cfg_data)
    rejected: list = []
    releases = list(replay(cfg, lines, ZeroNoise(), rejected))
    # The same again through the stages directly, for the ledger.
    parts = cfg.input.partitions
    stage1, stage2 = Stage1(cfg), Stage2(cfg, ZeroNoise(), parts)
    users: dict[str, dict] = {}
    pstates = [new_partition_state() for _ in range(parts)]
    sstates = {s.name: Stage2.new_state() for s in cfg.statistics}
    ledger, again = [], []
    limits = limits_for(cfg)
    for offset, line in enumerate(lines):
        obj = orjson.loads(line)
        if "tick" in obj:
            for p, pstate in enumerate(pstates):
                for report in stage1.close_tick(pstate, p, obj["tick"], users):
                    out, entries = stage2.on_report(sstates[report.statistic], report)
                    again += out
                    ledger += entries
            continue
        try:
            events, _ = decode_events(line, None, limits)
        except BadRecord:
            continue
        for p, pstate in enumerate(pstates):
            mine = [e for e in events if partition_for(e.user_id, parts) == p]
            stage1.add_events(pstate, users, mine, offset, p)
            pstate["last_offset"] = offset
    assert again == releases
    return releases, ledger, rejected


E1 = {"u1": [10, 20, 30, 40], "u2": [50, 60], "u3": [70, 80], "u4": [90, 100]}


def e1_lines() -> list[bytes]:
    return [ev(u, v) for u, vs in E1.items() for v in vs] + [tick(0), tick(1)]


@pytest.mark.parametrize("partitions", [1, 4])
def test_spec_003_e1_wraparound_and_bestfit_through_the_pipeline(partitions):
    """Worked example E1 (m_UB = 3): WrapAround K = 3, f = 56.667, Delta = 2U/K;
    BestFit K_bar = 4, f = 61.25, Delta = U/K_bar = 25."""
    arrays = {"mechanism": "array_averaging", "m_ub": 3}
    wrap, _, _ = run(cell_config(partitions, grouping="wrap_around", **arrays), e1_lines())
    best, _, _ = run(cell_config(partitions, grouping="best_fit", **arrays), e1_lines())
    assert [(r["n_arrays"], r["m_ub"], r["n_samples"]) for r in wrap] == [(3, 3, 9)]
    assert wrap[0]["value"] == lattice(Fraction(170, 3), Fraction(200, 3)) == 56.640625
    assert wrap[0]["noise_scale"] == pytest.approx(200 / 3)
    assert [(r["n_arrays"], r["m_ub"], r["n_samples"]) for r in best] == [(4, 3, 9)]
    assert best[0]["value"] == lattice(Fraction(245, 4), Fraction(25)) == 61.2548828125
    assert best[0]["noise_scale"] == 25.0
    for release in (wrap[0], best[0]):
        assert (release["cell"], release["slot"], release["tick"]) == ("A", 0, 1)
        assert release["slot_ticks"] == [0, 1] and release["n_users"] == 4
        assert release["neighbours"] == "user_values_same_counts"
        assert release["insecure"] == "insecure_zero"
    assert best[0]["mechanism"] == "cell_mean/array_averaging/best_fit"


def test_e1_baseline_is_the_pooled_mean_and_values_are_clipped_not_rejected():
    lines = [ev(u, v) for u, vs in E1.items() for v in vs]
    lines += [ev("u5", -40), ev("u5", 140)]  # clipped to 0 and 100
    releases, _, rejected = run(cell_config(), [*lines, tick(0), tick(1)])
    assert rejected == []
    (release,) = releases
    # N = 12, sum = 650, m* = 4: Delta = U m* / N = 100 / 3.
    assert release["value"] == lattice(Fraction(650, 12), Fraction(100, 3))
    assert (release["n_users"], release["n_samples"]) == (5, 12)


def test_clip_user_spec_003_e5_lowers_the_worst_loss_from_3_to_2_epsilon():
    """E5: A is in three cells; Clip-User drops A from g1 (bound 43.33 <= E0 = 66.67)."""
    cells = {
        "g1": {"A": [0], "B": [10, 20, 30], "C": [40, 50, 60], "D": [70, 80, 90]},
        "g2": {"A": [100], "B": [20, 30]},
        "g3": {"A": [60], "C": [10, 20], "D": [30, 40, 50]},
    }
    lines = [ev(u, v, g) for g, row in cells.items() for u, vs in row.items() for v in vs]
    releases, ledger, _ = run(cell_config(clip_user=True), [*lines, tick(0), tick(1)])
    by_cell = {r["cell"]: r for r in releases}
    assert by_cell["g1"]["n_users"] == 3  # A suppressed: mean of B, C, D
    assert by_cell["g1"]["value"] == lattice(Fraction(450, 9), Fraction(100, 3)) == 50.0
    assert by_cell["g2"]["value"] == lattice(Fraction(150, 3), Fraction(200, 3)) == 50.0
    assert by_cell["g3"]["value"] == lattice(Fraction(210, 6), Fraction(300, 6))
    (entry,) = [e for e in ledger if e.get("event") == "cells"]
    assert entry["clip_user"] == {
        "pairs_suppressed": 1,
        "loss_before": 3.0,
        "loss_after": 2.0,
        "rounds": 1,
        "error_bound_e0": pytest.approx(200 / 3),
        "cells_above_e0": 0,
    }
    assert entry["epoch_max_loss"] == 2.0 and entry["users_charged"] == 8
    assert entry["dropped_at_cap"] == {"users": 0, "pairs": 0, "cells_not_released": 0}


def _heavy_and_light(slots: int) -> list[bytes]:
    """slot_ticks 1: user h (90) in cell A in every slot, with a new user (10) each."""
    lines = []
    for t in range(slots):
        lines += [ev("h", 90), ev(f"l{t}", 10), tick(t)]
    return lines


def test_the_epoch_cap_drops_a_user_and_the_ledger_and_log_say_so(caplog):
    cfg = cell_config(slot_ticks=1, epoch_slots=3, epoch_cap=2)
    with caplog.at_level(logging.WARNING, logger="dpstream.statistics.cell_mean"):
        releases, ledger, _ = run(cfg, _heavy_and_light(4))
    assert [(r["slot"], r["epoch"], r["n_users"]) for r in releases] == [
        (0, 0, 2), (1, 0, 2), (2, 0, 1), (3, 1, 2),
    ]  # fmt: skip
    assert releases[2]["value"] == lattice(Fraction(10), Fraction(100))  # h spent B = 2
    assert releases[3]["value"] == 50.0  # a new epoch: h is back
    cells = [e for e in ledger if e.get("event") == "cells"]
    assert [e["dropped_at_cap"]["users"] for e in cells] == [0, 0, 1, 0]
    assert [e["epoch_max_loss"] for e in cells] == [1.0, 2.0, 2.0, 1.0]
    assert "epoch cap" in cells[2]["note"]
    assert "1 user(s) reached the epoch cap B=2.0 in epoch 0" in caplog.text
    assert "'h'" not in caplog.text and '"h"' not in orjson.dumps(ledger).decode()
    start = ledger[0]
    assert start["epoch_cap"] == 2.0 and start["epoch_slots"] == 3 and start["counts_public"]


def test_skip_cell_releases_nothing_for_a_cell_with_a_capped_user():
    cfg = cell_config(slot_ticks=1, epoch_slots=3, epoch_cap=2, on_cap="skip_cell")
    releases, ledger, _ = run(cfg, _heavy_and_light(3))
    assert [r["slot"] for r in releases] == [0, 1]
    entry = [e for e in ledger if e.get("event") == "cells"][-1]
    assert entry["dropped_at_cap"] == {"users": 1, "pairs": 1, "cells_not_released": 1}


def test_clip_user_with_a_cap_drops_the_capped_user_where_the_error_rises_least():
    # B = 1: h is in A and B of slot 0 and can stay in one; A has more users, so
    # dropping h there raises its error bound less.
    lines = [ev("h", 90, "A"), ev("x", 10, "A"), ev("y", 10, "A"), ev("h", 90, "B")]
    lines += [ev("z", 10, "B"), tick(0), tick(1)]
    cfg = cell_config(clip_user=True, epoch_cap=1)
    releases, ledger, _ = run(cfg, lines)
    assert {r["cell"]: r["n_users"] for r in releases} == {"A": 2, "B": 2}
    entry = [e for e in ledger if e.get("event") == "cells"][-1]
    assert entry["dropped_at_cap"]["users"] == 1 and entry["epoch_max_loss"] == 1.0


def strict_config(**cells) -> dict:
    return cell_config(
        counts_public=False,
        mechanism="noisy_ratio",
        contribution_cap=2,
        keys=["A", "B", "C"],
        **cells,
    )


def test_strict_mode_releases_every_listed_cell_and_publishes_no_counts(caplog):
    lines = [ev("u1", 10), ev("u1", 20), ev("u1", 90), ev("u2", 40, "C"), tick(0), tick(1)]
    lines += [ev("u1", 50, "B"), tick(2), tick(3)]
    with caplog.at_level(logging.WARNING):
        releases, ledger, _ = run(strict_config(epoch_cap=1, epoch_slots=2), lines)
    got = {(r["slot"], r["cell"]): r for r in releases}
    assert sorted(got) == [(s, c) for s in (0, 1) for c in "ABC"]  # empty cells too
    # c = 2: u1's third value in A is not used; an empty cell releases the midpoint.
    assert got[0, "A"]["value"] == 15.0 and got[0, "A"]["noisy_count"] == 2
    assert got[0, "B"]["value"] == 50.0 and got[0, "B"]["noisy_count"] == 0
    assert got[0, "C"]["value"] == 40.0
    # B = 1 = epsilon: u1 spent it in slot 0 and is dropped from B in slot 1, which is
    # released all the same (nobody left).
    assert got[1, "B"]["noisy_count"] == 0 and got[1, "B"]["value"] == 50.0
    for release in releases:
        assert "n_users" not in release and "n_samples" not in release
        assert release["neighbours"] == "add_remove_user"
    for entry in ledger:
        assert not {"users_charged", "epoch_max_loss", "dropped_at_cap"} & set(entry)
    assert "reached the epoch cap" in caplog.text


@pytest.mark.parametrize(("neighbours", "factor"), [("whole_user", 1), ("any_subset", 2)])
def test_strict_mode_doubles_the_sum_noise_under_any_subset(neighbours, factor):
    """privacy.neighbours reaches noisy_ratio: any subset of a user's events can promote
    later values into the first-c cap, so the sum's scale doubles (2 c U / (eps / 2)); the
    count's stays c / (eps / 2). Each release names the relation."""
    data = strict_config()
    data["privacy"]["neighbours"] = neighbours
    cfg = parse_config(data)
    stage1, recorder = Stage1(cfg), RecordingNoise(ZeroNoise())
    stage2 = Stage2(cfg, recorder, 1)
    users: dict[str, dict] = {}
    pstate, sstate = new_partition_state(), Stage2.new_state()
    lines = [ev("u1", 10), ev("u1", 90, "B"), tick(0), tick(1)]
    releases = []
    for offset, line in enumerate(lines):
        obj = orjson.loads(line)
        if "tick" in obj:
            for report in stage1.close_tick(pstate, 0, obj["tick"], users):
                releases += stage2.on_report(sstate, report)[0]
            continue
        stage1.add_events(pstate, users, decode_events(line, None, limits_for(cfg))[0], offset, 0)
    # Nodes: (*statistic identity, statistic, cell key, slot, "sum" or "count").
    scales = {(node[-3], node[-1]): scale for node, scale, _ in recorder.calls}
    assert len(scales) == len(recorder.calls) == 6  # one sum and one count per cell
    c, half = 2, Fraction(1, 2)  # contribution_cap 2, epsilon 1
    for cell in "ABC":
        assert scales[cell, "sum"] == factor * c * U / half
        assert scales[cell, "count"] == c / half
    assert len(releases) == 3
    expected = "any_subset" if neighbours == "any_subset" else "add_remove_user"
    assert {r["neighbours"] for r in releases} == {expected}
    assert {r["noise_scale"] for r in releases} == {factor * c * U / 1.0}  # value units


# The epoch cap across cells, exhaustively (issue 24 item 2). Strict cells admit a user
# from the user's own spend this epoch, so under any_subset dropping some of its events
# can move the user into cells it was dropped from: cells a and b, B = epsilon, one event
# in each: kept in a, dropped from b; without the event in a, kept in b. Both cells'
# inputs change. Every subset of one user's events (beside another user's fixed data) runs
# through replay, and the real admission code decides; each released cell is epsilon-DP
# in its input (tests/operators/cells/test_cell_mean.py, the per-cell exhaustive case),
# so a neighbour costs epsilon per cell whose input differs.
CAP_EVENTS = ((0, "a", 10), (0, "a", 20), (0, "b", 30), (1, "a", 40), (1, "b", 50))
CAP_OTHER = ((0, "a", 60), (1, "b", 70))  # (tick, cell, value) of user "other"


def cap_config(neighbours: str, epoch_cap: int) -> dict:
    """Strict cells a and b, epsilon 1 per cell, one-tick slots, one epoch of two slots."""
    data = cell_config(counts_public=False, mechanism="noisy_ratio", contribution_cap=1,
                       keys=["a", "b"], slot_ticks=1, epoch_slots=2, epoch_cap=epoch_cap,
                       total=2.0 * epoch_cap)  # fmt: skip
    data["privacy"]["neighbours"] = neighbours
    return data


def cell_inputs(monkeypatch, cfg_data: dict, kept: tuple[int, ...]) -> dict[tuple, tuple]:
    """Each released cell's input (its kept aggregates) when the user sends the events
    ``kept`` of CAP_EVENTS, read where the pipeline hands them to the cell mechanism."""
    inputs: dict[tuple, tuple] = {}
    release_cell = cm.release_cell

    def recording(spec, cell, aggregates, noise):
        inputs[tuple(cell)] = tuple(aggregates)
        return release_cell(spec, cell, aggregates, noise)

    monkeypatch.setattr(cm, "release_cell", recording)
    events = [("u", CAP_EVENTS[i]) for i in kept] + [("other", e) for e in CAP_OTHER]
    lines = []
    for t in (0, 1):
        lines += [ev(user, value, cell) for user, (at, cell, value) in events if at == t]
        lines.append(tick(t))
    list(replay(parse_config(cfg_data), lines, ZeroNoise()))
    monkeypatch.setattr(cm, "release_cell", release_cell)
    assert len(inputs) == 4  # strict: both cells in both slots, whoever is kept
    return inputs


def worst_loss(monkeypatch, cfg_data: dict, any_subset: bool) -> int:
    """max over neighbours of the cells whose input differs (epsilon = 1 each): D keeps
    any subset of the user's events; D' drops any subset of those (any_subset) or all of
    them (whole_user)."""
    n = len(CAP_EVENTS)
    subsets = [k for r in range(n + 1) for k in itertools.combinations(range(n), r)]
    inputs = {kept: cell_inputs(monkeypatch, cfg_data, kept) for kept in subsets}
    worst = 0
    for kept in subsets:
        for fewer in subsets if any_subset else [()]:
            if set(fewer) <= set(kept):
                changed = [c for c in inputs[kept] if inputs[kept][c] != inputs[fewer][c]]
                worst = max(worst, len(changed))
    return worst


@pytest.mark.parametrize("epoch_cap", [1, 2])
@pytest.mark.parametrize("neighbours", ["whole_user", "any_subset"])
def test_strict_cells_lose_at_most_their_charge_over_every_subset_of_a_users_events(
    monkeypatch, neighbours, epoch_cap
):
    """The statement's charge bounds the exhaustive worst case and equals it here: B under
    whole_user (removing the user changes only the cells that kept it), 2B under
    any_subset (the old charge, B, was exceeded)."""
    data = cap_config(neighbours, epoch_cap)
    charge = parse_config(data).privacy_statement().charges[0]
    worst = worst_loss(monkeypatch, data, neighbours == "any_subset")
    assert worst <= charge.epsilon
    if neighbours == "any_subset":
        assert worst == 2 * epoch_cap > epoch_cap
    else:
        assert worst == epoch_cap
    assert charge.epsilon == worst and charge.per_epoch


def test_the_review_two_cell_case_is_charged_2b_in_the_ledger():
    """The review's case through stage 2: the statistic's first ledger entry charges 2B;
    the user is kept in a and dropped from b, and kept in b once its event in a is gone."""
    data = cap_config("any_subset", 1)
    both = [ev("u", 10, "a"), ev("u", 30, "b"), tick(0)]
    releases, ledger, _ = run(data, both)
    assert ledger[0]["charged"] == 2.0 and ledger[0]["epoch_cap"] == 1.0
    assert "2B for strict cells under any_subset" in ledger[0]["note"]
    assert {r["cell"]: r["noisy_count"] for r in releases} == {"a": 1, "b": 0}
    releases, _, _ = run(data, both[1:])
    assert {r["cell"]: r["noisy_count"] for r in releases} == {"a": 0, "b": 1}
    _, ledger, _ = run(cap_config("whole_user", 1), both)
    assert ledger[0]["charged"] == 1.0


def test_strict_mode_rejects_unlisted_cells_and_events_without_a_cell():
    lines = [
        ev("u1", 10, "Z"),
        orjson.dumps({"user_id": "u1", "value": 3}),
        orjson.dumps({"user_id": "u1", "cell": "A"}),
        orjson.dumps({"user_id": "u1", "value": 3, "cell": 7}),
        orjson.dumps({"user_id": "u1", "value": 3, "cell": " "}),
        orjson.dumps({"user_id": "u1", "value": 3, "cell": "A" * 129}),
        tick(0),
    ]
    _, _, rejected = run(strict_config(), lines)
    assert [reason for _, _, reason in rejected] == [
        "cell not in cells.keys (statistic speed)",
        "missing cell (statistic speed)",
        "missing value (statistic speed)",
        "cell is not a string",
        "empty cell",
        "cell too long",
    ]


def test_event_json_writes_the_cell_back():
    cfg = parse_config(cell_config(field="h3"))
    raw = b'{"user_id": "u", "value": 2, "h3": "8a2a"}'
    (event,), _ = decode_events(raw, None, limits_for(cfg))
    assert event.cell("h3") == "8a2a"
    assert event_json(event) == {"user_id": "u", "value": 2.0, "h3": "8a2a"}
    again, _ = decode_events(orjson.dumps(event_json(event)), None, limits_for(cfg))
    assert again == [event]


def _users_on_partitions(parts: int) -> list[str]:
    """One user id per partition."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < parts:
        found.setdefault(partition_for(f"user-{i}", parts), f"user-{i}")
        i += 1
    return [found[p] for p in range(parts)]


def test_slots_follow_the_marker_after_the_event_across_a_gap():
    """slot_ticks 4. Partition 0 misses markers 4 and 6-8 and 10: its user's first event
    (after marker 3, before 5) is in tick 5 (slot 1) and is sent at marker 9; the
    second (after 5, before 9) is in tick 9 (slot 2), not 6. The pipeline with the gaps
    must release what a replay of the export-log form (every marker) releases."""
    a, b = _users_on_partitions(2)
    cfg = parse_config(cell_config(2, slot_ticks=4))
    script = {
        0: [*range(4), ("x", a, 10), 5, ("x", a, 20), 9, 11],
        1: [*range(6), ("x", b, 30), 6, 7, 8, 9, ("x", b, 50), 10, 11],
    }
    stage1, stage2 = Stage1(cfg), Stage2(cfg, ZeroNoise(), 2)
    users: dict[str, dict] = {}
    pstates = [new_partition_state(), new_partition_state()]
    sstate = Stage2.new_state()
    releases = []
    offsets = [0, 0]
    for p in (0, 1):  # partition 0's whole log first: stage 2 waits for partition 1
        for item in script[p]:
            offsets[p] += 1
            if isinstance(item, int):
                for report in stage1.close_tick(pstates[p], p, item, users):
                    releases += stage2.on_report(sstate, report)[0]
            else:
                event = Event(item[1], None, float(item[2]), cells=(("cell", "A"),))
                stage1.add_events(pstates[p], users, [event], offsets[p], p)
            pstates[p]["last_offset"] = offsets[p]
    export = []
    for t in range(12):
        export += {5: [ev(a, 10)], 6: [ev(b, 30)], 9: [ev(a, 20)], 10: [ev(b, 50)]}.get(t, [])
        export.append(tick(t))
    replayed, _, _ = run(cell_config(2, slot_ticks=4), export)
    assert releases == replayed
    assert [(r["slot"], r["tick"], r["n_users"]) for r in releases] == [(1, 7, 2), (2, 11, 2)]
    assert releases[0]["value"] == lattice(Fraction(20), Fraction(50))  # a: 10, b: 30
    assert releases[1]["value"] == lattice(Fraction(35), Fraction(50))  # a: 20, b: 50


def test_events_before_the_first_marker_and_between_slots():
    # Markers 0..5, slot_ticks 2: events before marker 0 are in tick 0; after marker 1
    # (the end of slot 0) in slot 1.
    lines = [ev("u", 10), tick(0), ev("u", 30), tick(1), ev("u", 50), tick(2), tick(3)]
    releases, _, _ = run(cell_config(), lines)
    assert [(r["slot"], r["value"], r["n_samples"]) for r in releases] == [
        (0, lattice(Fraction(20), Fraction(100)), 2),
        (1, 50.0, 1),
    ]


def _apply(stage1, pstate, users, events, offset):
    stage1.add_events(pstate, users, events, offset)
    pstate["last_offset"] = max(pstate["last_offset"], offset)


def test_stage1_is_idempotent_for_cells_whichever_write_a_crash_lost():
    cfg = parse_config(cell_config(mechanism="array_averaging", m_ub=2))
    stage1 = Stage1(cfg)

    def e(user: str, value: float, cell: str) -> Event:
        return Event(user, None, value, cells=(("cell", cell),))

    record = [e("a", 10, "X"), e("a", 20, "X"), e("b", 30, "Y"), e("a", 40, "Y")]
    first = new_partition_state(), {}
    _apply(stage1, *first, [e("a", 5, "X")], offset=0)
    _apply(stage1, *first, record, offset=1)
    full_pstate, full_users = first
    before_pstate, before_users = new_partition_state(), {}
    _apply(stage1, before_pstate, before_users, [e("a", 5, "X")], offset=0)
    for pstate, users in (
        (copy.deepcopy(full_pstate), copy.deepcopy(before_users)),  # user entries lost
        (copy.deepcopy(before_pstate), copy.deepcopy(full_users)),  # partition state lost
        (copy.deepcopy(full_pstate), copy.deepcopy(full_users)),  # plain re-delivery
    ):
        _apply(stage1, pstate, users, record, offset=1)
        assert (pstate, users) == (full_pstate, full_users)
    assert full_users["a"]["state"]["speed"]["p"] == [
        -1,
        {"X": [3, 35, [5, 10, 20]], "Y": [1, 40, [40]]},
    ]
    reports = stage1.close_tick(full_pstate, 0, 1, full_users)
    (report,) = reports
    slot = {"X": {"a": [3, 35, [5, 10, 20]]}, "Y": {"a": [1, 40, [40]], "b": [1, 30, [30]]}}
    assert report.payload == {"slots": {"0": slot}}


def _random_log(seed: int, users: int = 30, slots: int = 5) -> list[bytes]:
    rng = random.Random(seed)
    lines = []
    for t in range(slots * 3):
        for _ in range(rng.randint(0, 40)):
            u = f"user-{rng.randrange(users)}"
            lines.append(ev(u, round(rng.uniform(-10, 110), 2), rng.choice("ABC")))
        lines.append(tick(t))
    return lines


@pytest.mark.parametrize(
    "cells",
    [
        {"mechanism": "levy"},
        {"mechanism": "quantile", "quantile": "optimized", "grouping": "wrap_around"},
        {"mechanism": "array_averaging", "clip_user": True, "epoch_cap": 3},
        {
            "counts_public": False,
            "mechanism": "noisy_ratio",
            "contribution_cap": 3,
            "keys": ["A", "B", "C", "D"],
            "epoch_cap": 2,
        },
    ],
)
def test_replay_with_one_and_four_partitions_is_identical_under_a_key(cells):
    lines = _random_log(3)
    out = {}
    for parts in (1, 4):
        data = cell_config(parts, slot_ticks=3, step=0.01, **cells)
        data["noise"] = {"mode": "keyed"}
        cfg = parse_config(data)
        out[parts] = [orjson.dumps(r) for r in replay(cfg, lines, KeyedNoise(b"k" * 32))]
    assert out[1] == out[4] and len(out[1]) >= 5
    values = [orjson.loads(r) for r in out[1]]
    assert all("insecure" not in v for v in values)
    assert [v["slot"] for v in values] == sorted(v["slot"] for v in values)


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ({"mechanism": "levy", "counts_public": False}, "cells.counts_public: mechanism levy"),
        (
            {"mechanism": "noisy_ratio", "counts_public": False, "contribution_cap": 2},
            "cells.keys: required when counts_public is false",
        ),
        ({"mechanism": "noisy_ratio"}, "cells.contribution_cap: required for mechanism"),
        ({"contribution_cap": 3}, "cells.contribution_cap: only applies to noisy_ratio"),
        (
            {
                "mechanism": "noisy_ratio",
                "contribution_cap": 2,
                "keys": ["A"],
                "counts_public": False,
                "clip_user": True,
            },
            "cells.clip_user: needs counts_public: true",
        ),  # fmt: skip
        (
            {
                "mechanism": "noisy_ratio",
                "contribution_cap": 2,
                "keys": ["A"],
                "counts_public": False,
                "on_cap": "skip_cell",
            },
            "cells.on_cap: skip_cell needs counts_public: true",
        ),  # fmt: skip
        ({"lower": 0.5}, "cells.lower: must be a multiple of the grid step 1"),
        ({"upper": -1}, "cells.upper: must be greater than lower"),
        ({"field": "value"}, "cells.field: 'value' is an event attribute"),
        ({"field": "a-b"}, "cells.field: must be an attribute name"),
        ({"epoch_cap": 0.5}, "cells.epoch_cap: B = 0.5 is below one cell's epsilon"),
        ({"slot_ticks": 0}, "cells.slot_ticks: Input should be greater than or equal to 1"),
        ({"mechanism": "median"}, "cells.mechanism: Input should be"),
        ({"keys": ["A", "A"]}, "cells.keys: has duplicate cell keys"),
        ({"clip_kappa": 2}, "cells.clip_kappa: only applies with clip_user: true"),
        ({"epoch_cap": 60}, "privacy.total_epsilon: statistics spend 60 in total"),
    ],
)
def test_bad_cell_config_names_the_field(cells, message):
    with pytest.raises(ConfigError) as info:
        parse_config(cell_config(**cells))
    assert message in str(info.value)


def test_cells_section_belongs_to_cell_mean_only():
    data = cell_config()
    del data["statistics"][0]["cells"]
    with pytest.raises(
        ConfigError, match=r"statistics\[0\] \(speed\)\.cells: required for kind cell_mean"
    ):
        parse_config(data)
    data = cell_config()
    data["statistics"][0]["kind"] = "count"
    with pytest.raises(ConfigError, match=r"cells: only applies to kind cell_mean, not count"):
        parse_config(data)
    data = cell_config()
    data["statistics"][0]["tau"] = 3
    with pytest.raises(ConfigError, match=r"tau: does not apply to kind cell_mean"):
        parse_config(data)


def test_the_budget_check_charges_the_epoch_cap():
    cfg = parse_config(cell_config(total=4.0, epoch_cap=4))
    charge = cfg.privacy_statement().charges[0]
    assert charge.epsilon == 4 and charge.per_epoch and charge.exact_counts
