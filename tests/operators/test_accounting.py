"""The accountant (operators/accounting.py) against hand-computed statements."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpstream.operators import accounting as acc
from dpstream.operators.accounting import StatementError, StatisticTerms

ONE = Fraction(1)


def count(name: str, epsilon: Fraction = ONE) -> StatisticTerms:
    return StatisticTerms(name, "count", epsilon)


def cells(name: str, epoch_cap: Fraction, counts_public: bool) -> StatisticTerms:
    return StatisticTerms(name, "cell_mean", ONE, epoch_cap=epoch_cap, counts_public=counts_public)


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
    terms = StatisticTerms("views", "count", Fraction("0.05645"), "expiring", Fraction(2), 0, 10**6)
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


def test_any_subset_doubles_sensitivity_and_keeps_the_charges():
    # Item 4: strict cells under any_subset state that relation; the scales double
    # (operators/cell_mean.py), the charge stays B.
    out = acc.statement(
        "p", [count("a"), cells("speed", Fraction(2), False)], "any_subset", False, 3
    )
    assert [c.relation for c in out.charges] == ["any_subset", "any_subset"]
    assert out.per_user_total == 3
    assert acc.sensitivity_multiplier("any_subset") == 2
    assert acc.sensitivity_multiplier("whole_user") == 1


def test_public_counts_statistics_compose_among_themselves():
    mean = StatisticTerms("latency", "mean", Fraction(2))
    out = acc.statement("p", [mean, cells("speed", Fraction(3), True)], "whole_user", True, 5)
    assert out.relation == "public_counts" and out.per_user_total == 5 and out.per_epoch
    assert all(c.exact_counts and c.relation == "public_counts" for c in out.charges)
    assert "PUBLIC COUNTS" in out.describe()[1]


@pytest.mark.parametrize(
    ("statistics", "public_counts", "relation", "field"),
    [
        # Item 3's reproduction: a count with tau 8 beside a mean with m = 8 would release
        # the count's exact truncated value as the mean's sample count.
        ([count("events"), StatisticTerms("latency", "mean", ONE)], False, "whole_user",
         "statistics[1].kind"),
        ([count("events"), StatisticTerms("latency", "mean", ONE)], True, "whole_user",
         "statistics[0]"),
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
