"""Fixed-tau truncation of user contributions, spec 001 section 2.3 (Alg. 3).

Truncate(D, tau) keeps the first tau units of every user in time order and replaces the
rest by dummies. After it, removing one whole user changes each tree level's node
vector by at most tau in L1, so the tree runs with sensitivity tau (group privacy).

The used count is taken on the ORIGINAL stream (spec 001 section 0): a user's later
events stay truncated even though they added nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate


@dataclass(frozen=True, slots=True)
class TruncationSpec:
    """Attributes: tau, the number of units one user may contribute in total."""

    tau: int


def make_truncation(tau: int) -> TruncationSpec:
    _validate.check_int_ge("tau", tau, 1)
    return TruncationSpec(tau=tau)


def admit(spec: TruncationSpec, used: int, weight: int = 1) -> int:
    """Units of a ``weight``-unit item kept for a user who has already sent ``used`` units.

    A count item has weight 1; a batched sum item keeps ``clip(tau - used, 0, weight)``
    units, so the item that straddles tau is kept partly (spec 001 section 2.7).
    """
    return min(max(spec.tau - used, 0), weight)


# ---------------------------------------------------------------------------------------
# Rank bands: truncation at every power of two at once (spec 001 sections 2.4-2.7).
#
# The tracked tau~ is always a power of two, so a user's units need only be labelled by
# the band of their rank: band 0 is rank 1, band b >= 1 is ranks (2^(b-1), 2^b]. The units
# kept at tau = 2^i are those of bands 0..i; the bands above are the overflow that a later
# tau increase re-admits (operators/user_level.py).


def rank_band(rank: int) -> int:
    """The band of the ``rank``-th unit of a user (rank >= 1)."""
    return (rank - 1).bit_length()


def rank_bands(used: int, weight: int) -> list[tuple[int, int]]:
    """(band, units) for a ``weight``-unit item of a user who has sent ``used`` units.

    The item's units take ranks used+1 .. used+weight; an item that straddles a power of
    two is split exactly, which is the partial clipping of spec 001 section 2.7 at every
    tau = 2^i at once.
    """
    out: list[tuple[int, int]] = []
    rank, end = used + 1, used + weight
    while rank <= end:
        band = rank_band(rank)
        top = min(end, 1 << band)  # the band's last rank
        out.append((band, top - rank + 1))
        rank = top + 1
    return out


def crossings(used: int, weight: int) -> list[int]:
    """The j with used <= 2^j < used + weight: the powers of two this item pushes the
    user's total above, i.e. where Count(D_t, 2^j) = |{u : c_u > 2^j}| gains this user."""
    return [j for j in range((used + weight - 1).bit_length()) if used <= (1 << j)]
