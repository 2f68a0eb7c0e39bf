"""Stage 1's table, with its changelog written in record batches.

A Faust ``Table`` sends one changelog message per write (``__setitem__`` -> ``send_soon``
-> ``ProducerBuffer`` -> aiokafka ``send``): about 200 µs of event-loop work per write,
which made stage 1's per-user writes, not the DP work, the pipeline's dominant cost
(docs/benchmarks.md). ``BatchedTable`` writes to the table's local store at once and
sends the changelog entries later, one aiokafka record batch per window, to the same
changelog topic, partitions, keys (JSON) and values (JSON) as Faust would, so Faust's own
recovery reads them back unchanged.

What the crash argument of ``Stage1.add_events`` needs, and how it is kept:

* Only the last record's user entries may be ahead of the partition state that survives a
  crash. A window holds, per changelog partition, the latest value of every key written
  since the previous window, and goes to Kafka as ONE record batch: the broker appends a
  batch whole or not at all, and a partition's batches are sent in window order (from one
  place under a lock; aiokafka keeps one batch per partition in flight). So a crash keeps
  whole windows: the state as it stood at some window's end. At that moment every user
  entry is from a record the window's partition state already covers, or from the record
  being processed (its entries are written before its partition state); ``add_events``
  re-applies exactly that record's own contribution. A key written twice in one window
  is sent once, with its latest value, which is what makes a window cheap.
* A window is sealed when it reaches ``max_bytes`` (any moment is a consistent end, even
  between a record's user entries and its partition state); the worker flushes before the
  next record when one is sealed (``full``), so at most one sealed batch waits.
* Values are serialized when written, so a later in-place change of the same object
  (the partition state is mutated while the next record is processed) is never sent
  early.
* Offsets are never committed past unsent state: Faust flushes its producer before every
  commit and when partitions are revoked; ``install`` makes that flush send the windows
  first.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

import faust
import orjson

from .exits import exit_now
from .faust_compat import aiokafka_producer, memory_store, send_first_on_flush

log = logging.getLogger(__name__)

# Bytes a record adds to a v2 record batch besides its key and value (length, attributes,
# timestamp and offset deltas, key/value lengths, header count: varints of at most 5 bytes).
RECORD_OVERHEAD = 21
# A window's size bound: well under the producer batch size set in pipeline/worker/app.py and the
# broker's default max.message.bytes (1 MiB), so a window always fits one batch.
WINDOW_BYTES = 256 * 1024


def stop_unless_delivered(partition: str, delivered: asyncio.Future) -> None:
    """End the worker (:func:`exit_now`) if a window sent to the changelog ``partition``
    (``topic[n]``) failed. Its state would be lost at the next crash while its input
    offsets get committed; a restarted worker recovers from the changelog and reads those
    records again. At once, in this callback: Faust's own crash stop can hang."""
    if delivered.cancelled():
        failure = "cancelled"
    elif delivered.exception() is not None:
        failure = repr(delivered.exception())
    else:
        return
    log.critical(
        "stage-1 changelog write to %s failed: %s; stopping the worker", partition, failure
    )
    exit_now()


class ChangelogWindow:
    """Table writes not yet sent to the changelog: per changelog partition, the latest
    value of each key written since the last window, sealed at ``max_bytes``."""

    def __init__(self, max_bytes: int = WINDOW_BYTES) -> None:
        self.max_bytes = max_bytes
        self._open: dict[int, dict[str, bytes]] = {}  # partition -> key -> JSON value
        self._bytes: dict[int, int] = {}
        self._sealed: list[tuple[int, dict[str, bytes]]] = []

    def add(self, partition: int, key: str, value: bytes) -> None:
        self.add_many(partition, ((key, value),))

    def add_many(self, partition: int, items: Iterable[tuple[str, bytes]]) -> None:
        """``add`` for each (key, value), in order (one call per record: stage 1 writes a
        record's users at once)."""
        entries = self._open.setdefault(partition, {})
        size = self._bytes.get(partition, 0)
        for key, value in items:
            # Kept as an exact-size copy: orjson >= 3.12 returns each small value in a
            # 4 KiB allocation, and a window holds one value per key since the last flush.
            value = bytes(memoryview(value))
            old = entries.get(key)
            size += len(value) + (len(key) + RECORD_OVERHEAD if old is None else -len(old))
            if size > self.max_bytes and len(entries) > (old is not None):
                self._sealed.append((partition, entries))
                entries = self._open[partition] = {}
                size = len(key) + len(value) + RECORD_OVERHEAD
            entries[key] = value
        self._bytes[partition] = size

    @property
    def full(self) -> bool:
        """A window was sealed and waits for a flush."""
        return bool(self._sealed)

    def take(self) -> list[tuple[int, list[tuple[str, bytes]]]]:
        """Empty the window: (partition, entries) per record batch, in send order."""
        taken = self._sealed + [(p, e) for p, e in self._open.items() if e]
        self._open, self._bytes, self._sealed = {}, {}, []
        return [(partition, list(entries.items())) for partition, entries in taken]


class BatchedTable:
    """A Faust table (memory store) whose changelog writes are sent in batches;
    ``written`` is told how many records each flush sent (the metrics')."""

    def __init__(
        self,
        app: faust.App,
        table: Any,
        *,
        max_window_bytes: int = WINDOW_BYTES,
        written: Callable[[int], None] | None = None,
    ) -> None:
        self._app, self._table = app, table
        self._window = ChangelogWindow(max_window_bytes)
        self._lock = asyncio.Lock()
        self._written = written

    def get(self, key: str, default: Any = None) -> Any:
        return memory_store(self._table)[0].get(key, default)

    @property
    def full(self) -> bool:
        return self._window.full

    def for_partition(self, partition: int, prefix: str = "") -> PartitionEntries:
        data, key_partition = memory_store(self._table)
        return PartitionEntries(data, key_partition, self._window, partition, prefix)

    async def flush(self, delivered: bool = False) -> None:
        """Send the windows. Their delivery is awaited by the producer's flush before a
        commit, or here with ``delivered``."""
        async with self._lock:
            windows = self._window.take()
            if not windows:
                # Nothing to send; also at shutdown, where Faust flushes its producer
                # buffer once more after the producer has stopped.
                return
            producer = aiokafka_producer(self._app)
            topic = self._table.changelog_topic.get_topic_name()
            sent = []
            for partition, entries in windows:
                batch = producer.create_batch()
                for key, value in entries:
                    if batch.append(key=orjson.dumps(key), value=value, timestamp=None) is None:
                        # Split, a crash between the parts could keep half a window.
                        raise RuntimeError(
                            f"a changelog window of {len(entries)} entries does not fit one "
                            "record batch (producer_max_batch_size < WINDOW_BYTES?)"
                        )
                sent.append(await self._send(producer, batch, topic, partition))
            if self._written is not None:
                self._written(sum(len(entries) for _, entries in windows))
        if delivered and sent:
            # wait, not gather: cancelling this flush (the agent stopped at shutdown) must
            # not cancel the deliveries, whose callback would take that for a failure.
            await asyncio.wait(sent)

    async def _send(self, producer: Any, batch: Any, topic: str, partition: int) -> Any:
        batch.close()
        future = await producer.send_batch(batch, topic, partition=partition)
        future.add_done_callback(functools.partial(stop_unless_delivered, f"{topic}[{partition}]"))
        return future

    def install(self) -> None:
        """Make every producer flush (before a commit, at a rebalance, at shutdown) send
        the window first and wait for Faust's own buffer (``send_first_on_flush``)."""
        send_first_on_flush(self._app, self.flush)


class PartitionEntries(MutableMapping[str, Any]):
    """The table's entries whose keys start with ``prefix``, as seen while processing one
    record of ``partition``: reads see every entry, writes go to that partition's changelog
    (as Faust's per-event tables do). Keys are given without the prefix. ``get`` and
    ``__setitem__`` go straight to the store: stage 1 calls them per user per record."""

    def __init__(
        self,
        data: dict[str, Any],
        key_partition: dict[str, int],
        window: ChangelogWindow,
        partition: int,
        prefix: str = "",
    ) -> None:
        self._data, self._key_partition = data, key_partition
        self._window, self._partition, self._prefix = window, partition, prefix

    def __getitem__(self, key: str) -> Any:
        value = self._data.get(self._prefix + key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return self._data.get(self._prefix + key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        self.update(((key, value),))

    def update(self, pairs: Iterable[tuple[str, Any]]) -> None:  # type: ignore[override]
        """``self[key] = value`` for each (key, value), in order, in one call (stage 1
        writes a record's users at once)."""
        data, key_partition, partition = self._data, self._key_partition, self._partition
        prefix, dumps = self._prefix, orjson.dumps
        items = []
        for key, value in pairs:
            key = prefix + key
            data[key] = value
            # Faust's memory store only learns a key's partition from recovery; with it,
            # the entries of a revoked partition are dropped instead of lingering stale.
            key_partition[key] = partition
            items.append((key, dumps(value)))
        self._window.add_many(partition, items)

    def __delitem__(self, key: str) -> None:
        raise NotImplementedError("stage 1 never deletes entries")

    def __iter__(self) -> Iterator[str]:
        n, prefix = len(self._prefix), self._prefix
        return (k[n:] for k in self._data if k.startswith(prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)
