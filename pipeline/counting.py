"""Stage 1 of the kinds whose users contribute unit weights (count, sum, histogram,
kselect, distinct and the whole-user mean): what one user's events add to the tick.

Fixed tau: "w" = the kept units (Dong-Luo-Yi Alg. 3). User-level (tau: auto): units by
rank band and the users crossing each power of two (Alg. 5). Whole-user mean: kept
samples "c" and their grid units "s".
"""

from __future__ import annotations

from dataclasses import dataclass

from dpstream.operators import truncation, user_level
from dpstream.operators import whole_user_mean as wum

from .records import Event

# The whole-user mean's weight keys: kept samples C_t and their grid units S_t.
SAMPLES, UNITS = "c", "s"


def mean_weights(spec: wum.WholeUserMeanSpec, used: int, x: float) -> dict[str, int]:
    """Stage 1's weights for one sample of a user who sent ``used`` before (no zeros)."""
    samples, units = wum.admit(spec, used, x)
    return {k: v for k, v in ((SAMPLES, samples), (UNITS, units)) if v}


def add_weights(into: dict[str, int], weights: dict[str, int]) -> None:
    for key, value in weights.items():
        into[key] = into.get(key, 0) + value


@dataclass(frozen=True, slots=True)
class UnitCounting:
    """How stage 1 counts one statistic: which events, and what they contribute
    (``pipeline.statistic.Counting``)."""

    name: str
    key: str | None
    kind: str
    fixed: truncation.TruncationSpec | None  # None: user-level (rank bands) or a mean
    deletions: bool
    mean: wum.WholeUserMeanSpec | None = None  # the whole-user mean (its own first-m cap)

    def stream(self, event: Event) -> str | None:
        """ "+" (insertions) or "-" (deletions) if this statistic counts ``event``."""
        if self.key is not None and event.key != self.key:
            return None
        if event.delete:
            return "-" if self.deletions else None
        return "+"

    def add(self, events: list[Event], used: dict[str, int], kept: dict[str, dict]) -> None:
        """Count one user's ``events`` of a record: advance ``used`` (units per stream
        slot: the statistic's name, ``<name>/-`` for deletions) and add what they
        contribute to ``kept[self.name]`` (created only when non-empty).

        A count or sum contributes per stream what its events' total would as one item:
        Alg. 3 keeps clip(tau - used, 0, units) of them however they are split, rank bands
        and crossed powers of consecutive unit ranges add up (``band_units``,
        ``crossed_powers``). Other kinds depend on each event's value: ``contribution``.
        """
        if self.kind not in ("count", "sum"):
            for event in events:
                self.add_event(event, used, kept)
            return
        plus = minus = 0
        for event in events:
            if self.key is None or event.key == self.key:
                units = 1 if self.kind == "count" else int(event.value)  # type: ignore[arg-type]
                if not event.delete:
                    plus += units
                elif self.deletions:
                    minus += units
        if plus:
            before = used.get(self.name, 0)
            used[self.name] = before + plus
            if self.fixed is None:
                self._add_ranks("+", before, plus, kept)
            elif before < self.fixed.tau:
                kept[self.name] = {"w": truncation.admit(self.fixed, before, plus)}
        if minus:  # deletions: user-level statistics only
            slot = self.name + "/-"
            before = used.get(slot, 0)
            used[slot] = before + minus
            self._add_ranks("-", before, minus, kept)

    def add_event(self, event: Event, used: dict[str, int], kept: dict[str, dict]) -> None:
        """``add`` for one event, by its definition (``contribution``)."""
        stream = self.stream(event)
        if stream is None:
            return
        slot = self.name if stream == "+" else f"{self.name}/-"
        units, weights = self.contribution(stream, used.get(slot, 0), event)
        used[slot] = used.get(slot, 0) + units
        if weights:  # never holds zeros
            add_weights(kept.setdefault(self.name, {}), weights)

    def _add_ranks(self, stream: str, before: int, units: int, kept: dict[str, dict]) -> None:
        # user_level.crossed_powers and band_units (column 0), inlined: per user per record.
        out = kept.setdefault(self.name, {})
        after = before + units
        if after > 1:
            for j in range(
                0 if before <= 1 else (before - 1).bit_length(), (after - 1).bit_length()
            ):
                key = f"{stream}x{j}"
                out[key] = out.get(key, 0) + 1
        rank = before + 1
        while rank <= after:
            band = (rank - 1).bit_length()  # rank_band(rank); the band's last rank is 2^band
            last = min(after, 1 << band)
            key = f"{stream}b{band}/0"
            out[key] = out.get(key, 0) + last - rank + 1
            rank = last + 1

    def contribution(self, stream: str, used: int, event: Event) -> tuple[int, dict[str, int]]:
        """(units, weights) of ``event`` for a user who has sent ``used`` units before;
        weights holds no zero entries.

        Fixed tau: "w" = the kept units (Alg. 3, partial for a straddling sum item).
        Whole-user mean: "c" = 1 and "s" = its grid units for one of the user's first m
        samples (``mean_weights``); units count samples.
        User-level: "<stream>b<band>/<bin>" = units by rank band (operators.user_level),
        "<stream>x<j>" = 1 when the user's total passes 2^j (Count(D_t, 2^j) gains the
        user); distinct count: "b<band>/<value>" for the value instead of a bin.
        """
        if self.mean is not None:
            return 1, mean_weights(self.mean, used, event.value)  # type: ignore[arg-type]
        units = int(event.value) if self.kind == "sum" else 1  # type: ignore[arg-type]
        if self.fixed is not None:
            kept = truncation.admit(self.fixed, used, units)
            return units, ({"w": kept} if kept else {})
        out = {f"{stream}x{j}": 1 for j in user_level.crossed_powers(used, used + units)}
        if self.kind == "distinct":
            out[f"b{user_level.rank_band(used + 1)}/{event.value!r}"] = 1
            return units, out
        column = int(event.value) - 1 if self.kind in ("histogram", "kselect") else 0  # type: ignore[arg-type]
        for band, n in user_level.band_units(used, units):
            out[f"{stream}b{band}/{column}"] = out.get(f"{stream}b{band}/{column}", 0) + n
        return units, out
