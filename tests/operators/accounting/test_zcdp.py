"""zCDP accounting (dpstream.operators.accounting.zcdp): the Gaussian mechanism's rho,
composition, and the conversions to (epsilon, delta), bracketed by the exact privacy
profile of the Gaussian mechanism and the standard bound."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from dpstream.operators.accounting import zcdp
from dpstream.operators.errors import InvalidOperatorConfig


def gaussian_delta(rho: float, epsilon: float) -> float:
    """The exact delta(epsilon) of the continuous Gaussian mechanism with mu = Delta /
    sigma = sqrt(2 rho) (Balle-Wang 2018, Thm. 8): Phi(-eps/mu + mu/2) -
    e^eps Phi(-eps/mu - mu/2). Every rho-zCDP bound must be at least this."""
    mu = math.sqrt(2 * rho)

    def phi(x: float) -> float:
        return math.erfc(-x / math.sqrt(2)) / 2

    return phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * phi(-epsilon / mu - mu / 2)


def test_gaussian_rho_and_sigma2_are_exact_inverses():
    assert zcdp.gaussian_rho(2, 8) == Fraction(1, 4)
    assert zcdp.gaussian_rho(Fraction(3, 2), Fraction(9, 8)) == 1
    for delta, rho in ((1, Fraction(1, 2)), (Fraction(7, 3), Fraction(1, 100)), (64, 3)):
        assert zcdp.gaussian_rho(delta, zcdp.gaussian_sigma2(delta, rho)) == rho


def test_composition_adds():
    assert zcdp.compose([Fraction(1, 4), Fraction(1, 8), 0, 1]) == Fraction(11, 8)
    assert zcdp.compose([]) == 0
    with pytest.raises(InvalidOperatorConfig, match="rho must be an exact rational >= 0"):
        zcdp.compose([Fraction(-1, 2)])
    with pytest.raises(InvalidOperatorConfig, match="rho must be an exact rational >= 0"):
        zcdp.compose([0.5])


def test_bun_steinke_is_the_printed_formula():
    """Prop. 1.3: rho + 2 sqrt(rho ln(1/delta)), never rounded down."""
    for rho, delta in ((Fraction(1, 2), 1e-6), (Fraction(1, 100), 1e-9), (Fraction(3), 1e-5)):
        formula = float(rho) + 2 * math.sqrt(float(rho) * math.log(1 / delta))
        got = zcdp.epsilon_bun_steinke(rho, delta)
        assert formula <= got <= formula * (1 + 1e-11)


@pytest.mark.parametrize("rho", [0.001, 0.025, 0.1, 0.5, 2.0, 10.0])
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 3.0, 8.0])
def test_cks_delta_lies_between_the_gaussian_and_the_standard_bound(rho, epsilon):
    """Valid: at least the Gaussian mechanism's own delta (it is rho-zCDP, so any bound
    from rho must cover it). Tighter: at most Bun-Steinke's exp(-(eps - rho)^2 / (4 rho))."""
    delta = zcdp.delta_cks(rho, epsilon)
    assert gaussian_delta(rho, epsilon) <= delta * (1 + 1e-9) + 1e-300
    if epsilon >= rho:
        assert delta <= math.exp(-((epsilon - rho) ** 2) / (4 * rho)) * (1 + 1e-9)


@pytest.mark.parametrize("rho", [0.005, 0.025, 0.5, 2.63])
@pytest.mark.parametrize("delta", [1e-5, 1e-10])
def test_cks_epsilon_is_the_least_epsilon_for_the_delta(rho, delta):
    epsilon = zcdp.epsilon_cks(rho, delta)
    assert zcdp.delta_cks(rho, epsilon) <= delta
    assert zcdp.delta_cks(rho, epsilon * (1 - 1e-6)) > delta
    assert epsilon < zcdp.epsilon_bun_steinke(rho, delta)
    # and a Gaussian mechanism with that rho does reach (epsilon, delta)
    assert gaussian_delta(rho, epsilon) <= delta


def test_the_tighter_conversion_saves_five_to_fifteen_percent():
    """rho 0.5 at delta 1e-6: epsilon 5.22 against Bun-Steinke's 5.76; rho 2.63 at delta
    1e-10: 17.43 against 18.19."""
    assert zcdp.epsilon_cks(Fraction(1, 2), 1e-6) == pytest.approx(5.2215, abs=1e-4)
    assert zcdp.epsilon_bun_steinke(Fraction(1, 2), 1e-6) == pytest.approx(5.7565, abs=1e-4)
    assert zcdp.epsilon_cks(2.63, 1e-10) == pytest.approx(17.4306, abs=1e-4)
    assert zcdp.epsilon_bun_steinke(2.63, 1e-10) == pytest.approx(18.1938, abs=1e-4)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 1e-6), (1.0, 1e-9), (4.0, 1e-6)])
def test_rho_for_an_epsilon_delta_target(epsilon, delta):
    rho = zcdp.rho_cks(epsilon, delta)
    assert zcdp.delta_cks(rho, epsilon) <= delta
    assert zcdp.delta_cks(rho * (1 + 1e-6), epsilon) > delta
    assert zcdp.epsilon_cks(rho, delta) <= epsilon * (1 + 1e-9)


def test_zero_rho_is_free():
    assert zcdp.delta_cks(0, 1.0) == 0.0
    assert zcdp.epsilon_cks(0, 1e-6) == 0.0
    assert zcdp.epsilon_bun_steinke(0, 1e-6) == 0.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: zcdp.gaussian_rho(0, 1), "sensitivity must be finite and > 0, got 0"),
        (
            lambda: zcdp.gaussian_rho(1.5, 1),
            "sensitivity must be an exact rational (int or Fraction), got 1.5",
        ),
        (lambda: zcdp.gaussian_sigma2(1, -1), "rho must be finite and > 0, got -1"),
        (lambda: zcdp.epsilon_bun_steinke(-0.1, 1e-6), "rho must be finite and >= 0, got -0.1"),
        (lambda: zcdp.epsilon_bun_steinke(0.1, 0), "delta must be in (0, 1), got 0"),
        (lambda: zcdp.delta_cks(0.1, -1), "epsilon must be finite and >= 0, got -1"),
        (lambda: zcdp.epsilon_cks(0.1, 1.5), "delta must be in (0, 1), got 1.5"),
    ],
)
def test_rejects_bad_arguments(call, message):
    with pytest.raises(InvalidOperatorConfig) as info:
        call()
    assert str(info.value) == message
