"""The square-root factorization (Gaussian, rho-zCDP) against the k-ary trees (Laplace,
pure epsilon-DP), at matched rho and at matched (epsilon, delta).

Writes ``docs/sqrt-factorization.md`` and ``docs/img/sqrt-factorization.png``. Every
number is exact (closed forms, no simulation): the trees' from ``kary_tree.errors``
(continuous Laplace, 2 b^2 per node), the BLT's from ``sqrt_factorization.variance`` and
``mean_variance``, the exact square root's from its coefficients C(2j, j) / 4^j.

Usage:
    .venv/bin/python experiments/sqrt_factorization.py
"""

from __future__ import annotations

import math
import platform
from fractions import Fraction
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpstream.operators.accounting import zcdp  # noqa: E402
from dpstream.operators.noise import ZeroNoise  # noqa: E402
from dpstream.operators.trees import kary_tree as kt  # noqa: E402
from dpstream.operators.trees import sqrt_factorization as sf  # noqa: E402
from dpstream.operators.trees import tree_counter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ("experiment",)
HORIZONS = [10**3, 10**4, 10**5, 1 << 20, 10**7, 10**8]
DESIGN = 1 << 20
CHUNK = 1 << 22


def label(T: int) -> str:
    return "2^20" if T == 1 << 20 else f"10^{round(math.log10(T))}"


# ---------------------------------------------------------------------------------------
# Unit errors: variance times 2 rho for a user-level sensitivity of 1 (at matched rho every
# mechanism's variance is this over 2 rho; a Laplace tree at epsilon = sqrt(2 rho) is
# rho-zCDP, Bun-Steinke Prop. 1.4, and its variance times epsilon^2 is the same number).


def tree_unit(k: int, subtract: bool, horizons: list[int]) -> list[tuple[float, float]]:
    """(mean, max) of Var * eps^2 over steps 1..T of our infinite-stream k-ary tree."""
    return kt.errors(kt.make_kary_tree(1, 1, PREFIX, k, subtract), horizons, continuous=True)


def blt_unit(design: int, horizons: list[int]) -> list[tuple[float, float]]:
    """(mean, max) of Var * 2 rho over steps 1..T of the BLT built for ``design``: its
    variance is sigma^2 (...) with sigma^2 = Delta^2 / (2 rho), so this is
    Delta^2 sum beta^2 (the variance grows with t, so the max is at T)."""
    spec = sf.make_sqrt_factorization(Fraction(1, 1000), 1, PREFIX, design)
    unit = float(sf.sensitivity_squared(spec)) / float(spec.sigma2)
    return [(sf.mean_variance(spec, T) * unit, sf.variance(spec, T) * unit) for T in horizons]


def exact_sqrt_unit(horizons: list[int]) -> list[tuple[float, float]]:
    """(mean, max) of S_T S_t over t <= T for the exact square root built for each T:
    S_t = sum_{j < t} c_j^2, streamed in chunks."""
    out, running, c, done, sum_s = [], 0.0, 1.0, 0, 0.0
    targets = sorted(horizons)
    for T in targets:
        while done < T:
            n = min(CHUNK, T - done)
            j = np.arange(done, done + n, dtype=np.float64)
            ratios = np.where(j == 0, 1.0, (2 * j - 1) / np.maximum(2 * j, 1))
            coefficients = c * np.cumprod(ratios)
            c = float(coefficients[-1])
            sums = running + np.cumsum(coefficients * coefficients)
            running = float(sums[-1])
            sum_s += float(sums.sum())
            done += n
        out.append((running * sum_s / T, running * running))
    return out


def gaussian_binary_unit(horizons: list[int]) -> list[tuple[float, float]]:
    """(mean, max) for the Gaussian binary tree built for T: h = ceil(log2 T) + 1 levels,
    each leaf in h nodes (L2 sensitivity sqrt(h)), popcount(t) nodes per release."""
    out = []
    for T in horizons:
        h = (T - 1).bit_length() + 1
        most = max(bin(T).count("1"), T.bit_length() - 1)
        out.append((h * tree_counter.popcount_sum(T) / T, float(h * most)))
    return out


def matched_rho_table() -> tuple[str, dict]:
    rows, data = [], {}
    data["binary (Laplace)"] = tree_unit(2, False, HORIZONS)
    data["k-ary subtract k=13 (Laplace)"] = tree_unit(13, True, HORIZONS)
    data["BLT, design 2^20 (Gaussian)"] = blt_unit(DESIGN, HORIZONS)
    data["BLT, design = T (Gaussian)"] = [blt_unit(T, [T])[0] for T in HORIZONS]
    data["exact sqrt, built for T (Gaussian)"] = exact_sqrt_unit(HORIZONS)
    data["binary tree, built for T (Gaussian)"] = gaussian_binary_unit(HORIZONS)
    for name, values in data.items():
        rows.append([name] + [f"{mean:.1f} / {top:.1f}" for mean, top in values])
    header = ["mechanism (mean / max of Var × 2ρ)"] + [label(T) for T in HORIZONS]
    return md_table(header, rows), data


def matched_epsilon_delta_table() -> str:
    """Variance ratio Gaussian BLT / k = 13 Laplace tree at T = 2^20 when both meet
    (epsilon, delta): the tree is epsilon-DP, the Gaussian gets the largest rho whose
    conversion (Canonne-Kamath-Steinke) gives (epsilon, delta); last column: the delta
    below which the tree's mean variance is the lower one."""
    tree_mean, tree_max = tree_unit(13, True, [1 << 20])[0]
    blt_mean, blt_max = blt_unit(DESIGN, [1 << 20])[0]

    def mean_ratio(epsilon: float, delta: float) -> float:
        # tree: Var = unit / eps^2; Gaussian: Var = unit / (2 rho)
        return (blt_mean / (2 * zcdp.rho_cks(epsilon, delta))) / (tree_mean / epsilon**2)

    rows = []
    for epsilon in (0.25, 0.5, 1.0, 2.0, 4.0):
        cells = [f"{epsilon:g}"]
        for delta in (1e-6, 1e-9, 1e-12):
            rho = zcdp.rho_cks(epsilon, delta)
            top = (blt_max / (2 * rho)) / (tree_max / epsilon**2)
            cells.append(f"ρ={rho:.4f}: ×{mean_ratio(epsilon, delta):.2f} / ×{top:.2f}")
        low, high = -30.0, -6.0  # log10 delta: the ratio falls with delta
        for _ in range(60):
            mid = (low + high) / 2
            if mean_ratio(epsilon, 10**mid) < 1:
                high = mid
            else:
                low = mid
        cells.append(f"1e{high:.1f}")
        rows.append(cells)
    header = ["ε", "δ = 1e-6", "δ = 1e-9", "δ = 1e-12", "tree's mean lower below δ ="]
    return md_table(header, rows)


PIPELINE_HORIZONS = [10**3, 10**4, 10**5, 10**6]


def pipeline_table() -> str:
    """What a release states, std / 95% half-width, for a count with tau = 1 as the
    pipeline runs it: the pure default tree at epsilon = 1 (discrete Laplace, exact
    quantile) against the zCDP mode's counter (design horizon 2^20, its calibration's
    slack included, the guaranteed sub-Gaussian half-width) at the same rho (1/2) and at
    the same (epsilon, delta) = (1, 1e-6)."""
    tree = kt.make_kary_tree(1, 1, PREFIX, 13, True)
    matched_ed = zcdp.rho_cks(1.0, 1e-6)
    blts = {
        "zCDP square-root factorization, ρ = 0.5 (matched ρ)": Fraction(1, 2),
        f"zCDP square-root factorization, ρ = {matched_ed:.4f} (matched (1, 1e-6))": Fraction(
            repr(matched_ed)
        ),
    }
    rows = []
    cells = []
    for T in PIPELINE_HORIZONS:
        _, release = kt.step(tree, kt.KaryTreeState(t=T - 1), 0, ZeroNoise())
        cells.append(f"{release.std:.2f} / {release.ci95:g}")
    rows.append(["pure k-ary subtract k=13, ε = 1 (ρ = 0.5; (1, δ) for every δ)", *cells])
    for name, rho in blts.items():
        spec = sf.make_sqrt_factorization(rho, 1, PREFIX, DESIGN)
        rows.append(
            [
                name,
                *(f"{sf.std(spec, T):.2f} / {sf.half_width(spec, T):g}" for T in PIPELINE_HORIZONS),
            ]
        )
    header = ["counter (tau = 1): std / 95% half-width at tick"] + [
        label(T) for T in PIPELINE_HORIZONS
    ]
    return md_table(header, rows)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def figure(path: Path) -> None:
    steps = np.unique(np.logspace(0, math.log10(1 << 24), 300).astype(int))
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for k, subtract, name, color in (
        (2, False, "binary", "tab:red"),
        (13, True, "k=13", "tab:blue"),
    ):
        spec = kt.make_kary_tree(1, 1, PREFIX, k, subtract)
        ax.plot(
            steps,
            [kt.variance(spec, int(t), continuous=True) for t in steps],
            color=color,
            lw=0.7,
            label=f"{name} tree, Laplace (ε = √(2ρ))",
        )
    blt = sf.make_sqrt_factorization(Fraction(1, 1000), 1, PREFIX, DESIGN)
    unit = float(sf.sensitivity_squared(blt)) / float(blt.sigma2)
    ax.plot(
        steps,
        [sf.variance(blt, int(t)) * unit for t in steps],
        color="tab:green",
        lw=1.4,
        label="BLT square root, design 2^20, Gaussian",
    )
    sums = np.cumsum(
        np.concatenate(
            ([1.0], np.cumprod((2 * np.arange(1, 1 << 20) - 1) / (2 * np.arange(1, 1 << 20))))
        )
        ** 2
    )
    inside = steps[steps <= 1 << 20]
    ax.plot(
        inside,
        sums[-1] * sums[inside - 1],
        color="black",
        lw=1.0,
        ls="--",
        label="exact square root built for T = 2^20, Gaussian",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step t")
    ax.set_ylabel("variance × 2ρ (sensitivity 1)")
    ax.set_title("Per-step variance at matched ρ (Laplace trees: ε = √(2ρ))")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    rho_table, data = matched_rho_table()
    ed_table = matched_epsilon_delta_table()
    in_pipeline = pipeline_table()
    figure(ROOT / "docs" / "img" / "sqrt-factorization.png")
    i = HORIZONS.index(1 << 20)
    sqrt_mean, sqrt_max = data["exact sqrt, built for T (Gaussian)"][i]
    gb_mean, gb_max = data["binary tree, built for T (Gaussian)"][i]
    blt_mean, blt_max = data["BLT, design 2^20 (Gaussian)"][i]
    tree_mean, tree_max = data["k-ary subtract k=13 (Laplace)"][i]
    spec = sf.make_sqrt_factorization(Fraction(1, 1000), 1, PREFIX, DESIGN)
    doc = f"""# The square-root factorization (approximate-DP mode) against the trees

Generated by `experiments/sqrt_factorization.py` (Python {platform.python_version()}); regenerate
with `.venv/bin/python experiments/sqrt_factorization.py`. All numbers are exact (closed
forms): the k-ary trees' from `kary_tree.errors` (continuous Laplace, 2b² per node), the
BLT's from `sqrt_factorization.variance` and `mean_variance`, the exact square root's
from C(2j, j)/4^j. Sensitivity 1 throughout (a user-level counter with tau multiplies
every variance by tau²).

![variance against t at matched rho](img/sqrt-factorization.png)

## What is compared

* **Laplace trees** (pure ε-DP, `kary_tree`, our infinite-stream scheme): binary and the
  unbounded-stream choice, k-ary with subtraction, k = 13 (kary-mse.md, section 6).
* **The BLT** (`trees/sqrt_factorization.py`, ρ-zCDP on the infinite stream): the square
  root of the counting matrix as a buffered linear Toeplitz matrix with
  {len(spec.decay)} buffers at a design horizon of 2^20, exact discrete Gaussian noise;
  its sensitivity is that of the whole infinite stream (every decay is below 1).
* **References that need a horizon T** (not streaming on an unbounded stream): the exact
  square root built for T (sensitivity² = Σ_(j<T) c_j²) and the Gaussian binary tree
  built for T (⌈log2 T⌉ + 1 levels).

## At matched ρ

A Laplace mechanism that is ε-DP is ε²/2-zCDP (Bun-Steinke Prop. 1.4), so at a zCDP
budget ρ a tree runs at ε = √(2ρ) and every variance is proportional to 1/(2ρ): the table
gives variance × 2ρ, the mean over steps 1..T and the largest, for each horizon T.

{rho_table}

At T = 2^20 the exact square root's largest variance is ×{gb_max / sqrt_max:.1f} and its
mean ×{gb_mean / sqrt_mean:.1f} below the Gaussian binary tree's (issue 30 quotes about 14 and
7); the BLT, which needs no horizon, is within ×{blt_max / sqrt_max:.2f} (max) and
×{blt_mean / sqrt_mean:.2f} (mean) of the exact square root built for 2^20. Against the
best pure-DP tree at the same ρ the BLT's variance is ×{blt_mean / tree_mean:.2f} (mean) and
×{blt_max / tree_max:.2f} (max). Past its design horizon the BLT's variance grows linearly
(the 10^8 column of the design-2^20 row); a BLT designed for the horizon stays within
10% of the exact square root.

## At matched (ε, δ)

The tree is ε-DP, so (ε, δ)-DP for every δ. The Gaussian BLT gets the largest ρ whose
conversion gives (ε, δ) (Canonne-Kamath-Steinke Cor. 13, `accounting.zcdp.rho_cks`, tighter
than Bun-Steinke's ε = ρ + 2√(ρ ln(1/δ))). Cells: that ρ, then the BLT's variance over the
k = 13 tree's, mean and largest over steps 1..2^20 (below 1: the Gaussian mode is better).

{ed_table}

The smaller δ, the more ρ the conversion charges and the closer the two come: this is
the trade-off of Andersson-Pagh-Torkamani's "Count on Your Elders: Laplace vs Gaussian
Noise" (FORC 2025), whose Lemma 5.1 puts the crossing at δ about T^-0.92 (3e-6 at
T = 2^20) from the asymptotic constants of the paper's tree built for a known T. Ours
are exact but for an unbounded stream: the infinite-stream k-ary tree pays about 1.4
for not knowing T (kary-mse.md, section 4) and the Gaussian side uses the tighter
Canonne-Kamath-Steinke conversion, so at T = 2^20 the BLT's mean variance stays the
lower one down to the δ of the last column. The largest variance favours the BLT
further (its variance grows with t; a tree's jumps with the digit weight). Error bars:
the trees' intervals are exact quantiles (exact-intervals.md); the BLT's are the
guaranteed sub-Gaussian bound, 1.39 times the normal quantile
(`sqrt_factorization.half_width`), so in interval width the BLT gives back part of its
advantage until its intervals are made exact too.

## In the pipeline: what a release states

`privacy.accounting: zcdp` runs this counter for fixed-tau counts and sums
(`statistics/fixed_tau.py`, design horizon `horizon_ticks` or 2^20). The std and the 95%
half-width a release of a count with tau = 1 states (times tau for a larger tau), at
ticks 10^3 to 10^6: the pure default (the k = 13 tree with subtraction at ε = 1, discrete
Laplace, the exact quantile) against the zCDP counter at the same ρ (ε²/2 = 0.5) and at
the same (ε, δ) = (1, 1e-6) (ρ by Canonne-Kamath-Steinke). These are the exact numbers
`sqrt_factorization.std` and `half_width` and the tree's release give, the calibration's
slack (the fixed point, the lattice) included.

{in_pipeline}

At matched ρ the Gaussian counter's std is a fraction of the tree's (a quarter to a
sixth) at every horizon. At matched (1, 1e-6) the conversion costs most of that and the
two come close: the tree's std is the smaller at 10^3, the Gaussian's from 10^4 on (the
tree's std depends on t's digits, so it is not monotone in t), and the Gaussian's
guaranteed interval, 1.39 times the normal quantile, is the wider one but at 10^5. A
pipeline that reports in (ε, δ) with a small δ gains little from the zCDP mode; one that
accounts in ρ (or composes many statistics, where ρ composes more tightly than ε) gains
the most.
"""
    (ROOT / "docs" / "sqrt-factorization.md").write_text(doc)
    print(doc)


if __name__ == "__main__":
    main()
