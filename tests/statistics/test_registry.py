"""Every kind of the registry (config/schema.py's ``KINDS``) names a module that builds
and describes it, and every implementation satisfies the ``Statistic`` contract in the
form its stage 1 takes."""

from __future__ import annotations

import importlib
import inspect
import re
import typing

import pytest

from dpstream.config.schema import KINDS, Kind, parse_config
from dpstream.operators.noise import ZeroNoise
from dpstream.statistics.contract import PerUserStatistic, Report, StatisticBase, Step
from dpstream.statistics.counting import UnitCounting
from dpstream.statistics.registry import describe, implementation, statistic_for

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


def test_the_schema_accepts_exactly_the_registry_kinds_and_the_cases_cover_them():
    assert list(typing.get_args(Kind)) == list(KINDS)
    assert {case["kind"] for case, _ in CASES} == set(KINDS)


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_names_a_module_with_both_functions(kind):
    module = importlib.import_module(KINDS[kind].implementation)
    assert implementation(kind) is module
    # The signatures of the functions that call them: (stat: StatisticConfig, cfg:
    # PipelineConfig), and describe returns a str.
    for name, caller in (("make_statistic", statistic_for), ("describe", describe)):
        function = getattr(module, name)
        assert inspect.isfunction(function), (module, name)
        got = inspect.signature(function, eval_str=True)
        want = inspect.signature(caller, eval_str=True)
        assert list(got.parameters.values()) == list(want.parameters.values()), (module, name)
    assert inspect.signature(module.describe, eval_str=True).return_annotation is str


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
    stage2 = _methods(StatisticBase)
    assert stage2 == {"parts", "merge", "step", "ledger_start"}
    assert {"counts", "apply", "redo", "close_tick", "scan_order"} == PER_USER
    assert all(callable(getattr(impl, m, None)) for m in stage2), impl
    if impl.counting is None:  # per-user state: stage 1 is the statistic's own methods
        assert all(callable(getattr(impl, m, None)) for m in PER_USER), impl
    else:
        assert impl.counting.name == "s"
        assert isinstance(impl.counting, UnitCounting)
    # An empty first tick: one typed step, whose state stage 2 can store as JSON.
    assert impl.parts(Report("s", 0, 0, 0, {})) == []
    step = impl.step(None, None, 0, ZeroNoise())
    assert isinstance(step, Step)
    assert all(isinstance(fields, dict) for fields in step.releases + step.ledger)
    first = impl.ledger_start({"tau": stat.get("tau"), "note": "common"})
    assert isinstance(first, dict) and "note" in first
    assert describe(cfg.statistics[0], cfg)


def test_only_the_registry_dispatches_on_a_kind():
    # Stage 1, stage 2 and check-config build and describe statistics through
    # statistics/registry.py; the stages hold no per-kind or per-adapter branch.
    import dpstream.pipeline.stages.stage1 as stages

    source = inspect.getsource(stages)
    assert "isinstance(" not in source
    assert not re.search(r"\.kind (==|!=|in|not in) ", source)
