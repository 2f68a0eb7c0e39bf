"""Stage 1 / stage 2 bookkeeping and offline replay, with exact (zero-noise) values."""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Iterator, MutableMapping

import numpy as np
import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise, ZeroNoise
from dpstream.operators.user_level import truncation
from dpstream.pipeline.stages.stage1 import Stage1
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.stages.stage2 import Stage2
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.worker.changelog import WINDOW_BYTES, ChangelogWindow
from dpstream.statistics.contract import Report
from dpstream.statistics.events import Event


class KeyPrefix(MutableMapping[str, dict]):
    """The entries of ``table`` whose keys start with ``prefix`` (pipeline/worker/changelog.py's
    PartitionEntries over a plain dict)."""

    def __init__(self, table: MutableMapping[str, dict], prefix: str) -> None:
        self._table, self._prefix = table, prefix

    def __getitem__(self, key: str) -> dict:
        return self._table[self._prefix + key]

    def __setitem__(self, key: str, value: dict) -> None:
        self._table[self._prefix + key] = value

    def __delitem__(self, key: str) -> None:
        del self._table[self._prefix + key]

    def __iter__(self) -> Iterator[str]:
        n = len(self._prefix)
        return (k[n:] for k in self._table if k.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def config(**privacy):
    return parse_config(
        {
            "input": {"partitions": 2},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 2.0, **privacy},
            "statistics": [
                {"name": "all", "epsilon": 1.0, "tau": 2},
                {"name": "clicks", "epsilon": 1.0, "tau": 1, "key": "click"},
            ],
        }
    )


def test_example_d_truncation_keeps_the_first_tau_units():
    """Our worked example D: users a,a,a,b,a,b,_,a with tau = 2 keep 1,1,0,1,0,1,0,0."""
    spec = truncation.make_truncation(2)
    used: dict[str, int] = {}
    kept = []
    for user in ["a", "a", "a", "b", "a", "b", None, "a"]:
        if user is None:
            kept.append(0)
            continue
        kept.append(truncation.admit(spec, used.get(user, 0)))
        used[user] = used.get(user, 0) + 1
    assert kept == [1, 1, 0, 1, 0, 1, 0, 0]
    assert used == {"a": 5, "b": 2}  # counted on the original stream


def test_stage1_truncates_per_statistic_and_filters_by_key():
    cfg = config()
    stage1, users = Stage1(cfg), {}
    pstate = new_partition_state()
    events = [Event("a", "click", None)] * 3 + [Event("b", None, None)]
    stage1.add_events(pstate, users, events, offset=0)
    assert pstate["pending"] == {"all": {"w": 3}, "clicks": {"w": 1}}  # a: 2 of 3 kept; b: 1
    assert users == {
        "a": {"used": {"all": 3, "clicks": 3}, "offset": 0},
        "b": {"used": {"all": 1}, "offset": 0},
    }
    reports = stage1.close_tick(pstate, 1, 100)
    # ``born``: the partition state's first tick, on every report it ever sends.
    assert reports == [
        Report("all", 1, 100, 100, {"w": 3}, born=100),
        Report("clicks", 1, 100, 100, {"w": 1}, born=100),
    ]
    assert pstate["pending"] == {}
    assert [r.born for r in stage1.close_tick(pstate, 1, 103)] == [100, 100]


def _apply(stage1, pstate, users, events, offset):
    stage1.add_events(pstate, users, events, offset)
    pstate["last_offset"] = max(pstate["last_offset"], offset)


def test_stage1_is_idempotent_whichever_table_write_a_crash_lost():
    """A record is re-delivered after a crash that persisted only one of the two writes."""
    stage1 = Stage1(config())
    record = [Event("a", None, None)] * 3 + [Event("b", None, None)]
    first = new_partition_state(), {}
    _apply(stage1, *first, [Event("a", None, None)], offset=0)
    _apply(stage1, *first, record, offset=1)
    full_pstate, full_users = first
    before_pstate, before_users = new_partition_state(), {}
    _apply(stage1, before_pstate, before_users, [Event("a", None, None)], offset=0)

    # (1) partition state persisted, user entries lost: a's bound must still hold.
    pstate, users = copy.deepcopy(full_pstate), copy.deepcopy(before_users)
    _apply(stage1, pstate, users, record, offset=1)
    assert (pstate, users) == (full_pstate, full_users)
    # (2) user entries persisted, partition state lost: the kept units come back once.
    pstate, users = copy.deepcopy(before_pstate), copy.deepcopy(full_users)
    _apply(stage1, pstate, users, record, offset=1)
    assert (pstate, users) == (full_pstate, full_users)
    # (3) both persisted: a plain re-delivery changes nothing.
    pstate, users = copy.deepcopy(full_pstate), copy.deepcopy(full_users)
    _apply(stage1, pstate, users, record, offset=1)
    assert (pstate, users) == (full_pstate, full_users)
    assert full_pstate["pending"] == {"all": {"w": 3}} and full_users["a"]["used"] == {"all": 4}


class ChangelogTable(dict):
    """A Faust table stand-in that logs every write, in order, like its changelog."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log
        self.completed = 0

    def __setitem__(self, key, value) -> None:
        self.log.append((key, copy.deepcopy(value)))
        super().__setitem__(key, copy.deepcopy(value))

    def before_record(self) -> None:
        """Every write is in the changelog at once: nothing to flush."""

    def flush(self) -> None:
        pass


def _worker_step(stage1, table, record, reports, flush_mid: bool = False) -> None:
    """What pipeline/worker/app.py handle_input does with one record, in its write order: user
    entries ("u:") first, the partition state ("p:0") last, into one table. With batched
    changelog writes (WindowedTable) the window is flushed first if the record writes a
    user already in it; ``flush_mid``: a commit's flush lands while the record awaits its
    outputs (after its user entries, before its partition state)."""
    offset, payload = record
    pstate = copy.deepcopy(table.get("p:0")) or new_partition_state()
    if isinstance(payload, int):
        if offset <= pstate["last_offset"]:
            return
        reports.extend(stage1.close_tick(pstate, 0, payload))
    else:
        table.before_record()
        stage1.add_events(pstate, KeyPrefix(table, "u:"), payload, offset)
    if flush_mid:
        table.flush()
    pstate["last_offset"] = max(pstate["last_offset"], offset)
    table["p:0"] = pstate
    table.completed += 1


def test_a_re_added_user_never_has_a_negative_total():
    """A re-delivered record whose user's entry holds fewer units than the record gives
    (a corrupted entry): its units before the record were ``used`` - units < 0, which let
    a tau-4 user keep 5 units and put its rank-band units below band 0. They count from 0."""
    cfg = parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 2},
            "statistics": [
                {"name": "c", "epsilon": 1, "tau": "auto", "practical": False},
                {"name": "f", "epsilon": 1, "tau": 4},
            ],
        }
    )
    pstate = new_partition_state()
    pstate["last_offset"] = 4  # the partition state lost record 5; the user's entry has it
    users = {"u": {"used": {"c": 2, "f": 2}, "offset": 5}}
    Stage1(cfg).add_events(pstate, users, [Event("u", None, None)] * 5, 5)
    assert pstate["pending"]["f"] == {"w": 4}
    bands = {k: n for k, n in pstate["pending"]["c"].items() if k.startswith("+b")}
    assert bands == {"+b0/0": 1, "+b1/0": 1, "+b2/0": 2, "+b3/0": 1}  # units 1..5 from 0


def test_stage1_counts_every_record_once_after_a_crash_at_any_changelog_write():
    """One changelog partition holds both kinds of stage-1 entry in write order, so a
    crash keeps a prefix of the writes; Faust flushes them before it commits an offset,
    so the records re-delivered start at or before the first lost write. For every such
    prefix and restart offset, the run ends with the uninterrupted run's state and
    reports (a re-sent report is a duplicate stage 2 drops by tick)."""
    stage1 = Stage1(config())
    a, b, c = Event("a", None, None), Event("b", "click", None), Event("c", "click", None)
    records = list(enumerate([[a, b], [a, a], 10, [b, c, a], [c], [a, b, b], 11, [c, c], 12]))
    log: list = []
    table, reports = ChangelogTable(log), []
    for record in records:
        _worker_step(stage1, table, record, reports)
    full = {k: v for k, v in table.items()}
    expected = {(r.statistic, r.tick): r for r in reports}
    assert [(r.tick, r.weights) for r in reports if r.statistic == "all"] == [
        (10, {"w": 3}),  # a: 2 of 3 kept (tau 2), b: 1
        (11, {"w": 3}),  # a: 0 (at tau), b: 1 more, c: 2
        (12, {}),  # c: at tau
    ]
    for cut in range(len(log) + 1):
        persisted = {}
        for key, value in log[:cut]:
            persisted[key] = value
        done = persisted.get("p:0", {"last_offset": -1})["last_offset"]
        for restart in range(done + 2):  # any committed offset up to the persisted state's
            table = ChangelogTable([])
            table.update(copy.deepcopy(persisted))
            resent: list = []
            for record in records[restart:]:
                _worker_step(stage1, table, record, resent)
            assert dict(table) == full, (cut, restart)
            for r in resent:
                assert expected[r.statistic, r.tick] == r, (cut, restart)


def test_stage1_ignores_duplicate_markers_and_catches_up_gaps():
    stage1 = Stage1(config())
    pstate = new_partition_state()
    assert stage1.close_tick(pstate, 0, 10)[0].from_tick == 10
    assert stage1.close_tick(pstate, 0, 10) == []
    assert stage1.close_tick(pstate, 0, 9) == []
    caught_up = stage1.close_tick(pstate, 0, 14)[0]
    assert (caught_up.from_tick, caught_up.tick) == (11, 14)


def test_stage2_closes_a_tick_only_when_every_partition_reported_it():
    cfg = config()
    stage2 = Stage2(cfg, ZeroNoise(), partitions=2)
    state = Stage2.new_state()
    assert stage2.on_report(state, Report("all", 0, 10, 10, {"w": 5})) == ([], [])
    assert stage2.on_report(state, Report("all", 0, 11, 12, {"w": 1})) == ([], [])
    releases, ledger = stage2.on_report(state, Report("all", 1, 10, 11, {"w": 2}))
    assert [(r["tick"], r["step"], r["value"]) for r in releases] == [(10, 1, 5), (11, 2, 7)]
    assert [e["tick"] for e in ledger] == [10]  # one ledger entry when the statistic starts
    # A re-delivered report changes nothing; the next one closes tick 12.
    assert stage2.on_report(state, Report("all", 1, 10, 11, {"w": 2})) == ([], [])
    releases, ledger = stage2.on_report(state, Report("all", 1, 12, 12, {"w": 4}))
    assert [(r["tick"], r["value"]) for r in releases] == [(12, 12)]  # 1 + 4 more
    assert ledger == []
    release = releases[0]
    assert release["insecure"] == "insecure_zero"
    assert release["interval"][0] < release["value"] < release["interval"][1]
    assert release["tick_end"] == "1970-01-01T00:00:13+00:00"


def test_stage2_origin_is_the_earliest_first_tick():
    stage2 = Stage2(config(), ZeroNoise(), partitions=2)
    state = Stage2.new_state()
    stage2.on_report(state, Report("all", 1, 12, 12, {"w": 3}))
    releases, _ = stage2.on_report(state, Report("all", 0, 10, 12, {"w": 1}))
    assert [(r["tick"], r["value"]) for r in releases] == [(10, 0), (11, 0), (12, 4)]


def test_any_subset_neighbours_double_the_sensitivity():
    whole = Stage2(config(), ZeroNoise(), partitions=1)
    subset = Stage2(config(neighbours="any_subset"), ZeroNoise(), partitions=1)
    r1, _ = whole.on_report(Stage2.new_state(), Report("all", 0, 1, 1, {}))
    r2, _ = subset.on_report(Stage2.new_state(), Report("all", 0, 1, 1, {}))
    assert r2[0]["std"] > 1.9 * r1[0]["std"]


def _log(*items) -> list[bytes]:
    return [orjson.dumps(i) for i in items]


def test_replay_with_zero_noise_releases_truncated_running_counts():
    log = _log(
        {"user_id": "a", "key": "click"},
        {"user_id": "a"},
        {"user_id": "a", "key": "click"},
        {"tick": 5},
        [{"user_id": "b", "key": "click"}, {"user_id": "a"}],
        {"tick": 6},
        {"tick": 7},
        {"user_id": ""},  # rejected, like in the pipeline
        {"user_id": "c"},
        {"tick": 8},
        {"user_id": "d"},  # after the last marker: no closed tick yet
    )
    rejected: list = []
    out = list(replay(config(), log, ZeroNoise(), rejected))
    by_stat = {
        s: [(r["tick"], r["value"]) for r in out if r["statistic"] == s] for s in ("all", "clicks")
    }
    assert by_stat["all"] == [(5, 2), (6, 3), (7, 3), (8, 4)]
    assert by_stat["clicks"] == [(5, 1), (6, 2), (7, 2), (8, 2)]
    assert rejected == [(8, 0, "empty user_id")]


def test_replay_is_deterministic_under_a_key():
    log = _log({"user_id": "a"}, {"tick": 1}, {"user_id": "b"}, {"tick": 2}, {"tick": 3})
    cfg = config()
    key = b"k" * 32
    first = list(replay(cfg, log, KeyedNoise(key)))
    assert first == list(replay(cfg, log, KeyedNoise(key)))
    assert [r["value"] for r in first] != [
        r["value"] for r in replay(cfg, log, KeyedNoise(b"x" * 32))
    ]


@pytest.mark.parametrize("tau", [1, 3])
def test_replay_error_bars_are_public(tau):
    """std and interval depend on the step and parameters only, never on the data."""
    cfg = parse_config(
        {
            "privacy": {"total_epsilon": 1},
            "noise": {"mode": "insecure_zero"},
            "statistics": [{"name": "s", "epsilon": 1, "tau": tau}],
        }
    )
    empty = _log(*[{"tick": t} for t in range(1, 20)])
    busy = _log(*[x for t in range(1, 20) for x in ({"user_id": f"u{t}"}, {"tick": t})])
    a = list(replay(cfg, empty, ZeroNoise()))
    b = list(replay(cfg, busy, ZeroNoise()))
    assert [r["std"] for r in a] == [r["std"] for r in b]
    half_a = [r["interval"][1] - r["value"] for r in a]
    assert half_a == pytest.approx([r["interval"][1] - r["value"] for r in b], rel=1e-12)
    assert [r["value"] for r in a] != [r["value"] for r in b]


def user_level_config(**stat):
    """A tau: auto statistic whose tracker, with zero noise and a huge epsilon, moves as
    soon as one user exceeds tau (discount < 1): its releases are then exact. Alg. 5's
    tracker (from tau = 2, half of epsilon, Dong-Luo-Yi's series) where the kind has a
    choice."""
    tuning = {"tracker_share": 0.5, "series": "dly"}
    if stat.get("kind", "count") not in ("count", "sum", "histogram"):
        tuning = {}
    return parse_config(
        {
            "input": {"partitions": 1},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 4000},
            "statistics": [{"name": "s", "epsilon": 4000, "practical": False, **tuning, **stat}],
        }
    )


def _releases(cfg, *items):
    return list(replay(cfg, _log(*items), ZeroNoise()))


def test_user_level_count_tracks_tau_and_releases_the_exact_count():
    out = _releases(
        user_level_config(),
        *[{"user_id": "a"}] * 5,
        {"user_id": "b"},
        {"tick": 1},
        {"tick": 2},
        *[{"user_id": "a"}] * 4,
        {"tick": 3},
    )
    assert [(r["tick"], r["value"], r["tau"]) for r in out] == [(1, 6, 8), (2, 6, 8), (3, 10, 16)]
    assert [r["instance"] for r in out] == [1, 1, 2]  # one instance per tau change
    assert all(r["mechanism"] == "user_level" and r["step"] == r["tick"] for r in out)


def test_user_level_sum_histogram_distinct_and_deletions():
    summed = _releases(
        user_level_config(kind="sum", max_value=10),
        {"user_id": "a", "value": 3},
        {"user_id": "b", "value": 5},
        {"user_id": "a", "value": 4},
        {"tick": 1},
    )
    assert [(r["value"], r["tau"]) for r in summed] == [(12, 8)]
    hist = _releases(
        user_level_config(kind="histogram", bins=4),
        *[{"user_id": u, "value": v} for u, v in [("a", 1), ("a", 1), ("b", 4), ("c", 1)]],
        {"tick": 1},
    )
    assert hist[0]["values"] == [3, 0, 0, 1] and hist[0]["max_frequency"] == 3
    distinct = _releases(
        user_level_config(kind="distinct"),
        *[{"user_id": u, "value": v} for u, v in [("a", 5), ("a", 7), ("b", 5), ("b", 9.5)]],
        {"tick": 1},
        {"user_id": "c", "value": 7},
        {"tick": 2},
    )
    assert [r["value"] for r in distinct] == [3, 3]
    # -0.0 and 0.0 are one value (as == has it), whoever sends them.
    zeros = _releases(
        user_level_config(kind="distinct"),
        *[{"user_id": u, "value": v} for u, v in [("a", -0.0), ("a", 0.0), ("b", 0.0)]],
        {"tick": 1},
    )
    assert [r["value"] for r in zeros] == [1]
    deleted = _releases(
        user_level_config(deletions=True),
        *[{"user_id": "a"}] * 3,
        {"user_id": "a", "op": "delete"},
        {"tick": 1},
        {"user_id": "b", "op": "delete"},
        {"tick": 2},
    )
    assert [(r["value"], r["tau"], r["tau_deletions"]) for r in deleted] == [(2, 4, 2), (1, 4, 2)]


def test_user_level_ledger_reports_both_series_below_epsilon():
    cfg = user_level_config()
    stage1, stage2 = Stage1(cfg), Stage2(cfg, ZeroNoise(), partitions=1)
    pstate, users, sstate = new_partition_state(), {}, Stage2.new_state()
    entries = []
    for tick, n in enumerate([1, 3, 3, 20, 0], start=1):
        _apply(stage1, pstate, users, [Event("a", None, None)] * n, offset=tick)
        for report in stage1.close_tick(pstate, 0, tick):
            entries += stage2.on_report(sstate, report)[1]
    budget = [e for e in entries if e.get("event") == "budget"]
    assert [e["tau"] for e in budget] == [2, 4, 8, 32]  # an entry per change, none at tick 5
    for e in budget:
        assert e["tracker_epsilon"] < 2000 and e["instances_epsilon"] < 2000
        assert e["epsilon_spent"] == e["tracker_epsilon"] + e["instances_epsilon"] < 4000
    spent = [e["epsilon_spent"] for e in budget]
    assert spent == sorted(spent)


def test_user_level_k_selection_max_and_median():
    """Worked example G's items with zero noise. The threshold k + Delta uses the Chernoff
    bound of the (here tiny) noise, 0 < Delta < 1, so the released r is the largest with
    at least k + 1 items in [r, R]: one-way, never above the true k-th value."""
    items = [("a", 7), ("b", 3), ("c", 5), ("a", 4), ("d", 1)]
    events = [{"user_id": u, "value": v} for u, v in items]
    expected = {"max": (5, 1), "median": (3, 3), 2: (4, 2)}  # k = ceil(5 / 2) for median
    for rank, (value, k) in expected.items():
        cfg = user_level_config(kind="kselect", bins=8, rank=rank)
        (release,) = _releases(cfg, *events, {"tick": 1})
        assert (release["value"], release["k"]) == (value, k), rank
        assert 0 < release["margin"] < 1 and release["mechanism"] == "k_selection"


def test_k_selection_uses_the_full_margin_unless_halve_margin_and_says_which():
    """The threshold is k + Delta by default, also with practical: true (the schema's
    default); halve_margin: true opts into k + Delta/2. Each release states the mode and
    whether the one-way guarantee holds."""
    items = [("a", 7), ("b", 3), ("c", 5), ("a", 4), ("d", 1)]
    events = [{"user_id": u, "value": v} for u, v in items]
    out = {}
    for extra in ({}, {"practical": True}, {"halve_margin": True}):
        cfg = user_level_config(kind="kselect", bins=8, rank="max", **extra)
        (release,) = _releases(cfg, *events, {"tick": 1})
        out[tuple(extra)] = release
    full, practical, half = out[()], out[("practical",)], out[("halve_margin",)]
    assert (full["margin_mode"], full["one_way"]) == ("full", True)
    assert (practical["margin_mode"], practical["one_way"]) == ("full", True)
    assert (half["margin_mode"], half["one_way"]) == ("half", False)
    assert full["value"] == half["value"] == 5  # zero noise: both thresholds pass at 5
    assert half["margin"] == pytest.approx(full["margin"] / 2, rel=1e-12)


def _kselect_overshoot_rates(halve_margin: bool, runs: int, ticks: int) -> list[float]:
    """Per tick, the fraction of runs whose release exceeds the true max 1."""
    stat = {"name": "top", "kind": "kselect", "bins": 8, "rank": "max", "epsilon": 1.0}
    if halve_margin:
        stat["halve_margin"] = True
    cfg = parse_config(
        {
            "input": {"partitions": 1},
            "noise": {"mode": "insecure_zero"},  # replaced by the keyed noise below
            "privacy": {"total_epsilon": 1.0},
            "statistics": [stat],
        }
    )
    assert cfg.statistics[0].beta == 0.1 and cfg.statistics[0].practical  # the defaults
    log = []
    for t in range(1, ticks + 1):  # five users send the value 1 at every tick
        log += [{"user_id": f"u{j}", "value": 1} for j in range(5)] + [{"tick": t}]
    lines = _log(*log)
    over = [0] * ticks
    for i in range(runs):
        key = hashlib.sha256(f"run-{i}".encode()).digest()  # a distinct key per run
        releases = list(replay(cfg, lines, KeyedNoise(key)))
        assert [r["tick"] for r in releases] == list(range(1, ticks + 1))
        assert {r["margin_mode"] for r in releases} == {"half" if halve_margin else "full"}
        for t, release in enumerate(releases):
            over[t] += release["value"] > 1
    return [n / runs for n in over]


@pytest.mark.statistical
def test_k_selection_is_one_way_with_probability_1_minus_beta_per_tick():
    """P(value > true k-th) <= beta at every tick, with the configured beta = 0.1 and the
    schema's defaults, through the pipeline (stage 1, stage 2, replay) with keyed noise.

    n = 400 runs, run i keyed by sha256("run-i"). At a true rate p <= beta the per-tick
    estimate has standard error <= sqrt(beta (1 - beta) / n) = 0.015; the test allows
    beta + 3 standard errors = 0.145 (one tick of a correct mechanism exceeds it with
    probability about 0.14%; the full Delta's union bound keeps the true rate far below
    beta, measured 0 to 0.015). The same runs with halve_margin: true exceed beta at some
    tick (measured up to 0.19), so the test can fail. About 20 s."""
    runs, ticks, beta = 400, 16, 0.1
    tolerance = 3 * math.sqrt(beta * (1 - beta) / runs)
    full = _kselect_overshoot_rates(False, runs, ticks)
    assert max(full) <= beta + tolerance, full
    half = _kselect_overshoot_rates(True, runs, ticks)
    assert max(half) > beta + tolerance, half


def test_an_expiring_statistic_stops_when_its_lifetime_budget_is_spent(caplog):
    """Charged epsilon * g(horizon_ticks): the release of step horizon + 1 would let the
    first tick's items lose more. Stage 2 publishes one exhausted marker, says so on the
    ledger and in the log, and releases nothing more."""
    cfg = parse_config(
        {
            "input": {"partitions": 1},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 5},
            "statistics": [
                {
                    "name": "e",
                    "epsilon": 1,
                    "tau": 1,
                    "mechanism": "expiring",
                    "lambda": 1,
                    "horizon_ticks": 3,
                }
            ],
        }
    )
    stage2 = Stage2(cfg, ZeroNoise(), partitions=1)
    state = Stage2.new_state()
    releases, ledger = [], []
    for tick in range(10, 16):
        r, entries = stage2.on_report(state, Report("e", 0, tick, tick, {"w": 1}))
        releases += r
        ledger += entries
    assert [(r["tick"], r["value"]) for r in releases] == [(10, 1), (11, 2), (12, 3), (13, None)]
    assert releases[-1]["exhausted"] is True and "exhausted" not in releases[0]
    spent = [e for e in ledger if e.get("event") == "exhausted"]
    assert [(e["tick"], e["epsilon_spent"]) for e in spent] == [
        (13, float(cfg.privacy_statement().charges[0].epsilon))
    ]
    assert spent[0]["epsilon_spent"] <= cfg.privacy.total_epsilon
    assert "lifetime budget spent at tick 13" in caplog.text


class WindowedTable(dict):
    """pipeline/worker/changelog.py's BatchedTable without Kafka: writes reach the store at once
    and the changelog (``batches``: record batches, each kept whole or lost) only when
    flushed, through the real ChangelogWindow."""

    def __init__(self, batches: list, max_bytes: int = WINDOW_BYTES) -> None:
        super().__init__()
        self.batches = batches
        self.window = ChangelogWindow(max_bytes)
        self.completed = 0  # records whose writes are all made
        self.flushed_through: list[int] = []  # per completed record, batches once flushed

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, copy.deepcopy(value))
        self.window.add(0, key, orjson.dumps(value))

    def before_record(self) -> None:
        if self.window.full:
            self.flush()

    def flush(self) -> None:
        for _, entries in self.window.take():
            self.batches.append([(key, orjson.loads(value)) for key, value in entries])
        self.flushed_through += [len(self.batches)] * (self.completed - len(self.flushed_through))


A, B, C = Event("a", None, None), Event("b", "click", None), Event("c", "click", None)
BATCHED_RECORDS = list(
    enumerate([[A, B], [C], [A, A], 10, [B, C, A], [C], [A, B, B], 11, [C, C], [A], 12])
)


def _crash_mismatches(schedule: int, split_batches: bool = False) -> list[tuple[int, int]]:
    """Run BATCHED_RECORDS through WindowedTable under flush schedule ``schedule``, then
    for every crash (a prefix of the changelog's batches survives; with ``split_batches``,
    a prefix of its entries) and every offset the worker may have committed by then, the
    (cut, restart) pairs whose restarted run ends with another state or report than the
    uninterrupted run."""
    rng = np.random.default_rng(schedule)
    stage1 = Stage1(config())
    batches: list = []
    table, reports = WindowedTable(batches, int(rng.integers(60, 700))), []
    for record in BATCHED_RECORDS:
        _worker_step(stage1, table, record, reports, flush_mid=bool(rng.random() < 0.3))
        if rng.random() < 0.3:
            table.flush()
    table.flush()
    flushed_through = table.flushed_through
    assert len(flushed_through) == len(BATCHED_RECORDS)
    if split_batches:  # every entry its own batch, as if a window could be cut anywhere
        flushed_through = [sum(len(b) for b in batches[:n]) for n in flushed_through]
        batches = [[entry] for batch in batches for entry in batch]
    full = dict(table)
    expected = {(r.statistic, r.tick): r for r in reports}
    mismatches = []
    for cut in range(len(batches) + 1):
        persisted = {}
        for key, value in (entry for batch in batches[:cut] for entry in batch):
            persisted[key] = value
        done = persisted.get("p:0", {"last_offset": -1})["last_offset"]
        # Committed offsets: records whose writes are all in the kept batches.
        committable = [i + 1 for i, n in enumerate(flushed_through) if n <= cut]
        for restart in {0, *committable}:
            assert restart <= done + 1
            table = WindowedTable([])
            dict.update(table, copy.deepcopy(persisted))
            resent: list = []
            for record in BATCHED_RECORDS[restart:]:
                _worker_step(stage1, table, record, resent)
            if dict(table) != full or any(expected[r.statistic, r.tick] != r for r in resent):
                mismatches.append((cut, restart))
    return mismatches


@pytest.mark.parametrize("schedule", range(40))
def test_stage1_counts_every_record_once_with_batched_changelog_writes(schedule):
    """As above with BatchedTable's windows: a crash keeps whole windows (each is one
    record batch), and the committed offset never passes a record whose writes were not
    flushed. Windows end where they are sealed (a random small size bound, so also
    between a record's user entries) and, per schedule, between records and mid-record
    (a commit's flush while the record awaits its outputs)."""
    assert _crash_mismatches(schedule) == []


def test_a_window_cut_inside_would_count_wrong():
    """Why a window must reach Kafka whole: with the same schedules, a crash that kept
    part of a window (a user entry two records ahead of the surviving partition state,
    its earlier write folded into the later one) re-counts or loses units."""
    assert any(_crash_mismatches(schedule, split_batches=True) for schedule in range(40))
