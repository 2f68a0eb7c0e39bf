"""The registry of kinds (statistics/registry.py): it names the config's kinds, each with a
module that builds, describes and identifies it, checked at import; every implementation
satisfies the ``Statistic`` contract in the form its stage 1 takes; no other module
compares kind names."""

from __future__ import annotations

import ast
import inspect
import types
import typing
from fractions import Fraction
from pathlib import Path

import pytest

from dpstream.config.schema import parse_config
from dpstream.config.statistic import KINDS, Kind, Mechanism
from dpstream.operators.noise import ZeroNoise
from dpstream.operators.user_level import counter as ul
from dpstream.operators.user_level import svt
from dpstream.statistics import registry
from dpstream.statistics.bounding import UnitBounding
from dpstream.statistics.contract import PerUserStatistic, Report, StatisticBase, Step
from dpstream.statistics.identity import fingerprint, identity_parameters
from dpstream.statistics.registry import (
    KIND_FUNCTIONS,
    REGISTRY,
    check_registry,
    default_tree,
    describe,
    identity,
    statistic_for,
)
from dpstream.statistics.releases import INTERVAL_OF

MECHANISMS = typing.get_args(Mechanism)

ROOT = Path(__file__).resolve().parents[2]

CELLS = {
    "field": "cell",
    "slot_ticks": 1,
    "lower": 0,
    "upper": 10,
    "step": 1,
    "mechanism": "baseline",
    "counts_public": True,
    "epoch_slots": 4,
    "epoch_cap": 10,
}
MEAN = {"max_samples_per_user": 2, "lower": 0, "upper": 10}

# One statistic per form of each kind: (statistic, privacy settings).
CASES = [
    ({"kind": "count", "tau": 2}, {}),
    ({"kind": "count", "tau": 2, "mechanism": "expiring", "lam": 0.5, "horizon_ticks": 8}, {}),
    ({"kind": "count", "tau": "auto"}, {}),
    ({"kind": "count", "tau": "auto", "deletions": True}, {}),
    ({"kind": "sum", "tau": 3, "max_value": 2}, {}),
    ({"kind": "sum", "tau": "auto", "max_value": 2}, {}),
    ({"kind": "histogram", "tau": "auto", "bins": 3}, {}),
    ({"kind": "kselect", "tau": "auto", "bins": 4, "rank": "median"}, {}),
    ({"kind": "distinct", "tau": "auto"}, {}),
    ({"kind": "mean", "mean": MEAN}, {}),
    ({"kind": "mean", "mean": {**MEAN, "max_users": 4}}, {"public_counts": True}),
    ({"kind": "cell_mean", "cells": CELLS}, {"public_counts": True}),
]


def config(stat: dict, privacy: dict):
    return parse_config(
        {
            "input": {"partitions": 2},
            "noise": {"mode": "insecure_zero"},
            "privacy": {"total_epsilon": 50.0, **privacy},
            "statistics": [{"name": "s", "epsilon": 1.0, **stat}],
        }
    )


def test_the_schema_and_the_registry_name_the_same_kinds_and_the_cases_cover_them():
    assert list(typing.get_args(Kind)) == list(KINDS)
    assert set(REGISTRY) == set(KINDS)
    assert {case["kind"] for case, _ in CASES} == set(KINDS)


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_s_modules_have_the_three_functions(kind):
    implementation = REGISTRY[kind]
    for field in implementation.__dataclass_fields__:
        module = getattr(implementation, field)
        # The signatures of the registry's functions that call them: (stat:
        # StatisticConfig, cfg: PipelineConfig); describe returns a str.
        for name, caller in zip(KIND_FUNCTIONS, (statistic_for, describe, identity), strict=True):
            function = getattr(module, name)
            assert inspect.isfunction(function), (module, name)
            got = inspect.signature(function, eval_str=True)
            want = inspect.signature(caller, eval_str=True)
            assert list(got.parameters.values()) == list(want.parameters.values()), (module, name)
        assert inspect.signature(module.describe, eval_str=True).return_annotation is str


def test_a_kind_that_misses_a_function_or_a_line_fails_at_import(monkeypatch):
    check_registry()  # the shipped registry is complete
    broken = types.ModuleType("dpstream.statistics.broken")
    broken.make_statistic = broken.describe = lambda stat, cfg: None  # no identity
    monkeypatch.setitem(REGISTRY, "count", registry.One(broken))
    with pytest.raises(TypeError, match=r"^kind count: dpstream.statistics.broken has no identity"):
        check_registry()
    # A copy without it: deleting from REGISTRY itself would put "count" back last, and the
    # published schemas list the kinds in the registry's order.
    monkeypatch.setattr(registry, "REGISTRY", {k: v for k, v in REGISTRY.items() if k != "count"})
    with pytest.raises(TypeError, match=r"the registry's kinds .* are not the config's"):
        check_registry()


def _methods(protocol: type) -> set[str]:
    return {
        name
        for name, v in vars(protocol).items()
        if inspect.isfunction(v) and not name.startswith("__")
    }


PER_USER = _methods(PerUserStatistic)


@pytest.mark.parametrize(("stat", "privacy"), CASES, ids=lambda x: str(x))
def test_every_implementation_satisfies_the_contract(stat, privacy):
    cfg = config(stat, privacy)
    impl = statistic_for(cfg.statistics[0], cfg)
    assert impl.name == "s"
    assert isinstance(impl.mechanism, str) and impl.mechanism
    assert impl.neighbours is None or isinstance(impl.neighbours, str)
    assert impl.lifetime_steps is None or impl.lifetime_steps > 0
    stage2 = _methods(StatisticBase)
    assert stage2 == {"parts", "merge", "step", "ledger_start", "accuracy"}
    # What every release states of its interval and its tree (releases.py).
    assert impl.interval_of in INTERVAL_OF
    assert impl.tree is None or (impl.tree[0] in MECHANISMS and impl.tree[1] >= 2)
    ticks = (10, 1000)
    plan = impl.accuracy(ticks)
    assert plan.unit and plan.covers
    assert all(len(stds) == len(ticks) for _, stds in plan.rows)
    assert {"counts", "apply", "redo", "close_tick", "scan_order"} == PER_USER
    assert all(callable(getattr(impl, m, None)) for m in stage2), impl
    if impl.bounding is None:  # per-user state: stage 1 is the statistic's own methods
        assert all(callable(getattr(impl, m, None)) for m in PER_USER), impl
    else:
        assert impl.bounding.name == "s"
        assert isinstance(impl.bounding, UnitBounding)
    # An empty first tick: one typed step, whose state stage 2 can store as JSON.
    assert impl.parts(Report("s", 0, 0, 0, {})) == []
    step = impl.step(None, None, 0, ZeroNoise())
    assert isinstance(step, Step)
    assert all(isinstance(fields, dict) for fields in step.releases + step.ledger)
    first = impl.ledger_start({"tau": stat.get("tau"), "note": "common"})
    assert isinstance(first, dict) and "note" in first
    assert describe(cfg.statistics[0], cfg)


def kind_comparisons(source: str) -> list[int]:
    """The lines of ``source`` that compare something with a kind's name (``== "sum"``,
    ``in ("count", "sum")``)."""
    names = set(KINDS)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            values = (
                operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            )
            if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                found.append(node.lineno)
    return found


def test_only_config_validation_and_the_registry_compare_kind_names():
    # A kind dispatched by branching (`if stat.kind == "sum"`) in a module that does not
    # own it still runs, wrongly, for a new kind that misses the branch: a kind is one
    # module and one registry line (docs/architecture.md).
    # (The operators take the papers' statistics as their own parameters, e.g. the
    # deletions' "histogram"; the accountant, which charges the kinds, is checked.)
    allowed = {ROOT / "config" / "schema.py", ROOT / "statistics" / "registry.py"}
    for folder in ("operators/accounting", "statistics", "pipeline", "config"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path not in allowed:
                assert kind_comparisons(path.read_text()) == [], path
    assert kind_comparisons('if stat.kind in ("count", "sum"): pass') == [1]


@pytest.mark.parametrize(
    ("stat", "tree"),
    [
        ({"tau": 8}, ("kary_subtract", 13)),  # a fixed-tau count without a horizon
        ({"kind": "sum", "tau": 2, "max_value": 9}, ("kary_subtract", 13)),
        ({"tau": 8, "horizon_ticks": 1000}, ("binary", None)),  # names auto to choose
        ({"tau": "auto"}, ("kary_subtract", 13)),  # tau: auto's instances
        ({"kind": "histogram", "tau": "auto", "bins": 4}, ("kary_subtract", 13)),
        ({"tau": "auto", "deletions": True}, ("kary_subtract", 13)),
        ({"kind": "distinct", "tau": "auto"}, ("binary", None)),  # runs the binary tree only
        ({"kind": "kselect", "tau": "auto", "bins": 4, "rank": 1}, ("binary", None)),
        ({"kind": "mean", "mean": {"max_samples_per_user": 4}}, ("binary", None)),
    ],
)
def test_a_new_statistic_that_names_no_mechanism_gets_the_default_tree(stat, tree):
    cfg = config(stat, {})
    assert cfg.statistics[0].mechanism is None
    assert default_tree(cfg.statistics[0]) == tree
    # The identity records that tree as if it were named (so one that ran before the
    # default changed, which recorded "binary", is recognised: tests/pipeline/worker).
    recorded = identity_parameters(cfg.statistics[0], cfg)["statistic"]
    assert (recorded["mechanism"], recorded["k"]) == tree
    if "mean" in stat:
        return  # a mean names no mechanism (its own), and recorded binary before too
    named = config({**stat, "mechanism": tree[0], **({"k": tree[1]} if tree[1] else {})}, {})
    assert identity_parameters(cfg.statistics[0], cfg) == identity_parameters(
        named.statistics[0], named
    )
    assert statistic_for(cfg.statistics[0], cfg).mechanism == (
        statistic_for(named.statistics[0], named).mechanism
    )


def test_a_statistics_release_shape_is_its_configs_choice():
    from dpstream.statistics.releases import (
        ContinualMeanFields,
        CounterFields,
        UserLevelFields,
        WholeUserMeanFields,
    )

    def shapes(public_counts: bool, *stats: dict) -> list[type]:
        cfg = parse_config({"privacy": {"total_epsilon": 10.0, "public_counts": public_counts},
                            "statistics": list(stats)})  # fmt: skip
        return [registry.release_fields(s, cfg) for s in cfg.statistics]

    fixed = {"name": "a", "kind": "count", "epsilon": 1.0, "tau": 2}
    auto = {"name": "b", "kind": "count", "epsilon": 1.0, "tau": "auto"}
    mean = {"name": "m", "kind": "mean", "epsilon": 1.0,
            "mean": {"lower": 0, "upper": 1, "max_samples_per_user": 2}}  # fmt: skip
    assert shapes(False, fixed, auto, mean) == [CounterFields, UserLevelFields, WholeUserMeanFields]
    public = {**mean, "mean": {**mean["mean"], "max_users": 10}}
    assert shapes(True, public) == [ContinualMeanFields]


# ---------------------------------------------------------------------------------------
# tau: auto's tracker tuning (docs/user-level.md section 6)

# Fingerprints of statistics that ran before the tuning existed, computed with the code
# before it (commit f29f853): resolved against the ledger, they must not change.
PINNED = {
    "views": "dc42fcafb13b9b81fc07753bab6fe531",
    "views_k": "f8034c1fc730ce9bae77c2e9bcc01abc",
    "revenue": "f50425c38467ac13ee308cd19c628964",
    "hist": "9c84467efc2ebf8c7f747141c1c8aaad",
}


def pinned_config():
    return parse_config(
        {
            "privacy": {"total_epsilon": 4},
            "statistics": [
                {"name": "views", "epsilon": 1, "tau": "auto", "mechanism": "binary"},
                {"name": "views_k", "epsilon": 1, "mechanism": "kary_subtract", "k": 13},
                {
                    "name": "revenue",
                    "kind": "sum",
                    "epsilon": 1,
                    "max_value": 5,
                    "mechanism": "binary",
                    "deletions": True,
                },
                {
                    "name": "hist",
                    "kind": "histogram",
                    "bins": 8,
                    "epsilon": 1,
                    "mechanism": "binary",
                    "practical": False,
                },
            ],
        }
    )


def test_statistics_that_ran_keep_their_fingerprint_and_alg5_new_ones_get_the_tuning():
    cfg = pinned_config()
    # What a ledger recorded before the tuning existed: the definition without it.
    ran = {s.name: {"mechanism": s.mechanism, "k": s.k} for s in cfg.statistics}
    kept = registry.with_mechanisms(cfg, ran)
    assert {s.name: fingerprint(s, kept) for s in kept.statistics} == PINNED
    for stat in kept.statistics:
        legacy = registry.legacy_tuning(stat)
        assert {f: getattr(stat, f) for f in registry.TUNING_FIELDS} == legacy
        spec = statistic_for(stat, kept).spec
        side = spec.inserts if stat.deletions else spec
        assert side.tracker_share == Fraction(1, 2) and side.instance_series == "dly"
        assert side.tracker.series == "dly" and side.tracker.start_exponent == (
            6 if stat.practical else 1
        )
    # The same statistics, new to the ledger: the new tuning, in the fingerprint.
    fresh = registry.with_mechanisms(cfg, {})
    for stat in fresh.statistics:
        assert stat.tracker_share == 0.25 and stat.series == "telescoping"
        assert stat.tau_start == (256 if stat.practical else 2)  # hist: practical false
        assert fingerprint(stat, fresh) != PINNED[stat.name]
        definition = identity_parameters(stat, fresh)["statistic"]
        assert definition["tracker_share"] == 0.25 and definition["series"] == "telescoping"
        spec = statistic_for(stat, fresh).spec
        side = spec.inserts if stat.deletions else spec
        epsilon = Fraction(1, 2) if stat.deletions else Fraction(1)  # a side has half
        assert side.tracker.epsilon == epsilon / 4 and ul.instance_budget(side) == epsilon * 3 / 4
        assert svt.tau_start(side.tracker) == stat.tau_start
    # Recorded as resolved, a new statistic keeps its tuning at its next start.
    recorded = {s.name: identity_parameters(s, fresh)["statistic"] for s in fresh.statistics}
    again = registry.with_mechanisms(cfg, recorded)
    assert [fingerprint(s, again) for s in again.statistics] == [
        fingerprint(s, fresh) for s in fresh.statistics
    ]
    # Named at Alg. 5's values, a new statistic is the old one: same behaviour, same print.
    named = parse_config(
        {
            "privacy": {"total_epsilon": 1},
            "statistics": [
                {"name": "views", "epsilon": 1, "mechanism": "binary"}
                | {"tracker_share": 0.5, "series": "dly", "tau_start": 64}
            ],
        }
    )
    assert fingerprint(named.statistics[0], named) == PINNED["views"]
    histogram = {"name": "h", "kind": "histogram", "bins": 8, "epsilon": 1}
    new = parse_config({"privacy": {"total_epsilon": 1}, "statistics": [histogram]})
    assert registry.resolved(new.statistics[0]).tau_start == 64  # App. C-A's, per bin


@pytest.mark.parametrize(
    ("stat", "message"),
    [
        ({"kind": "kselect", "bins": 4, "rank": "max", "tracker_share": 0.25}, "tracker_share"),
        ({"kind": "distinct", "series": "telescoping"}, "series"),
        ({"tau": 8, "tau_start": 256}, "tau_start"),
        ({"tau_start": 100}, "tau_start: must be a power of two"),
        ({"tracker_share": 1.0}, "tracker_share"),
    ],
)
def test_the_tuning_fields_are_refused_where_they_do_not_apply(stat, message):
    with pytest.raises(ValueError, match=message):
        parse_config({"statistics": [{"name": "s", "epsilon": 1} | stat]})
