"""A fixed-tau count or sum under privacy.accounting: zcdp (statistics/fixed_tau.py): the
square-root factorization counter through the kind's contract, its releases' fields, exact
with zero noise, keyed and replay-safe, its std the exact one."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import orjson
import pytest

from dpstream.config.schema import parse_config
from dpstream.operators.accounting import zcdp
from dpstream.operators.noise import KeyedNoise, ScopedNoise, SeededNoise, ZeroNoise
from dpstream.operators.trees import sqrt_factorization
from dpstream.pipeline.tools.replay import replay
from dpstream.statistics.registry import statistic_for
from dpstream.statistics.weights import KEPT_UNITS

TAU, FIRST_TICK, TICKS = 3, 100, 30


def config(mode: str = "insecure_zero", neighbours: str = "whole_user") -> dict:
    return {
        "input": {"partitions": 2},
        "noise": {"mode": mode, **({"key_env": "K"} if mode == "keyed" else {})},
        "privacy": {
            "accounting": "zcdp",
            "total_rho": 1.0,
            "delta": 1e-7,
            "neighbours": neighbours,
        },
        "statistics": [
            {"name": "events", "rho": 0.25, "tau": TAU},
            {"name": "spend", "kind": "sum", "rho": 0.5, "tau": 20, "max_value": 9},
        ],
    }


def traffic(seed: int) -> list[list[tuple[str, int]]]:
    """(user, value) per tick: a few heavy users pass tau early, quiet ticks between."""
    rng = random.Random(seed)
    return [
        [(f"u{min(rng.randrange(12), rng.randrange(12))}", rng.randint(1, 9)) for _ in range(n)]
        for n in (rng.choice([0, 0, 1, 3, 8]) for _ in range(TICKS))
    ]


def log_of(ticks: list[list[tuple[str, int]]]) -> list[bytes]:
    lines = []
    for t, tick in enumerate(ticks):
        lines += [orjson.dumps({"user_id": u, "value": v}) for u, v in tick]
        lines.append(orjson.dumps({"tick": FIRST_TICK + t}))
    return lines


def truncated(ticks: list[list[tuple[str, int]]]) -> dict[str, list[int]]:
    """By the definition: each user's first tau events (a sum's first 20 value units)."""
    events: dict[str, int] = {}
    units: dict[str, int] = {}
    count = total = 0
    out: dict[str, list[int]] = {"events": [], "spend": []}
    for tick in ticks:
        for user, value in tick:
            kept = min(value, 20 - units.get(user, 0))
            units[user] = units.get(user, 0) + kept
            total += kept
            events[user] = events.get(user, 0) + 1
            count += events[user] <= TAU
        out["events"].append(count)
        out["spend"].append(total)
    return out


def by_statistic(releases) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in releases:
        out.setdefault(r["statistic"], []).append(r)
    return out


def test_zero_noise_releases_the_truncated_values_exactly_with_the_exact_std():
    ticks = traffic(seed=1)
    cfg = parse_config(config())
    out = by_statistic(replay(cfg, log_of(ticks), ZeroNoise()))
    exact = truncated(ticks)
    assert exact["events"][-1] > 10 and exact["spend"][-1] > 50
    charges = {c.statistic: c for c in cfg.privacy_statement().charges}
    for name, releases in out.items():
        spec = statistic_for(next(s for s in cfg.statistics if s.name == name), cfg).spec
        assert [r["value"] for r in releases] == [r["unbiased"] for r in releases]
        assert [r["value"] for r in releases] == exact[name]
        for step, release in enumerate(releases, start=1):
            assert release["step"] == step
            assert release["std"] == math.sqrt(sqrt_factorization.variance(spec, step))
            h = sqrt_factorization.half_width(spec, step)
            assert release["interval"] == [max(release["value"] - h, 0), release["value"] + h]
            assert release["mechanism"] == "sqrt_factorization" and release["tree"] is None
            assert release["accounting"] == "zcdp" and release["noise"] == "discrete_gaussian"
            assert release["rho"] == float(charges[name].rho) and release["delta"] == 1e-7
            assert release["epsilon"] == pytest.approx(
                zcdp.epsilon_cks(charges[name].rho, 1e-7), rel=1e-12
            )


@pytest.mark.parametrize(("neighbours", "factor"), [("whole_user", 1), ("any_subset", 2)])
def test_the_counter_s_sensitivity_is_what_stage_1_lets_one_user_move(neighbours, factor):
    cfg = parse_config(config(neighbours=neighbours))
    events, spend = (statistic_for(s, cfg).spec for s in cfg.statistics)
    # A count keeps tau events per user; a max_value sum tau value units per user.
    assert (events.sensitivity, spend.sensitivity) == (factor * TAU, factor * 20)
    assert (events.rho, spend.rho) == (Fraction(1, 4), Fraction(1, 2))


def test_keyed_noise_is_scoped_replay_safe_and_never_redrawn():
    ticks = traffic(seed=2)
    cfg = parse_config(config("keyed"))
    key = KeyedNoise(bytes(range(32)))
    first = list(replay(cfg, log_of(ticks), key))
    again = list(replay(cfg, log_of(ticks), KeyedNoise(bytes(range(32)))))
    assert first == again  # the same key and identity: the same releases, byte for byte
    other = list(replay(cfg, log_of(ticks), KeyedNoise(bytes(range(1, 33)))))
    exact = truncated(ticks)
    for name, releases in by_statistic(first).items():
        noisy = [r["unbiased"] for r in releases]
        assert sum(v != e for v, e in zip(noisy, exact[name], strict=True)) > TICKS // 2
        assert noisy != [r["unbiased"] for r in by_statistic(other)[name]]
        assert all(r["value"] >= 0 and "insecure" not in r for r in releases)


@pytest.mark.statistical
def test_the_released_noise_has_the_exact_std():
    # The kind's step over many independent seeded noise streams: run i stops at step
    # t_i = 1 + i mod 6, so the samples are independent; each z = (unbiased - exact) / std
    # has mean 0 and variance 1. With n = 3000, a sample variance of Gaussian-tailed z is
    # within 5 sqrt(2 / n) = 0.13 of 1, and the mean within 5 / sqrt(n) = 0.09 of 0, but
    # with probability about 1e-6.
    cfg = parse_config(config("keyed"))
    stat = statistic_for(cfg.statistics[0], cfg)
    n, horizon = 3000, 6
    zs = []
    weights = [0, 2, 5, 0, 1, 3]
    for i in range(n):
        noise = ScopedNoise(SeededNoise(1000 + i), ("test", i))
        state = None
        for t in range(1 + i % horizon):
            step = stat.step(state, {KEPT_UNITS: weights[t]} if weights[t] else None, t, noise)
            state = step.state
        (release,) = step.releases
        zs.append((release["unbiased"] - sum(weights[: t + 1])) / release["std"])
    mean = sum(zs) / n
    variance = sum((z - mean) ** 2 for z in zs) / (n - 1)
    assert abs(mean) < 5 / math.sqrt(n)
    assert abs(variance - 1) < 5 * math.sqrt(2 / n)


@pytest.mark.parametrize("neighbours", ["whole_user", "any_subset"])
def test_one_user_moves_the_counter_s_leaves_by_at_most_its_sensitivity(neighbours):
    # Exhaustively on a small stream: every subset of user u0's events dropped (any_subset;
    # all of them under whole_user), the kept leaves (the zero-noise releases' increments)
    # move by at most the Delta_1 the counter is calibrated to, in L1, and the bound is
    # attained.
    stream = [
        [("u0", 4), ("u1", 9), ("u0", 9)],
        [("u1", 2), ("u0", 3)],
        [("u0", 7), ("u1", 5)],
        [("u0", 9), ("u1", 9), ("u0", 8)],
    ]
    mine = [(t, i) for t, tick in enumerate(stream) for i, (u, _) in enumerate(tick) if u == "u0"]
    cfg = parse_config(config(neighbours=neighbours))
    bounds = {s.name: statistic_for(s, cfg).spec.sensitivity for s in cfg.statistics}

    def leaves(dropped: set) -> dict[str, list[int]]:
        kept = [
            [e for i, e in enumerate(tick) if (t, i) not in dropped]
            for t, tick in enumerate(stream)
        ]
        out = by_statistic(replay(cfg, log_of(kept), ZeroNoise()))
        sums = {n: [0] + [r["value"] for r in rs] for n, rs in out.items()}
        return {n: [b - a for a, b in itertools.pairwise(v)] for n, v in sums.items()}

    full = leaves(set())
    subsets = (
        [set(mine)]
        if neighbours == "whole_user"
        else [{e for j, e in enumerate(mine) if mask >> j & 1} for mask in range(1 << len(mine))]
    )
    largest = dict.fromkeys(bounds, 0)
    for dropped in subsets:
        for name, moved in leaves(dropped).items():
            distance = sum(abs(a - b) for a, b in zip(full[name], moved, strict=True))
            assert distance <= bounds[name], (name, dropped)
            largest[name] = max(largest[name], distance)
    # Attained by the count under both relations (under any_subset: u0's first three
    # events dropped, its last three kept instead, at other ticks); the sum's 20 units
    # (40 sent) as far as this stream reaches.
    assert largest["events"] == bounds["events"]
    assert largest["spend"] >= bounds["spend"] // 2
