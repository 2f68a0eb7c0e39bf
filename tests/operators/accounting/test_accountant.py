"""The accountant (operators/accounting/accountant.py) against hand-computed statements."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpstream.operators import accounting as acc
from dpstream.operators.accounting import StatementError, StatisticTerms
from dpstream.operators.trees import sqrt_factorization

ONE = Fraction(1)


def count(name: str, epsilon: Fraction = ONE) -> StatisticTerms:
    return StatisticTerms(name, "count", epsilon)


def cells(name: str, epoch_cap: Fraction, counts_public: bool) -> StatisticTerms:
    return StatisticTerms(
        name, "cell_mean", ONE, "per_cell_mean", epoch_cap=epoch_cap, counts_public=counts_public
    )


def george_mean(name: str, epsilon: Fraction = ONE) -> StatisticTerms:
    """kind mean in a public-counts pipeline: George et al.'s continual mean."""
    return StatisticTerms(name, "mean", epsilon, "continual_mean", counts_public=True)


def mean(name: str, epsilon: Fraction = ONE, m: int = 8, resolution: int = 1024) -> StatisticTerms:
    """kind mean by default: the whole-user mean."""
    return StatisticTerms(
        name, "mean", epsilon, "whole_user_mean", max_samples=m, resolution=resolution
    )


def test_basic_composition_of_three_counts_is_their_sum():
    # The demo: three counts at epsilon 1 each, total 3.
    out = acc.statement("demo", [count("a"), count("b"), count("c")], "whole_user", False, 3)
    assert out.per_user_total == 3 and not out.per_epoch
    assert [c.relation for c in out.charges] == ["whole_user"] * 3
    assert out.to_json()["public_counts"] is False
    assert out.describe()[-1] == (
        "  one user can lose at most 3 over the whole stream (basic composition) of total_epsilon=3"
    )


def test_a_total_above_the_budget_names_the_field():
    with pytest.raises(StatementError) as info:
        acc.statement("p", [count("a"), count("b", Fraction(1, 10))], "whole_user", False, 1)
    assert info.value.field == "privacy.total_epsilon"
    assert "statistics spend 1.1 in total (a 1, b 0.1)" in str(info.value)
    # 0.1 + 0.2 is exactly 0.3 in the decimals the user wrote.
    tenth = [count("a", Fraction(1, 10)), count("b", Fraction(2, 10))]
    assert acc.statement("p", tenth, "whole_user", False, Fraction(3, 10)).per_user_total == (
        Fraction(3, 10)
    )


def test_an_expiring_counter_is_charged_epsilon_g_at_its_horizon():
    # Andersson et al. (arXiv:2406.03802), lambda = 2: epsilon = 0.05645 gives a loss of
    # about 23.7 for an item 10^6 steps old (the paper's table, reproduced in the tree's tests).
    terms = StatisticTerms(
        "views", "count", Fraction("0.05645"), "tree_counter", "expiring", Fraction(2), 0, 10**6
    )
    charge = acc.charge_of(terms, "whole_user")
    assert float(charge.epsilon) == pytest.approx(23.7, rel=2e-3)
    assert "horizon d = 1000000" in charge.basis


def test_strict_cells_and_counts_compose_per_epoch():
    # A count (1 over the stream) and strict cells with B = 2 per epoch: 3 per epoch.
    out = acc.statement(
        "p", [count("a"), cells("speed", Fraction(2), False)], "whole_user", False, 3
    )
    assert out.per_user_total == 3 and out.per_epoch
    assert out.charges[1].relation == "whole_user" and not out.charges[1].exact_counts
    assert "per accounting epoch" in out.describe()[-1]


def test_any_subset_doubles_sensitivity_keeps_a_count_charge_and_doubles_strict_cells():
    # Strict cells under any_subset state that relation; the scales double
    # (operators/cells/cell_mean.py); a count's charge stays its epsilon, and strict cells
    # with B = 2 are charged 2B = 4: dropping some of a user's events can admit the user
    # into cells it was dropped from at the cap (issue 24 item 2). 1 + 4 = 5 per epoch.
    out = acc.statement(
        "p", [count("a"), cells("speed", Fraction(2), False)], "any_subset", False, 5
    )
    assert [c.relation for c in out.charges] == ["any_subset", "any_subset"]
    assert [c.epsilon for c in out.charges] == [1, 4]
    assert out.per_user_total == 5 and out.per_epoch
    assert acc.sensitivity_multiplier("any_subset") == 2
    assert acc.sensitivity_multiplier("whole_user") == 1
    with pytest.raises(StatementError) as info:  # 5 > 3, which B alone would have passed
        acc.statement("p", [count("a"), cells("speed", Fraction(2), False)], "any_subset",
                      False, 3)  # fmt: skip
    assert info.value.field == "privacy.total_epsilon"
    assert "statistics spend 5 in total (a 1, speed 4)" in str(info.value)


def test_the_review_two_cell_case_is_charged_twice_the_epoch_cap():
    # Issue 24 item 2: strict cells a and b, epsilon 0.5 per cell, epoch_cap 0.5, one user
    # with one event in each: kept in a, dropped from b at the cap; without the event in a,
    # kept in b. Both cells' inputs change: 1.0 = 2B (the exhaustive case:
    # tests/statistics/test_cell_mean.py). Under whole_user removing the user changes a only: B.
    half = Fraction(1, 2)
    strict = StatisticTerms("speed", "cell_mean", half, "per_cell_mean", epoch_cap=half)
    charge = acc.charge_of(strict, "any_subset")
    assert charge.epsilon == 1 and charge.per_epoch and charge.relation == "any_subset"
    assert charge.basis == (
        "2B, epoch cap B = 0.5 over disjoint cells of epsilon 0.5 each: under any_subset, "
        "dropping some of a user's events can admit the user into cells it was dropped from "
        "at the cap"
    )
    assert acc.charge_of(strict, "whole_user").epsilon == half
    out = acc.statement("p", [strict], "any_subset", False, 1)
    assert out.to_json()["statistics"][0]["epsilon"] == 1.0
    assert out.to_json()["per_user_total"] == 1.0
    assert out.describe()[-1] == (
        "  one user can lose at most 1 per accounting epoch (basic composition) of total_epsilon=1"
    )
    # Public counts: neighbours share the count matrix, so admissions cannot move: B.
    public = StatisticTerms(
        "speed", "cell_mean", half, "per_cell_mean", epoch_cap=half, counts_public=True
    )
    assert acc.charge_of(public, "whole_user").epsilon == half


def test_public_counts_statistics_compose_among_themselves():
    out = acc.statement(
        "p",
        [george_mean("latency", Fraction(2)), cells("speed", Fraction(3), True)],
        "whole_user",
        True,
        5,
    )
    assert out.relation == "public_counts" and out.per_user_total == 5 and out.per_epoch
    assert all(c.exact_counts and c.relation == "public_counts" for c in out.charges)
    assert "PUBLIC COUNTS" in out.describe()[1]


@pytest.mark.parametrize(
    ("statistics", "public_counts", "relation", "field"),
    [
        # Item 3's reproduction with George et al.'s mean: a count with tau 8 beside it
        # (m = 8) would release the count's exact truncated value as the mean's samples.
        ([count("events"), george_mean("latency")], False, "whole_user", "statistics[1].kind"),
        ([count("events"), george_mean("latency")], True, "whole_user", "statistics[0]"),
        # The whole-user mean protects whole users: never in a public-counts pipeline.
        ([mean("latency")], True, "whole_user", "statistics[0]"),
        ([cells("speed", ONE, True)], False, "whole_user", "statistics[0].cells.counts_public"),
        ([cells("speed", ONE, True), cells("strict", ONE, False)], True, "whole_user",
         "statistics[1]"),
        ([cells("speed", ONE, True)], True, "any_subset", "privacy.neighbours"),
    ],
)  # fmt: skip
def test_whole_user_and_public_counts_never_share_a_total(
    statistics, public_counts, relation, field
):
    with pytest.raises(StatementError) as info:
        acc.statement("p", statistics, relation, public_counts, 10)
    assert info.value.field == field


def test_retired_statistics_stay_charged():
    old = acc.charge_of(count("events_v1"), "whole_user")
    out = acc.statement("p", [count("events_v2")], "whole_user", False, 2, [old])
    assert out.per_user_total == 2
    assert out.to_json()["retired"][0]["statistic"] == "events_v1"
    with pytest.raises(StatementError, match="events_v1 1"):
        acc.statement("p", [count("events_v2")], "whole_user", False, Fraction(3, 2), [old])


def test_the_fingerprint_changes_with_every_parameter_and_names_what_changed():
    base = {"app_id": "prod", "statistic": {"name": "e", "epsilon": 1.0, "tau": 8}}
    fp = acc.fingerprint(base)
    assert fp == acc.fingerprint({"statistic": {"tau": 8, "epsilon": 1.0, "name": "e"},
                                  "app_id": "prod"})  # fmt: skip
    changed = {**base, "statistic": {**base["statistic"], "epsilon": 0.5}}
    assert acc.fingerprint(changed) != fp
    assert acc.fingerprint({**base, "app_id": "staging"}) != fp
    assert acc.changed_fields(base, changed) == ["statistic.epsilon"]
    assert acc.changed_fields(base, {**base, "neighbours": "any_subset"}) == ["neighbours"]


def test_a_whole_user_mean_is_charged_its_epsilon_for_both_counters():
    # epsilon 1 split in half; m = 8 kept samples of R = 1024 units: sensitivities 8 and
    # 8 * 1024 = 8192 per tree level.
    charge = acc.charge_of(mean("latency"), "whole_user")
    assert charge.epsilon == 1 and charge.relation == "whole_user"
    assert not charge.exact_counts and not charge.per_epoch
    assert charge.basis == (
        "whole-user mean: kept-samples counter at 0.5 (sensitivity 8) + grid-units counter "
        "at 0.5 (sensitivity 8192), tree counters over the whole infinite stream"
    )


def test_any_subset_doubles_both_sensitivities_of_the_whole_user_mean():
    # m = 3, R = 10, epsilon 0.5: 2 * 3 = 6 and 2 * 3 * 10 = 60 at 0.25 each.
    charge = acc.charge_of(mean("latency", Fraction(1, 2), m=3, resolution=10), "any_subset")
    assert charge.epsilon == Fraction(1, 2) and charge.relation == "any_subset"
    assert "counter at 0.25 (sensitivity 6)" in charge.basis
    assert "counter at 0.25 (sensitivity 60)" in charge.basis


def test_the_review_reproduction_composes_a_count_and_a_whole_user_mean():
    # Item 3: a count with tau 8 and a default mean with m = 8 over the same events, one
    # total: 1 + 1 = 2 (basic composition), no exact count anywhere.
    pair = [count("events"), mean("latency")]
    out = acc.statement("p", pair, "whole_user", False, 2)
    assert out.per_user_total == 2 and out.relation == "whole_user"
    assert not any(c.exact_counts for c in out.charges)
    lines = out.describe()
    assert lines[2].startswith("  latency: 1 (whole_user; whole-user mean:")
    assert lines[-1].startswith("  one user can lose at most 2 over the whole stream")
    with pytest.raises(StatementError) as info:  # 2 > 1.5
        acc.statement("p", pair, "whole_user", False, Fraction(3, 2))
    assert info.value.field == "privacy.total_epsilon"
    # With strict cells (B = 2 per epoch) and under any_subset: 1 + 1/2 + 2B per epoch.
    three = [count("events"), mean("latency", Fraction(1, 2)), cells("speed", Fraction(2), False)]
    out = acc.statement("p", three, "any_subset", False, Fraction(11, 2))
    assert out.per_user_total == Fraction(11, 2) and out.per_epoch
    assert [c.relation for c in out.charges] == ["any_subset"] * 3


# ---------------------------------------------------------------------------------------
# zCDP accounting


def gaussian_count(name: str, rho: Fraction, tau: int = 4) -> StatisticTerms:
    """A fixed-tau count under privacy.accounting: zcdp (config's terms)."""
    return StatisticTerms(
        name, "count", Fraction(0), mechanism="sqrt_factorization", rho=rho, sensitivity=tau
    )


def test_a_zcdp_count_is_charged_its_rho_at_its_user_level_sensitivity():
    rho = Fraction(1, 8)
    charge = acc.charge_of(gaussian_count("views", rho), "whole_user", 1e-6)
    assert charge.rho == rho and charge.delta == 1e-6
    assert float(charge.epsilon) == pytest.approx(acc.zcdp.epsilon_cks(rho, 1e-6), rel=1e-12)
    # By hand: Delta = tau ||c||_2, ||c||_2^2 = 1 + sum_{i,k} w_i w_k / (1 - t_i t_k) of
    # the BLT; sigma^2 = Delta^2 / (2 rho) up to the fixed point's and the lattice's slack
    # (below 1e-9 relative) and the rounding up to 2^-32.
    spec = acc.sqrt_counter(gaussian_count("views", rho), "whole_user")
    decay, weight = sqrt_factorization.sqrt_blt(sqrt_factorization.DEFAULT_HORIZON)
    norm2 = 1 + sum(
        wi * wk / (1 - ti * tk)
        for ti, wi in zip(decay, weight, strict=True)
        for tk, wk in zip(decay, weight, strict=True)
    )
    assert spec.sensitivity == 4
    assert float(spec.sigma2) == pytest.approx(float(16 * norm2 / (2 * rho)), rel=1e-9)
    assert sqrt_factorization.rho_spent(spec) <= rho
    assert f"= 4 x {float(norm2) ** 0.5:.4f}" in charge.basis
    # Under any_subset the leaves' sensitivity doubles, the charge does not.
    doubled = acc.sqrt_counter(gaussian_count("views", rho), "any_subset")
    assert doubled.sensitivity == 8 and doubled.sigma2 > 3.9 * spec.sigma2
    assert acc.charge_of(gaussian_count("views", rho), "any_subset", 1e-6).rho == rho


def test_zcdp_composition_adds_rhos_and_states_the_epsilon_at_delta():
    stats = [gaussian_count("a", Fraction(1, 8)), gaussian_count("b", Fraction(1, 4))]
    out = acc.statement("z", stats, "whole_user", False, None, total_rho=Fraction(1, 2), delta=1e-6)
    assert out.rho_total == Fraction(3, 8)
    assert float(out.per_user_total) == pytest.approx(acc.zcdp.epsilon_cks(0.375, 1e-6))
    assert float(out.total_epsilon) == pytest.approx(acc.zcdp.epsilon_cks(0.5, 1e-6))
    as_json = out.to_json()
    assert as_json["accounting"] == "zcdp" and as_json["rho_total"] == 0.375
    assert as_json["total_rho"] == 0.5 and as_json["delta"] == 1e-6
    assert [c["rho"] for c in as_json["statistics"]] == [0.125, 0.25]
    assert acc.Charge.from_json(as_json["statistics"][1]) == out.charges[1]
    # Exactly at the total is allowed; a hair above is refused, naming the field.
    acc.statement("z", stats, "whole_user", False, None, total_rho=Fraction(3, 8), delta=1e-6)
    with pytest.raises(StatementError, match=r"^privacy.total_rho: statistics spend rho=0.375"):
        acc.statement(
            "z", stats, "whole_user", False, None, total_rho=Fraction(37, 100), delta=1e-6
        )


def test_a_retired_pure_charge_counts_epsilon_squared_over_two_under_zcdp():
    old = acc.charge_of(count("events_v1", Fraction(1, 2)), "whole_user")
    out = acc.statement(
        "z",
        [gaussian_count("a", Fraction(1, 8))],
        "whole_user",
        False,
        None,
        retired=[old],
        total_rho=Fraction(1),
        delta=1e-6,
    )
    assert out.rho_total == Fraction(1, 8) + Fraction(1, 8)  # (1/2)^2 / 2: Bun-Steinke 1.4


def test_a_pure_statement_cannot_cover_a_zcdp_charge():
    zcdp_charge = acc.charge_of(gaussian_count("a", Fraction(1, 8)), "whole_user", 1e-6)
    with pytest.raises(StatementError, match=r"^privacy.accounting: 'a' is charged in rho-zCDP"):
        acc.statement("p", [count("b")], "whole_user", False, ONE * 3, retired=[zcdp_charge])
