"""Stage 1's states: one per events-topic partition (``PartitionEntry``) and one per user
of it (``UserEntry``).

They are declared as ``TypedDict``s, not dataclasses with a codec like ``Stage2State``,
because the JSON dict *is* the state: stage 1's Faust table (memory store) holds these
dicts, its changelog holds their ``orjson.dumps``, and Faust's recovery hands them back
as the same dicts, so no code converts between a stored and a working form. Stage 1
reads and writes a user entry per user per record, the pipeline's per-event hot path:
slots dataclasses with a ``to_json`` measured +10.8% of stage 1's instructions per event
on single-event records and +6.9% with batches of 100, the ``TypedDict``s the same as
undeclared dicts (docs/throughput-gaps.md). The declarations are what
mypy checks every read and write of a key against (``make lint``); this module is the
one place that says what each key holds.

The keys and their order are the stored bytes: ``new_partition_state`` makes the first
three, ``sources`` and ``stats`` are added when first needed (a partition whose pipeline
has no per-user kinds never stores ``stats``); a user entry always has ``used`` and
``offset``, and ``kept``, ``state`` and ``redo`` only when its statistics have them.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired from evaluated
# annotations only (Python 3.11).
from typing import Any, NotRequired, TypedDict


class PartitionEntry(TypedDict):
    """Stage 1's state of one events-topic partition (table key ``p:<partition>``, beside
    its users' ``UserEntry``; not the continual mean's ``PartitionState``),
    advanced in place by the driver, record by record."""

    last_offset: int
    """The last record applied: its outputs were acknowledged (-1: none yet)."""
    last_tick: int | None
    """The last tick closed by a marker (None: none yet)."""
    born: NotRequired[int]
    """The tick of the first marker this state closed: sent with every report, so stage 2
    can tell a state that was lost and begun again (docs/design.md section 4a)."""
    pending: dict[str, dict[str, int]]
    """Per statistic counted by unit weights, the weights its users added in the open
    tick (the next report's ``weights``; keys: ``pipeline.counting``)."""
    sources: NotRequired[dict[str, list[int]]]
    """Per source partition (``"<topic>/<partition>"``, ``records.source_id``), the last
    position counted:
    [source offset, index in its record] (``Stage1Driver.unseen``)."""
    stats: NotRequired[dict[str, Any]]
    """Per statistic with per-user state, its partition state (the kind's JSON)."""


class UserEntry(TypedDict):
    """Stage 1's entry of one user (table key ``u:<user id>``), written whole once per
    record that has the user's events (``Stage1.add_events`` says how the entry makes a
    re-delivered record idempotent)."""

    used: dict[str, int]
    """Units per stream slot so far: the statistic's name, ``<name>/-`` for deletions."""
    offset: int
    """The record this entry was last written for."""
    kept: NotRequired[dict[str, dict[str, int]]]
    """Per statistic counted per user, the weights that record gave the open tick."""
    state: NotRequired[dict[str, Any]]
    """Per statistic with per-user state, the user's state (the kind's JSON)."""
    redo: NotRequired[dict[str, Any]]
    """Per statistic with per-user state, what that record did to the partition's state
    (the kind's JSON), re-applied if the partition state lost it."""


def new_partition_state() -> PartitionEntry:
    return {"last_offset": -1, "last_tick": None, "pending": {}}


def redelivered(pstate: PartitionEntry, offset: int) -> bool:
    """Whether record ``offset`` was applied before (a re-delivery: its outputs went out
    the first time; a user entry that missed it is repaired, ``Stage1.add_events``)."""
    return offset <= pstate["last_offset"]
