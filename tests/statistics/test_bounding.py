"""Stage 1 over whole batches in numpy (``bounding.UnitColumns``) is the event-at-a-time
definition (``UnitBounding.add_event``): the same users' totals, the same pending sums,
keys in the order the reports have always had, the same crash repairs, the same
releases."""

from __future__ import annotations

import copy
import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.config.schema import parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.pipeline.stages.stage1 import Stage1
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.wire.records import decode_envelope, encode_envelope
from dpstream.statistics.bounding import add_weights
from dpstream.statistics.contract import Report
from dpstream.statistics.events import Batch, Event
from dpstream.statistics.weights import DELETES, BandKey, CrossingKey, parse_key

MEAN = {"max_samples_per_user": 2, "lower": 0, "upper": 10}
# Every kind with a ``bounding`` stage 1, in each tau mode, with keys and deletions.
COUNTING = [
    {"kind": "count", "tau": 3},
    {"kind": "count", "tau": 2, "key": "click"},
    {"kind": "count", "tau": "auto", "deletions": True},
    {"kind": "count", "tau": "auto", "key": "click", "deletions": True},
    {"kind": "sum", "tau": 5, "max_value": 3},
    {"kind": "sum", "tau": "auto", "max_value": 3, "deletions": True},
    {"kind": "sum", "tau": "auto", "max_value": 3, "key": "view"},
    {"kind": "histogram", "tau": "auto", "bins": 3},
    {"kind": "kselect", "tau": "auto", "bins": 4, "rank": "median"},
    {"kind": "distinct", "tau": "auto"},
    {"kind": "mean", "mean": MEAN},
]


def counting_config():
    stats = [
        {"name": f"s{i}", "epsilon": 1, "practical": False, **s}
        if s.get("tau") == "auto"
        else {"name": f"s{i}", "epsilon": 1, **s}
        for i, s in enumerate(COUNTING)
    ]
    return parse_config(
        {
            "input": {"partitions": 1},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": len(stats)},
            "statistics": stats,
        }
    )


def _reference_add_events(self, pstate, users, events, offset, partition=0) -> None:
    """``Stage1.add_events`` by the definition: every event through
    ``UnitBounding.add_event``, users in order of their first event (no re-delivery)."""
    events = list(events)
    in_pending = offset <= pstate["last_offset"]
    by_user: dict[str, list[Event]] = {}
    for event in events:
        by_user.setdefault(event.user_id, []).append(event)
    for user_id, mine in by_user.items():
        stored = users.get(user_id)
        assert stored is None or stored["offset"] < offset
        used, kept = dict(stored["used"]) if stored else {}, {}
        for event in mine:
            for stat in self._stats:
                stat.add_event(event, used, kept)
        if not in_pending:
            for name, weights in kept.items():
                add_weights(pstate["pending"].setdefault(name, {}), weights)
        entry = {"used": used, "offset": offset, "kept": kept}
        if self._user_stats:
            self._apply_user_stats(pstate, stored or {}, entry, mine, partition, in_pending)
        users[user_id] = entry


def _canonical(key: str) -> tuple:
    """Where a weight key sits in one user's contribution to a statistic: insertions
    before deletions, crossed powers before bands, then by index."""
    parsed = parse_key(key)
    if isinstance(parsed, CrossingKey):
        return parsed.stream == DELETES, False, parsed.power
    if isinstance(parsed, BandKey):
        return parsed.stream == DELETES, True, parsed.band
    assert parsed is None, key  # fixed tau: the kept units, its only key
    return False, False, 0


users_st = st.sampled_from([f"u{i}" for i in range(6)] + ["heavy"] * 6)
event_st = st.builds(
    Event,
    users_st,
    st.sampled_from([None, "click", "view"]),
    st.integers(1, 3).map(float),
    st.sampled_from([False, False, False, True]),
    attrs=st.just(()),  # no statistic here reads a field by path
)
record_st = st.lists(event_st, min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(record_st, min_size=1, max_size=30), tick_every=st.integers(1, 8))
def test_the_numpy_batch_path_is_the_event_at_a_time_definition(records, tick_every):
    cfg = counting_config()
    stage1 = Stage1(cfg)
    columnar = {s.name for s in stage1._columns.stats}
    fast = new_partition_state(), {}
    slow = new_partition_state(), {}
    for offset, events in enumerate(records):
        if offset % 3 == 1:  # through the events topic's wire form
            positions = list(range(len(events)))
            raw = encode_envelope("s/0", positions, [0] * len(events), events, rules="r")
            batch = decode_envelope(raw).batch
        elif offset % 3 == 2:  # the tail of a re-sent envelope (``unseen``)
            batch = Batch.of([*reversed(events), Event("gone", None, 1.0), *events]).tail(
                len(events) + 1
            )
        else:
            batch = Batch.of(events)
        previous = {name: list(weights) for name, weights in fast[0]["pending"].items()}
        stage1.add_events(*fast, batch, offset)
        _reference_add_events(stage1, *slow, events, offset)
        assert fast[0]["pending"] == slow[0]["pending"], offset
        for user_id, entry in slow[1].items():
            mine = fast[1][user_id]
            assert (mine["used"], mine["offset"]) == (entry["used"], entry["offset"])
            others = {n: w for n, w in entry["kept"].items() if n not in columnar}
            assert mine.get("kept", {}) == others
        # The keys a tick's report carries come in the per-user order they always had:
        # users in order of first event, each user's keys in canonical order.
        for name in columnar:
            order = previous.get(name, [])
            for user_id in dict.fromkeys(e.user_id for e in events):
                for key in sorted(slow[1][user_id]["kept"].get(name, {}), key=_canonical):
                    if key not in order:
                        order.append(key)
            assert list(fast[0]["pending"].get(name, {})) == order, (offset, name)
        if offset % tick_every == 0:
            fast[0]["pending"], slow[0]["pending"] = {}, {}
        fast[0]["last_offset"] = slow[0]["last_offset"] = offset


@settings(max_examples=40, deadline=None)
@given(records=st.lists(record_st, min_size=2, max_size=12), cut=st.integers(1, 11))
def test_a_re_delivered_record_repairs_either_lost_write(records, cut):
    """The crash argument of ``Stage1.add_events`` for every counting kind: after record
    ``cut`` (user entries written, then the partition state), a crash that kept only its
    user entries, or only the partition state, and re-delivers it ends in the state of
    the run without the crash, pending keys in the same order."""
    cut = min(cut, len(records) - 1)
    stage1 = Stage1(counting_config())

    def run(pstate, users, upto):
        for offset in range(upto):
            stage1.add_events(pstate, users, records[offset], offset)
            pstate["last_offset"] = offset

    full = new_partition_state(), {}
    run(*full, cut + 1)
    before = new_partition_state(), {}
    run(*before, cut)
    expected = orjson.dumps(full[0]), full[1]
    for pstate, users in (
        (copy.deepcopy(before[0]), copy.deepcopy(full[1])),  # the partition state lost
        (copy.deepcopy(full[0]), copy.deepcopy(before[1])),  # the user entries lost
        (copy.deepcopy(full[0]), copy.deepcopy(full[1])),  # neither
    ):
        stage1.add_events(pstate, users, records[cut], cut)
        pstate["last_offset"] = max(pstate["last_offset"], cut)
        assert (orjson.dumps(pstate), users) == expected


def _log(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    lines, tick = [], 0
    for _ in range(300):
        if rng.random() < 0.07:
            tick += rng.randint(1, 2)
            lines.append(orjson.dumps({"tick": tick}))
            continue

        def event() -> dict:
            out = {"user_id": f"u{min(int(rng.paretovariate(1.0)), 30)}", "cell": "a"}
            if rng.random() < 0.4:
                out["key"] = "click"
            out["value"] = float(rng.randint(1, 2))
            if rng.random() < 0.15:
                out["op"] = "delete"
            return out

        batch = [event() for _ in range(rng.randint(1, 30))]
        lines.append(orjson.dumps(batch if len(batch) > 1 else batch[0]))
    return [*lines, orjson.dumps({"tick": tick + 1})]


def _run(cfg, monkeypatch, reference: bool) -> tuple[list[bytes], list[Report]]:
    reports: list[Report] = []
    close_tick = Stage1.close_tick

    def closing(self, *args, **kwargs):
        out = close_tick(self, *args, **kwargs)
        reports.extend(out)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(Stage1, "close_tick", closing)
        if reference:
            patch.setattr(Stage1, "add_events", _reference_add_events)
        releases = [
            orjson.dumps(r) for seed in range(3) for r in replay(cfg, _log(seed), ZeroNoise())
        ]
    return releases, reports


@pytest.mark.parametrize("stat", COUNTING, ids=lambda s: f"{s['kind']}-{s.get('tau')}")
def test_replay_releases_what_the_event_at_a_time_definition_releases(stat, monkeypatch):
    """Every release byte for byte, and every report's weights, of replay over random
    logs (2 partitions) with stage 1 in numpy and with stage 1 by the definition."""
    cfg = parse_config(
        {
            "input": {"partitions": 2},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 2},
            "statistics": [
                {"name": "s", "epsilon": 1, **stat},
                {"name": "t", "epsilon": 1, "tau": 2},
            ],
        }
    )
    releases, reports = _run(cfg, monkeypatch, reference=False)
    assert releases and reports
    assert (releases, reports) == _run(cfg, monkeypatch, reference=True)


def test_sum_values_become_units_in_0_to_r_whatever_reaches_stage_1():
    """``value: 1e20`` became -2^63 units (``astype(int64)``), so the user's total and the
    release went to -9.2e18; 1e6 became 1e6 units of a sum whose values are at most R."""
    cfg = parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 1},
            "statistics": [{"name": "s", "kind": "sum", "max_value": 10, "tau": 100, "epsilon": 1}],
        }
    )
    stage1 = Stage1(cfg)
    values = [1e6, 1e20, float("nan"), -3.0, 5.0, 2.5]
    batch = Batch.of([Event("u", None, v) for v in values])
    _, rows = batch.by_user()
    # Clipped into [0, R], then the nearest unit (ties upward): 2.5 is 3 units.
    assert stage1._columns.units(batch, rows, 1).tolist() == [[10 + 10 + 0 + 0 + 5 + 3]]
    (counting,) = stage1._columns.stats
    by_event = [counting.contribution("+", 0, Event("u", None, v))[0] for v in values if v == v]
    assert by_event == [10, 10, 0, 5, 3]


@pytest.mark.parametrize(("value", "column"), [(0.0, 0), (-7.0, 0), (1.0, 0), (4.0, 3), (9.0, 3)])
def test_a_histogram_value_outside_1_to_bins_never_leaves_the_columns(value, column):
    """Value 0 became column -1 (so its units landed in the rank band below)."""
    cfg = parse_config(
        {
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 1},
            "statistics": [
                {"name": "h", "kind": "histogram", "bins": 4, "tau": "auto", "epsilon": 1}
            ],
        }
    )
    (counting,) = Stage1(cfg)._per_user
    _, weights = counting.contribution("+", 0, Event("u", None, value))
    assert weights == {f"+b0/{column}": 1}
