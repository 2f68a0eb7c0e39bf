"""User-level distinct count F_0: Dong-Luo-Yi Sec. IV-D, our first-occurrence re-admission,
a worked example (Example E), a from-scratch build, any-subset neighbours."""

from __future__ import annotations

from fractions import Fraction

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.errors import InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise, RecordingNoise, ZeroNoise
from dpstream.operators.trees import tree_counter as tc
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import distinct_count as dc

KEY = bytes(range(32))

Tick = list[tuple[str, int]]  # (user, value) items in the users' own order

EXAMPLE_E: list[Tick] = [[("a", 5)], [("a", 7)], [("a", 9)], [("b", 9)], [("b", 5)]]


def run(spec: dc.DistinctCountSpec, ticks: list[Tick], noise) -> tuple[list, list]:
    """Reference stage 1 (split_values_tick), the value table m(v), then the mechanism."""
    state, totals, table = dc.init(spec), {}, {}
    states, releases = [], []
    for items in ticks:
        by_band, crossings, totals = dc.split_values_tick(totals, items)
        updates, units = dc.first_occurrence_units(table, by_band)
        table.update(updates)
        state, rel = dc.step(spec, state, units, crossings, noise)
        states.append(state)
        releases.append(rel)
    return states, releases


def first_occurrence_leaves(ticks: list[Tick], tau: int) -> list[int]:
    """From scratch: D-bar of Truncate(D, tau), 1 at each value's first KEPT occurrence."""
    used: dict[str, int] = {}
    seen: set[int] = set()
    leaves = []
    for items in ticks:
        leaf = 0
        for user, value in items:
            used[user] = used.get(user, 0) + 1
            if used[user] <= tau and value not in seen:
                seen.add(value)
                leaf += 1
        leaves.append(leaf)
    return leaves


def kept(spec: dc.DistinctCountSpec, vector: tuple[int, ...], tau: int) -> int:
    return ul.kept_bins(spec.mechanism, vector, tau)[0]


# ---------------------------------------------------------------------------------------
# Example E and the band form


def test_example_e_band_units():
    """Ex. E: (a,5),(a,7),(a,9),(b,9),(b,5). a's ranks 1,2,3 lie in bands 0,1,2,
    b's ranks 1,2 in bands 0,1; (b,9)@4 arrives in band 0 below m(9) = 2: +1 in band 0,
    -1 in band 2 at tick 4."""
    table: dict[int, int] = {}
    totals: dict[str, int] = {}
    units_per_tick = []
    for items in EXAMPLE_E:
        by_band, _, totals = dc.split_values_tick(totals, items)
        updates, units = dc.first_occurrence_units(table, by_band)
        table.update(updates)
        units_per_tick.append(units)
    assert units_per_tick == [(1,), (0, 1), (0, 0, 1), (1, 0, -1), ()]
    assert table == {5: 0, 7: 1, 9: 0}
    # Leaves at tau = 2 (bands 0..1) and tau = 4 (bands 0..2).
    assert [dc.leaf_at(u, 1) for u in units_per_tick] == [1, 1, 0, 1, 0]
    assert [dc.leaf_at(u, 2) for u in units_per_tick] == [1, 1, 1, 0, 0]
    assert first_occurrence_leaves(EXAMPLE_E, 2) == [1, 1, 0, 1, 0]
    assert first_occurrence_leaves(EXAMPLE_E, 4) == [1, 1, 1, 0, 0]


def test_example_e_tree_shift_and_f0():
    """tau = 2 at t = 5 (period 2, k = 2): P = [1, 1], live alpha_1[4-5] = 1, F_0 = 3.
    Switching to tau = 4 at t = 5 moves 9's first occurrence from 4 to 3: P = [1, 2],
    alpha_1[4-5] = 0, F_0 still 3."""
    for schedule, tau, periods, alpha_1 in (
        (((1, 2),), 2, [1, 1], 1),
        (((1, 2), (5, 4)), 4, [1, 2], 0),
    ):
        spec = dc.make_distinct_count("f0", 2, Fraction(1, 10), forced_schedule=schedule)
        states, releases = run(spec, EXAMPLE_E, ZeroNoise())
        state = states[-1]
        assert state.tau == tau
        assert [kept(spec, p, tau) for p in state.periods] == periods
        assert kept(spec, state.alpha[1], tau) == alpha_1
        assert [r.value for r in releases] == [1, 2, 2, 3, 3]
        assert dc.exact_value(spec, state) == 3


def test_example_e_explicit_moves():
    """The per-band earliest ticks give the explicit first-occurrence moves: raising tau
    from 2 to 4 moves value 9 from tick 4 to tick 3 (-1 at 4, +1 at 3), nothing else."""
    earliest = {5: (1, 5, 0), 7: (0, 2, 0), 9: (4, 0, 3)}
    assert dc.first_ticks(earliest, 1) == {5: 1, 7: 2, 9: 4}
    assert dc.first_ticks(earliest, 2) == {5: 1, 7: 2, 9: 3}
    assert dc.readmission_moves(earliest, 1, 2) == [(4, 3)]
    # A value first seen above the old tau appears: old tick NO_TICK.
    assert dc.readmission_moves({3: (0, 0, 6)}, 1, 2) == [(dc.NO_TICK, 6)]
    assert dc.readmission_moves(earliest, 2, 2) == []


ticks_strategy = st.lists(
    st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 6)), max_size=5),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ticks_strategy)
def test_band_units_give_every_power_of_two_at_once(ticks):
    """Summing the signed units of bands 0..i gives D-bar of Truncate(D, 2^i), for all i."""
    table: dict[int, int] = {}
    totals: dict[str, int] = {}
    all_units = []
    for items in ticks:
        by_band, _, totals = dc.split_values_tick(totals, items)
        updates, units = dc.first_occurrence_units(table, by_band)
        table.update(updates)
        all_units.append(units)
    for i in range(7):
        assert [dc.leaf_at(u, i) for u in all_units] == first_occurrence_leaves(ticks, 1 << i)


@st.composite
def schedules(draw) -> tuple[tuple[int, int], ...]:
    points = sorted(draw(st.sets(st.integers(2, 40), max_size=4)))
    tau, out = 2, []
    for t in points:
        tau *= draw(st.sampled_from([2, 4]))
        out.append((t, tau))
    return tuple(out)


@settings(max_examples=50, deadline=None)
@given(ticks_strategy, schedules())
def test_oracle_4_readmission_equals_a_from_scratch_build(ticks, schedule):
    """Oracle 4 for F_0: after any forced tau schedule, every exact node the release uses
    (P[p], live alpha[j]) and the noise-free output equal a from-scratch tree (tree_counter)
    built on the first-occurrence leaves of Truncate(D_t, tau~_t)."""
    spec = dc.make_distinct_count("f0", 1, Fraction(1, 10), forced_schedule=schedule)
    states, releases = run(spec, ticks, ZeroNoise())
    tree_spec = tc.make_binary_tree(1, 1, ("ref",))
    for t, (state, rel) in enumerate(zip(states, releases, strict=True), 1):
        tau = state.tau
        leaves = first_occurrence_leaves(ticks[:t], tau)
        ref = tc.init(tree_spec)
        for w in leaves:
            ref, _ = tc.step(tree_spec, ref, w, ZeroNoise())
        assert [kept(spec, p, tau) for p in state.periods] == list(ref.period_totals)
        _, k = ul.period_of(t)
        for level, vector in enumerate(state.alpha):
            if k >> level & 1:
                assert kept(spec, vector, tau) == ref.alpha[level]
        assert rel.value == sum(leaves) == dc.exact_value(spec, state)


def test_f0_uses_the_truncated_stream_and_the_tracker_the_original():
    """A heavy user repeating one value: F_0 counts it once, while Count(D_t, 2^j) on the
    ORIGINAL stream sees all of the user's items (Sec. IV-D)."""
    spec = dc.make_distinct_count("f0", 1, Fraction(1, 10), forced_schedule=((1, 2),))
    ticks: list[Tick] = [[("a", 1)] * 5, [("b", 2)], [("a", 3)]]
    states, releases = run(spec, ticks, ZeroNoise())
    assert states[0].crossings == (1, 1, 1)  # c_a = 5 > 1, 2, 4
    assert [r.value for r in releases] == [1, 2, 2]  # (a,3) has rank 6 > tau = 2


@pytest.mark.parametrize("any_subset, multiplier", [(False, 2), (True, 4)])
def test_node_scale_is_2_tau_or_4_tau(any_subset, multiplier):
    """Node noise Lap((l+1) * 2 tau~ / eps_inst_j) (4 tau~ with any-subset neighbours), and
    a restart draws every node in use anew at the new scale (new instance in the id)."""
    spec = dc.make_distinct_count(
        "f0", 1, Fraction(1, 10), any_subset=any_subset, forced_schedule=((1, 2), (6, 8))
    )
    assert spec.mechanism.multiplier == multiplier
    noise = RecordingNoise(ZeroNoise())
    states, _ = run(spec, [[("a", t)] for t in range(1, 9)], noise)
    instance_calls = [(node, scale) for node, scale, _ in noise.calls if node[1] == "inst"]
    assert instance_calls
    for node, scale in instance_calls:
        j = node[2]
        tau = 2 if j == 1 else 8
        period = node[4] if node[3] == "P" else node[3]
        expected = Fraction((period + 1) * multiplier * tau) / ul.epsilon_instance(
            spec.mechanism, j
        )
        assert scale == expected
    assert {node[2] for node, _ in instance_calls} == {1, 2}
    assert states[-1].instance == 2
    assert dc.spent_epsilon(spec, states[-1]) < 1


def test_state_json_round_trip_with_signed_units():
    spec = dc.make_distinct_count("f0", 1, Fraction(1, 10), forced_schedule=((1, 2),))
    states, _ = run(spec, EXAMPLE_E, KeyedNoise(KEY))
    state = states[-1]
    assert any(v < 0 for node in state.alpha + state.periods for v in node)
    data = orjson.loads(orjson.dumps(state_codec.to_json(state)))
    restored = state_codec.from_json(ul.UserLevelState, data)
    assert restored == state
    _, a = dc.step(spec, state, (1,), (), KeyedNoise(KEY))
    _, b = dc.step(spec, restored, (1,), (), KeyedNoise(KEY))
    assert a == b


def test_empty_ticks_release_noise():
    spec = dc.make_distinct_count("f0", 2, Fraction(1, 10))
    state, rel = dc.step(spec, dc.init(spec), (), (), KeyedNoise(KEY))
    assert rel.t == 1 and rel.tau == 2 and rel.bins[0].std > 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epsilon": 0}, "epsilon must be finite and > 0, got"),
        ({"beta": 1}, "beta must be in (0, 1), got"),
        ({"any_subset": 1}, "any_subset must be a bool, got 1"),
    ],
)
def test_make_rejects_bad_parameters(kwargs, message):
    args = {"name": "f0", "epsilon": 1, "beta": Fraction(1, 10)} | kwargs
    with pytest.raises(
        InvalidOperatorConfig, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        dc.make_distinct_count(**args)


def test_step_rejects_non_integer_units():
    spec = dc.make_distinct_count("f0", 1, Fraction(1, 10))
    with pytest.raises(InvalidOperatorConfig, match="units entries must be integers, got 'float'"):
        dc.step(spec, dc.init(spec), (1.0,), (), ZeroNoise())
