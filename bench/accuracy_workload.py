"""Issue 26's workload, measured before and after the accuracy work (docs/accuracy.md).

2,000 users with Zipf activity, 24,000 events over 8 minutes of 1 s ticks (50 a tick) then
2 quiet minutes; page views (count, tau 16 and tau auto), a purchase revenue sum (tau
auto), an 8-bin histogram (tau auto), epsilon 1 each. Each configuration is replayed in
process (``pipeline.tools.replay``: the worker's code) under several keys; per statistic:
the RMSE of the released value against the truncated value (each user's first tau, or
tau~ as released) and against the true value, the share of negative releases in the
first 60 ticks, and the mean tick-to-tick move at the quiet ticks. "before": the binary
tree and the unbiased estimate (``unbiased``, what ``value`` was); "after": the value
shown, on the tree a new statistic gets. Run: ``python -m bench.accuracy_workload``
(``--alg5``: the tau: auto statistics with Alg. 5's tracker tuning, which a statistic
that ran before the tuning existed keeps; without it, a new statistic's).
"""

from __future__ import annotations

import hashlib
import sys
from collections import defaultdict

import numpy as np
import orjson

from dpstream.config.schema import parse_config
from dpstream.operators.noise import KeyedNoise, ZeroNoise
from dpstream.pipeline.tools.replay import replay
from dpstream.pipeline.tools.synthetic import synthetic_events

USERS, EVENTS, BUSY, QUIET = 2000, 24_000, 480, 120
EARLY = 60
STATS = [
    {"name": "views16", "epsilon": 1.0, "tau": 16},
    {"name": "views_auto", "epsilon": 1.0, "tau": "auto"},
    {"name": "revenue", "kind": "sum", "epsilon": 1.0, "tau": "auto", "max_value": 5},
    {"name": "histogram", "kind": "histogram", "epsilon": 1.0, "tau": "auto", "bins": 8},
]


def workload(seed: int = 0) -> tuple[list[bytes], list[list[dict]]]:
    """(the log: events and tick markers, the events of each tick)."""
    events = list(synthetic_events(USERS, EVENTS, seed=seed))
    per_tick = [events[i * (EVENTS // BUSY) : (i + 1) * (EVENTS // BUSY)] for i in range(BUSY)]
    per_tick += [[] for _ in range(QUIET)]
    lines = []
    for tick, evs in enumerate(per_tick):
        lines += [orjson.dumps(e) for e in evs]
        lines.append(orjson.dumps({"tick": tick}))
    return lines, per_tick


def truth(per_tick: list[list[dict]]) -> list[dict[str, list[int]]]:
    """Per tick: each user's values so far, in order (the true and truncated values)."""
    values: dict[str, list[int]] = defaultdict(list)
    snapshots = []
    for evs in per_tick:
        for e in evs:
            values[e["user_id"]].append(e["value"])
        snapshots.append({u: list(v) for u, v in values.items()})
    return snapshots


def exact(name: str, users: dict[str, list[int]], tau: int | None) -> np.ndarray:
    """The statistic over each user's first ``tau`` events, for the sum each user's first
    ``tau`` units of value (None: everything)."""
    if name == "revenue":
        return np.array([sum(sum(v) if tau is None else min(sum(v), tau) for v in users.values())])
    cut = [v if tau is None else v[:tau] for v in users.values()]
    if name.startswith("views"):
        return np.array([sum(len(v) for v in cut)])
    bins = np.zeros(8, dtype=np.int64)
    for v in cut:
        for x in v:
            bins[x - 1] += 1
    return bins


ALG5 = {"tracker_share": 0.5, "series": "dly", "tau_start": 64}
"""Dong-Luo-Yi Alg. 5's tracker tuning: what a tau: auto statistic that ran before the
tuning existed keeps (docs/user-level.md section 6); ``--alg5`` measures it."""


def config(alg5: bool = False, **named: object):
    stats = [{**s, **named} for s in STATS]
    if alg5:
        stats = [s | ALG5 if s["tau"] == "auto" else s for s in stats]
    return parse_config({"privacy": {"total_epsilon": 4.0}, "statistics": stats})


def by_name(releases) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in releases:
        out[r["statistic"]].append(r)
    return out


def values(r: dict, field: str) -> np.ndarray:
    if "values" in r:
        return np.array(r["unbiased_values" if field == "unbiased" else "values"])
    return np.array([r[field]])


def measure(runs: list[dict[str, list[dict]]], snapshots: list, field: str) -> dict[str, list]:
    """Per statistic: [RMSE vs truncated, RMSE vs true, negative share early, quiet move]."""
    out = {}
    for stat in STATS:
        name = stat["name"]
        err_trunc, err_true, negative, moves = [], [], [], []
        for run in runs:
            previous = None
            for tick, r in enumerate(run[name]):
                v = values(r, field)
                tau = stat["tau"] if stat["tau"] != "auto" else r["tau"]
                err_trunc.append(v - exact(name, snapshots[tick], tau))
                err_true.append(v - exact(name, snapshots[tick], None))
                if tick < EARLY:
                    negative.append(v < 0)
                if tick >= BUSY and previous is not None:
                    moves.append(np.abs(v - previous))
                previous = v
        out[name] = [
            float(np.sqrt(np.mean(np.square(np.concatenate(err_trunc))))),
            float(np.sqrt(np.mean(np.square(np.concatenate(err_true))))),
            float(np.mean(np.concatenate(negative))),
            float(np.mean(np.concatenate(moves))),
        ]
    return out


def check_truncation(lines: list[bytes], snapshots: list) -> None:
    """With zero noise every release is exactly the truncated value this script computes
    (so 'against the truncated value' measures the noise and the post-processing only)."""
    cfg = parse_config(
        {"noise": {"mode": "insecure_zero"}, "privacy": {"total_epsilon": 4.0}, "statistics": STATS}
    )
    for name, rels in by_name(replay(cfg, lines, ZeroNoise())).items():
        stat = next(s for s in STATS if s["name"] == name)
        for tick, r in enumerate(rels):
            tau = stat["tau"] if stat["tau"] != "auto" else r["tau"]
            got, want = values(r, "value"), exact(name, snapshots[tick], tau)
            assert (got == want).all(), (name, tick, got, want)


def main(keys: int = 4, alg5: bool = False) -> None:
    lines, per_tick = workload()
    snapshots = truth(per_tick)
    check_truncation(lines, snapshots)
    rows = {}
    configs = (("binary", config(alg5, mechanism="binary")), ("default", config(alg5)))
    for label, cfg in configs:
        runs = [
            by_name(replay(cfg, lines, KeyedNoise(hashlib.sha256(bytes([i])).digest())))
            for i in range(keys)
        ]
        for field, shown in (("unbiased", "estimate"), ("value", "shown")):
            rows[(label, shown)] = measure(runs, snapshots, field)
    print(
        "| statistic | tree, value | RMSE vs truncated | RMSE vs true | "
        "negative, first 60 ticks | mean move, quiet ticks |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for stat in STATS:
        for (label, shown), table in rows.items():
            t, r, n, m = table[stat["name"]]
            print(
                f"| {stat['name']} | {label}, {shown} | {t:,.0f} | {r:,.0f} | {n:.0%} | {m:,.0f} |"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if a != "--alg5"]
    main(int(numbers[0]) if numbers else 4, "--alg5" in sys.argv[1:])
