"""The default kind mean (whole-user mean) in the pipeline: issue 13 item 3's reproduction
no longer reveals the count, zero noise gives both sums exactly, and the config refuses
what only George et al.'s mean means."""

from __future__ import annotations

import copy
import random
from fractions import Fraction

import orjson
import pytest

from dpstream.config.base import ConfigError
from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise, ZeroNoise, clip_to_grid
from dpstream.pipeline.stages.stage1 import Stage1
from dpstream.pipeline.stages.stage1_state import new_partition_state
from dpstream.pipeline.stages.stage2 import Stage2
from dpstream.pipeline.tools.replay import replay
from dpstream.statistics import identity
from dpstream.statistics.contract import Report
from dpstream.statistics.events import Event
from dpstream.statistics.releases import SCHEMA_VERSION

M, R, LOWER, UPPER = 8, 1000, 0.0, 100.0
FIRST_TICK = 100


def reproduction(mode: str = "insecure_zero", partitions: int = 3, **privacy) -> dict:
    """The review's pair: a count with tau 8 and a mean with m = 8 over the same events."""
    return {
        "input": {"partitions": partitions},
        "noise": {"mode": mode},
        "privacy": {"total_epsilon": 2.0, **privacy},
        "statistics": [
            {"name": "events", "epsilon": 1.0, "tau": M},
            {
                "name": "latency",
                "kind": "mean",
                "epsilon": 1.0,
                "mean": {
                    "lower": LOWER,
                    "upper": UPPER,
                    "max_samples_per_user": M,
                    "resolution": R,
                },
            },
        ],
    }


def traffic(seed: int, ticks: int = 24, users: int = 40) -> list[list[tuple[str, str, float]]]:
    """(user, key, value) per tick: heavy users pass m, some values are out of range."""
    rng = random.Random(seed)
    out = []
    for _ in range(ticks):
        tick = []
        for _ in range(rng.randrange(0, 30)):
            user = f"u{min(rng.randrange(users), rng.randrange(users))}"
            tick.append((user, rng.choice(["rtt", "ttfb"]), rng.uniform(-10.0, 110.0)))
        out.append(tick)
    return out


def log_of(ticks) -> list[bytes]:
    lines = []
    for t, tick in enumerate(ticks):
        for user, key, x in tick:
            lines.append(orjson.dumps({"user_id": user, "key": key, "value": x}))
        lines.append(orjson.dumps({"tick": FIRST_TICK + t}))
    return lines


def from_scratch(ticks, key: str | None = None) -> list[tuple[int, int]]:
    """(C, S) after each tick by the definition: every user's first m samples (that the
    statistic counts) in stream order, clipped and snapped, summed."""
    used: dict[str, int] = {}
    c = s = 0
    out = []
    for tick in ticks:
        for user, k, x in tick:
            if key is not None and k != key:
                continue
            used[user] = used.get(user, 0) + 1
            if used[user] <= M:
                c += 1
                s += clip_to_grid(Fraction(0), Fraction(100), R, x)[0]
        out.append((c, s))
    return out


def by_statistic(releases) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in releases:
        out.setdefault(r["statistic"], []).append(r)
    return out


def test_zero_noise_releases_both_sums_exactly():
    ticks = traffic(seed=3)
    out = by_statistic(replay(parse_config(reproduction()), log_of(ticks), ZeroNoise()))
    exact = from_scratch(ticks)
    assert len(out["latency"]) == len(ticks) and exact[-1][0] > 100
    for release, count, (c, s) in zip(out["latency"], out["events"], exact, strict=True):
        assert release["samples"] == c == count["value"]  # the same kept events
        # value = lower + (upper - lower) S / (R C): the same rational, rounded once.
        assert release["value"] == (float(Fraction(s, c) * 100 / R) if c else None)
        assert release["schema_version"] == SCHEMA_VERSION == 5
        assert release["mechanism"] == "whole_user_mean" and release["insecure"]


def test_a_key_filter_keeps_only_the_events_it_counts():
    data = reproduction(partitions=2)
    data["statistics"][1]["key"] = "rtt"
    ticks = traffic(seed=4)
    out = by_statistic(replay(parse_config(data), log_of(ticks), ZeroNoise()))
    for release, (c, s) in zip(out["latency"], from_scratch(ticks, "rtt"), strict=True):
        assert release["samples"] == c
        assert release["value"] == (float(Fraction(s, c) * 100 / R) if c else None)


# Fields a release may carry; none of them is an exact data-dependent number.
RELEASED = {
    "schema_version", "statistic", "kind", "tick", "tick_end", "tick_end_unix", "step",
    "value", "std", "interval", "samples", "samples_std", "samples_interval",
    "max_samples_per_user", "bounds", "confidence", "epsilon", "neighbours", "mechanism",
    "tree", "interval_of", "accounting", "noise",
}  # fmt: skip


def test_the_review_reproduction_no_longer_reveals_the_count():
    # Issue 13 item 3: with tau 8 and m = 8 over the same events the mean's "samples"
    # used to equal the count's exact truncated value. Now both are noised, independently.
    ticks = traffic(seed=5)
    cfg = parse_config(reproduction(mode="keyed"))
    out = by_statistic(replay(cfg, log_of(ticks), KeyedNoise(b"r" * 32)))
    exact = [c for c, _ in from_scratch(ticks)]
    samples = [r["samples"] for r in out["latency"]]
    counts = [r["value"] for r in out["events"]]
    assert all(s != c for s, c in zip(samples, exact, strict=True))
    assert samples != counts
    # The noise is not the count's: the two errors differ at every tick.
    assert all(s - c != n - c for s, n, c in zip(samples, counts, exact, strict=True))
    for r in out["latency"]:
        assert set(r) == RELEASED, set(r) ^ RELEASED
        assert r["neighbours"] == "whole_user" and "public_counts" not in r
    # The statement: one total, both statistics whole-user, nothing exact.
    statement = cfg.privacy_statement().to_json()
    assert statement["per_user_total"] == 2.0 and statement["public_counts"] is False
    assert [s["exact_counts"] for s in statement["statistics"]] == [False, False]


def test_the_mean_is_charged_and_noised_as_the_accountant_says():
    for neighbours, factor in (("whole_user", 1), ("any_subset", 2)):
        cfg = parse_config(reproduction(neighbours=neighbours))
        stat = cfg.statistics[1]
        params = identity.identity_parameters(stat, cfg)
        assert params["mechanism"] == "whole_user_mean"
        assert params["sensitivities"] == [factor * M, factor * M * R]
        (start,) = [e for e in _ledger(cfg) if e["statistic"] == "latency" and "fingerprint" in e]
        assert start["sensitivities"] == [factor * M, factor * M * R]
        assert start["split"] == {"samples": 0.5, "units": 0.5}
        assert start["fingerprint"] == identity.fingerprint(stat, cfg)


def _ledger(cfg) -> list[dict]:
    """Stage 2's ledger entries when the mean's first tick closes."""
    _, ledger = Stage2(cfg, ZeroNoise(), 1).on_report(
        Stage2.new_state(), Report("latency", 0, 5, 5, {})
    )
    return ledger


@pytest.mark.parametrize(
    "change",
    [
        {"public_counts": True},
        {"neighbours": "any_subset"},
        {"max_samples_per_user": 9},
        {"resolution": 1024},
        {"upper": 200.0},
    ],
)
def test_every_parameter_of_the_mean_is_in_its_identity(change):
    def fingerprint(data: dict) -> str:
        cfg = parse_config(data)
        return identity.fingerprint(cfg.statistics[-1], cfg)

    base = reproduction()
    del base["statistics"][0]  # public counts admit no count
    data = copy.deepcopy(base)
    privacy = {k: v for k, v in change.items() if k in ("public_counts", "neighbours")}
    data["privacy"].update(privacy)
    data["statistics"][0]["mean"].update({k: v for k, v in change.items() if k not in privacy})
    if change.get("public_counts"):
        data["statistics"][0]["mean"]["max_users"] = 100
    assert fingerprint(data) != fingerprint(base)


@pytest.mark.parametrize(
    ("privacy", "mean", "message"),
    [
        ({}, {"max_users": 100}, "statistics[1] (latency).mean.max_users: applies only with "
         "privacy.public_counts: true"),
        ({}, {"delta": 0.01}, "statistics[1] (latency).mean.delta: applies only with"),
    ],
)  # fmt: skip
def test_george_et_al_parameters_are_refused_outside_public_counts(privacy, mean, message):
    data = reproduction(**privacy)
    data["statistics"][1]["mean"].update(mean)
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)


def test_george_et_al_mean_still_needs_its_cap_on_users():
    data = reproduction(public_counts=True)
    del data["statistics"][0]
    with pytest.raises(
        ConfigError, match=r"statistics\[0\] \(latency\)\.mean\.max_users: required with"
    ):
        parse_config(data)


def test_stage1_counts_a_redelivered_record_once():
    cfg = parse_config(reproduction(partitions=1))
    stage1 = Stage1(cfg)
    pstate, users = new_partition_state(), {}
    record = [Event("u1", None, 50.0) for _ in range(M + 3)]
    for _ in range(2):  # a re-delivery of offset 0
        stage1.add_events(pstate, users, record, 0, 0)
        pstate["last_offset"] = 0
    assert pstate["pending"]["latency"] == {"c": M, "s": M * R // 2}
    assert users["u1"]["used"] == {"events": M + 3, "latency": M + 3}
