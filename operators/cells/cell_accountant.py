"""Per-user privacy loss over disjoint cells, with a per-epoch cap B: Rameshwar et al. Thm II.3
and our epochs (docs/papers.md).

A cell is (key, time slot). Cells are disjoint, and a cell's release reads only the
records of the users it keeps, so by Thm II.3 (disjointness; adaptive, since its proof is
a product of conditional probabilities) the releases of an epoch are eps_bar-DP with

    eps_bar = max over users l of loss_l,   loss_l = sum of eps_g over the released cells g
                                                      in which l is kept.

The ledger holds loss_l for the current accounting epoch (e.g. a day; the stream is
infinite, so budgets are per epoch: our choice) and refuses any charge that would take a
user above the cap B. It reports eps_bar, never basic composition (sum over all cells),
which is what a user would lose only if they were in every cell.

Enforcing B happens BEFORE a cell is released, in one of two ways,
chosen by ``on_cap``:

* ``"drop_user"`` (default; "mandatory suppressions"): a user who
  cannot afford eps_g more is removed from the cell; the others are released as usual.
  If nobody is left, nothing is released and nothing is charged.
* ``"skip_cell"``: if any user cannot afford it, the whole cell is not released and
  nobody is charged. Only allowed with public counts: in strict mode, skipping a cell
  because of one user's history would reveal that user to the others' release.

Two privacy models (``counts_public``):

* ``True`` (Rameshwar et al. Sec. II-D): neighbours share the count matrix and differ in one user's
  values. Admission, suppression and Clip-User may then look at everyone's counts.
* ``False`` (strict, ours, the default): neighbours add or remove a user. Every
  decision about user l must depend on l's own data only. ``admit`` (drop_user) is such a
  decision (l's own ledger); so is the online rule (c), ``admit_online``: a user's
  first C = floor(B / eps) distinct cells of the epoch, in arrival order, at ingest.

All loss amounts are exact rationals; the state stores them as (numerator, denominator)
pairs so that it is plain JSON data (``state_codec``).

References:
    Rameshwar et al. Thm II.3, Cor. II.1; epochs, caps and the strict mode are ours
    (docs/papers.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..errors import BudgetExceededError
from ..noise import NodeId, node_bytes

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

ON_CAP = ("drop_user", "skip_cell")


@dataclass(frozen=True, slots=True)
class CellAccountantSpec:
    """Public parameters of the per-user epoch ledger.

    Attributes:
        epoch_cap: B, the most one user may lose in one epoch.
        counts_public: the Rameshwar et al. model (True) or strict add/remove-user model (False).
        on_cap: what ``admit`` does when a user cannot afford a cell ("drop_user" or
            "skip_cell").
    """

    epoch_cap: Fraction
    counts_public: bool
    on_cap: str


@dataclass(frozen=True, slots=True)
class CellCharge:
    """The privacy event of one cell release: eps_g charged to each kept user.

    Attributes:
        cell: public identity of the released cell, e.g. (statistic, key, slot).
        epsilon: eps_g, the cell mechanism's total budget.
        users: the users kept in the release (sorted, distinct). Never published.
    """

    cell: NodeId
    epsilon: Fraction
    users: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CellLedgerState:
    """The ledger of one epoch. Plain data.

    Attributes:
        epoch: the current accounting epoch.
        users: (user, loss numerator, loss denominator, kept cells), sorted by user.
        charged: identities of the cells charged this epoch, sorted by their encoding;
            a second charge of the same cell (a replay) is ignored.
        top: eps_bar so far as (numerator, denominator).
    """

    epoch: int = 0
    users: tuple[tuple[str, int, int, int], ...] = ()
    charged: tuple[tuple[str | int, ...], ...] = ()
    top: tuple[int, int] = (0, 1)


@dataclass(frozen=True, slots=True)
class Admission:
    """Who may be kept in a cell before it is released.

    Attributes:
        kept: users who can afford the cell (sorted).
        dropped: users at or near the cap, removed from the cell (sorted).
        release: False when the cell must not be released at all (nobody kept, or
            skip_cell with a dropped user).
    """

    kept: tuple[str, ...]
    dropped: tuple[str, ...]
    release: bool


@dataclass(frozen=True, slots=True)
class OnlineAdmissionState:
    """Stage-1 state of rule (c) for one user (strict mode).

    Attributes:
        epoch: the epoch the cells belong to.
        cells: the cells admitted so far this epoch, in arrival order (at most C).
    """

    epoch: int = 0
    cells: tuple[tuple[str | int, ...], ...] = ()


def make_cell_accountant(
    epoch_cap: float | int | str | Fraction,
    counts_public: bool = False,
    on_cap: str = "drop_user",
) -> CellAccountantSpec:
    """Validate and build the ledger's spec.

    Args:
        epoch_cap: B > 0, exact rational (config "2.5" means 5/2).
        counts_public: True only where the config declares counts public (Rameshwar et al.
            Sec. II-D); False gives the strict mode.
        on_cap: "drop_user" or "skip_cell" ("skip_cell" needs counts_public).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range.

    Privacy:
        With counts_public: eps_bar <= B per epoch for value neighbours (Thm II.3), as long
        as every released cell is charged. Strict: the same bound for add/remove-user
        neighbours provided every drop decision about a user depends only on that user's
        own data (``admit`` with drop_user, ``admit_online``).
    """
    cap = _validate.exact_fraction("epoch_cap", epoch_cap)
    _validate.check_positive("epoch_cap", cap)
    if not isinstance(counts_public, bool):
        raise _validate.invalid("counts_public", "a bool", counts_public)
    if on_cap not in ON_CAP:
        raise _validate.invalid("on_cap", f"one of {ON_CAP}", on_cap)
    if on_cap == "skip_cell" and not counts_public:
        raise _validate.invalid("on_cap", "'drop_user' when counts_public is False", on_cap)
    return CellAccountantSpec(epoch_cap=cap, counts_public=counts_public, on_cap=on_cap)


def init(spec: CellAccountantSpec, epoch: int = 0) -> CellLedgerState:
    _validate.check_int_ge("epoch", epoch, 0)
    return CellLedgerState(epoch=epoch)


def start_epoch(spec: CellAccountantSpec, state: CellLedgerState, epoch: int) -> CellLedgerState:
    """A fresh ledger for a later epoch (every user's loss back to 0).

    Raises:
        InvalidOperatorConfig: ``epoch`` is not after the current one (a pipeline bug).
    """
    _validate.check_int_ge("epoch", epoch, state.epoch + 1)
    return CellLedgerState(epoch=epoch)


def _losses(state: CellLedgerState) -> dict[str, tuple[Fraction, int]]:
    return {user: (Fraction(num, den), cells) for user, num, den, cells in state.users}


def loss(state: CellLedgerState, user: str) -> Fraction:
    """loss_l: what ``user`` has lost so far this epoch (0 if never kept)."""
    for name, num, den, _ in state.users:
        if name == user:
            return Fraction(num, den)
    return Fraction(0)


def max_loss(state: CellLedgerState) -> Fraction:
    """eps_bar = max_l loss_l, the epoch's guarantee by Thm II.3 (0 before any charge)."""
    return Fraction(*state.top)


def kept_cells(state: CellLedgerState, user: str) -> int:
    """G_l: the number of released cells of this epoch in which ``user`` was kept."""
    return next((cells for name, _, _, cells in state.users if name == user), 0)


def remaining(spec: CellAccountantSpec, state: CellLedgerState, user: str) -> Fraction:
    """B - loss_l, the budget ``user`` has left this epoch."""
    return spec.epoch_cap - loss(state, user)


def allowance(
    spec: CellAccountantSpec, state: CellLedgerState, user: str, epsilon: Fraction
) -> int:
    """floor((B - loss_l) / eps): further cells at eps that ``user`` can afford."""
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    return max(0, math.floor(remaining(spec, state, user) / eps))


def admit(
    spec: CellAccountantSpec,
    state: CellLedgerState,
    users: Iterable[str],
    epsilon: Fraction,
) -> Admission:
    """Check the epoch cap before a cell at ``epsilon`` is released.

    Args:
        spec: the ledger spec.
        state: the ledger now.
        users: the cell's users (any order, duplicates ignored).
        epsilon: eps_g of the cell's mechanism.

    Returns:
        The Admission: keep the users with loss_l + eps_g <= B; drop the others
        (drop_user) or release nothing (skip_cell, when anyone is dropped).
    """
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    losses = _losses(state)
    kept: list[str] = []
    dropped: list[str] = []
    for user in sorted(set(users)):
        spent = losses.get(user, (Fraction(0), 0))[0]
        (kept if spent + eps <= spec.epoch_cap else dropped).append(user)
    release = bool(kept) and not (spec.on_cap == "skip_cell" and dropped)
    return Admission(kept=tuple(kept), dropped=tuple(dropped), release=release)


def charge(
    spec: CellAccountantSpec, state: CellLedgerState, charges: Sequence[CellCharge]
) -> CellLedgerState:
    """Record released cells: add eps_g to every kept user, all or nothing.

    The whole batch is checked before anything changes (check-then-commit). A cell that is
    already charged this epoch (a replay re-sending its release) is skipped, so a cell is
    charged exactly once.

    Args:
        spec: the ledger spec.
        state: the ledger now.
        charges: the cells released, e.g. ``outcome.charge`` of ``cell_mean``.

    Returns:
        The new ledger.

    Raises:
        BudgetExceededError: some user would exceed B (nothing is recorded); the caller
            forgot ``admit`` or a planner, a bug rather than data.
        InvalidOperatorConfig: a malformed charge (bad epsilon or cell id, repeated user,
            the same cell twice in one batch).
    """
    losses = _losses(state)
    charged = {node_bytes(cell): cell for cell in state.charged}
    batch: set[bytes] = set()
    for item in charges:
        key = node_bytes(item.cell)
        eps = _validate.exact_fraction("epsilon", item.epsilon)
        _validate.check_positive("epsilon", eps)
        if len(set(item.users)) != len(item.users):
            raise _validate.invalid("charge users", "distinct", len(item.users))
        if key in batch:
            raise _validate.invalid("charges", "distinct cells", item.cell)
        batch.add(key)
        if key in charged:
            continue
        charged[key] = tuple(item.cell)
        for user in item.users:
            spent, cells = losses.get(user, (Fraction(0), 0))
            losses[user] = (spent + eps, cells + 1)
    over = [user for user, (spent, _) in losses.items() if spent > spec.epoch_cap]
    if over:
        raise BudgetExceededError(
            f"charge would take {len(over)} user(s) above the epoch cap "
            f"{spec.epoch_cap} in epoch {state.epoch}"
        )
    top = max((spent for spent, _ in losses.values()), default=Fraction(0))
    return CellLedgerState(
        epoch=state.epoch,
        users=tuple(
            (user, spent.numerator, spent.denominator, cells)
            for user, (spent, cells) in sorted(losses.items())
        ),
        charged=tuple(charged[k] for k in sorted(charged)),
        top=(top.numerator, top.denominator),
    )


def ledger_entry(state: CellLedgerState, item: CellCharge) -> dict[str, object]:
    """What the ledger topic records for a charge: no user ids, only counts and totals.

    Args:
        state: the ledger AFTER the charge.
        item: the charge.

    Returns:
        {epoch, cell, epsilon, users_charged, epoch_max_loss} (floats for the rationals).
    """
    return {
        "epoch": state.epoch,
        "cell": list(item.cell),
        "epsilon": float(item.epsilon),
        "users_charged": len(item.users),
        "epoch_max_loss": float(max_loss(state)),
    }


def online_cell_limit(spec: CellAccountantSpec, epsilon: Fraction) -> int:
    """C = floor(B / eps): the cells one user may join per epoch under rule (c)."""
    eps = _validate.exact_fraction("epsilon", epsilon)
    _validate.check_positive("epsilon", eps)
    return math.floor(spec.epoch_cap / eps)


def admit_online(
    spec: CellAccountantSpec,
    state: OnlineAdmissionState,
    epoch: int,
    cell: NodeId,
    epsilon: Fraction,
) -> tuple[OnlineAdmissionState, bool]:
    """Rule (c) at ingest (stage 1, one user's state): keep or drop an event.

    The user's first C = floor(B / eps) distinct cells of the epoch, in arrival order, are
    admitted; events of any later cell are dropped. It depends only on the user's own
    events and their order, so it is valid in strict mode; it gives no error guarantee.

    Args:
        spec: the ledger spec (B).
        state: this user's admission state.
        epoch: the event's epoch (a later epoch starts afresh).
        cell: the event's cell.
        epsilon: eps of the statistic's cell releases.

    Returns:
        (new state, admitted).
    """
    node_bytes(cell)
    _validate.check_int_ge("epoch", epoch, 0)
    if epoch > state.epoch:
        state = OnlineAdmissionState(epoch=epoch)
    elif epoch < state.epoch:
        return state, False  # an event of a closed epoch: its cells are released already
    cell = tuple(cell)
    if cell in state.cells:
        return state, True
    if len(state.cells) >= online_cell_limit(spec, epsilon):
        return state, False
    return OnlineAdmissionState(epoch=state.epoch, cells=(*state.cells, cell)), True
