"""Stage 1's table, with its changelog written in record batches.

A Faust ``Table`` sends one changelog message per write (``__setitem__`` -> ``send_soon``
-> ``ProducerBuffer`` -> aiokafka ``send``): about 200 µs of event-loop work per write,
which made stage 1's per-user writes, not the DP work, the pipeline's dominant cost
(docs/benchmarks.md). ``BatchedTable`` writes to the table's local store at once and
sends the changelog entries later, many per aiokafka record batch, to the same changelog
topic, partitions, keys (JSON) and values (JSON) as Faust would, so Faust's own recovery
reads them back unchanged.

What the crash argument of ``Stage1.add_events`` needs, and how it is kept:

* A crash loses a suffix of a changelog partition's writes. Entries of one partition are
  sent in write order, one batch at a time (aiokafka keeps one batch per partition in
  flight and sends a partition's batches in order), from one place under a lock.
* Only the last record's user entries may be ahead of the partition state. Between two
  flushes a partition's writes form a window in which every user entry is written at most
  once (``must_flush_before`` is asked before each record) and the partition state
  (keys starting ``last_prefix``) goes last. If a crash loses a suffix of a window, every
  user entry that survived is from a record after the surviving partition state, and each
  holds that record's own contribution: the per-record re-application of ``add_events``
  restores exactly what was lost.
* Values are serialized when written, so a later in-place change of the same object
  (the partition state is mutated while the next record is processed) is never sent
  early.
* Offsets are never committed past unsent state: Faust flushes its producer before every
  commit and when partitions are revoked; ``install`` makes that flush send the window
  first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import faust
import orjson

log = logging.getLogger(__name__)


class ChangelogWindow:
    """Table writes not yet sent to the changelog, per changelog partition, in the order
    they must be sent: write order, except that the partition state (keys starting
    ``last_prefix``) goes last.

    ``must_flush_before`` keeps every user entry written at most once per partition state:
    a key written since the last partition state that reached the changelog may not be
    written again until the next one has (a flush that lands between a record's user
    entries and its partition state leaves those entries ahead of the sent state).
    """

    def __init__(self, last_prefix: str, max_entries: int = 5000) -> None:
        self.last_prefix, self.max_entries = last_prefix, max_entries
        self._entries: dict[int, dict[str, bytes]] = {}  # partition -> key -> JSON value
        self._count = 0
        # partition -> keys written before / after the window's partition state write
        self._covered: dict[int, set[str]] = {}
        self._uncovered: dict[int, set[str]] = {}

    def add(self, partition: int, key: str, value: bytes) -> None:
        self._entries.setdefault(partition, {})[key] = value
        self._count += 1
        uncovered = self._uncovered.setdefault(partition, set())
        if key.startswith(self.last_prefix):
            self._covered.setdefault(partition, set()).update(uncovered)
            uncovered.clear()
        else:
            uncovered.add(key)

    def must_flush_before(self, partition: int, keys: Iterable[str]) -> bool:
        """Whether a record writing ``keys`` in ``partition`` must wait for a flush: one of
        them was written since the last partition state sent, or the window is full."""
        if self._count >= self.max_entries:
            return True
        for written in (self._covered.get(partition), self._uncovered.get(partition)):
            if written and any(k in written for k in keys):
                return True
        return False

    def take(self) -> list[tuple[int, list[tuple[str, bytes]]]]:
        """Empty the window; per partition, its entries in send order."""
        taken, self._entries, self._count = self._entries, {}, 0
        self._covered = {}  # sent with (before) the partition state that covers them
        out = []
        for partition, entries in taken.items():
            first = [(k, v) for k, v in entries.items() if not k.startswith(self.last_prefix)]
            last = [(k, v) for k, v in entries.items() if k.startswith(self.last_prefix)]
            out.append((partition, first + last))
        return out


class BatchedTable:
    """A Faust table (memory store) whose changelog writes are sent in batches."""

    def __init__(
        self, app: faust.App, table: Any, *, last_prefix: str, max_window_entries: int = 5000
    ) -> None:
        self._app, self._table = app, table
        self._window = ChangelogWindow(last_prefix, max_window_entries)
        self._lock = asyncio.Lock()

    @property
    def _store(self) -> Any:
        return self._table.data  # faust.stores.memory.Store, created lazily by Faust

    def get(self, key: str, default: Any = None) -> Any:
        return self._store.data.get(key, default)

    def keys(self) -> Iterator[str]:
        return iter(self._store.data)

    def set(self, partition: int, key: str, value: dict) -> None:
        store = self._store
        store.data[key] = value
        # Faust's memory store only learns a key's partition from recovery; with it, the
        # entries of a revoked partition are dropped instead of lingering stale.
        store._key_partition[key] = partition
        self._window.add(partition, key, orjson.dumps(value))

    def must_flush_before(self, partition: int, keys: Iterable[str]) -> bool:
        return self._window.must_flush_before(partition, keys)

    def for_partition(self, partition: int) -> PartitionEntries:
        return PartitionEntries(self, partition)

    async def flush(self, delivered: bool = False) -> None:
        """Send the window's entries. Their delivery is awaited by the producer's flush
        before a commit, or here with ``delivered``."""
        async with self._lock:
            producer = self._app.producer._ensure_producer()  # Faust's aiokafka producer
            topic = self._table.changelog_topic.get_topic_name()
            sent = []
            for partition, entries in self._window.take():
                batch = producer.create_batch()
                for key, value in entries:
                    if batch.append(key=orjson.dumps(key), value=value, timestamp=None) is None:
                        sent.append(await self._send(producer, batch, topic, partition))
                        batch = producer.create_batch()
                        batch.append(key=orjson.dumps(key), value=value, timestamp=None)
                sent.append(await self._send(producer, batch, topic, partition))
        if delivered:
            await asyncio.gather(*sent)

    async def _send(self, producer: Any, batch: Any, topic: str, partition: int) -> Any:
        batch.close()
        future = await producer.send_batch(batch, topic, partition=partition)
        future.add_done_callback(self._on_delivered)
        return future

    def _on_delivered(self, delivered: asyncio.Future) -> None:
        if delivered.cancelled() or delivered.exception() is not None:
            # State that did not reach the changelog would be lost at the next crash while
            # its input offsets get committed: stop the worker instead.
            exc = delivered.exception() if not delivered.cancelled() else None
            log.error("stage-1 changelog write failed: %r; stopping the worker", exc)
            asyncio.ensure_future(self._app.crash(exc or RuntimeError("changelog send")))

    def install(self) -> None:
        """Make every producer flush (before a commit, at a rebalance, at shutdown) send
        the window first and then wait until Faust's own send buffer is empty.

        Faust's ``ProducerBuffer.flush`` gives up after 0.1 s without a send
        (``flush_atmost``, faust-streaming 0.15.3), so offsets were committed while table
        changelog writes of the committed records still sat in the buffer, and a crash
        lost them for good; the loop waits for them (docs/reliability.md).
        """
        buffer = self._app.producer.buffer

        async def flush() -> None:
            await self.flush()
            while buffer.size:
                await buffer.flush_atmost(None)

        buffer.flush = flush  # type: ignore[method-assign]


class PartitionEntries(MutableMapping[str, dict]):
    """The table as seen while processing one record of ``partition``: reads see every
    entry, writes go to that partition's changelog (as Faust's per-event tables do)."""

    def __init__(self, table: BatchedTable, partition: int) -> None:
        self._table, self._partition = table, partition

    def __getitem__(self, key: str) -> dict:
        value = self._table.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return self._table.get(key, default)

    def __setitem__(self, key: str, value: dict) -> None:
        self._table.set(self._partition, key, value)

    def __delitem__(self, key: str) -> None:
        raise NotImplementedError("stage 1 never deletes entries")

    def __iter__(self) -> Iterator[str]:
        return self._table.keys()

    def __len__(self) -> int:
        return len(self._table._store.data)
