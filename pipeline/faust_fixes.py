"""A workaround for a faust-streaming 0.15.3 / aiokafka bug that loses input records at a
rebalance (docs/reliability.md, "a worker dies among two").

At a rebalance Faust clears the records its agents had buffered but not processed, then
seeks every partition to its committed offset (``Consumer.perform_seek``). aiokafka's
``seek_to_committed`` seeks only when the committed offset is positive: a partition
without one (no commit yet: a worker that had run for less than a commit interval, or
whose commits were discarded at the revocation) keeps its fetch position, which is past
the cleared records. Those records were never processed and never are. Seen in
``test_two_workers_one_dies_the_survivor_takes_over``: the first worker kept partitions 2
and 3 at the second worker's join, had fetched offsets 21-26 and 17-27 of them, and went
on at 27 and 28.

The fix seeks such partitions of the app's own stream topics to their beginning, which is
what ``auto_offset_reset = earliest`` promises; stage 1 and stage 2 are idempotent per
record (``Stage1.add_events``, ``Stage2.on_report``), so records already processed change
nothing. Changelog partitions are left alone (Faust's recovery positions them itself).
"""

from __future__ import annotations

import functools
from typing import Any

from aiokafka import AIOKafkaConsumer

_STREAM_TOPICS: set[str] = set()
_PATCHED = "_dpstream_seek_unset_to_beginning"


def seek_uncommitted_to_beginning(topics: set[str]) -> None:
    """Make a seek to committed offsets start ``topics``' partitions that have none at
    their beginning (installed once per process; ``topics`` accumulate)."""
    _STREAM_TOPICS.update(topics)
    original = AIOKafkaConsumer.seek_to_committed
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    async def seek_to_committed(self: AIOKafkaConsumer, *partitions: Any) -> dict:
        committed = await original(self, *partitions)
        for tp, at in committed.items():
            if not at and tp.topic in _STREAM_TOPICS:
                # A plain seek: ``seek_to_beginning`` waits for the fetcher to reset the
                # position, which it cannot while Faust is in this call (a recovery hung
                # for minutes). Offset 0 gone to retention resets to the earliest one
                # (auto_offset_reset).
                self.seek(tp, 0)
        return committed

    setattr(seek_to_committed, _PATCHED, True)
    AIOKafkaConsumer.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
