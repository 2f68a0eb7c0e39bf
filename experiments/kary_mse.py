"""Andersson-Pagh-Torkamani's MSE numbers: exact values, the paper's constants, and a seeded
simulation.

Writes ``docs/kary-mse.md`` (tables) and ``docs/img/kary-mse.png`` (MSE * eps^2 / log2(T)^3
against T). Exact values come from ``operators/trees/kary_tree.py``'s closed forms; measured
values from running the real ``step`` functions (binary: ``tree_counter``; k-ary:
``kary_tree``) with the production noise source, one secret key per run (derived from the
run number, so the whole experiment is reproducible).

Usage:
    .venv/bin/python experiments/kary_mse.py [--runs 400] [--horizon 1000] [--workers 2]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpstream.operators.noise import CachedNoise, KeyedNoise  # noqa: E402
from dpstream.operators.trees import kary_tree as kt  # noqa: E402
from dpstream.operators.trees import tree_counter as tc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ("experiment", 0)
STREAM_SEED = 20240814


@dataclass(frozen=True)
class Shape:
    """One of the three mechanisms the paper compares."""

    label: str
    k: int
    subtract: bool
    paper_constant: float  # as printed in the paper (Sec. 1, Thm 1.1) or derived by us


SHAPES = [
    Shape("binary (Alg. 1, k=2)", 2, False, 1.0),
    Shape("k-ary (Alg. 1, k=17)", 17, False, 0.2343),
    Shape("k-ary subtract (Alg. 2, k=19)", 19, True, 0.1236),
]

# Our reference table: exact MSE * eps^2 of the single tree built for T, with h.
SPEC_TABLE_6_2 = {
    10**3: ((987.6, 10), (299.9, 3), (449.0, 7), (280.1, 5), (199.4, 3), (13, 170.4), 122.3),
    10**4: ((2532.8, 14), (778.5, 4), (1206.9, 10), (739.9, 7), (472.5, 4), (29, 368.7), 290.0),
    10**5: ((4710.9, 17), (1547.5, 5), (2162.4, 12), (1136.0, 8), (1004.5, 5), (23, 679.6), 566.3),
    10**6: (
        (7908.0, 20),
        (1872.9, 5),
        (3524.8, 14),
        (2174.4, 10),
        (1142.5, 5),
        (19, 1142.5),
        978.6,
    ),
    2**20: (
        (8820.0, 21),
        (1880.5, 5),
        (3531.4, 14),
        (2194.5, 10),
        (1147.4, 5),
        (19, 1147.4),
        988.7,
    ),
    10**7: (
        (13182.9, 24),
        (3093.2, 6),
        (5294.4, 16),
        (3015.9, 11),
        (1848.2, 6),
        (17, 1776.8),
        1554.0,
    ),
    10**9: (
        (26724.5, 30),
        (7150.2, 8),
        (10569.1, 20),
        (6321.5, 14),
        (4262.4, 8),
        (23, 3715.2),
        3302.8,
    ),
}
TABLE_6_2_COLUMNS = [(2, False), (17, False), (3, True), (5, True), (19, True)]

# Our reference constants (derived from the paper's formulas).
SPEC_6_1_ALG2 = {3: .3349, 5: .1917, 7: .1550, 9: .1395, 11: .1317, 13: .1275, 15: .1252,
                 17: .1240, 19: .1236, 21: .1236, 23: .1240, 25: .1246, 31: .1273}  # fmt: skip
SPEC_6_1_ALG1 = {2: 1.000, 3: .5023, 4: .3750, 5: .3195, 8: .2593, 16: .2344, 17: .2343,
                 18: .2345, 20: .2354}  # fmt: skip


def log3(T: int) -> float:
    return math.log2(T) ** 3


def doubling_constant(k: int, subtract: bool) -> float:
    """[derived] Leading constant of this repo's infinite-stream scheme.

    Within period p the release is the paper's tree with h = p + 1 ~ log_k T (same mean
    weight), plus the totals of periods 0..p-1, sum_q 2 (q+1)^2 ~ (2/3) h^3. So
    C_doubling = C + 2 / (3 log2(k)^3).
    """
    return kt.asymptotic_constant(k, subtract) + 2 / (3 * math.log2(k) ** 3)


def spec_of(shape: Shape) -> kt.KaryTreeSpec:
    return kt.make_kary_tree(1, 1, PREFIX, shape.k, shape.subtract)


def best_odd_k(T: int) -> tuple[int, float]:
    values = {k: kt.fixed_tree_mse(k, True, T) for k in range(3, 100, 2)}
    k = min(values, key=values.__getitem__)
    return k, float(values[k])


# ---------------------------------------------------------------------------------------
# Simulation


def simulate(shape_index: int, runs: range, horizon: int) -> list[float]:
    """Per-run MSE (1/T) sum_t (release_t - S(t))^2 of the real mechanism, keyed noise."""
    shape = SHAPES[shape_index]
    rng = np.random.Generator(np.random.PCG64(STREAM_SEED))
    stream = [int(v) for v in rng.integers(0, 2, size=horizon)]
    prefix = np.cumsum(stream)
    out = []
    for run in runs:
        key = hashlib.sha256(f"kary-mse/{shape_index}/{run}".encode()).digest()
        noise = CachedNoise(KeyedNoise(key))
        if shape.k == 2 and not shape.subtract:
            spec_b = tc.make_binary_tree(1, 1, PREFIX)
            state_b = tc.init(spec_b)
            values = []
            for w in stream:
                state_b, rel = tc.step(spec_b, state_b, w, noise)
                values.append(rel.value)
        else:
            spec = spec_of(shape)
            state = kt.init(spec)
            values = []
            for w in stream:
                state, rel = kt.step(spec, state, w, noise)
                values.append(rel.value)
        errors = np.asarray(values, dtype=np.float64) - prefix
        out.append(float(np.mean(errors**2)))
    return out


def structural_mc(shape: Shape, horizon: int, runs: int, seed: int) -> tuple[float, float]:
    """Mean and SE of the per-run MSE from the public node structure alone.

    The nodes, signs and scales come from ``release_terms`` (``release_nodes`` for the
    binary tree); their noise is exact discrete Laplace drawn by numpy as the difference
    of two geometric variables. Cheap, so it can afford many more runs than ``simulate``.
    """
    if shape.k == 2 and not shape.subtract:
        spec_b = tc.make_binary_tree(1, 1, PREFIX)
        terms = [tc.release_nodes(spec_b, t) for t in range(1, horizon + 1)]
    else:
        spec = spec_of(shape)
        terms = [kt.release_terms(spec, t) for t in range(1, horizon + 1)]
    scales: dict = {}
    for row in terms:
        for node, scale, _ in row:
            scales.setdefault(node, scale)
    column = {node: j for j, node in enumerate(scales)}
    matrix = np.zeros((horizon, len(column)))
    for t, row in enumerate(terms):
        for node, _, sign in row:
            matrix[t, column[node]] = sign
    p = np.exp(-1 / np.array([float(b) for b in scales.values()]))
    rng = np.random.Generator(np.random.PCG64(seed))
    per_run = []
    for lo in range(0, runs, 1000):
        size = (min(1000, runs - lo), len(column))
        z = (rng.geometric(1 - p, size=size) - rng.geometric(1 - p, size=size)).astype(float)
        per_run.append(np.mean((z @ matrix.T) ** 2, axis=1))
    values = np.concatenate(per_run)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


def measure(runs: int, horizon: int, workers: int) -> dict[int, list[float]]:
    chunks = [
        (i, range(lo, min(lo + 25, runs))) for i in range(len(SHAPES)) for lo in range(0, runs, 25)
    ]
    results: dict[int, list[float]] = {i: [] for i in range(len(SHAPES))}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [(i, pool.submit(simulate, i, r, horizon)) for i, r in chunks]
        for i, future in futures:
            results[i].extend(future.result())
    return results


# ---------------------------------------------------------------------------------------
# Tables


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def constants_table(measured: dict[int, list[float]], horizon: int) -> tuple[str, list[dict]]:
    rows, records = [], []
    for i, shape in enumerate(SHAPES):
        spec = spec_of(shape)
        per_run = np.asarray(measured[i])
        mean = float(per_run.mean())
        se = float(per_run.std(ddof=1) / math.sqrt(len(per_run)))
        exact_d = kt.mse(spec, horizon)
        exact_c = kt.mse(spec, horizon, continuous=True)
        fixed = float(kt.fixed_tree_mse(shape.k, shape.subtract, horizon))
        z = (mean - exact_d) / se
        mc_mean, mc_se = structural_mc(shape, horizon, 20000, STREAM_SEED + i)
        mc_z = (mc_mean - exact_d) / mc_se
        records.append(
            {"shape": shape, "mean": mean, "se": se, "exact": exact_d, "z": z, "mc_z": mc_z}
        )
        rows.append(
            [
                shape.label,
                f"{shape.paper_constant:.4f}",
                f"{kt.asymptotic_constant(shape.k, shape.subtract):.4f}",
                f"{doubling_constant(shape.k, shape.subtract):.4f}",
                f"{fixed:.1f}",
                f"{exact_c:.1f}",
                f"{exact_d:.1f}",
                f"{mean:.1f} ± {se:.1f}",
                f"{z:+.2f}",
                f"{mc_mean:.1f} ± {mc_se:.1f} ({mc_z:+.2f})",
                f"{mean / log3(horizon):.4f}",
            ]
        )
    header = [
        "mechanism",
        "C (paper)",
        "C (formula)",
        "C (ours, doubling)",
        f"paper tree, exact (T={horizon})",
        "ours, exact, Laplace",
        "ours, exact, discrete",
        "ours, measured (discrete)",
        "z",
        "structure + numpy noise, 20000 runs (z)",
        "measured / log2(T)^3",
    ]
    return md_table(header, rows), records


def table_6_2() -> tuple[str, int]:
    rows, mismatches = [], 0
    for T, spec_row in SPEC_TABLE_6_2.items():
        cells = [f"10^{round(math.log10(T))}" if T != 2**20 else "2^20"]
        for (k, sub), (want, want_h) in zip(TABLE_6_2_COLUMNS, spec_row[:5], strict=True):
            got = round(float(kt.fixed_tree_mse(k, sub, T)), 1)
            h = kt.tree_height(k, sub, T)
            ok = got == want and h == want_h
            mismatches += not ok
            cells.append(f"{got:.1f} ({h})" + ("" if ok else f" **spec: {want} ({want_h})**"))
        k_best, v_best = best_odd_k(T)
        want_k, want_v = spec_row[5]
        ok = k_best == want_k and round(v_best, 1) == want_v
        mismatches += not ok
        cells.append(
            f"k={k_best}: {v_best:.1f}" + ("" if ok else f" **spec: k={want_k}: {want_v}**")
        )
        asym = round(kt.asymptotic_constant(19, True) * log3(T), 1)
        ok = asym == spec_row[6]
        mismatches += not ok
        cells.append(f"{asym:.1f}" + ("" if ok else f" **spec: {spec_row[6]}**"))
        rows.append(cells)
    header = ["T", "binary (Alg1 k=2)", "Alg1 k=17", "Alg2 k=3", "Alg2 k=5", "Alg2 k=19"]
    header += ["best odd k (Alg2)", "C₁₉·log(T)³, C₁₉ = 0.12359"]
    return md_table(header, rows), mismatches


def table_6_1() -> tuple[str, int]:
    rows, mismatches = [], 0
    for name, table, sub in [("Alg. 2", SPEC_6_1_ALG2, True), ("Alg. 1", SPEC_6_1_ALG1, False)]:
        for k, want in table.items():
            got = kt.asymptotic_constant(k, sub)
            ok = round(got, 4) == want
            mismatches += not ok
            rows.append([name, str(k), f"{want:.4f}", f"{got:.5f}", "" if ok else "differs"])
    return md_table(["algorithm", "k", "reference", "formula", ""], rows), mismatches


def doubling_table() -> str:
    rows = []
    for T in SPEC_TABLE_6_2:
        cells = [f"10^{round(math.log10(T))}" if T != 2**20 else "2^20"]
        for shape in SHAPES:
            ours = kt.mse(spec_of(shape), T, continuous=True)
            fixed = float(kt.fixed_tree_mse(shape.k, shape.subtract, T))
            cells.append(f"{ours:.1f} (×{ours / fixed:.2f})")
        name, k = kt.choose_tree(1, 1, T, PREFIX)
        chosen = kt.mse(kt.make_kary_tree(1, 1, PREFIX, k, name == "kary_subtract"), T)
        cells.append(f"{name} k={k}: {chosen:.1f}")
        rows.append(cells)
    header = ["T"] + [f"{s.label}" for s in SHAPES] + ["`choose_tree` pick (discrete MSE)"]
    return md_table(header, rows)


def ratio_ranges() -> list[tuple[int, float, float]]:
    """min / max over T of (this repo's exact MSE) / (paper's tree's exact MSE)."""
    grid = sorted({int(v) for v in np.logspace(3, 12, 400)})
    out = []
    for shape in SHAPES:
        spec = spec_of(shape)
        ratios = [
            kt.mse(spec, T, continuous=True) / float(kt.fixed_tree_mse(shape.k, shape.subtract, T))
            for T in grid
        ]
        out.append((shape.k, min(ratios), max(ratios)))
    return out


def limit_table() -> str:
    rows = []
    for shape in SHAPES:
        cells = [shape.label]
        for e in (9, 30, 100, 300):
            T = 10**e
            ours = kt.mse(spec_of(shape), T, continuous=True) / log3(T)
            fixed = float(kt.fixed_tree_mse(shape.k, shape.subtract, T)) / log3(T)
            cells.append(f"{fixed:.4f} / {ours:.4f}")
        cells.append(
            f"{kt.asymptotic_constant(shape.k, shape.subtract):.4f} / "
            f"{doubling_constant(shape.k, shape.subtract):.4f}"
        )
        rows.append(cells)
    header = ["mechanism", "T=10^9", "T=10^30", "T=10^100", "T=10^300", "limit"]
    return md_table(header, rows)


def unbounded_table() -> tuple[str, str]:
    """Section 6: exact MSE and largest variance (continuous Laplace, eps = 1) of a few
    trees and of the best tree per horizon, for T = 10^3..10^8; and the chooser's scores."""
    horizons = [10**e for e in range(3, 9)]
    by_candidate = {}
    for name, k, subtract in kt._candidates():
        spec = kt.make_kary_tree(1, 1, PREFIX, k, subtract)
        by_candidate[(name, k)] = kt.errors(spec, horizons, continuous=True)
    pick = kt.choose_unbounded_tree()
    shown = [("binary", 2), ("kary", 17), ("kary_subtract", 19), pick]
    rows = []
    for i, T in enumerate(horizons):
        best_mse = min(by_candidate, key=lambda c: by_candidate[c][i][0])
        best_max = min(by_candidate, key=lambda c: by_candidate[c][i][1])
        cells = [f"10^{round(math.log10(T))}"]
        cells += [f"{by_candidate[c][i][0]:.0f} / {by_candidate[c][i][1]:.0f}" for c in shown]
        cells.append(f"k={best_mse[1]}: {by_candidate[best_mse][i][0]:.0f}")
        cells.append(f"k={best_max[1]}: {by_candidate[best_max][i][1]:.0f}")
        cells.append(
            f"×{by_candidate[pick][i][0] / by_candidate[best_mse][i][0]:.3f} / "
            f"×{by_candidate[pick][i][1] / by_candidate[best_max][i][1]:.3f}"
        )
        rows.append(cells)
    header = ["T", "binary", "k-ary k=17", "k-ary subtract k=19", f"{pick[0]} k={pick[1]} (pick)"]
    header += ["best MSE (subtract)", "best max (subtract)", "pick / best (MSE / max)"]
    scores = sorted(kt.unbounded_scores(), key=lambda row: (row[2] + row[3]) / 2)
    score_rows = [
        [f"{name} k={k}", f"{mse:.4f}", f"{largest:.4f}", f"{(mse + largest) / 2:.4f}"]
        for name, k, mse, largest in scores[:8]
    ]
    binary = next(row for row in scores if row[0] == "binary")
    score_rows.append(
        [
            "binary",
            f"{binary[2]:.4f}",
            f"{binary[3]:.4f}",
            f"{(binary[2] + binary[3]) / 2:.4f}",
        ]
    )
    score_header = ["candidate", "MSE score", "largest-variance score", "mean (chooser)"]
    return md_table(header, rows), md_table(score_header, score_rows)


def small_horizons(pick: tuple[str, int]) -> tuple[float, float]:
    """(pick's MSE / binary's at T = 100, the largest pick / choose_tree's pick over T in
    10..1000): what the unbounded choice costs on short streams."""
    mine = kt.make_kary_tree(1, 1, PREFIX, pick[1], pick[0] == "kary_subtract")
    binary = kt.make_kary_tree(1, 1, PREFIX, 2, False)
    worst = 0.0
    for T in range(10, 1001):
        name, k = kt.choose_tree(1, 1, T, PREFIX)
        best = kt.make_kary_tree(1, 1, PREFIX, k, name == "kary_subtract")
        worst = max(worst, kt.mse(mine, T, True) / kt.mse(best, T, True))
    return kt.mse(mine, 100, True) / kt.mse(binary, 100, True), worst


# ---------------------------------------------------------------------------------------
# Figure


def figure(records: list[dict], horizon: int, path: Path) -> None:
    grid = sorted({int(v) for v in np.logspace(1, 15, 500)})
    fig, ax = plt.subplots(figsize=(12, 5.5))
    colors = ["tab:red", "tab:blue", "tab:green"]
    for shape, color, rec in zip(SHAPES, colors, records, strict=True):
        spec = spec_of(shape)
        ours = [kt.mse(spec, T, continuous=True) / log3(T) for T in grid]
        fixed = [float(kt.fixed_tree_mse(shape.k, shape.subtract, T)) / log3(T) for T in grid]
        ax.plot(grid, ours, color=color, lw=1.2, label=f"{shape.label}: this repo (unknown T)")
        ax.plot(grid, fixed, color=color, lw=0.9, ls="--", label="  paper's tree for known T")
        ax.axhline(shape.paper_constant, color=color, lw=0.8, ls=":")
        ax.errorbar(
            [horizon],
            [rec["mean"] / log3(horizon)],
            yerr=[2 * rec["se"] / log3(horizon)],
            fmt="o",
            color=color,
            ms=4,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("horizon T")
    ax.set_ylabel("MSE · ε² / log2(T)³   (continuous Laplace; dots: measured, discrete)")
    ax.set_title("k-ary tree counters (Andersson-Pagh-Torkamani): dotted = asymptotic constants")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--horizon", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    started = time.monotonic()
    measured = measure(args.runs, args.horizon, args.workers)
    sim_seconds = time.monotonic() - started
    constants, records = constants_table(measured, args.horizon)
    t62, miss62 = table_6_2()
    t61, miss61 = table_6_1()
    figure(records, args.horizon, ROOT / "docs" / "img" / "kary-mse.png")

    command = "/work/main/.venv/bin/python experiments/kary_mse.py"
    if (args.runs, args.horizon, args.workers) != (400, 1000, 2):
        command += f" --runs {args.runs} --horizon {args.horizon} --workers {args.workers}"
    worst_z = max(max(abs(r["z"]), abs(r["mc_z"])) for r in records)
    norm_fixed = " / ".join(
        f"{float(kt.fixed_tree_mse(sh.k, sh.subtract, 10**6)) / log3(10**6):.4f}" for sh in SHAPES
    )
    gap = " / ".join(
        f"{float(kt.fixed_tree_mse(sh.k, sh.subtract, 10**6)) / log3(10**6) / sh.paper_constant - 1:+.1%}"  # noqa: E501
        for sh in SHAPES
    )
    extra = ", ".join(
        f"+{2 / (3 * math.log2(sh.k) ** 3):.4f} for k = {sh.k} "
        f"({2 / (3 * math.log2(sh.k) ** 3) / kt.asymptotic_constant(sh.k, sh.subtract):.0%})"
        for sh in SHAPES
    )
    ratio_range = ", ".join(f"{lo:.2f}–{hi:.2f} (k = {k})" for k, lo, hi in ratio_ranges())
    unbounded, scores = unbounded_table()
    pick = kt.choose_unbounded_tree()
    small = small_horizons(pick)
    scores_15 = next(
        f"{mse:.4f} against {mine:.4f}"
        for name, k, mse, _ in kt.unbounded_scores()
        if (name, k) == ("kary_subtract", 15)
        for n2, k2, mine, _ in kt.unbounded_scores()
        if (n2, k2) == pick
    )
    odd = {k: doubling_constant(k, True) for k in range(3, 99, 2)}
    k_dbl = min(odd, key=odd.__getitem__)
    c_dbl, c_19 = odd[k_dbl], odd[19]
    doc = f"""# k-ary tree counters: MSE (Andersson-Pagh-Torkamani)

Generated by `experiments/kary_mse.py`; regenerate with

    {command}

(Python {platform.python_version()}, {args.workers} worker processes, simulation
{sim_seconds:.0f} s.) ε = 1 and sensitivity 1 throughout, so every MSE below is MSE·ε².
"Exact" values are the closed forms of `operators/trees/kary_tree.py` (ours, from Lemmas 3.5
and 4.7); "Laplace" means the paper's continuous Laplace (variance 2b²), "discrete" the discrete
Laplace the releases actually carry (variance 2p/(1−p)², p = e^(−1/b), a little smaller).

![MSE·ε²/log2(T)³ against T](img/kary-mse.png)

## 1. Leading constants and a seeded simulation

C is the constant in MSE ≈ (C/ε²)·log2(T)³. "C (paper)" is the printed value,
"C (formula)" the paper's formula ((k−1)/log2(k)³ for Alg. 1, k(1−1/k²)/(2·log2(k)³) for
Alg. 2), "C (ours, doubling)" the constant of this repo's infinite-stream scheme
(C + 2/(3·log2(k)³), derived below). The measured column runs the real `step` functions
(binary: `operators/trees/tree_counter.py`, k-ary: `operators/trees/kary_tree.py`) {args.runs} times
for T = {args.horizon} steps on one Bernoulli(1/2) stream, with the production noise
source `CachedNoise(KeyedNoise(key))`, one key per run (key = SHA-256 of the run number:
seeded). Measured = mean over runs of (1/T)·Σ_t (release_t − S(t))², ± its standard error
over runs; z = (measured − exact discrete) / SE. The next column checks the exact formula
with many more runs: the public node structure (`release_terms`, `release_nodes`) with
exact discrete Laplace noise drawn by numpy (difference of two geometrics).

{constants}

All six |z| ≤ {worst_z:.2f}. If the exact formula is right, the largest of six
independent |z| exceeds 2 with probability about 24% and exceeds 3 with about 1.6%, so
the measurements agree with it: the implementation's error is the exact formula's.
At T = {args.horizon} the normalized MSE is far from C: the constants are limits, and the
o(log³T) terms (mostly the ceiling in h) dominate at moderate T (next tables).

## 2. Our reference table reproduced: the paper's tree for a known T

Exact MSE·ε² of the single tree built for T (h in parentheses), continuous Laplace.
Entries that differ from the reference table when rounded to 0.1 are flagged in bold
({miss62} flagged).

{t62}

## 3. Reference asymptotic constants ({miss61} differ at 4 decimals)

{t61}

## 4. This repo's mechanism (T unknown): exact MSE·ε², continuous Laplace

`operators/trees/kary_tree.py` does not know T. Period p covers k^p steps and runs the
paper's tree for T = k^p (h = p + 1, scale h/ε), and every completed period adds its
noisy total, which is that period's top node (module docstring). In parentheses: the
ratio to the paper's tree built for exactly that T (§2), i.e. the price of not knowing T.
The binary column is exactly `operators/trees/tree_counter.py` (the tests check it node for
node). Last column: what `choose_tree` picks for that horizon (discrete MSE, ε = 1).

{doubling_table()}

Normalized MSE·ε²/log2(T)³, paper's tree / ours, as T grows:

{limit_table()}

## 5. Notes on the differences

* **Sections 2 and 3 reproduce** the reference values to the printed precision
  ({miss62} + {miss61} differences).
  The paper's constants 1.0, 0.2343 and 0.1236 are limits. At T = 10^6 its own trees
  are at {norm_fixed} (normalized, binary / k=17 / k=19): the o(log³T) term, mostly the
  ceiling in h, is still {gap}.
* **Doubling costs a constant factor, not an order.** With T unknown, the totals of the
  completed periods add Σ_(q<p) 2(q+1)² ≈ (2/3)·h³ to every release, i.e.
  2/(3·log2(k)³) to C: {extra}. For binary that is the same 67% `tree_counter` pays. The
  rest of the gap at finite T is the phase of T within a period (the current period's h
  is fixed by k^p, not by T), the sawtooth in the figure: over 400 log-spaced T in
  [10^3, 10^12] the ratio ours / paper's tree ranges over {ratio_range}. It dips below 1
  just after T crosses a capacity of the paper's tree (k^h − 1 for Alg. 1, (k^h − 1)/2
  for Alg. 2): that tree then pays the larger h on every step, while most of our steps
  are still in earlier periods with a smaller h.
* **Best k under doubling.** C + 2/(3·log2(k)³) is minimised at odd k = {k_dbl}
  ({c_dbl:.4f}; k = 19 gives {c_19:.4f}). At a finite horizon `choose_tree` picks by exact
  MSE anyway.
* **Discrete vs continuous Laplace.** The releases carry discrete Laplace noise, whose
  variance is below 2b² by about 1/6 per node for large b (more for b near 1), so the
  discrete MSE is slightly lower; the paper's numbers use 2b².
* **Simulation size.** {args.runs} runs × {args.horizon} steps per mechanism; a per-run
  MSE averages {args.horizon} correlated squared errors, and the SE is taken across runs,
  so it accounts for the correlation between steps.

## 6. Unbounded streams: the tree when nobody says when the stream ends

`choose_tree` needs a horizon; a stream that runs until someone stops it has none, and the
best k at a given T moves with the phase of T in the periods (section 5: from 9 to 21 over
10^3..10^8). `kary_tree.choose_unbounded_tree` chooses once for all horizons users will
see: each candidate of `choose_tree` (binary; Alg. 1 and Alg. 2 with 3 <= k <= 64) is
scored at the 41 log-spaced horizons T from 10^3 to 10^8 ticks (a quarter of an hour to
three years of one-second ticks) by its exact MSE over steps 1..T and its exact largest
variance over them (`kary_tree.max_variance`, a digit walk over each period's largest
weight), each divided by the best candidate's at that T; the score is the mean log-ratio,
and the chooser takes the least mean of the two scores. Continuous Laplace (2b²) makes the
scores independent of ε and the sensitivity, so the choice is one tree:
**{pick[0]} with k = {pick[1]}**, the default of `mechanism: auto` without a horizon.

Exact MSE / largest variance (× ε², continuous Laplace, sensitivity 1), against the best
candidate at each T (all of them k-ary with subtraction):

{unbounded}

The chooser's scores (mean log-ratio to the best at each horizon; 0 would be the best tree
at every T; the best eight, then binary):

{scores}

Below 10^3 ticks the pick still beats binary (at T = 100 its MSE is ×{small[0]:.2f}
binary's) but trails the per-horizon best by up to ×{small[1]:.2f} (T from 10 to 1000).
Beyond 10^8 the asymptotic constants of section 5 decide: under doubling k = 13 has
{doubling_constant(13, True):.4f}, the best odd k = {k_dbl} {c_dbl:.4f}. k = 15 has the
same MSE score ({scores_15}); 13 wins on the largest variance.
"""
    (ROOT / "docs" / "kary-mse.md").write_text(doc)
    print(doc)


if __name__ == "__main__":
    main()
