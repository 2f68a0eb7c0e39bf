"""Clip-User: suppress (user, cell) pairs to lower the worst per-user loss: our reconstruction of
the procedure Rameshwar et al. announce (docs/papers.md).

Over the disjoint cells of a slot, a user's loss is the sum of eps_g over the cells that
keep them (Thm II.3); with uniform eps it is G_l eps and the slot costs G_1 eps, G_1 the
largest number of cells of one user (Cor II.1). Removing user l from cell g takes g out of
l's cells. Clip-User removes users from cells while the worst cell's error bound stays at
or below its value without any removal:

    E_g(R_g) = U r / N + kappa U m'^* / (N' eps_g),

R_g the users removed from g, r their count of values, N' = N - r, m'^* the largest kept
count. U r / N bounds the bias of dropping r of N values in [lower, upper] (attained), and
kappa U m'^* / (N' eps_g) the Baseline noise: kappa = 1 for the expected absolute error
(E|Lap(b)| = b), kappa = ln(1 / delta) for a (1 - delta) tail bound (Prop II.1).

Algorithm (ours, losses in place of G_l so that per-cell budgets may differ):

    E0 = max_g E_g(empty); R = {}
    loop:
        top = the users of largest loss; stop if one of them is kept in <= 1 cell
        trial = R; for each top user l, in ascending id:
            feasible = cells g keeping l where g keeps another user and
                       E_g(trial_g + {l}) <= E0
            none: discard trial and stop
            add l to trial_g for the feasible g of least E_g (ties: least cell id)
        R = trial      # only if every top user was reduced (else: bias, no gain)

``plan`` can first apply the *mandatory* suppressions of an epoch cap (our
choice): while a user's planned loss exceeds the budget they have left, they are removed
from the cell whose E_g rises least (cells that would become empty last; such a cell is
then not released), and cells pushed above E0 are reported in ``forced``.

Privacy:
    Every decision is a function of the count matrix, public under Rameshwar et al. Sec. II-D; the
    cell mechanisms then read only kept users, so Thm II.3 applies to the reduced cell sets and
    the slot costs max_l loss_l. Not valid when counts are private (strict mode):
    ``make_clip_user`` refuses counts_public=False.

References:
    Rameshwar et al. Thm II.3, Cor. II.1, Prop. II.1; the suppression idea is announced by the
    abstract of arXiv:2405.06261, the algorithm is ours (docs/papers.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from .. import _validate
from ..noise import NodeId, node_bytes

# In every statistic's fingerprint: raise it when the same input and noise would release
# anything else (a fixed bug, a changed algorithm), so a running statistic is refused.
VERSION = 1

Cell = NodeId
CountMatrix = Mapping[Cell, Mapping[str, int]]
"""{cell: {user: m_l in that cell}}: the public counts of one slot."""


@dataclass(frozen=True, slots=True)
class ClipUserSpec:
    """Attributes: value_range U = upper - lower (value units), kappa >= 0 (rational)."""

    value_range: Fraction
    kappa: Fraction


@dataclass(frozen=True, slots=True)
class ClipPlan:
    """What to suppress before the cells of a slot are released.

    Attributes:
        suppressed: (cell, users removed from it), for cells with a removal, by cell id.
        released: cells that keep at least one user, by cell id.
        e0: max_g E_g(empty), the worst bound without removals (value units).
        bounds: (cell, E_g) of every released cell after the removals.
        loss_before: max_l loss_l without removals.
        loss_after: max_l loss_l after them.
        rounds: committed Clip-User rounds.
        forced: released cells whose bound exceeds e0 because of mandatory removals.
    """

    suppressed: tuple[tuple[Cell, tuple[str, ...]], ...]
    released: tuple[Cell, ...]
    e0: Fraction
    bounds: tuple[tuple[Cell, Fraction], ...]
    loss_before: Fraction
    loss_after: Fraction
    rounds: int
    forced: tuple[Cell, ...]


def make_clip_user(
    lower: float | int | str | Fraction,
    upper: float | int | str | Fraction,
    kappa: float | int | str | Fraction = 1,
    counts_public: bool = False,
) -> ClipUserSpec:
    """Validate and build the reducer's spec.

    Args:
        lower: lower value bound a.
        upper: upper value bound b > a.
        kappa: weight of the noise term, >= 0 (1: expected error; ln(1/delta): tail).
        counts_public: must be True (the reducer reads everyone's counts).

    Returns:
        The spec.

    Raises:
        InvalidOperatorConfig: a parameter is out of range, or counts are not public.
    """
    if counts_public is not True:
        raise _validate.invalid(
            "counts_public", "True for Clip-User (Rameshwar et al. Sec. II-D)", counts_public
        )
    a = _validate.exact_fraction("lower", lower)
    b = _validate.exact_fraction("upper", upper)
    if not b > a:
        raise _validate.invalid("upper", f"> lower = {a}", b)
    k = _validate.exact_fraction("kappa", kappa)
    if k < 0:
        raise _validate.invalid("kappa", ">= 0", k)
    return ClipUserSpec(value_range=b - a, kappa=k)


def error_bound(
    spec: ClipUserSpec, counts: Mapping[str, int], removed: frozenset[str] | set[str], eps: Fraction
) -> Fraction | None:
    """E_g(R_g) of one cell (value units), or None when nobody would be kept.

    Args:
        spec: the reducer's spec.
        counts: {user: m_l} of the cell.
        removed: R_g.
        eps: eps_g.

    Returns:
        U r / N + kappa U m'^* / (N' eps), exact.
    """
    total = sum(counts.values())
    kept = [m for user, m in counts.items() if user not in removed]
    if not kept:
        return None
    kept_total = sum(kept)
    r = total - kept_total
    u = spec.value_range
    return u * Fraction(r, total) + spec.kappa * u * max(kept) / (kept_total * Fraction(eps))


def _check_matrix(counts: CountMatrix) -> dict[Cell, dict[str, int]]:
    out: dict[Cell, dict[str, int]] = {}
    for cell, users in counts.items():
        node_bytes(cell)
        row = {}
        for user, m in users.items():
            if not isinstance(user, str):
                raise _validate.invalid("user id", "a str", type(user).__name__)
            _validate.check_int_ge("count", m, 0)
            if m:
                row[user] = m
        if row:
            out[tuple(cell)] = row
    return out


def _eps_map(
    cells: list[Cell], epsilon: Fraction | Mapping[Cell, Fraction]
) -> dict[Cell, Fraction]:
    if isinstance(epsilon, Mapping):
        by_cell = {tuple(c): e for c, e in epsilon.items()}
        out = {}
        for cell in cells:
            if cell not in by_cell:
                raise _validate.invalid("epsilon", "given for every cell", cell)
            out[cell] = _validate.exact_fraction("epsilon", by_cell[cell])
    else:
        eps = _validate.exact_fraction("epsilon", epsilon)
        out = dict.fromkeys(cells, eps)
    for eps in out.values():
        _validate.check_positive("epsilon", eps)
    return out


def _losses(
    matrix: dict[Cell, dict[str, int]], removed: dict[Cell, set[str]], eps: dict[Cell, Fraction]
) -> tuple[dict[str, Fraction], dict[str, list[Cell]]]:
    loss: dict[str, Fraction] = {}
    cells_of: dict[str, list[Cell]] = {}
    for cell, row in matrix.items():
        gone = removed.get(cell, set())
        for user in row:
            if user not in gone:
                loss[user] = loss.get(user, Fraction(0)) + eps[cell]
                cells_of.setdefault(user, []).append(cell)
    return loss, cells_of


def _cell_order(cell: Cell) -> bytes:
    return node_bytes(cell)


def _round(
    spec: ClipUserSpec,
    matrix: dict[Cell, dict[str, int]],
    removed: dict[Cell, set[str]],
    eps: dict[Cell, Fraction],
    e0: Fraction,
) -> dict[Cell, set[str]] | None:
    """One Clip-User round: the new removals, or None if the round must be discarded."""
    loss, cells_of = _losses(matrix, removed, eps)
    if not loss:
        return None
    top = max(loss.values())
    users = sorted(u for u, v in loss.items() if v == top)
    if any(len(cells_of[u]) <= 1 for u in users):
        return None
    trial = {cell: set(gone) for cell, gone in removed.items()}
    for user in users:
        best: tuple[Fraction, bytes, Cell] | None = None
        for cell in cells_of[user]:
            gone = trial.setdefault(cell, set())
            if user in gone or len(matrix[cell]) - len(gone) <= 1:
                continue
            bound = error_bound(spec, matrix[cell], gone | {user}, eps[cell])
            if bound is None or bound > e0:
                continue
            key = (bound, _cell_order(cell), cell)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            return None
        trial[best[2]].add(user)
    return trial


def _mandatory(
    spec: ClipUserSpec,
    matrix: dict[Cell, dict[str, int]],
    eps: dict[Cell, Fraction],
    budget_left: Mapping[str, Fraction],
) -> dict[Cell, set[str]]:
    removed: dict[Cell, set[str]] = {}
    users = sorted({u for row in matrix.values() for u in row})
    for user in users:
        if user not in budget_left:
            raise _validate.invalid("budget_left", "given for every user of the slot", len(users))
        left = _validate.exact_fraction("budget_left", budget_left[user])
        while True:
            cells = [
                c for c, row in matrix.items() if user in row and user not in removed.get(c, set())
            ]
            if sum(eps[c] for c in cells) <= left:
                break
            choices = []
            for cell in cells:
                gone = removed.get(cell, set()) | {user}
                bound = error_bound(spec, matrix[cell], gone, eps[cell])
                empties = bound is None
                choices.append((empties, bound or Fraction(0), _cell_order(cell), cell))
            choices.sort(key=lambda t: t[:3])
            removed.setdefault(choices[0][3], set()).add(user)
    return removed


def plan(
    spec: ClipUserSpec,
    counts: CountMatrix,
    epsilon: Fraction | Mapping[Cell, Fraction],
    budget_left: Mapping[str, Fraction] | None = None,
    clip: bool = True,
    initial: Mapping[Cell, tuple[str, ...]] | None = None,
) -> ClipPlan:
    """Plan the suppressions of one slot from its public count matrix.

    Args:
        spec: the reducer's spec.
        counts: {cell: {user: count}} (zero counts are ignored).
        epsilon: eps_g, one value for every cell or a {cell: eps_g} mapping.
        budget_left: {user: B - loss so far} for every user of the slot (from
            ``cell_accountant.remaining``); None for no epoch cap.
        clip: run the Clip-User rounds (False: mandatory removals only).
        initial: removals to start from (a previous plan's ``suppressed``).

    Returns:
        The ClipPlan. Deterministic, and independent of the order of cells, users and events.

    Raises:
        InvalidOperatorConfig: malformed counts, epsilon or budget_left.
    """
    matrix = _check_matrix(counts)
    cells = sorted(matrix, key=_cell_order)
    eps = _eps_map(cells, epsilon)
    e0 = max(
        (error_bound(spec, matrix[c], set(), eps[c]) or Fraction(0) for c in cells),
        default=Fraction(0),
    )
    before, _ = _losses(matrix, {}, eps)
    removed: dict[Cell, set[str]] = {}
    if initial:
        for cell, users in initial.items():
            removed.setdefault(tuple(cell), set()).update(users)
    if budget_left is not None:
        for cell, mandatory in _mandatory(spec, matrix, eps, budget_left).items():
            removed.setdefault(cell, set()).update(mandatory)
    rounds = 0
    while clip:
        trial = _round(spec, matrix, removed, eps, e0)
        if trial is None:
            break
        removed, rounds = trial, rounds + 1
    return _summary(spec, matrix, cells, eps, removed, e0, before, rounds)


def _summary(
    spec: ClipUserSpec,
    matrix: dict[Cell, dict[str, int]],
    cells: list[Cell],
    eps: dict[Cell, Fraction],
    removed: dict[Cell, set[str]],
    e0: Fraction,
    before: dict[str, Fraction],
    rounds: int,
) -> ClipPlan:
    after, _ = _losses(matrix, removed, eps)
    bounds = []
    for cell in cells:
        bound = error_bound(spec, matrix[cell], removed.get(cell, set()), eps[cell])
        if bound is not None:
            bounds.append((cell, bound))
    return ClipPlan(
        suppressed=tuple(
            (cell, tuple(sorted(removed[cell]))) for cell in cells if removed.get(cell)
        ),
        released=tuple(cell for cell, _ in bounds),
        e0=e0,
        bounds=tuple(bounds),
        loss_before=max(before.values(), default=Fraction(0)),
        loss_after=max(after.values(), default=Fraction(0)),
        rounds=rounds,
        forced=tuple(cell for cell, bound in bounds if bound > e0),
    )


def plan_fixed_total(
    spec: ClipUserSpec, counts: CountMatrix, epsilon_total: Fraction
) -> tuple[int, Fraction, ClipPlan]:
    """Fixed-total mode of Clip-User (our choice): spend at most eps_tot per user on the slot.

    With G0 = max_l G_l before removals, E0 is computed at eps = eps_tot / G0. For
    G_target = G0 - 1, G0 - 2, ..., 1 the cells run at eps_tot / G_target and Clip-User
    rounds (bounded by that E0) run until max_l G_l <= G_target; the smallest reachable
    G_target wins (a larger per-cell eps opens slack for more removals). Uniform eps only.

    Args:
        spec: the reducer's spec.
        counts: the slot's count matrix.
        epsilon_total: eps_tot > 0.

    Returns:
        (G_target, per-cell eps, plan); G_target = G0 and no removal if nothing is reachable.
    """
    total = _validate.exact_fraction("epsilon_total", epsilon_total)
    _validate.check_positive("epsilon_total", total)
    matrix = _check_matrix(counts)
    cells = sorted(matrix, key=_cell_order)
    if not cells:
        empty = plan(spec, counts, total)
        return 0, total, empty
    ones = dict.fromkeys(cells, Fraction(1))
    g0 = int(max(_losses(matrix, {}, ones)[0].values()))
    base_eps = dict.fromkeys(cells, total / g0)
    e0 = max(error_bound(spec, matrix[c], set(), base_eps[c]) or Fraction(0) for c in cells)
    best: tuple[int, Fraction, ClipPlan] | None = None
    for target in range(g0 - 1, 0, -1):
        eps = dict.fromkeys(cells, total / target)
        removed: dict[Cell, set[str]] = {}
        rounds = 0
        while max(_losses(matrix, removed, ones)[0].values()) > target:
            trial = _round(spec, matrix, removed, eps, e0)
            if trial is None:
                break
            removed, rounds = trial, rounds + 1
        if max(_losses(matrix, removed, ones)[0].values()) > target:
            continue  # a smaller target has more slack per cell: keep trying
        before, _ = _losses(matrix, {}, base_eps)
        summary = _summary(spec, matrix, cells, eps, removed, e0, before, rounds)
        best = (target, total / target, summary)
    if best is None:
        before, _ = _losses(matrix, {}, base_eps)
        return g0, total / g0, _summary(spec, matrix, cells, base_eps, {}, e0, before, 0)
    return best


def kept_counts(counts: CountMatrix, result: ClipPlan) -> dict[Cell, dict[str, int]]:
    """The count matrix after the plan's removals (released cells only)."""
    matrix = _check_matrix(counts)
    gone = {cell: set(users) for cell, users in result.suppressed}
    return {
        cell: {u: m for u, m in matrix[cell].items() if u not in gone.get(cell, set())}
        for cell in result.released
    }
