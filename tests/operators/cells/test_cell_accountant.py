"""Per-user loss over cells, the epoch cap B, and the Clip-User reducer
(ours, on Rameshwar et al. Thm II.3).

Accounting properties, Clip-User properties and a worked example (E5).
"""

from __future__ import annotations

import random
from fractions import Fraction

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.operators import state_codec
from dpstream.operators.cells import cell_accountant as ca
from dpstream.operators.cells import cell_mean as cm
from dpstream.operators.cells import clip_user as cu
from dpstream.operators.errors import BudgetExceededError, InvalidOperatorConfig
from dpstream.operators.noise import KeyedNoise

KEY = b"cell-accounting-test-key-0123456789"

E5 = {
    ("g1",): {"A": 1, "B": 3, "C": 3, "D": 3},
    ("g2",): {"A": 1, "B": 2},
    ("g3",): {"A": 1, "C": 2, "D": 3},
}


def public_ledger(cap: float | str = 3, **kw) -> ca.CellAccountantSpec:
    return ca.make_cell_accountant(cap, counts_public=True, **kw)


def charge_of(cell: tuple, users: tuple[str, ...], eps: Fraction = Fraction(1)) -> ca.CellCharge:
    return ca.CellCharge(cell=cell, epsilon=eps, users=tuple(sorted(users)))


# ---------------------------------------------------------------------------------------
# Accounting


def test_ledger_is_the_sum_over_kept_released_cells() -> None:
    spec = public_ledger(10)
    state = ca.init(spec, epoch=4)
    state = ca.charge(spec, state, [charge_of(cell, tuple(users)) for cell, users in E5.items()])
    assert [(u, ca.loss(state, u), ca.kept_cells(state, u)) for u in "ABCD"] == [
        ("A", 3, 3), ("B", 2, 2), ("C", 2, 2), ("D", 2, 2)
    ]  # fmt: skip
    assert ca.max_loss(state) == 3  # G_1 eps, Cor II.1; basic composition would say 3 too
    state = ca.charge(spec, state, [charge_of(("g4",), ("B",), Fraction(1, 2))])
    assert ca.loss(state, "B") == Fraction(5, 2) and ca.max_loss(state) == 3
    assert ca.loss(state, "nobody") == 0 and ca.kept_cells(state, "nobody") == 0


def test_max_loss_is_disjointness_not_basic_composition() -> None:
    spec = public_ledger(100)
    cells = [charge_of(("speed", f"h3-{i}", 0), (f"user{i}",)) for i in range(50)]
    state = ca.charge(spec, ca.init(spec), cells)
    assert ca.max_loss(state) == 1  # 50 cells, but each user is in one of them


def test_replayed_charge_counts_once() -> None:
    spec = public_ledger(5)
    once = ca.charge(spec, ca.init(spec), [charge_of(("g1",), ("A", "B"))])
    twice = ca.charge(spec, once, [charge_of(("g1",), ("A", "B"))])
    assert twice == once
    with pytest.raises(InvalidOperatorConfig, match="charges must be distinct cells"):
        ca.charge(spec, ca.init(spec), [charge_of(("g1",), ("A",))] * 2)


def test_budget_boundary_exact_cap_accepted_just_below_rejected() -> None:
    cells = [charge_of((f"g{i}",), ("A",), Fraction(1, 3)) for i in range(6)]  # total 2
    spec = public_ledger(2)
    state = ca.charge(spec, ca.init(spec), cells)
    assert ca.loss(state, "A") == 2 == ca.max_loss(state)
    tight = public_ledger(Fraction(2) - Fraction(1, 10**6))
    before = ca.init(tight)
    with pytest.raises(BudgetExceededError, match=r"1 user\(s\) above the epoch cap"):
        ca.charge(tight, before, cells)
    assert before == ca.init(tight)  # nothing committed


def test_admit_drops_users_who_cannot_afford_the_cell() -> None:
    spec = public_ledger(2)
    state = ca.charge(
        spec, ca.init(spec), [charge_of(("g1",), ("A", "B")), charge_of(("g2",), ("A",))]
    )
    got = ca.admit(spec, state, ["C", "B", "A", "B"], Fraction(1))
    assert got == ca.Admission(kept=("B", "C"), dropped=("A",), release=True)
    assert ca.allowance(spec, state, "A", Fraction(1)) == 0
    assert ca.allowance(spec, state, "B", Fraction(1, 3)) == 3
    assert ca.remaining(spec, state, "C") == 2
    alone = ca.admit(spec, state, ["A"], Fraction(1))
    assert alone == ca.Admission(kept=(), dropped=("A",), release=False)
    skip = public_ledger(2, on_cap="skip_cell")
    assert ca.admit(skip, state, ["A", "C"], Fraction(1)).release is False


def test_strict_ledger_forbids_skip_cell_and_validates() -> None:
    with pytest.raises(
        InvalidOperatorConfig, match="on_cap must be 'drop_user' when counts_public is False"
    ):
        ca.make_cell_accountant(1, on_cap="skip_cell")
    with pytest.raises(InvalidOperatorConfig, match="epoch_cap must be finite and > 0"):
        ca.make_cell_accountant(0)
    with pytest.raises(InvalidOperatorConfig, match="on_cap must be one of"):
        ca.make_cell_accountant(1, on_cap="panic")
    with pytest.raises(InvalidOperatorConfig, match="counts_public must be a bool, got 'yes'"):
        ca.make_cell_accountant(1, counts_public="yes")
    assert ca.make_cell_accountant("2.5").counts_public is False
    assert ca.make_cell_accountant("2.5").epoch_cap == Fraction(5, 2)


def test_epochs_reset_the_ledger() -> None:
    spec = public_ledger(1)
    state = ca.charge(spec, ca.init(spec), [charge_of(("g1",), ("A",))])
    with pytest.raises(InvalidOperatorConfig, match="epoch must be >= 1, got 0"):
        ca.start_epoch(spec, state, 0)
    fresh = ca.start_epoch(spec, state, 1)
    assert fresh == ca.CellLedgerState(epoch=1) and ca.loss(fresh, "A") == 0


def test_ledger_entry_has_no_user_ids() -> None:
    spec = public_ledger(5)
    item = charge_of(("speed", "h3", 3), ("secret-user-1", "secret-user-2"), Fraction(1, 2))
    state = ca.charge(spec, ca.init(spec, 2), [item])
    entry = ca.ledger_entry(state, item)
    assert entry == {"epoch": 2, "cell": ["speed", "h3", 3], "epsilon": 0.5,
                     "users_charged": 2, "epoch_max_loss": 0.5}  # fmt: skip
    assert b"secret" not in orjson.dumps(entry)


ledgers = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.sets(st.sampled_from(["u1", "u2", "u3", "u4"]), min_size=1),
        st.fractions(min_value=Fraction(1, 8), max_value=2, max_denominator=8),
    ),
    max_size=8,
    unique_by=lambda t: t[0],
)


@given(ledgers, st.integers(0, 5))
@settings(max_examples=100, deadline=None)
def test_state_round_trips_through_json(items, slot) -> None:
    spec = public_ledger(100)
    charges = [charge_of(("speed", cell, slot), tuple(users), eps) for cell, users, eps in items]
    state = ca.charge(spec, ca.init(spec, slot), charges)
    data = orjson.loads(orjson.dumps(state_codec.to_json(state)))
    assert state_codec.from_json(ca.CellLedgerState, data) == state
    online = ca.OnlineAdmissionState(epoch=slot, cells=tuple(c.cell for c in charges))
    data = orjson.loads(orjson.dumps(state_codec.to_json(online)))
    assert state_codec.from_json(ca.OnlineAdmissionState, data) == online
    # The ledger equals sum of eps over the cells that kept each user.
    for user in ("u1", "u2", "u3", "u4"):
        assert ca.loss(state, user) == sum((e for _, us, e in items if user in us), Fraction(0))


def test_online_rule_c_admits_the_first_c_cells() -> None:
    spec = ca.make_cell_accountant(2)  # strict; C = floor(2 / (1/2)) = 4
    state = ca.OnlineAdmissionState()
    decisions = []
    for cell in ["a", "b", "a", "c", "d", "e", "b", "f"]:
        state, ok = ca.admit_online(spec, state, 0, ("speed", cell, 0), Fraction(1, 2))
        decisions.append(ok)
    assert decisions == [True, True, True, True, True, False, True, False]
    assert [c[1] for c in state.cells] == ["a", "b", "c", "d"]
    state, ok = ca.admit_online(spec, state, 1, ("speed", "e", 24), Fraction(1, 2))
    assert ok and state.epoch == 1 and len(state.cells) == 1
    _, late = ca.admit_online(spec, state, 0, ("speed", "x", 0), Fraction(1, 2))
    assert late is False


def test_release_charge_round_trip_with_cell_means() -> None:
    """The pipeline's order: admit against the cap, release, charge the kept users."""
    mean = cm.make_cell_mean("array_averaging", 1, 0, 100, 1, counts_public=True)
    ledger = public_ledger(2)
    state = ca.init(ledger)
    data = {"A": [10, 20, 30], "B": [40], "C": [50, 60]}
    for slot in range(3):
        cell = ("speed", "h3", slot)
        admission = ca.admit(ledger, state, data, mean.epsilon)
        items = [cm.aggregate(mean, u, data[u]) for u in admission.kept]
        out = cm.release_cell(mean, cell, items, KeyedNoise(KEY))
        if out.charge is not None:
            state = ca.charge(ledger, state, [out.charge])
        if slot == 2:
            assert admission.release is False and out.release is None
    assert ca.max_loss(state) == 2 == ca.loss(state, "A")


# ---------------------------------------------------------------------------------------
# Clip-User: E5 and properties


def clip_spec(kappa: int = 1) -> cu.ClipUserSpec:
    return cu.make_clip_user(0, 100, kappa, counts_public=True)


def test_e5_clip_user() -> None:
    spec = clip_spec()
    bounds = [cu.error_bound(spec, E5[c], set(), Fraction(1)) for c in sorted(E5)]
    assert bounds == [30, Fraction(200, 3), 50]
    for cell, want in ((("g1",), Fraction(130, 3)), (("g2",), Fraction(400, 3)),
                       (("g3",), Fraction(230, 3))):  # fmt: skip
        assert cu.error_bound(spec, E5[cell], {"A"}, Fraction(1)) == want  # 43.33, 133.3, 76.67
    result = cu.plan(spec, E5, Fraction(1))
    assert result.suppressed == ((("g1",), ("A",)),)
    assert result.e0 == Fraction(200, 3)
    assert dict(result.bounds) == {
        ("g1",): Fraction(130, 3),
        ("g2",): Fraction(200, 3),
        ("g3",): 50,
    }
    assert (result.loss_before, result.loss_after, result.rounds) == (3, 2, 1)
    assert result.forced == () and result.released == (("g1",), ("g2",), ("g3",))
    assert cu.kept_counts(E5, result)[("g1",)] == {"B": 3, "C": 3, "D": 3}


def random_matrix(rng: random.Random) -> dict[tuple, dict[str, int]]:
    users = [f"u{i}" for i in range(rng.randint(2, 9))]
    matrix = {}
    for g in range(rng.randint(1, 7)):
        present = rng.sample(users, rng.randint(1, len(users)))
        matrix[("speed", f"h{g}", 0)] = {u: rng.choice([1, 1, 2, 3, 5, 10, 40]) for u in present}
    return matrix


@given(st.integers(0, 10**9), st.sampled_from([Fraction(1, 2), Fraction(1), Fraction(3)]))
@settings(max_examples=300, deadline=None)
def test_clip_user_properties(seed, eps) -> None:
    rng = random.Random(seed)
    matrix = random_matrix(rng)
    spec = clip_spec(rng.choice([1, 3]))
    result = cu.plan(spec, matrix, eps)
    assert max(b for _, b in result.bounds) <= result.e0  # worst bound never worse
    assert result.loss_after <= result.loss_before  # G_max never increases
    assert set(result.released) == set(matrix)  # no cell becomes empty
    assert all(kept for kept in cu.kept_counts(matrix, result).values())
    # Rerunning from the output changes nothing.
    assert cu.plan(spec, matrix, eps, initial=dict(result.suppressed)) == dataclass_rounds(result)
    # Invariant to the order of cells, users (and so of events).
    shuffled = {c: dict(rng.sample(list(row.items()), len(row)))
                for c, row in rng.sample(list(matrix.items()), len(matrix))}  # fmt: skip
    assert cu.plan(spec, shuffled, eps) == result


def dataclass_rounds(result: cu.ClipPlan) -> cu.ClipPlan:
    """The same plan, as a rerun from its own output reports it (no further round)."""
    import dataclasses

    return dataclasses.replace(result, rounds=0)


@given(st.integers(0, 10**9))
@settings(max_examples=200, deadline=None)
def test_mandatory_suppressions_respect_the_budget(seed) -> None:
    rng = random.Random(seed)
    matrix = random_matrix(rng)
    users = sorted({u for row in matrix.values() for u in row})
    budget = {u: Fraction(rng.randint(0, 4), 2) for u in users}
    spec = clip_spec()
    eps = Fraction(1, 2)
    result = cu.plan(spec, matrix, eps, budget_left=budget)
    kept = cu.kept_counts(matrix, result)
    for user in users:
        assert sum(eps for row in kept.values() if user in row) <= budget[user]
    assert result.loss_after <= max(budget.values())
    # The ledger built from the plan never rejects it.
    ledger = public_ledger(2)
    state = ca.init(ledger)
    state = ca.charge(ledger, state, [charge_of(("pre", u), (u,), 2 - budget[u]) for u in users
                                      if budget[u] < 2])  # fmt: skip
    state = ca.charge(ledger, state, [charge_of(c, tuple(row), eps) for c, row in kept.items()])
    assert ca.max_loss(state) <= 2


def test_mandatory_without_clip_and_forced_cells() -> None:
    spec = clip_spec()
    result = cu.plan(
        spec, E5, Fraction(1), budget_left={"A": 1, "B": 2, "C": 2, "D": 2}, clip=False
    )
    # A keeps one cell: dropped first where E_g rises least (g1: 43.3), then g3 (76.7 < 133).
    assert result.suppressed == ((("g1",), ("A",)), (("g3",), ("A",)))
    assert result.forced == (("g3",),) and result.loss_after == 2
    with pytest.raises(InvalidOperatorConfig, match="budget_left must be given for every user"):
        cu.plan(spec, E5, Fraction(1), budget_left={"A": 1})


def test_a_cell_emptied_by_the_cap_is_not_released() -> None:
    spec = clip_spec()
    matrix = {("g1",): {"A": 2}, ("g2",): {"A": 1, "B": 1}}
    result = cu.plan(spec, matrix, Fraction(1), budget_left={"A": 1, "B": 1})
    assert result.suppressed == ((("g2",), ("A",)),)  # emptying a cell is the last resort
    result = cu.plan(spec, {("g1",): {"A": 2}}, Fraction(1), budget_left={"A": 0})
    assert result.released == () and result.loss_after == 0


def test_fixed_total_mode_spends_at_most_the_total() -> None:
    spec = clip_spec()
    target, eps, result = cu.plan_fixed_total(spec, E5, Fraction(3))
    assert (target, eps) == (2, Fraction(3, 2))
    assert result.loss_after <= 3 and result.suppressed == ((("g1",), ("A",)),)
    assert result.loss_before == 3
    rng = random.Random(1)
    for _ in range(100):
        matrix = random_matrix(rng)
        target, eps, result = cu.plan_fixed_total(spec, matrix, Fraction(2))
        assert result.loss_after <= 2 and eps == Fraction(2, target)


def test_heterogeneous_budgets_and_validation() -> None:
    spec = clip_spec()
    eps = {("g1",): Fraction(1), ("g2",): Fraction(1, 2), ("g3",): Fraction(2)}
    result = cu.plan(spec, E5, eps)
    assert result.loss_before == Fraction(7, 2) and result.loss_after <= result.loss_before
    with pytest.raises(InvalidOperatorConfig, match="epsilon must be given for every cell"):
        cu.plan(spec, E5, {("g1",): Fraction(1)})
    with pytest.raises(InvalidOperatorConfig, match="counts_public must be True for Clip-User"):
        cu.make_clip_user(0, 100)
    with pytest.raises(InvalidOperatorConfig, match="kappa must be >= 0"):
        cu.make_clip_user(0, 100, -1, counts_public=True)
    with pytest.raises(InvalidOperatorConfig, match="upper must be > lower = 5"):
        cu.make_clip_user(5, 5, counts_public=True)
