"""The pipeline's privacy statement: one accountant for every statistic of a pipeline.

What one user can lose, and under which neighbouring relation, is decided here and only
here: the config validation, ``dpstream check-config``, the worker's ledger and stage 2's
tree counters all ask this module.

**Relations.** A statistic's guarantee holds for a neighbouring relation:

* ``whole_user``: neighbouring streams differ by all events of one user (added or
  removed). Tree counters, the user-level mechanisms and strict per-cell means
  (``add_remove_user``, the same relation in the cells paper's words).
* ``any_subset``: neighbours may drop ANY subset of one user's events. Truncation then
  moves up to 2 tau leaf units (Dong, Luo, Yi, "Continual Observation under User-level
  Differential Privacy", IEEE S&P 2023, the remark on neighbouring definitions), so every
  sensitivity doubles (:func:`sensitivity_multiplier`).
* ``public_counts``: who sent how many events when is public; only values are protected.
  The continual mean of George, Ramesh, Singh, Tyagi ("Continual Mean Estimation Under
  User-Level Privacy", arXiv:2212.09980: Algs. 4-6 use un-noised arrival counts) and the
  per-cell mean mechanisms of Rameshwar et al. (arXiv:2405.06261, Sec. II-D: a public count
  matrix) are private under this relation only, and their releases carry exact counts.
  ``kind: mean`` runs George et al.'s algorithm only in a public-counts pipeline; by
  default it is the whole-user mean (``whole_user_mean``: a noisy sum over a noisy count,
  both tree counters, epsilon / 2 each), which releases no exact count.

A whole-user statistic protects exactly what a public-counts statistic publishes, so the
two never share one ``total_epsilon``: a pipeline declares ``privacy.public_counts`` and
then holds statistics of that relation only (:func:`statement` refuses a mix).

**Composition.** Basic composition (epsilons add up, adaptively too) over the pipeline's
statistics. A tree counter's epsilon covers its whole infinite stream. An expiring counter
(Andersson, Henzinger, Pagh, Steiner, Upadhyay, arXiv:2406.03802, Theorem 1.2) protects an
item of age d with epsilon g(d), charged at the declared horizon. A per-cell mean is
charged its epoch cap B: disjoint cells compose in parallel within an accounting epoch
(arXiv:2401.15906, Thm II.3), so with a per-cell mean the pipeline's total is per epoch.
A strict per-cell mean under ``any_subset`` is charged 2B (:func:`charge_of` says why).

**zCDP.** A pipeline with ``privacy.accounting: zcdp`` is accounted in rho-zCDP instead
(Bun-Steinke 2016 Def. 1.1): its statistics are fixed-tau counts and sums on the
square-root factorization counter (``trees.sqrt_factorization``), each charged its rho
over the whole infinite stream, calibrated to the user-level sensitivity Delta_1 ||c||_2
(Delta_1 = tau times the value bound, doubled under any_subset; ||c||_2 the encoder's
largest column norm); the rhos add up (Bun-Steinke Lemma 1.7, adaptively too) against
``total_rho``. The statement also states the (epsilon, delta)-DP the total implies at the
pipeline's delta by Canonne-Kamath-Steinke 2020 Cor. 13 (``zcdp.epsilon_cks``; Bun-Steinke
Prop. 1.3 gives a larger epsilon): ``total_epsilon`` and ``per_user_total`` are those
epsilons there, so what reads a statement in epsilon reads a valid (epsilon, delta) bound.
A pure epsilon-DP charge a zCDP statement inherits (retired) counts epsilon^2 / 2
(Bun-Steinke Prop. 1.4); a pure statement cannot cover a zCDP charge, which it refuses.

**Identity.** A statistic's noise is bound to :func:`fingerprint` of every parameter that
shapes its noise or sensitivity; a statistic whose fingerprint changed is a new statistic,
and what the old one spent stays spent (``retired`` charges).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import orjson

from ..errors import DpStreamError
from ..means import whole_user_mean
from ..trees import expiring_tree, sqrt_factorization
from . import zcdp

WHOLE_USER = "whole_user"
ANY_SUBSET = "any_subset"
PUBLIC_COUNTS = "public_counts"


class StatementError(DpStreamError, ValueError):
    """The statistics cannot be run under the declared statement; ``field`` names why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


Form = Literal["tree_counter", "whole_user_mean", "continual_mean", "per_cell_mean"]


@dataclass(frozen=True)
class StatisticTerms:
    """What the accountant needs of one statistic (``config/statistic.py`` builds it).

    Attributes:
        name: the statistic's name.
        kind: its kind (for messages).
        form: how it is charged: a tree counter (every counting kind: epsilon over the
            whole stream, or epsilon g(horizon) when expiring), the whole-user mean
            (two counters at epsilon / 2), George et al.'s continual mean (public
            counts), a per-cell mean (B per accounting epoch).
        epsilon: its epsilon (one cell release's for cell_mean), exact.
        mechanism: the tree (binary, kary, kary_subtract, expiring, auto).
        lam, delay, horizon_ticks: the expiring tree's lambda, delay and charged age.
        epoch_cap: cell_mean's B per accounting epoch.
        counts_public: cell_mean's public-counts model; for a mean, George et al.'s
            algorithm (the pipeline's ``privacy.public_counts``) instead of the
            whole-user mean.
        max_samples, resolution: the whole-user mean's m and R (its sensitivities).
        rho: its zCDP budget under ``privacy.accounting: zcdp`` (None: pure, charged
            ``epsilon``); then ``mechanism`` is ``sqrt_factorization`` and
            ``horizon_ticks`` its design horizon (None: the module's default).
        sensitivity: a fixed-tau count's or sum's bound on one user's leaves,
            sum_t |x_t| (tau times the value bound), before the relation's multiplier.
    """

    name: str
    kind: str
    epsilon: Fraction
    form: Form = "tree_counter"
    mechanism: str = "binary"
    lam: Fraction | None = None
    delay: int = 0
    horizon_ticks: int | None = None
    epoch_cap: Fraction | None = None
    counts_public: bool = False
    max_samples: int | None = None
    resolution: int | None = None
    rho: Fraction | None = None
    sensitivity: int = 1


@dataclass(frozen=True)
class Charge:
    """What one user can lose through one statistic.

    Attributes:
        statistic: its name.
        relation: the neighbouring relation its guarantee is stated for.
        epsilon: the most one user loses through it (over the whole stream, or per
            accounting epoch when ``per_epoch``).
        per_epoch: a per-cell mean: ``epsilon`` is per accounting epoch.
        exact_counts: its releases carry exact data-dependent counts (public counts).
        basis: how the charge comes about, in words.
        run_id: which run of the statistic it charges (None: its current one). A
            statistic started anew (its state lost, a changed key) is charged once per run.
        rho: under zCDP accounting, its rho; ``epsilon`` is then the epsilon of the
            (epsilon, delta)-DP it implies alone at ``delta`` (Canonne-Kamath-Steinke).
        delta: that delta (None: a pure charge).
    """

    statistic: str
    relation: str
    epsilon: Fraction
    per_epoch: bool
    exact_counts: bool
    basis: str
    run_id: str | None = None
    rho: Fraction | None = None
    delta: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "statistic": self.statistic,
            "relation": self.relation,
            "epsilon": float(self.epsilon),
            "per_epoch": self.per_epoch,
            "exact_counts": self.exact_counts,
            "basis": self.basis,
        }
        if self.run_id is not None:
            out["run_id"] = self.run_id
        if self.rho is not None:
            out["rho"] = float(self.rho)
            out["delta"] = self.delta
        return out

    @property
    def as_rho(self) -> Fraction:
        """The charge in zCDP: its rho, or a pure charge's epsilon^2 / 2 (epsilon-DP
        implies epsilon^2 / 2-zCDP, Bun-Steinke Prop. 1.4)."""
        return self.rho if self.rho is not None else self.epsilon * self.epsilon / 2

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Charge:
        """The charge a ledger statement recorded (``to_json``); epsilon as the decimal written."""
        return cls(
            statistic=obj["statistic"],
            relation=obj["relation"],
            epsilon=Fraction(repr(obj["epsilon"])),
            per_epoch=obj["per_epoch"],
            exact_counts=obj["exact_counts"],
            basis=obj["basis"],
            run_id=obj.get("run_id"),
            rho=None if obj.get("rho") is None else Fraction(repr(obj["rho"])),
            delta=obj.get("delta"),
        )


@dataclass(frozen=True)
class PrivacyStatement:
    """A pipeline's privacy statement: its relation, its charges, their composition.

    Attributes:
        app_id: the pipeline.
        relation: whole_user, any_subset or public_counts.
        total_epsilon: the declared bound on what one user may lose.
        charges: one per configured statistic, in config order.
        retired: statistics that ran under this app id before and are no longer
            configured (or changed, so are new statistics now): what they spent stays spent.
        total_rho: under zCDP accounting, the declared bound in rho; ``total_epsilon`` is
            then the epsilon it implies at ``delta`` (module docstring).
        delta: the delta of a zCDP statement's (epsilon, delta) (None: pure).
    """

    app_id: str
    relation: str
    total_epsilon: Fraction
    charges: tuple[Charge, ...]
    retired: tuple[Charge, ...] = field(default=())
    total_rho: Fraction | None = None
    delta: float | None = None

    @property
    def zcdp(self) -> bool:
        """Accounted in rho-zCDP (``privacy.accounting: zcdp``)."""
        return self.total_rho is not None

    @property
    def rho_total(self) -> Fraction:
        """zCDP composition over every statistic, retired ones included: the rhos add up
        (Bun-Steinke Lemma 1.7), a retired pure charge as epsilon^2 / 2."""
        return sum((c.as_rho for c in (*self.charges, *self.retired)), Fraction(0))

    @property
    def per_epoch(self) -> bool:
        """The total bounds the loss within one accounting epoch (a per-cell mean)."""
        return any(c.per_epoch for c in (*self.charges, *self.retired))

    @property
    def per_user_total(self) -> Fraction:
        """Basic composition over every statistic, retired ones included; under zCDP the
        epsilon that ``rho_total`` implies at ``delta`` (Canonne-Kamath-Steinke)."""
        if self.delta is not None:
            return implied_epsilon(self.rho_total, self.delta)
        return sum((c.epsilon for c in (*self.charges, *self.retired)), Fraction(0))

    def to_json(self) -> dict[str, Any]:
        composition = "basic" + (" (cells: disjoint, per epoch)" if self.per_epoch else "")
        out = {
            "app_id": self.app_id,
            "relation": self.relation,
            "public_counts": self.relation == PUBLIC_COUNTS,
            "composition": "zcdp (rhos add up)" if self.zcdp else composition,
            "per_user_total": float(self.per_user_total),
            "per_epoch": self.per_epoch,
            "total_epsilon": float(self.total_epsilon),
            "statistics": [c.to_json() for c in self.charges],
            "retired": [c.to_json() for c in self.retired],
        }
        if self.total_rho is not None:
            out["accounting"] = "zcdp"
            out["rho_total"] = float(self.rho_total)
            out["total_rho"] = float(self.total_rho)
            out["delta"] = self.delta
        return out

    def describe(self) -> list[str]:
        """The statement in words, one line each (check-config prints them)."""
        if self.total_rho is not None:
            return self._describe_zcdp(self.total_rho)
        lines = [f"privacy statement ({self.relation} neighbours):"]
        if self.relation == PUBLIC_COUNTS:
            lines.append(
                "  PUBLIC COUNTS: who sent how many events when is NOT protected; only "
                "values are. Releases carry exact counts."
            )
        for c in self.charges:
            unit = " per epoch" if c.per_epoch else ""
            lines.append(f"  {c.statistic}: {float(c.epsilon):g}{unit} ({c.relation}; {c.basis})")
        for c in self.retired:
            run = "" if c.run_id is None else f", run {c.run_id}"
            lines.append(f"  {c.statistic} (retired{run}, spent): {float(c.epsilon):g}")
        unit = " per accounting epoch" if self.per_epoch else " over the whole stream"
        lines.append(
            f"  one user can lose at most {float(self.per_user_total):g}{unit} "
            f"(basic composition) of total_epsilon={float(self.total_epsilon):g}"
        )
        return lines

    def _describe_zcdp(self, total_rho: Fraction) -> list[str]:
        lines = [f"privacy statement ({self.relation} neighbours, rho-zCDP):"]
        for c in self.charges:
            lines.append(
                f"  {c.statistic}: rho={float(c.as_rho):g}, alone ({float(c.epsilon):.4g}, "
                f"{c.delta:g})-DP ({c.relation}; {c.basis})"
            )
        for c in self.retired:
            run = "" if c.run_id is None else f", run {c.run_id}"
            lines.append(f"  {c.statistic} (retired{run}, spent): rho={float(c.as_rho):g}")
        assert self.delta is not None
        rho = self.rho_total
        lines += [
            f"  one user can lose at most rho={float(rho):g} over the whole stream (zCDP: "
            f"rhos add up, Bun-Steinke 2016 Lemma 1.7) of total_rho={float(total_rho):g}",
            f"  which implies ({float(self.per_user_total):.4g}, {self.delta:g})-DP at "
            f"delta={self.delta:g} (Canonne-Kamath-Steinke 2020 Cor. 13; Bun-Steinke 2016 "
            f"Prop. 1.3 gives epsilon {zcdp.epsilon_bun_steinke(rho, self.delta):.4g}); "
            f"total_rho implies ({float(self.total_epsilon):.4g}, {self.delta:g})-DP",
        ]
        return lines


@functools.lru_cache(maxsize=256)
def implied_epsilon(rho: Fraction, delta: float) -> Fraction:
    """The epsilon of the (epsilon, delta)-DP that rho-zCDP implies (Canonne-Kamath-
    Steinke 2020 Cor. 13, ``zcdp.epsilon_cks``: rounded up), as the decimal it prints as."""
    return Fraction(repr(zcdp.epsilon_cks(rho, delta)))


def sensitivity_multiplier(relation: str) -> int:
    """How much more than under whole-user neighbours one user can move a truncated sum:
    2 under any_subset (dropping a user's early events promotes later ones), else 1."""
    return 2 if relation == ANY_SUBSET else 1


def charge_of(terms: StatisticTerms, relation: str, delta: float | None = None) -> Charge:
    """What one user can lose through the statistic ``terms`` under ``relation``.

    A tree counter: its epsilon over the whole stream (any_subset doubles its sensitivity,
    not its charge); an expiring one: epsilon g(horizon); a whole-user mean: its epsilon
    for both counters; George et al.'s mean: its epsilon under public counts; a per-cell
    mean: its epoch cap B per accounting epoch, 2B for a strict one under any_subset.

    Privacy:
        Per-cell means. Each released cell is epsilon-DP in the data of the users it
        keeps (under any_subset its sum's noise is doubled, operators/cells/cell_mean.py)
        and draws its own noise, so a neighbour costs epsilon per cell whose input
        changes (Rameshwar et al. Thm II.3). Which cells keep user l is decided by l's
        own spend this epoch (``on_cap: drop_user``, the only choice in strict mode): l
        is kept in cell g if l's loss before g plus epsilon is at most B. Let K be the
        cells that keep l in the stream D and K' those that keep l in a neighbour D';
        each holds at most B / epsilon cells. A cell outside K and K' reads none of l's
        data in either stream, and no other user's admission depends on l, so only the
        cells of K and K' change input: the loss is at most
        epsilon |K u K'| <= epsilon (|K| + |K'|) <= 2B.

        * whole_user: D' lacks l, so K' is empty and the loss is at most B.
        * any_subset: D' keeps a subset of l's events, so K' need not be empty and can be
          disjoint from K: with cells a and b, epsilon = B, one event of l in each, l is
          kept in a (the first cell in key order) and dropped from b; without the event
          in a, l is kept in b. Both cells change: 2B, and the bound is attained
          (``tests/statistics/test_cell_mean.py``, exhaustively over small cases).
        * public counts: the count matrix is public, so neighbours have the same cells,
          the same users in them and the same admissions, and differ in values only: B
          (any_subset does not apply to them, :func:`statement`).

    References:
        Rameshwar, Tandon, Gupta, Singh, Chakraborty, Sharma, "Mean Estimation with
        User-Level Privacy for Spatio-Temporal IoT Datasets", arXiv:2401.15906, Thm II.3
        (docs/papers.md: Rameshwar et al.); the epoch cap, the strict mode and the 2B
        bound are ours (docs/design.md section 13).
    """
    if terms.rho is not None:
        return _zcdp_charge(terms, relation, zcdp_delta(delta))
    if terms.form == "continual_mean":
        return Charge(
            terms.name,
            PUBLIC_COUNTS,
            terms.epsilon,
            False,
            True,
            "continual mean: medians and binary mechanisms by basic composition",
        )
    if terms.form == "whole_user_mean":
        assert terms.max_samples is not None and terms.resolution is not None
        count, units = whole_user_mean.sensitivities(
            terms.max_samples, terms.resolution, sensitivity_multiplier(relation)
        )
        half = float(terms.epsilon / 2)
        basis = (
            f"whole-user mean: kept-samples counter at {half:g} (sensitivity {count}) + "
            f"grid-units counter at {half:g} (sensitivity {units}), tree counters over the "
            "whole infinite stream"
        )
        return Charge(terms.name, relation, terms.epsilon, False, False, basis)
    if terms.form == "per_cell_mean":
        assert terms.epoch_cap is not None
        charged = terms.epoch_cap
        basis = f"epoch cap B over disjoint cells of epsilon {float(terms.epsilon):g} each"
        if relation == ANY_SUBSET and not terms.counts_public:
            charged = 2 * terms.epoch_cap
            basis = (
                f"2B, epoch cap B = {float(terms.epoch_cap):g} over disjoint cells of epsilon "
                f"{float(terms.epsilon):g} each: under any_subset, dropping some of a user's "
                "events can admit the user into cells it was dropped from at the cap"
            )
        return Charge(
            terms.name,
            PUBLIC_COUNTS if terms.counts_public else relation,
            charged,
            True,
            terms.counts_public,
            basis,
        )
    if terms.mechanism == "expiring":
        assert terms.lam is not None and terms.horizon_ticks is not None
        spec = expiring_tree.make_expiring_tree(
            terms.epsilon, 1, (terms.name, 0), terms.lam, terms.delay
        )
        loss = Fraction(expiring_tree.privacy_loss(spec, terms.horizon_ticks))
        basis = f"expiring: epsilon g(d) at the horizon d = {terms.horizon_ticks} ticks"
        return Charge(terms.name, relation, loss, False, False, basis)
    return Charge(
        terms.name, relation, terms.epsilon, False, False, "tree counter, whole infinite stream"
    )


def zcdp_delta(delta: float | None) -> float:
    """The delta a zCDP charge states its (epsilon, delta) at (a statement always gives
    one; config's DEFAULT_DELTA)."""
    if delta is None:
        raise StatementError("privacy.delta", "a zCDP statement needs the delta it states")
    return delta


def sqrt_counter(terms: StatisticTerms, relation: str) -> sqrt_factorization.SqrtFactorizationSpec:
    """The square-root factorization counter of a zCDP statistic, as stage 2 builds it
    (the same rho, leaf sensitivity and design horizon; noise prefix aside)."""
    assert terms.rho is not None
    horizon = terms.horizon_ticks or sqrt_factorization.DEFAULT_HORIZON
    d1 = sensitivity_multiplier(relation) * terms.sensitivity
    return sqrt_factorization.make_sqrt_factorization(terms.rho, d1, (terms.name, 0), horizon)


def _zcdp_charge(terms: StatisticTerms, relation: str, delta: float) -> Charge:
    """A square-root factorization counter's charge: its rho over the whole infinite
    stream; sigma^2 is calibrated so that (Delta_1 ||c||_2)^2 / (2 sigma^2), plus the
    fixed point's and the lattice's slack, is at most rho (``make_sqrt_factorization``)."""
    assert terms.rho is not None
    spec = sqrt_counter(terms, relation)
    d1 = spec.sensitivity
    norm = math.sqrt(sqrt_factorization.column_norm_squared(spec))
    basis = (
        f"square-root factorization counter, discrete Gaussian sigma^2={float(spec.sigma2):.6g}"
        f", user-level L2 sensitivity Delta_1 ||c||_2 = {d1} x {norm:.4f} (Delta_1: the "
        "most one user's kept units move the leaves, tau or tau times a grid sum's bound"
        f"{', doubled under any_subset' if relation == ANY_SUBSET else ''}), whole infinite "
        "stream"
    )
    epsilon = implied_epsilon(terms.rho, delta)
    return Charge(terms.name, relation, epsilon, False, False, basis, rho=terms.rho, delta=delta)


def lifetime_steps(terms: StatisticTerms) -> int | None:
    """How many steps a statistic may release under its charge: an expiring counter is
    charged epsilon g(d) at the declared horizon d (:func:`charge_of`), and a release at a
    later step would let its oldest item lose more, so it stops after ``horizon_ticks``
    steps. None: its charge covers the whole infinite stream."""
    if terms.mechanism == "expiring":
        assert terms.horizon_ticks is not None
        return terms.horizon_ticks
    return None


def statement(
    app_id: str,
    statistics: Sequence[StatisticTerms],
    relation: str,
    public_counts: bool,
    total_epsilon: Fraction | None,
    retired: Sequence[Charge] = (),
    total_rho: Fraction | None = None,
    delta: float | None = None,
) -> PrivacyStatement:
    """The pipeline's privacy statement, or a StatementError naming the field at fault.

    Args:
        app_id: the pipeline.
        statistics: its statistics, in config order.
        relation: ``privacy.neighbours``: whole_user or any_subset.
        public_counts: ``privacy.public_counts``: the pipeline holds public-counts
            statistics only, and every release says so.
        total_epsilon: ``privacy.total_epsilon`` (None under zCDP accounting).
        retired: charges of statistics this app id ran before and no longer runs.
        total_rho: ``privacy.total_rho``: the statement is in zCDP (None: pure).
        delta: under zCDP, the delta its (epsilon, delta) is stated at.

    Raises:
        StatementError: a public-counts statistic without ``public_counts``, a whole-user
            one with it, any_subset with it, a total above ``total_epsilon`` (or
            ``total_rho``), a pure statement over zCDP charges.
    """
    if total_rho is not None:
        return _zcdp_statement(
            app_id, statistics, relation, public_counts, total_rho, zcdp_delta(delta), retired
        )
    if total_epsilon is None:
        raise StatementError("privacy.total_epsilon", "required (total_rho under zcdp)")
    in_rho = [t.name for t in statistics if t.rho is not None]
    in_rho += [c.statistic for c in retired if c.rho is not None]
    if in_rho:
        raise StatementError(
            "privacy.accounting",
            f"{in_rho[0]!r} is charged in rho-zCDP, which a pure epsilon-DP statement "
            "cannot cover (zCDP implies only (epsilon, delta)-DP)",
        )
    if public_counts and relation != WHOLE_USER:
        raise StatementError(
            "privacy.neighbours",
            f"{relation} does not apply with public_counts: true (counts are public; only "
            "values are protected)",
        )
    charges = tuple(charge_of(t, relation) for t in statistics)
    for i, (terms, charge) in enumerate(zip(statistics, charges, strict=True)):
        if charge.exact_counts and not public_counts:
            where = "kind" if terms.form == "continual_mean" else "cells.counts_public"
            raise StatementError(
                f"statistics[{i}].{where}",
                f"{terms.name!r} is private only with its counts public (who sent how many "
                "events when) and releases them exactly; declare privacy.public_counts: true, "
                "in a pipeline of its own (whole-user statistics protect what it publishes)",
            )
        if public_counts and not charge.exact_counts:
            raise StatementError(
                f"statistics[{i}]",
                f"{terms.name!r} ({terms.kind}) protects whole users, but privacy.public_counts "
                "is true: public-counts statistics publish what it protects, so they cannot "
                "share one total_epsilon; run it in a pipeline with public_counts: false",
            )
    out = PrivacyStatement(
        app_id,
        PUBLIC_COUNTS if public_counts else relation,
        total_epsilon,
        charges,
        tuple(retired),
    )
    if out.per_user_total > total_epsilon:
        spent = ", ".join(f"{c.statistic} {float(c.epsilon):g}" for c in (*charges, *retired))
        raise StatementError(
            "privacy.total_epsilon",
            f"statistics spend {float(out.per_user_total):g} in total ({spent}), more than "
            f"total_epsilon={float(total_epsilon):g}",
        )
    return out


def _zcdp_statement(
    app_id: str,
    statistics: Sequence[StatisticTerms],
    relation: str,
    public_counts: bool,
    total_rho: Fraction,
    delta: float,
    retired: Sequence[Charge],
) -> PrivacyStatement:
    """``statement`` under zCDP accounting: every statistic charged in rho, the rhos
    composed against ``total_rho`` (module docstring)."""
    if public_counts:
        raise StatementError(
            "privacy.public_counts", "public-counts statistics are pure-DP; not under zcdp"
        )
    for i, terms in enumerate(statistics):
        if terms.rho is None:
            raise StatementError(f"statistics[{i}].rho", "required with accounting: zcdp")
    charges = tuple(charge_of(t, relation, delta) for t in statistics)
    out = PrivacyStatement(
        app_id,
        relation,
        implied_epsilon(total_rho, delta),
        charges,
        tuple(retired),
        total_rho=total_rho,
        delta=delta,
    )
    if out.rho_total > total_rho:
        spent = ", ".join(f"{c.statistic} {float(c.as_rho):g}" for c in (*charges, *retired))
        raise StatementError(
            "privacy.total_rho",
            f"statistics spend rho={float(out.rho_total):g} in total ({spent}), more than "
            f"total_rho={float(total_rho):g}",
        )
    return out


# ---------------------------------------------------------------------------------------
# Identity


def fingerprint(parameters: Mapping[str, Any]) -> str:
    """A statistic's identity: SHA-256 of its parameters as canonical JSON (hex, 32 chars).

    ``parameters`` holds everything that shapes the statistic's noise or sensitivity, so
    two statistics share a fingerprint only if they would draw the same noise for the same
    data; noise derived from it is never shared by different parameter sets. It is stable:
    the ledger stores it, so the same parameters must give the same value in every release.

    Example:
        >>> fingerprint({"tau": 4, "epsilon": "1/2"}) == fingerprint({"epsilon": "1/2", "tau": 4})
        True
        >>> fingerprint({"epsilon": "1/2", "tau": 4})
        '56cf3790cab0239e53ca7d2138b2980f'
    """
    canonical = orjson.dumps(dict(parameters), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(b"dpstream/statistic/v1\0" + canonical).hexdigest()[:32]


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted names of the parameters that differ between ``old`` and ``new``."""
    out: list[str] = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(changed_fields(a, b, f"{prefix}{name}."))
        elif a != b:
            out.append(f"{prefix}{name}")
    return out
