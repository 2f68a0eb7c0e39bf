"""One slot's cell releases under the epoch cap: which users each cell keeps, what each
user is charged, which cells are released (Rameshwar et al., with our epoch cap).

A slot s of a per-cell mean holds, per cell key, each user's aggregate. Its cells are
released one by one in key order; before each, ``cell_accountant.admit`` keeps the users
whose loss this epoch stays within the cap B (``on_cap: drop_user``: a user who would
exceed it is dropped, and spends nothing more this epoch), and after it each kept user is
charged the cell's epsilon (``cell_accountant.charge``). With public counts and
Clip-User, the (user, cell) pairs that Clip-User suppresses are left out first; with
``drop_user``, Clip-User plans with each user's remaining budget. Strict mode
(``counts_public`` false) releases every listed cell, whoever is left in it (maybe
nobody): which cells have data is private.

References:
    Rameshwar, Tandon, Gupta, Singh, Chakraborty, Sharma, "Mean Estimation with
    User-Level Privacy for Spatio-Temporal IoT Datasets", arXiv:2401.15906 (Thm II.3,
    Clip-User); the epoch cap and strict mode are ours (docs/design.md section 13).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..noise import NoiseSource
from . import cell_accountant as acct
from . import cell_mean, clip_user

# Versioned with ``cell_accountant`` (its charge rules): a change here raises that
# module's VERSION, which every per-cell mean's fingerprint holds.


@dataclass(frozen=True, slots=True)
class SlotReleaseSpec:
    """A per-cell mean's release policy: one cell's mechanism, the epoch ledger's cap and
    mode (``accountant.counts_public``), Clip-User (public counts only)."""

    mean: cell_mean.CellMeanSpec
    accountant: acct.CellAccountantSpec
    clip: clip_user.ClipUserSpec | None


@dataclass(frozen=True, slots=True)
class SlotRelease:
    """What one slot released and spent.

    Attributes:
        releases: (cell key, its release), in key order.
        book: the epoch ledger after the slot.
        charged: the (user, cell) charges made.
        capped: users dropped at the epoch cap in this slot.
        dropped_pairs: (cell, user) pairs left out because their user was at the cap.
        skipped: cells with data not released (public counts: every user dropped).
        clip: Clip-User's plan, when it ran.
    """

    releases: tuple[tuple[str, cell_mean.CellRelease], ...]
    book: acct.CellLedgerState
    charged: int
    capped: frozenset[str]
    dropped_pairs: int
    skipped: int
    clip: clip_user.ClipPlan | None


Aggregates = Mapping[str, Mapping[str, cell_mean.UserCellAggregate]]
"""Cell key -> user -> the user's aggregate in that cell (users in sorted order)."""


def release_slot(
    spec: SlotReleaseSpec,
    book: acct.CellLedgerState | None,
    epoch: int,
    keys: Sequence[str],
    aggs: Aggregates,
    cell_id: Callable[[str], tuple[str | int, ...]],
    noise: NoiseSource,
) -> SlotRelease:
    """Release the cells ``keys`` of one slot of accounting epoch ``epoch``.

    Args:
        spec: the policy.
        book: the epoch ledger before the slot (None: none yet).
        epoch: the slot's accounting epoch (a later one starts a fresh ledger).
        keys: the cells to release, in order (strict mode: every listed cell).
        aggs: the slot's aggregates.
        cell_id: a cell key's node identity (the noise of its release).
        noise: the noise source.

    Returns:
        The releases and what they spent.
    """
    if book is None:
        book = acct.init(spec.accountant, epoch)
    elif epoch > book.epoch:
        book = acct.start_epoch(spec.accountant, book, epoch)
    removed, capped, plan = _clip(spec, book, keys, aggs, cell_id)
    eps = spec.mean.epsilon
    released: list[tuple[str, cell_mean.CellRelease]] = []
    charged = dropped_pairs = skipped = 0
    for key in keys:
        row = aggs.get(key, {})
        candidates = [u for u in row if u not in removed.get(key, set())]
        if spec.accountant.counts_public and not candidates:
            if row:
                skipped += 1  # every user suppressed (at the cap): not released
            continue
        admission = acct.admit(spec.accountant, book, candidates, eps)
        if admission.dropped:
            dropped_pairs += len(admission.dropped)
            capped.update(admission.dropped)
        if spec.accountant.counts_public and not admission.release:
            skipped += 1
            continue
        # Strict mode releases every listed cell, whoever is left (maybe nobody).
        outcome = cell_mean.release_cell(
            spec.mean, cell_id(key), [row[u] for u in admission.kept], noise
        )
        if outcome.release is None:
            continue
        if outcome.charge is not None and outcome.charge.users:
            book = acct.charge(spec.accountant, book, [outcome.charge])
            charged += len(outcome.charge.users)
        released.append((key, outcome.release))
    if spec.clip is not None:
        dropped_pairs += sum(1 for key in keys for u in removed.get(key, set()) if u in capped)
    return SlotRelease(
        tuple(released), book, charged, frozenset(capped), dropped_pairs, skipped, plan
    )


def _clip(
    spec: SlotReleaseSpec,
    book: acct.CellLedgerState,
    keys: Sequence[str],
    aggs: Aggregates,
    cell_id: Callable[[str], tuple[str | int, ...]],
) -> tuple[dict[str, set[str]], set[str], clip_user.ClipPlan | None]:
    """Clip-User's suppressed (cell, user) pairs, the users already over the cap this
    slot would take them past (``drop_user``), and the plan; nothing without Clip-User."""
    if spec.clip is None:
        return {}, set(), None
    eps = spec.mean.epsilon
    ids = {key: cell_id(key) for key in keys}
    counts = {ids[k]: {u: a.count for u, a in aggs[k].items()} for k in keys}
    budget = None
    capped: set[str] = set()
    if spec.accountant.on_cap == "drop_user":
        people = sorted({u for row in aggs.values() for u in row})
        budget = {u: acct.remaining(spec.accountant, book, u) for u in people}
        need: dict[str, Fraction] = {}
        for row in aggs.values():
            for user in row:
                need[user] = need.get(user, Fraction(0)) + eps
        capped = {u for u in people if need[u] > budget[u]}
    plan = clip_user.plan(spec.clip, counts, eps, budget_left=budget)
    by_id = {ids[k]: k for k in keys}
    removed = {by_id[tuple(c)]: set(users) for c, users in plan.suppressed}
    return removed, capped, plan
