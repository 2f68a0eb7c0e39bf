"""tau: auto against every fixed tau in hindsight (issue 30 item 2, docs/user-level.md).

For each skewed workload (Zipf user activity with exponents 1.1, 1.5 and 2; the demo's
``pipeline.tools.synthetic`` workload; Dong-Luo-Yi's Table III Zipf workload, scaled), over
a 10^4-tick horizon at epsilon 1: the RMSE of tau: auto's release against the true running
count, and the RMSE of the fixed-tau count for every tau = 2^j up to the largest user's
contribution, each on the tree a new statistic gets (k-ary with subtraction, k = 13).

How it is measured (exactly where it can be, sampled where it must be):

* Stage 1 is simulated with numpy, as the pipeline's columnar bounding computes it: every
  event's rank within its user, its rank band, and the users crossing each power of two.
* A fixed tau's release is the truncated count plus noise independent of the data, so
  its MSE at tick t is exact: the tree's exact variance plus the squared truncation bias.
* tau: auto's release at t is the count truncated at tau~_t plus instance j's noise,
  independent of the tracker's. Given the tracker's path (tau~_t, j_t), the MSE is again
  exact: the instance tree's variance plus the squared bias. Only the tracker is sampled:
  ``operators.user_level.counter.advance_bound`` (the operator's own tracker and instance
  bookkeeping) runs every tick under seeded noise, and the exact conditional MSE is
  averaged over the runs. This is the release's MSE without the variance of sampling the
  instance noise (tests/operators/user_level/test_tau_auto_accuracy.py checks it against
  full noisy runs of ``counter.step``).

Run: ``python -m bench.tau_auto`` (``--runs N``, ``--quick``). Prints the table of
docs/user-level.md section 6, RMSE at the last tick (t = 10^4) and over the whole horizon.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpstream.operators.noise import NodeId
from dpstream.operators.trees import kary_tree
from dpstream.operators.user_level import counter as ul
from dpstream.pipeline.tools.synthetic import synthetic_events

TICKS = 10_000
EPSILON = Fraction(1)
BETA = Fraction(1, 10)
DEFAULT_TREE: tuple[kary_tree.ChosenTree, int] = ("kary_subtract", 13)


# ---------------------------------------------------------------------------------------
# Workloads and the simulated stage 1


@dataclass(frozen=True)
class Workload:
    """A workload after the simulated stage 1; row t - 1 is tick t.

    Attributes:
        name: its label in the table.
        crossings: (T, J) users whose count crossed 2^j in the tick.
        band_totals: (T, B) cumulative units per rank band up to the tick.
        largest: the largest user's contribution at T.
    """

    name: str
    crossings: np.ndarray
    band_totals: np.ndarray
    largest: int

    @property
    def ticks(self) -> int:
        """T, the horizon."""
        return int(self.crossings.shape[0])

    @property
    def checkpoints(self) -> range:
        """Every hundredth of the horizon, T included: where the RMSE over it is taken."""
        step = max(1, self.ticks // 100)
        return range(step, self.ticks + 1, step)

    @property
    def truth(self) -> np.ndarray:
        """The true running count at every tick."""
        return self.band_totals.sum(axis=1)

    def truncated(self, tau: int) -> np.ndarray:
        """The running count with each user's first ``tau`` events (tau a power of two)."""
        return self.band_totals[:, : tau.bit_length()].sum(axis=1)


def stage1(name: str, users: np.ndarray, ticks: int = TICKS) -> Workload:
    """Ranks, bands and crossings of a stream of user ids spread evenly over ``ticks``."""
    n = len(users)
    tick = (np.arange(n) * ticks) // n
    order = np.argsort(users, kind="stable")
    sorted_users = users[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_users)) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = np.arange(n) - run_start + 1
    bands = np.ceil(np.log2(ranks)).astype(np.int64)  # rank_band: 0 for 1, b for (2^(b-1), 2^b]
    bands[ranks == 1] = 0
    width = int(bands.max()) + 1
    per_tick = np.zeros((ticks, width), dtype=np.int64)
    np.add.at(per_tick, (tick, bands), 1)
    # A user crosses 2^j (from <= 2^j to > 2^j) at its event of rank 2^j + 1.
    above = ranks - 1
    crossing = (above >= 1) & ((above & (above - 1)) == 0)
    j = np.log2(np.maximum(above, 1)).astype(np.int64)
    crossings = np.zeros((ticks, width), dtype=np.int64)
    np.add.at(crossings, (tick[crossing], j[crossing]), 1)
    return Workload(name, crossings, np.cumsum(per_tick, axis=0), int(ranks.max()))


def zipf_users(exponent: float, users: int, events: int, seed: int) -> np.ndarray:
    """Each event's user drawn with probability proportional to 1 / rank^exponent."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, users + 1) ** exponent
    return rng.choice(users, size=events, p=weights / weights.sum())


def table3_users(users: int, events: int, seed: int) -> np.ndarray:
    """Dong-Luo-Yi Sec. VII-A's Zipf data, scaled: per-user totals f(x) ~ (x + 10)^-1 on
    [1024], all tokens shuffled, the first ``events`` kept (docs/user-level.md section 5)."""
    rng = np.random.default_rng(seed)
    x = np.arange(1, 1025)
    p = 1.0 / (x + 10.0)
    totals = rng.choice(x, users, p=p / p.sum())
    tokens = np.repeat(np.arange(users), totals)
    rng.shuffle(tokens)
    return tokens[:events]


def workloads(quick: bool = False) -> list[Workload]:
    """The measured workloads (``quick``: a tenth of the events, for a smoke run)."""
    scale = 10 if quick else 1
    out = [
        stage1(f"Zipf {s}", zipf_users(s, 2_000, 200_000 // scale, seed=1)) for s in (1.1, 1.5, 2.0)
    ]
    # The demo's generator (2,000 users, Zipf exponent 0.8) at its 50 events a tick.
    demo = synthetic_events(2_000, 500_000 // scale, seed=0)
    out.append(stage1("demo (Zipf 0.8)", np.array([int(e["user_id"][5:]) for e in demo])))
    out.append(stage1("Table III Zipf / 50", table3_users(20_000, 1_000_000 // scale, seed=2)))
    # Not skewed, not in issue 30's list: what a high tau_1 costs where every user is light.
    light = np.random.default_rng(4).integers(0, 20_000, 100_000 // scale)
    out.append(stage1("light: uniform, 5 a user", light))
    return out


# ---------------------------------------------------------------------------------------
# The tracker's noise and the exact conditional MSE


class MemoNoise:
    """Seeded discrete Laplace draws, one per node (a node asked again gets its draw
    again, as from the keyed production source): the difference of two geometric draws."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._drawn: dict[tuple[NodeId, Fraction], int] = {}

    def discrete_laplace(self, node: NodeId, scale: Fraction) -> int:
        key = (node, scale)
        value = self._drawn.get(key)
        if value is None:
            p = -math.expm1(-1 / float(scale))
            value = int(self._rng.geometric(p)) - int(self._rng.geometric(p))
            self._drawn[key] = value
        return value

    def discrete_gaussian(
        self, node: NodeId, sigma2: Fraction, center: Fraction = Fraction(0)
    ) -> int:
        raise NotImplementedError("the tracker draws discrete Laplace noise only")


def variance_of(spec: ul.UserLevelSpec, t: int, instance: int, tau: int) -> float:
    """Exact variance of instance j's release at t with bound tau (any tree)."""
    if spec.tree == ul.BINARY:
        return ul.release_std(spec, t, instance, tau) ** 2
    return kary_tree.variance(ul.instance_tree(spec, instance, tau), t)


def fixed_variance(tau: int, t: int, tree: tuple[kary_tree.ChosenTree, int]) -> float:
    """Exact variance of a fixed-tau count at t: Alg. 3 on ``tree`` (the k-ary counter
    with sensitivity tau; k = 2 without subtraction for the binary tree) with all of
    epsilon."""
    name, k = ("kary", 2) if tree == ul.BINARY else tree
    counter = kary_tree.make_kary_tree(
        EPSILON, tau, ("fixed",), k, subtract=name == "kary_subtract"
    )
    return kary_tree.variance(counter, t)


@dataclass(frozen=True)
class Result:
    """RMSEs at the last tick and over the checkpoints (every 100th tick)."""

    last: float
    horizon: float


def fixed_results(w: Workload, tree: tuple[kary_tree.ChosenTree, int]) -> dict[int, Result]:
    """Every fixed tau = 2^j up to the largest contribution (and the first power above)."""
    out = {}
    truth = w.truth
    tau = 1
    while True:
        bias = truth - w.truncated(tau)
        mse = [fixed_variance(tau, t, tree) + bias[t - 1] ** 2 for t in w.checkpoints]
        out[tau] = Result(math.sqrt(mse[-1]), math.sqrt(float(np.mean(mse))))
        if tau >= w.largest:
            return out
        tau *= 2


def auto_result(w: Workload, spec: ul.UserLevelSpec, runs: int) -> tuple[Result, list[int]]:
    """tau: auto's RMSE (exact given the tracker's path, averaged over ``runs`` seeded
    paths) and tau~ at T in each run."""
    truth = w.truth
    checkpoints = w.checkpoints
    mse = np.zeros(len(checkpoints))
    final_taus = []
    cache: dict[tuple[int, int, int], float] = {}
    for run in range(runs):
        noise = MemoNoise(seed=1000 + run)
        bound = ul.BoundState()
        c = 0
        for t in range(1, w.ticks + 1):
            row = w.crossings[t - 1]
            bound, _ = ul.advance_bound(spec, bound, [int(x) for x in row], noise)
            if t == checkpoints[c]:
                key = (t, bound.instance, bound.tau)
                if key not in cache:
                    cache[key] = variance_of(spec, t, bound.instance, bound.tau)
                bias = truth[t - 1] - w.truncated(bound.tau)[t - 1]
                mse[c] += cache[key] + bias**2
                c += 1
        final_taus.append(bound.tau)
    mse /= runs
    return Result(math.sqrt(mse[-1]), math.sqrt(float(np.mean(mse)))), final_taus


# ---------------------------------------------------------------------------------------
# Variants of tau: auto and the report


def spec_with(**options: Any) -> ul.UserLevelSpec:
    """A tau: auto count's spec at epsilon 1, beta 0.1 with ``options`` (the operator's)."""
    base: dict[str, Any] = {"practical": True, "tree": DEFAULT_TREE}
    return ul.make_user_level("bench", EPSILON, BETA, **{**base, **options})


def report(ws: Sequence[Workload], variants: dict[str, dict[str, Any]], runs: int) -> None:
    fixed = {w.name: fixed_results(w, DEFAULT_TREE) for w in ws}
    for w in ws:
        best = min(fixed[w.name], key=lambda tau: fixed[w.name][tau].last)
        best_h = min(fixed[w.name], key=lambda tau: fixed[w.name][tau].horizon)
        print(f"\n## {w.name}: largest contribution {w.largest}, true count {int(w.truth[-1]):,}")
        print(
            "fixed tau (RMSE at T / over the horizon): "
            + ", ".join(
                f"{tau}: {r.last:,.0f}/{r.horizon:,.0f}" for tau, r in fixed[w.name].items()
            )
        )
        print(
            f"best fixed at T: tau {best} {fixed[w.name][best].last:,.0f}; over the horizon: "
            f"tau {best_h} {fixed[w.name][best_h].horizon:,.0f}"
        )
        print("| variant | auto RMSE at T | ratio | auto RMSE horizon | ratio | tau~ at T |")
        print("|---|---:|---:|---:|---:|---|")
        for label, options in variants.items():
            result, taus = auto_result(w, spec_with(**options), runs)
            r_last = result.last / fixed[w.name][best].last
            r_h = result.horizon / fixed[w.name][best_h].horizon
            spread = f"{min(taus)}-{max(taus)}" if min(taus) != max(taus) else str(taus[0])
            print(
                f"| {label} | {result.last:,.0f} | {r_last:.2f} | {result.horizon:,.0f} | "
                f"{r_h:.2f} | {spread} |",
                flush=True,
            )


TELESCOPING = {"tracker_series": "telescoping", "instance_series": "telescoping"}
AFTER: dict[str, Any] = {
    "tracker_share": Fraction(1, 4),
    **TELESCOPING,
    "start_exponent": 8,
}
"""What a new statistic runs (``statistics.registry.new_tuning``), as operator options."""

VARIANTS: dict[str, dict[str, Any]] = {
    "before: Alg. 5 (share 1/2, DLY series, tau_1 64, x2)": {},
    "  binary instances": {"tree": ul.BINARY},
    "  tracker share 1/4": {"tracker_share": Fraction(1, 4)},
    "  tracker share 1/8": {"tracker_share": Fraction(1, 8)},
    "  telescoping series": TELESCOPING,
    "  growth x4": {"growth": 2},
    "  discount x1/4": {"discount_scale": Fraction(1, 4)},
    "  tau_1 128": {"start_exponent": 7},
    "  tau_1 256": {"start_exponent": 8},
    "after: share 1/4, telescoping, tau_1 256": AFTER,
    "  with binary instances": {**AFTER, "tree": ul.BINARY},
    "  with share 1/2": {**AFTER, "tracker_share": Fraction(1, 2)},
    "  with DLY series": {**AFTER, "tracker_series": "dly", "instance_series": "dly"},
    "  with tau_1 64": {**AFTER, "start_exponent": 6},
}
"""tau: auto as it was, each change alone, as it is for a new statistic, and each of its
changes undone alone (operator options of ``counter.make_user_level``)."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    report(workloads(args.quick), VARIANTS, args.runs)


if __name__ == "__main__":
    main()
