"""privacy.accounting: zcdp in the config (config/schema.py, config/statistic.py): each
accounting's budget fields and no other's, what zCDP runs, and the statement check-config prints."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.config.statistic import DEFAULT_DELTA
from dpstream.operators.accounting import zcdp
from dpstream.statistics import identity
from tests.config_builders import MINIMAL

ZCDP: dict[str, Any] = {
    "privacy": {"accounting": "zcdp", "total_rho": 0.5},
    "statistics": [
        {"name": "events", "rho": 0.125, "tau": 4},
        {"name": "revenue", "kind": "sum", "rho": 0.25, "tau": 10, "max_value": 100},
    ],
}


def zcdp_config(privacy: dict[str, Any] | None = None, **stat0: Any) -> dict[str, Any]:
    """``ZCDP`` with ``privacy`` fields and its first statistic's fields changed (None
    removes one)."""
    data = copy.deepcopy(ZCDP)
    data["privacy"].update(privacy or {})
    data["privacy"] = {k: v for k, v in data["privacy"].items() if v is not None}
    data["statistics"][0].update(stat0)
    data["statistics"][0] = {k: v for k, v in data["statistics"][0].items() if v is not None}
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            zcdp_config(epsilon=1.0, rho=None),
            "statistics[0] (events).epsilon: does not apply with privacy.accounting: zcdp; "
            "give rho",
        ),
        (zcdp_config(epsilon=1.0), "statistics[0] (events).rho: give epsilon (pure DP) or rho"),
        (
            zcdp_config(rho=None),
            "statistics[0] (events).epsilon: required (rho instead under privacy.accounting",
        ),
        (
            zcdp_config({"total_epsilon": 2.0}),
            "privacy.total_epsilon: does not apply with accounting: zcdp",
        ),
        (
            zcdp_config({"cross_pipeline_epsilon": 2.0}),
            "privacy.cross_pipeline_epsilon: does not apply with accounting: zcdp",
        ),
        (zcdp_config({"total_rho": None}), "privacy.total_rho: required with accounting: zcdp"),
        (
            zcdp_config(kind="histogram", bins=4, tau="auto"),
            "statistics[0] (events).kind: histogram has no zCDP mechanism; privacy.accounting: "
            "zcdp runs count and sum with a fixed tau",
        ),
        (
            zcdp_config(tau=None),  # tau: auto by default
            "statistics[0] (events).tau: privacy.accounting: zcdp needs a fixed tau",
        ),
        (
            zcdp_config(mechanism="kary_subtract", k=13),
            "statistics[0] (events).mechanism: kary_subtract adds Laplace noise (pure DP)",
        ),
        (
            zcdp_config({"total_rho": 0.3}),
            "privacy.total_rho: statistics spend rho=0.375 in total (events 0.125, revenue "
            "0.25), more than total_rho=0.3",
        ),
        (
            {**MINIMAL, "privacy": {"total_epsilon": 2.0, "total_rho": 1.0}},
            "privacy.total_rho: applies only with accounting: zcdp",
        ),
        (
            {**MINIMAL, "privacy": {"total_epsilon": 2.0, "delta": 1e-9}},
            "privacy.delta: applies only with accounting: zcdp",
        ),
        (
            {**MINIMAL, "statistics": [{"name": "events", "rho": 0.1, "tau": 4}]},
            "statistics[0] (events).rho: applies only with privacy.accounting: zcdp",
        ),
        (
            {
                **MINIMAL,
                "statistics": [
                    {"name": "events", "epsilon": 1.0, "tau": 4, "mechanism": "sqrt_factorization"}
                ],
            },
            "statistics[0] (events).mechanism: sqrt_factorization (Gaussian noise) runs only "
            "with privacy.accounting: zcdp",
        ),
    ],
)
def test_each_accounting_refuses_the_other_s_fields_naming_them(data, message):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)


def test_the_statement_states_rho_and_the_epsilon_delta_it_implies():
    cfg = parse_config(ZCDP)
    statement = cfg.privacy_statement()
    assert statement.rho_total == pytest.approx(0.375) and statement.delta == DEFAULT_DELTA
    lines = "\n".join(statement.describe())
    # By hand, Bun-Steinke Prop. 1.3: 0.375 + 2 sqrt(0.375 ln 10^6) = 0.375 + 2 x 2.27615
    # = 4.9273; Canonne-Kamath-Steinke's is the least epsilon whose delta is <= 10^-6.
    cks = zcdp.epsilon_cks(0.375, 1e-6)
    assert zcdp.delta_cks(0.375, cks) <= 1e-6 < zcdp.delta_cks(0.375, cks * (1 - 1e-6))
    assert 4.3 < cks < 4.9273
    assert f"({cks:.4g}, 1e-06)-DP at delta=1e-06 (Canonne-Kamath-Steinke 2020" in lines
    assert "Prop. 1.3 gives epsilon 4.927" in lines
    assert "one user can lose at most rho=0.375" in lines and "total_rho=0.5" in lines
    # A delta of its own.
    other = parse_config(zcdp_config({"delta": 1e-9})).privacy_statement()
    assert float(other.per_user_total) == pytest.approx(zcdp.epsilon_cks(0.375, 1e-9), rel=1e-9)


def test_mechanism_auto_or_none_runs_the_square_root_factorization():
    cfg = parse_config(zcdp_config(mechanism="auto", horizon_ticks=1000))
    named = parse_config(zcdp_config(mechanism="sqrt_factorization", horizon_ticks=1000))
    fingerprints = [identity.fingerprint(c.statistics[0], c) for c in (cfg, named)]
    assert fingerprints[0] == fingerprints[1]  # auto resolves to it: the same statistic
    params = identity.identity_parameters(cfg.statistics[0], cfg)
    assert params["accounting"] == "zcdp"
    assert params["algorithm"] == {
        "mechanism": "sqrt_factorization",
        "accounting": "zcdp",
        "design_horizon": 1000,
        "versions": {"truncation": 1, "sqrt_factorization": 1, "discrete_gaussian": 1},
    }


def test_a_zcdp_statistic_never_shares_a_fingerprint_with_a_pure_one():
    pure = parse_config(MINIMAL)
    zcdp_cfg = parse_config(
        {"privacy": {"accounting": "zcdp", "total_rho": 1.0}, "statistics": [ZCDP["statistics"][0]]}
    )
    assert "accounting" not in identity.identity_parameters(pure.statistics[0], pure)
    assert identity.fingerprint(pure.statistics[0], pure) != identity.fingerprint(
        zcdp_cfg.statistics[0], zcdp_cfg
    )
    # The rho is part of the identity.
    other = parse_config(zcdp_config(rho=0.0625))
    assert identity.fingerprint(other.statistics[0], other) != identity.fingerprint(
        parse_config(ZCDP).statistics[0], parse_config(ZCDP)
    )
