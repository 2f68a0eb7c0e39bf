"""Kind cell_mean: Rameshwar et al.'s per-cell user-level means, a statistic with
per-user state (``contract.PerUserStatistic``).

The mechanisms are ``operators.cells``: one cell's mean (``cell_mean``), the epoch ledger
(``cell_accountant``), Clip-User (``clip_user``) and the slot's release under the epoch
cap (``slot_release``); this module keeps per-(cell, user) aggregates in stage 1, hands
them to stage 2 when their slot closes, and turns outcomes into release records and
ledger entries.

A cell is (cell key, slot): the key is the event's attribute ``cells.field`` (e.g. an H3
index), the slot is ``tick // slot_ticks``. Slot s covers ticks
``s*S .. (s+1)*S - 1`` and closes at the marker of its last tick.

**Which tick an event belongs to.** Stage 1 learns an event's tick only at the next
marker (events between markers t-1 and t belong to t; after a gap, to the later marker).
So an event is TAGGED with the partition's last marker L when it arrives, and the tag is
resolved when the next marker m comes: tag L means tick m. The partition state
(``CellMarks``) keeps two numbers, L and F: tags in [F, L) are resolved into the
still-open slot of L, tag L is unresolved, tags below F belong to slots already sent. A
user's state (``CellUserState``) keeps at most two groups of aggregates, ``opened``
(resolved, open slot; the smallest tag it holds) and ``pending`` (one tag), so neither
state grows with the slot's length.

**What stage 1 sends.** At a marker that closes a slot (the slot's last tick, or a marker
past it after a gap) stage 1 scans the users of its partition that hold data no close has
sent (``scan_order``: an index kept in memory, not every user entry) and sends every
(cell, user) aggregate of the closing slot(s): count, sum and the first values in arrival order, in
grid units (``UserCellAggregate``). Stage 2 files a slot's data under the slot's last tick
(``parts``), so a partition that missed markers is not late.

**Stage 2**, at the tick that ends slot s, once every partition reported it: groups by
cell (sorted keys, sorted users) and releases the slot under the epoch cap
(``slot_release.release_slot``: Clip-User when configured, admission before each cell,
charge after it), one record per cell and one ledger entry per slot. Node ids are
(statistic, cell key, slot): a replay re-derives the same noise.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpstream.config.schema import PipelineConfig
from dpstream.config.statistic import CellConfig, Neighbours, StatisticConfig
from dpstream.operators.cells import cell_accountant as acct
from dpstream.operators.cells import cell_mean as per_cell
from dpstream.operators.cells import clip_user, pseudo_users, slot_release
from dpstream.operators.noise import NoiseSource, interval
from dpstream.operators.selection import private_interval, private_quantile
from dpstream.operators.state_codec import from_json, to_json

from .contract import MEAN_COVERS, Accuracy, Report, Step, own_caps
from .events import Event
from .releases import CellMeanFields

log = logging.getLogger(__name__)

Agg = list  # [count, total, [head...]] in grid units: one user's aggregate in one cell
Cells = dict[str, Agg]  # cell key -> aggregate


# The states are stored as JSON (stage 1's and stage 2's tables); each class's
# ``to_json``/``from_json`` are the only code that knows its JSON form.


RELEASE_FIELDS = CellMeanFields
"""The fields of its releases, inside the common ones (``releases.ReleaseHeader``)."""


@dataclass(frozen=True, slots=True)
class CellMarks:
    """A partition's markers: the last one (L, -1 before any) and the first open tag (F)."""

    last: int = -1
    first_open: int = -1

    def to_json(self) -> dict[str, int]:
        return {"last": self.last, "from": self.first_open}

    @classmethod
    def from_json(cls, data: Any) -> CellMarks:
        return cls() if data is None else cls(int(data["last"]), int(data["from"]))


@dataclass(frozen=True, slots=True)
class TaggedCells:
    """One user's aggregates by cell, of the events tagged ``tag`` (or later)."""

    tag: int
    cells: Cells

    def to_json(self) -> list:
        return [self.tag, self.cells]

    @classmethod
    def from_json(cls, data: list) -> TaggedCells:
        return cls(data[0], data[1])


@dataclass(frozen=True, slots=True)
class CellUserState:
    """A user's aggregates: ``opened``, resolved into the open slot (the smallest tag it
    holds), and ``pending``, of one tag not resolved yet."""

    opened: TaggedCells | None = None
    pending: TaggedCells | None = None

    def to_json(self) -> dict[str, list]:
        out = {}
        if self.opened is not None:
            out["o"] = self.opened.to_json()
        if self.pending is not None:
            out["p"] = self.pending.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any) -> CellUserState:
        if not data:
            return cls()
        opened, pending = data.get("o"), data.get("p")
        return cls(
            None if opened is None else TaggedCells.from_json(opened),
            None if pending is None else TaggedCells.from_json(pending),
        )


@dataclass(frozen=True, slots=True)
class CellStage2State:
    """Stage 2's state of a cell_mean statistic: the epoch ledger (the JSON of
    ``cell_accountant.CellLedgerState``, None before the first slot), the last slot
    released and how many slots' data came after their release (ignored)."""

    ledger: dict[str, Any] | None = None
    released_through: int | None = None
    late_slots: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger,
            "released_through": self.released_through,
            "late_slots": self.late_slots,
        }

    @classmethod
    def from_json(cls, data: Any) -> CellStage2State:
        if data is None:
            return cls()
        return cls(data["ledger"], data["released_through"], data["late_slots"])


@dataclass(frozen=True)
class CellMeanStatistic:
    """One ``kind: cell_mean`` statistic (``contract.PerUserStatistic``)."""

    name: str
    key: str | None
    cells: CellConfig
    release: slot_release.SlotReleaseSpec
    mechanism: str
    neighbours: str
    bounding: None = None
    lifetime_steps: int | None = None
    tree: None = None  # one-shot releases per cell and slot
    interval_of: str = "clipped"

    @property
    def spec(self) -> per_cell.CellMeanSpec:
        """One cell's mechanism."""
        return self.release.mean

    # ----------------------------------------------------------------- slots and ticks

    def slot(self, tick: int) -> int:
        return tick // self.cells.slot_ticks

    def slot_end(self, slot: int) -> int:
        """The slot's last tick: its cells close at this tick's marker."""
        return (slot + 1) * self.cells.slot_ticks - 1

    def _ends_slot(self, tick: int) -> bool:
        return (tick + 1) % self.cells.slot_ticks == 0

    # ----------------------------------------------------------------- stage 1

    def counts(self, event: Event) -> bool:
        return (
            not event.delete
            and (self.key is None or event.key == self.key)
            and event.value is not None
            and event.cell(self.cells.field) is not None
        )

    def _fold(self, into: Cells, user: str, cell: str, value: float) -> None:
        old = into.get(cell)
        agg = (
            None if old is None else per_cell.UserCellAggregate(user, old[0], old[1], tuple(old[2]))
        )
        new = per_cell.add_value(self.spec, agg, user, value)  # clip, snap, count, sum, head
        into[cell] = [new.count, new.total, list(new.head)]

    def _join(self, a: Agg, b: Agg) -> Agg:
        """One user's aggregates of one cell, ``a``'s values arriving before ``b``'s."""
        head = (a[2] + b[2])[: self.spec.head_cap]
        return [a[0] + b[0], a[1] + b[1], head]

    def _join_cells(self, a: Cells, b: Cells) -> Cells:
        out = dict(a)
        for cell, agg in b.items():
            out[cell] = agg if cell not in out else self._join(out[cell], agg)
        return out

    def _settle(self, user: CellUserState, marks: CellMarks) -> CellUserState:
        """The user's state with its pending tag resolved (if it is) and stale data gone."""
        last, first = marks.last, marks.first_open
        opened = user.opened
        if opened is not None and not first <= opened.tag < last:
            opened = None
        pending = user.pending
        if pending is not None and pending.tag != last:
            if first <= pending.tag < last:  # resolved into the open slot, after ``opened``
                if opened is None:
                    opened = pending
                else:
                    opened = TaggedCells(opened.tag, self._join_cells(opened.cells, pending.cells))
            pending = None
        return CellUserState(opened, pending)

    def apply(
        self, pstate: Any, ustate: Any, events: list[Event], partition: int
    ) -> tuple[Any, Any, Any]:
        """Fold the user's events into the aggregates of the current tag. The partition
        state is not touched (the tag is read from it), so there is nothing to redo."""
        marks = CellMarks.from_json(pstate)
        user = self._settle(CellUserState.from_json(ustate), marks)
        tagged = user.pending or TaggedCells(marks.last, {})
        cells = dict(tagged.cells)
        field = self.cells.field
        for event in events:
            self._fold(cells, event.user_id, event.cell(field), event.value)  # type: ignore[arg-type]
        user = CellUserState(user.opened, TaggedCells(tagged.tag, cells))
        return pstate, user.to_json(), None

    def redo(self, pstate: Any, redo: Any, partition: int) -> Any:
        return pstate

    def scan_order(self, pstate: Any, ustate: Any) -> int | None:
        """0 while the user holds data a slot close has not sent (stage 2 sorts users:
        any order does), None once every close that needed it is past."""
        user = self._settle(CellUserState.from_json(ustate), CellMarks.from_json(pstate))
        return None if user.opened is None and user.pending is None else 0

    def close_tick(
        self, pstate: Any, partition: int, from_tick: int, tick: int, users: Any
    ) -> tuple[Any, Any]:
        """At marker ``tick``: send the (cell, user) aggregates of every slot that closes."""
        marks = CellMarks.from_json(pstate)
        last, first = marks.last, marks.first_open
        open_closes = first < last and (self._ends_slot(tick) or self.slot(tick) != self.slot(last))
        pending_closes = self._ends_slot(tick)
        if self._ends_slot(tick):
            new_first = tick
        elif last >= 0 and self.slot(tick) == self.slot(last):
            new_first = first  # tag ``last`` joins the tags already in this open slot
        else:
            new_first = last
        new_pstate = CellMarks(tick, new_first).to_json()
        if not (open_closes or pending_closes):
            return new_pstate, None
        out: dict[str, dict[str, dict[str, Agg]]] = {}

        def add(slot: int, user: str, cells: Cells) -> None:
            by_cell = out.setdefault(str(slot), {})
            for cell, agg in cells.items():
                row = by_cell.setdefault(cell, {})
                row[user] = agg if user not in row else self._join(row[user], agg)

        for user, ustate in users():
            # Resolves tags below ``last`` only: a pending tag left is ``last``.
            state = self._settle(CellUserState.from_json(ustate), marks)
            if open_closes and state.opened is not None:
                add(self.slot(last), user, state.opened.cells)
            if pending_closes and state.pending is not None:
                add(self.slot(tick), user, state.pending.cells)
        return new_pstate, ({"slots": out} if out else None)

    # ----------------------------------------------------------------- stage 2

    def parts(self, report: Report) -> list[tuple[int, Any]]:
        """File each slot's data under the slot's last tick (``Stage2.on_report``)."""
        if report.payload is None:
            return []
        slots = report.payload["slots"]
        return [(self.slot_end(int(s)), {"slots": {s: slots[s]}}) for s in sorted(slots, key=int)]

    def merge(self, a: Any, b: Any) -> Any:
        out = {s: {c: dict(row) for c, row in cells.items()} for s, cells in a["slots"].items()}
        for s, cells in b["slots"].items():
            into = out.setdefault(s, {})
            for cell, row in cells.items():
                mine = into.setdefault(cell, {})
                for user, agg in row.items():
                    # A user lives on one partition: two partitions never both hold it.
                    mine[user] = agg if user not in mine else self._join(mine[user], agg)
        return {"slots": out}

    def step(self, state_json: Any, payload: Any, tick: int, noise: NoiseSource) -> Step:
        state = CellStage2State.from_json(state_json)
        data = payload["slots"] if payload else {}
        slots = {int(s) for s in data}
        if not self.cells.counts_public and self._ends_slot(tick):
            slots.add(self.slot(tick))  # strict: every listed cell, every slot
        fields: list[dict] = []
        ledger: list[dict] = []
        for slot in sorted(slots):
            done = state.released_through
            if done is not None and slot <= done:
                # Never applied to a released cell: a release is never redrawn.
                state = replace(state, late_slots=state.late_slots + 1)
                log.warning("statistic %s: data for released slot %s ignored", self.name, slot)
                continue
            out, entry, book = self._release_slot(
                state.ledger, slot, data.get(str(slot), {}), noise
            )
            state = replace(state, ledger=to_json(book), released_through=slot)
            fields.extend(out)
            ledger.append(entry)
        return Step(state.to_json(), tuple(fields), tuple(ledger))

    def _release_slot(
        self, book_json: dict | None, slot: int, data: dict, noise: NoiseSource
    ) -> tuple[list[dict], dict, acct.CellLedgerState]:
        """(release fields, ledger entry, epoch ledger after it) of one slot
        (``operators.cells.slot_release``)."""
        epoch = slot // self.cells.epoch_slots
        book = None if book_json is None else from_json(acct.CellLedgerState, book_json)
        aggs = {
            cell: {
                user: per_cell.UserCellAggregate(user, agg[0], agg[1], tuple(agg[2]))
                for user, agg in sorted(row.items())
            }
            for cell, row in data.items()
        }
        keys = sorted(aggs) if self.cells.counts_public else sorted(self.cells.keys or ())
        out = slot_release.release_slot(
            self.release, book, epoch, keys, aggs, lambda key: self._cell_id(key, slot), noise
        )
        if out.capped:
            log.warning(
                "statistic %s: %d user(s) reached the epoch cap B=%s in epoch %s; dropped "
                "from %d (cell, user) pair(s) of slot %s, %d cell(s) not released",
                self.name,
                len(out.capped),
                float(self.release.accountant.epoch_cap),
                epoch,
                out.dropped_pairs,
                slot,
                out.skipped,
            )
        released = [self._fields(rel, key, slot, epoch) for key, rel in out.releases]
        return released, self._ledger_entry(slot, epoch, out), out.book

    def _cell_id(self, key: str, slot: int) -> tuple[str | int, ...]:
        return (self.name, key, slot)

    def _fields(self, rel: per_cell.CellRelease, key: str, slot: int, epoch: int) -> dict:
        S = self.cells.slot_ticks  # noqa: N806 - the config's name
        fields: dict[str, Any] = {
            "cell": key,
            "slot": slot,
            "slot_ticks": [slot * S, self.slot_end(slot)],
            "epoch": epoch,
            "value": rel.value,
            "std": rel.std,
            "interval": interval(rel.value, rel.ci95),
            "noise_scale": rel.noise_scale,
            "cell_mechanism": rel.mechanism,
            "bounds": [self.cells.lower, self.cells.upper],
        }
        if rel.interval is not None:
            fields["clip_interval"] = list(rel.interval)
        for name in ("n_users", "n_samples", "m_ub", "n_arrays", "noisy_count"):
            value = getattr(rel, name)
            if value is not None:
                fields[name] = value
        return fields

    def _ledger_entry(self, slot: int, epoch: int, out: slot_release.SlotRelease) -> dict:
        # Stage 2 adds schema_version, statistic, tick and total_epsilon.
        entry: dict[str, Any] = {
            "event": "cells",
            "epoch": epoch,
            "slot": slot,
            "cells_released": len(out.releases),
            "epsilon_per_cell": float(self.release.mean.epsilon),
            "epoch_cap": float(self.release.accountant.epoch_cap),
        }
        if not self.cells.counts_public:
            entry["note"] = (
                "strict mode: user counts are private, so this entry holds public parameters "
                "only; users at the epoch cap are dropped (spend nothing more this epoch) "
                "and the worker logs it"
            )
            return entry
        entry.update(
            users_charged=out.charged,
            epoch_max_loss=float(acct.max_loss(out.book)),
            dropped_at_cap={
                "users": len(out.capped),
                "pairs": out.dropped_pairs,
                "cells_not_released": out.skipped,
            },
        )
        if out.capped:
            entry["note"] = (
                "users at the epoch cap were dropped: they spend nothing more this epoch"
            )
        if out.clip is not None:
            entry["clip_user"] = {
                "pairs_suppressed": sum(len(users) for _, users in out.clip.suppressed),
                "loss_before": float(out.clip.loss_before),
                "loss_after": float(out.clip.loss_after),
                "rounds": out.clip.rounds,
                "error_bound_e0": float(out.clip.e0),
                "cells_above_e0": len(out.clip.forced),
            }
        return entry

    def accuracy(self, ticks: Sequence[int]) -> Accuracy:
        """Nothing planned: a mean's std depends on how many samples it covers (data)."""
        return Accuracy("value", (), MEAN_COVERS)

    def ledger_start(self, entry: dict[str, Any]) -> dict[str, Any]:
        cells = self.cells
        start = {
            "neighbours": self.neighbours,
            "note": (
                "Rameshwar et al. per-cell means: each released cell costs epsilon to each user it "
                "keeps; cells are disjoint, so a user's loss in an accounting epoch is the "
                "sum over their kept cells (Thm II.3), capped at epoch_cap B; charged, per "
                "epoch, is what total_epsilon is checked against: B, or 2B for strict cells "
                "under any_subset (dropping some of a user's events can admit the user into "
                "cells it was dropped from at the cap)"
            ),
            "counts_public": cells.counts_public,
            "cell_field": cells.field,
            "slot_ticks": cells.slot_ticks,
            "epoch_slots": cells.epoch_slots,
            "epoch_cap": float(self.release.accountant.epoch_cap),
            "on_cap": cells.on_cap,
            "clip_user": cells.clip_user,
            "bounds": [cells.lower, cells.upper],
            "step": cells.step,
        }
        return own_caps(entry, start)


def identity(stat: StatisticConfig, cfg: PipelineConfig) -> dict[str, object]:
    """What runs ``stat``, for its fingerprint: the mechanism and its algorithms' versions."""
    modules = [per_cell, acct, clip_user, pseudo_users, private_interval, private_quantile]
    versions = {m.__name__.rsplit(".", 1)[-1]: m.VERSION for m in modules}
    return {"algorithm": {"mechanism": make_statistic(stat, cfg).mechanism, "versions": versions}}


def make_statistic(stat: StatisticConfig, cfg: PipelineConfig) -> CellMeanStatistic:
    """kind cell_mean: its mechanisms, epoch ledger and Clip-User from the config."""
    cells = stat.cells
    assert cells is not None
    # Strict mode honours privacy.neighbours: any_subset doubles the sum's noise (the
    # accountant refuses any_subset beside public counts).
    any_subset = cfg.privacy.neighbours is Neighbours.any_subset
    spec = cells.operator_spec(stat.pure_epsilon, any_subset=any_subset)
    clip = None
    if cells.clip_user:
        clip = clip_user.make_clip_user(
            repr(cells.lower), repr(cells.upper), repr(cells.clip_kappa), True
        )
    arrays = spec.mechanism not in ("baseline", "noisy_ratio")
    mechanism = f"{per_cell.MECHANISM}/{spec.mechanism}" + (f"/{spec.grouping}" if arrays else "")
    # Public counts: the paper's neighbours (same count matrix, one user's values
    # differ). Strict: a user's whole data added or removed, or any subset of it.
    if cells.counts_public:
        neighbours = "user_values_same_counts"
    else:
        neighbours = "any_subset" if spec.any_subset else "add_remove_user"
    release = slot_release.SlotReleaseSpec(spec, cells.accountant_spec(), clip)
    return CellMeanStatistic(stat.name, stat.key, cells, release, mechanism, neighbours)


def describe(stat: StatisticConfig, cfg: PipelineConfig) -> str:
    """What a cell_mean statistic computes, in one line (``dpstream check-config``)."""
    c = stat.cells
    assert c is not None
    mode = "public counts" if c.counts_public else "strict"
    return (
        f"cell_mean via {c.mechanism} ({mode}), epsilon={stat.epsilon:g} per cell, cells by "
        f"{c.field!r} x {c.slot_ticks}-tick slots, epoch_cap={c.epoch_cap:g} per "
        f"{c.epoch_slots} slots"
    )
