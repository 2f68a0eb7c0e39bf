"""Reproduce Table 1 and the expiration curves of Andersson et al. 2024 (Sec. 6, App. A).

Every curve is calibrated to the same mean squared error, MSE = 1000 averaged over
t = 1..T with the continuous Laplace variance 2 b^2 (as the paper does), and then compared
by its privacy loss as a function of the elapsed time d:

* Algorithm 3 (``operators/trees/expiring_tree.py``, B = 0, lambda = 1, 2, 3): the worst case
  over j of the canonical-decomposition cost (the paper's "empirical" curve) and the
  Theorem 1.2 bound epsilon * g_lambda(d);
* the round-restarted binary mechanism (``operators/baselines/round_restart.py``) with
  eps_past = eps_cur / 10, and with the fraction that minimises the loss at d = T.

Everything is deterministic (the loss does not depend on the data), so there are no
error bars and no random numbers. Runs in a few seconds on one core.

Usage:
    .venv/bin/python experiments/expiration.py

Writes ``docs/expiration.md`` and ``docs/img/expiration.png``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpstream.operators.baselines import round_restart as rr  # noqa: E402
from dpstream.operators.trees import expiring_tree as et  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "expiration.md"
IMG = ROOT / "docs" / "img" / "expiration.png"
COMMAND = ".venv/bin/python experiments/expiration.py"
TARGET_MSE = 1000
PREFIX = ("experiment",)

# Table 1 of the paper; the lambda / W column is our reconstruction (docs/papers.md).
PAPER_ALG3 = {
    (10**3, 1): "0.1341",
    (10**3, 2): "0.05542",
    (10**3, 3): "0.04651",
    (10**6, 1): "0.1947",
    (10**6, 2): "0.05645",
    (10**6, 3): "0.04652",
}
PAPER_BASELINE = {(10**3, 31): "0.5678", (10**3, 63): "0.6372", (10**3, 127): "0.7197"}
PAPER_BASELINE |= {(10**6, 127): "0.7387", (10**6, 1023): "1.096"}
PAPER_OPTIMAL = {
    (10**3, 31): ("0.7328", "0.05048"),
    (10**3, 63): ("0.7031", "0.05796"),
    (10**3, 127): ("0.7170", "0.07252"),
    (10**6, 127): ("6.973", "0.04488"),
    (10**6, 1023): ("4.413", "0.04589"),
}
# Our expected plotted values (T = 10^6), computed when we rebuilt the paper's Sec. 6.
SPEC_CURVES = {
    "Alg 3, λ=1": ".195 .974 1.75 2.92 3.50 4.28 5.06",
    "Alg 3, λ=2": ".056 .508 1.75 4.52 7.17 10.6 15.6",
    "Alg 3, λ=3": ".047 1.02 6.47 24.9 53.5 96.6 178",
    "baseline W=127, ε_past=ε_cur/10": ".106 .422 .739 1.26 6.50 58.9 582",
    "baseline W=1023, ε_past=ε_cur/10": ".110 .438 .767 1.10 2.08 11.7 108",
    "baseline W=127, paper's optimal pair": ".996 3.99 6.97 7.29 10.5 42.3 360",
    "baseline W=1023, paper's optimal pair": ".441 1.77 3.09 4.41 4.83 8.86 49.2",
}
CURVE_DS = [1, 10, 100, 10**3, 10**4, 10**5, 10**6]


def sig(value: float, digits: int = 4) -> str:
    return f"{value:.{digits}g}"


def alg3_epsilon(horizon: int, lam: int) -> float:
    """epsilon with MSE = 1000: the MSE at epsilon is MSE(1) / epsilon^2."""
    spec = et.make_expiring_tree(1, 1, PREFIX, lam, 0)
    return math.sqrt(et.mean_noise_variance(spec, horizon, continuous=True) / TARGET_MSE)


def alg3_spec(epsilon: float, lam: int) -> et.ExpiringTreeSpec:
    return et.make_expiring_tree(epsilon, 1, PREFIX, lam, 0)


def baseline_epsilons(horizon: int, window: int, ratio: float) -> tuple[float, float]:
    """(eps_cur, eps_past = ratio * eps_cur) with MSE = 1000; both scale together."""
    spec = rr.make_round_restart(1, 1, PREFIX, window, ratio)
    eps_cur = math.sqrt(rr.mean_noise_variance(spec, horizon, continuous=True) / TARGET_MSE)
    return eps_cur, ratio * eps_cur


def baseline_spec(eps_cur: float, eps_past: float, window: int) -> rr.RoundRestartSpec:
    return rr.make_round_restart(eps_cur, 1, PREFIX, window, eps_past)


def optimal_fraction(horizon: int, window: int) -> tuple[float, float, float]:
    """Appendix A.1: the eps_past / eps_cur minimising the loss at d = T under MSE = 1000.

    A log-spaced grid over the ratio, then a golden-section refinement around its best
    point (the objective is piecewise smooth and flat near the optimum).

    Returns:
        (eps_cur, eps_past, loss at d = T).
    """

    def loss(log_ratio: float) -> float:
        eps_cur, eps_past = baseline_epsilons(horizon, window, math.exp(log_ratio))
        return rr.privacy_loss(baseline_spec(eps_cur, eps_past, window), horizon)

    grid = [math.log(1e-4) + i * (math.log(1.0) - math.log(1e-4)) / 400 for i in range(401)]
    best = min(range(len(grid)), key=lambda i: loss(grid[i]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
        if loss(a) <= loss(b):
            hi = b
        else:
            lo = a
    eps_cur, eps_past = baseline_epsilons(horizon, window, math.exp((lo + hi) / 2))
    return eps_cur, eps_past, loss((lo + hi) / 2)


def ds_for(horizon: int) -> list[int]:
    """Every d up to 2000, then about 400 log-spaced points per decade up to T."""
    ds = set(range(1, min(horizon, 2000) + 1))
    if horizon > 2000:
        steps = 400 * round(math.log10(horizon / 2000) + 1)
        ratio = (horizon / 2000) ** (1 / steps)
        ds |= {min(horizon, round(2000 * ratio**i)) for i in range(steps + 1)}
    return sorted(ds)


def table_1() -> tuple[list[str], dict]:
    lines = [
        "| Fig | T | Algorithm | λ or W | ours: ε (Alg 3) or ε_cur | paper | ε_past (ours) |"
        " paper ε_past | match |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    eps: dict = {}
    for horizon, fig in ((10**3, "2(b)"), (10**6, "3")):
        for lam in (1, 2, 3):
            ours = alg3_epsilon(horizon, lam)
            eps[("alg3", horizon, lam)] = ours
            paper = PAPER_ALG3[(horizon, lam)]
            ok = "yes" if sig(ours) == paper else "NO"
            lines.append(
                f"| {fig} | 10^{round(math.log10(horizon))} | Alg 3 | λ={lam} | {sig(ours)} | "
                f"{paper} | | | {ok} |"
            )
    for (horizon, window), paper in PAPER_BASELINE.items():
        eps_cur, eps_past = baseline_epsilons(horizon, window, 0.1)
        eps[("base", horizon, window)] = (eps_cur, eps_past)
        fig = "2(c)" if horizon == 10**3 else "3"
        ok = "yes" if sig(eps_cur) == paper else "NO"
        lines.append(
            f"| {fig} | 10^{round(math.log10(horizon))} | baseline, ε_past = ε_cur/10 | "
            f"W={window} | {sig(eps_cur)} | {paper} | {sig(eps_past)} | {sig(float(paper) / 10)}"
            f" | {ok} |"
        )
    return lines, eps


def optimal_rows() -> tuple[list[str], dict]:
    lines = [
        "| T | W | paper (ε_cur, ε_past) | MSE of paper's pair | loss at d=T, paper's pair |"
        " ours (ε_cur, ε_past) | loss at d=T, ours | ε_cur/ε_past paper | ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    pairs: dict = {}
    for (horizon, window), (cur, past) in PAPER_OPTIMAL.items():
        spec = baseline_spec(float(cur), float(past), window)
        mse = rr.mean_noise_variance(spec, horizon, continuous=True)
        paper_loss = rr.privacy_loss(spec, horizon)
        o_cur, o_past, o_loss = optimal_fraction(horizon, window)
        pairs[(horizon, window)] = (o_cur, o_past)
        lines.append(
            f"| 10^{round(math.log10(horizon))} | {window} | ({cur}, {past}) | {mse:.2f} | "
            f"{paper_loss:.4g} | ({sig(o_cur)}, {sig(o_past)}) | {o_loss:.4g} | "
            f"{float(cur) / float(past):.3g} | {o_cur / o_past:.3g} |"
        )
    return lines, pairs


def curve_rows(eps: dict) -> list[str]:
    lines = [
        "| curve (T = 10^6) | " + " | ".join(f"d={d:g}" for d in CURVE_DS) + " | cells off |",
        "|---|" + "---|" * (len(CURVE_DS) + 1),
    ]
    specs = {}
    # The expected values used Table 1's rounded epsilons; so do we.
    for lam in (1, 2, 3):
        paper_eps = float(PAPER_ALG3[(10**6, lam)])
        specs[f"Alg 3, λ={lam}"] = (et.canonical_loss, alg3_spec(paper_eps, lam))
    for window in (127, 1023):
        cur = float(PAPER_BASELINE[(10**6, window)])
        spec = baseline_spec(cur, cur / 10, window)
        specs[f"baseline W={window}, ε_past=ε_cur/10"] = (rr.privacy_loss, spec)
        cur, past = PAPER_OPTIMAL[(10**6, window)]
        spec = baseline_spec(float(cur), float(past), window)
        specs[f"baseline W={window}, paper's optimal pair"] = (rr.privacy_loss, spec)
    for name, row in SPEC_CURVES.items():
        loss, spec = specs[name]
        cells, off = [], 0
        for d, expected in zip(CURVE_DS, row.split(), strict=True):
            got = loss(spec, d)
            decimals = len(expected.partition(".")[2])
            if round(got, decimals) == float(expected):
                cells.append(f"{got:.3g}")
            else:
                off += 1
                cells.append(f"**{got:.4g}** (spec {expected})")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {off} |")
    for lam, spec_value in ((2, "23.7"), (3, "267")):
        bound = et.privacy_loss(alg3_spec(float(PAPER_ALG3[(10**6, lam)]), lam), 10**6)
        lines.append(
            f"| Alg 3, λ={lam}, Theorem 1.2 bound | | | | | | | {bound:.3g} (spec {spec_value}) | |"
        )
    return lines


def small_t_rows() -> list[str]:
    """T = 10^3, d = 1000 with Table 1's epsilons, over all j and over the paper's j <= T-d+1."""
    d = horizon = 1000
    alg3 = [alg3_spec(float(PAPER_ALG3[(horizon, lam)]), lam) for lam in (1, 2, 3)]
    base = []
    for window in (31, 63, 127):
        cur = float(PAPER_BASELINE[(horizon, window)])
        base.append(baseline_spec(cur, cur / 10, window))
    unbounded = [et.canonical_loss(s, d) for s in alg3] + [rr.privacy_loss(s, d) for s in base]
    # Only j = 1 has tau = j + d - 1 <= T.
    finite = [float(s.epsilon * et.coupling_cost(s, 1, d)) for s in alg3]
    finite += [float(rr.item_loss(s, 1, d)) for s in base]
    return [
        "| T = 10^3, d = 1000 | Alg 3 λ=1 | λ=2 | λ=3 | baseline W=31 | W=63 | W=127 |",
        "|---|---|---|---|---|---|---|",
        "| ours, max over all j (unbounded stream) | "
        + " | ".join(f"{v:.3g}" for v in unbounded)
        + " |",
        "| ours, j ≤ T − d + 1 (the paper's finite-T curve) | "
        + " | ".join(f"{v:.4g}" for v in finite)
        + " |",
        "| expected | 2.01 | 4.43 | 24.7 | 2.39 | 1.59 | 1.22 |",
    ]


def discrete_rows(eps: dict) -> list[str]:
    """The pipeline adds discrete Laplace noise, whose variance is below 2 b^2."""
    lines = [
        "| T | mechanism | MSE, continuous Laplace (calibrated) |"
        " MSE, discrete Laplace (released) |",
        "|---|---|---|---|",
    ]
    for horizon in (10**3, 10**6):
        for lam in (1, 2, 3):
            spec = alg3_spec(eps[("alg3", horizon, lam)], lam)
            cont = et.mean_noise_variance(spec, horizon, continuous=True)
            disc = et.mean_noise_variance(spec, horizon)
            lines.append(
                f"| 10^{round(math.log10(horizon))} | Alg 3 λ={lam} | {cont:.1f} | {disc:.1f} |"
            )
    return lines


def plot(eps: dict, pairs: dict) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    colours = {1: "tab:blue", 2: "tab:orange", 3: "tab:green"}
    for ax, horizon, windows in ((axes[0], 10**3, (31, 63, 127)), (axes[1], 10**6, (127, 1023))):
        ds = ds_for(horizon)
        for lam in (1, 2, 3):
            spec = alg3_spec(eps[("alg3", horizon, lam)], lam)
            label = f"Alg 3, λ={lam} (ε={eps[('alg3', horizon, lam)]:.4g})"
            ax.plot(
                ds,
                [et.canonical_loss(spec, d) for d in ds],
                color=colours[lam],
                lw=1.0,
                label=label,
            )
            ax.plot(
                ds,
                [et.privacy_loss(spec, d) for d in ds],
                color=colours[lam],
                lw=1.0,
                ls="--",
                alpha=0.7,
            )
        greys = ["tab:red", "tab:purple", "tab:brown"]
        for colour, window in zip(greys, windows, strict=False):
            cur, past = eps[("base", horizon, window)]
            spec = baseline_spec(cur, past, window)
            ax.plot(
                ds,
                [rr.privacy_loss(spec, d) for d in ds],
                color=colour,
                lw=1.4,
                label=f"baseline W={window}, ε_cur={cur:.4g}, ε_past=ε_cur/10",
            )
            if horizon == 10**6:
                cur, past = pairs[(horizon, window)]
                spec = baseline_spec(cur, past, window)
                ax.plot(
                    ds,
                    [rr.privacy_loss(spec, d) for d in ds],
                    color=colour,
                    lw=1.0,
                    ls=":",
                    label=f"baseline W={window}, optimal ε_past (ours)",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("elapsed time d = τ − j + 1")
        ax.set_ylabel("privacy loss ε·g(d)")
        ax.set_title(f"T = 10^{round(math.log10(horizon))}, every curve at MSE = 1000")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "Privacy expiration: Algorithm 3 (solid: worst-case canonical cost; dashed: "
        "Theorem 1.2 bound) vs round-restarted binary mechanism",
        fontsize=10,
    )
    fig.tight_layout()
    IMG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG, dpi=130)
    plt.close(fig)


def main() -> None:
    start = time.perf_counter()
    table, eps = table_1()
    optimal, pairs = optimal_rows()
    curves = curve_rows(eps)
    small = small_t_rows()
    discrete = discrete_rows(eps)
    plot(eps, pairs)
    elapsed = time.perf_counter() - start
    doc = f"""# Privacy expiration: Table 1 and the expiration curves (Andersson et al.)

Reproduction of Andersson, Henzinger, Pagh, Steiner, Upadhyay, *Continual Counting with
Gradual Privacy Expiration* (NeurIPS 2024, arXiv:2406.03802), Table 1 and Figs 1(b)/2/3,
with the mechanisms of `operators/trees/expiring_tree.py` (Algorithm 3, Algorithm 2 = λ=1) and
`operators/baselines/round_restart.py` (the round-restarted binary mechanism baseline).

Regenerate (deterministic, took {elapsed:.0f} s):

```
{COMMAND}
```

Method (the paper's Sec. 6 and App. A): every curve is calibrated to MSE = 1000, the mean
over t = 1..T of the noise variance, using the **continuous** Laplace variance 2b² as the paper does
(`mean_noise_variance(..., continuous=True)`; MSE ∝ 1/ε², so ε = √(MSE(ε=1)/1000)).
Algorithm 3 runs with B = 0. Losses are absolute (ε·g(d)), d = τ − j + 1.

## Table 1

{chr(10).join(table)}

All Algorithm-3 and ε_past = ε_cur/10 baseline entries reproduce to 4 significant digits.

### Baseline with the optimal fraction (Fig 4, Appendix A.1)

{chr(10).join(optimal)}

The paper's pairs all give MSE = 1000 (±0.2). Minimising the loss at d = T ourselves
(grid + golden section over ε_past/ε_cur) gives different pairs: the objective is flat
near its optimum, so the pair is ill-determined while the optimal loss is not (compare
the two loss columns). The plot uses our optimal pairs for the dotted lines; the curve
table below uses the paper's pairs.

## Expiration curves

![expiration curves](img/expiration.png)

Both panels are log-log. Left (T = 10³, like Figs 2(b)/2(c)): Algorithm 3 for λ = 1, 2,
3 against the baseline with W = 31, 63, 127. Right (T = 10⁶, like Figs 1(b)/3): λ = 1, 2,
3 against the baseline with W = 127, 1023 (solid: ε_past = ε_cur/10, dotted: our optimal
ε_past).
Algorithm 3's solid lines are the worst case over j of the canonical-decomposition cost
(`canonical_loss`, what the paper plots; not monotone, see docs/papers.md), its dashed lines
the Theorem 1.2 bound ε·g_λ(d) (`privacy_loss`, what the pipeline's accountant reports).
The baseline's curve is its exact loss maximised over j (`round_restart.privacy_loss`).

### Values at selected d, against our expected values

{chr(10).join(curves)}

{chr(10).join(small)}

## Discrete vs continuous noise

The releases carry **discrete** Laplace noise with the same scales; its variance is a
little below 2b², so at the calibrated ε the pipeline's actual MSE is below 1000:

{chr(10).join(discrete)}

## Notes and differences

* Every Algorithm-3 and ratio-10 baseline ε of Table 1 is reproduced to 4 significant
  digits. With Table 1's (rounded) ε, as our expected values used, so is every cell of
  our table of expected plotted values but one: baseline W = 127 with the paper's optimal
  pair at d = 10 is 4 nodes × 6.973/7 = 3.9846, which the table prints as 3.99 (double
  rounding via 3.985). Likewise its 2.39 at T = 10³, d = 1000, W = 31 is 2.38476 exactly.
* Our curves are the worst case over **all** j, the guarantee on an unbounded stream.
  The paper's finite-T curves only use j ≤ T − d + 1 (so τ ≤ T); the two agree except for
  d close to T, e.g. λ = 3 at T = d = 10³: 24.9 over all j, 24.74 with j = 1 only (the
  table's 24.7).
* The optimal-fraction pairs of Fig 4 are not reproduced exactly (flat objective; our
  rebuild found the same), but the loss at d = T is.
* Theorem 1.2's g_λ counts two intervals per level and is loose: the worst-case canonical
  cost is 25–35% lower at d = 10³–10⁶. It is looser still against the
  exact likelihood ratio: the coupling may shift dyadic intervals that reach past τ − B
  (outputs after τ are not part of the guarantee), so the cheapest coupling is roughly
  one interval per level. The exact-likelihood tests in
  `tests/operators/trees/test_expiring_tree.py` find halved noise landing exactly on g_λ (never
  above) in every case with τ ≤ 16, which is why they need a third of the noise to show
  that the check can fail. We keep g_λ as the reported bound (it is the proven one).
* For λ = 3 the canonical decomposition is not the cheapest partition (small scales are
  cheaper at level 0); the plotted curve follows the paper (canonical).
"""
    DOC.write_text(doc)
    print(doc)
    print(f"wrote {DOC} and {IMG} in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
